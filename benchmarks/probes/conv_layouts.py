"""What a timm conv net's training step costs in each memory layout, with cuDNN's autotuner and
with each compile a report may advise, its kernel time and the host's time to issue it: the
measurements behind the report's cap of kernel-time predictions at step − host.

ConvNeXt's block runs a depthwise 7×7 convolution, permutes its output to NHWC for its
LayerNorm and MLP, and permutes back: from the first block on the activations are NHWC in memory
whatever the model's format, so cuDNN runs its NHWC depthwise kernels either way (measured: the
same kernels and step time in both layouts). What a fix changes here is the host's side: the
step of about 1,070 launches takes the host about as long to issue as the GPU to run, so the
probe records both.

Each variant runs in a process of its own (a fresh cuDNN and Dynamo state), in the order given,
``--repeats`` times round-robin so host drift falls on every variant alike; each process times
``--steps`` steps after ``--warmup`` with CUDA events and reports the median. Eager
and compiled variants alike record one profiled step (its GPU kernel time by kernel name) and
the host's time to issue a step from an idle GPU.

    python3 benchmarks/probes/conv_layouts.py --out OUT_DIR
    python3 benchmarks/probes/conv_layouts.py --out OUT_DIR --model convnext_tiny \\
        --variants nchw,cl,nchw+bench,cl+bench,cl+compile-LayerNorm --repeats 2

Variant words, joined by '+': ``nchw`` / ``cl`` (the layout of the model and the batch),
``bench`` (``torch.backends.cudnn.benchmark = True``), ``compile-CLASS`` (``module.compile()``
on every module of that class), ``compile`` (``torch.compile(model)``), ``graphs``
(``torch.compile(model, mode="reduce-overhead")``: CUDA graphs).

Needs a CUDA GPU, torch and timm. Writes OUT_DIR/conv_layouts.json and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_VARIANTS = (
    "nchw,cl,nchw+bench,cl+bench,nchw+compile-LayerNorm,cl+compile-LayerNorm,"
    "nchw+compile-ConvNeXtBlock,cl+compile-ConvNeXtBlock,nchw+compile,cl+compile"
)


def one(model_name: str, variant: str, batch: int, warmup: int, steps: int) -> dict:
    """Time ``variant`` in this process (the child side)."""
    import timm
    import torch
    import torch.nn.functional as F

    words = variant.split("+")
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = "bench" in words
    model = timm.create_model(model_name, pretrained=False, num_classes=1000).cuda().train()
    fmt = torch.channels_last if "cl" in words else torch.contiguous_format
    model = model.to(memory_format=fmt)
    for word in words:
        if word.startswith("compile-"):
            cls = word.removeprefix("compile-")
            hits = [m for m in model.modules() if type(m).__name__ == cls]
            if not hits:
                raise SystemExit(f"{model_name} has no module of class {cls}")
            for m in hits:
                m.compile()
    step_model = model
    if "compile" in words:
        step_model = torch.compile(model)
    elif "graphs" in words:  # CUDA graphs: the compiled forward and backward replayed at once
        step_model = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step() -> None:
        images = torch.randn(batch, 3, 224, 224, generator=gen, device="cuda").to(memory_format=fmt)
        labels = torch.randint(0, 1000, (batch,), generator=gen, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(step_model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - start
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    marks[0].record()
    for i in range(steps):
        step()
        marks[i + 1].record()
    torch.cuda.synchronize()
    step_ms = [a.elapsed_time(b) for a, b in itertools.pairwise(marks)]
    # The host's side: seconds to issue one step with the GPU idle at its start (synchronized
    # before and after the call), against the GPU's busy time in one profiled step. A step
    # whose issue time exceeds its kernel time waits on the host.
    issue_ms = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        issue_ms.append(1e3 * (time.perf_counter() - t0))
        torch.cuda.synchronize()
    from torch._dynamo.utils import counters

    kernels: dict[str, float] = {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    launches = 0
    for e in prof.events():
        if e.device_type.name == "CUDA":
            launches += 1
            kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / 1e3
    return {
        "variant": variant,
        "median_ms": statistics.median(step_ms),
        "step_ms": [round(t, 4) for t in step_ms],
        "warmup_s": round(warm_s, 2),
        "issue_ms": round(statistics.median(issue_ms), 3),
        "kernel_sum_ms": round(sum(kernels.values()), 3),
        "launches": launches,
        "dynamo": {k: dict(v) for k, v in counters.items() if k in ("stats", "graph_break", "recompiles")},
        # Every kernel of the profiled step, so that a compiled step's fused kernels can be set
        # against the eager kernels they replace.
        "kernel_ms": {k: round(v, 4) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON result")
    parser.add_argument("--model", default="convnext_tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1, help="processes per variant, round-robin")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated (see above)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(one(args.model, args.child, args.batch, args.warmup, args.steps)))
        return

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    runs: list[dict] = []
    for rep in range(args.repeats):
        for variant in variants:
            cmd = [sys.executable, __file__, "--out", str(args.out), "--model", args.model]
            cmd += ["--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps)]
            cmd += ["--child", variant]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                runs.append({"variant": variant, "repeat": rep, "error": f"past {args.timeout:.0f} s"})
                print(f"{variant:34s} past {args.timeout:.0f} s", flush=True)
                save(args, runs)
                continue
            lines = done.stdout.strip().splitlines()
            if done.returncode or not lines:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                runs.append({"variant": variant, "repeat": rep, "error": tail[:300]})
                print(f"{variant:34s} failed: {tail[:120]}", flush=True)
                save(args, runs)
                continue
            run = json.loads(lines[-1]) | {"repeat": rep}
            runs.append(run)
            top = ", ".join(f"{k[:40]} {v:.2f}" for k, v in list(run["kernel_ms"].items())[:2])
            print(
                f"{variant:34s} {run['median_ms']:8.2f} ms  warm-up {run['warmup_s']:6.1f} s  {top}",
                flush=True,
            )
            save(args, runs)


def save(args: argparse.Namespace, runs: list[dict]) -> None:
    """Write what has been measured so far (a later process past its limit loses nothing)."""
    import torch

    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": args.model,
        "batch": args.batch,
        "runs": runs,
    }
    (args.out / "conv_layouts.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
