"""How many replay passes, and how long a profiled launch, each part of phase 2's metrics costs.

Nsight Compute replays a kernel once per pass its metrics need; the instruction counters
(``smsp__sass_thread_inst_executed_op_*``, the FLOPs of the roofline) are collected by patched
SASS and may need passes of their own. Each variant is one process under ncu that launches a
small fp32 elementwise kernel and a bf16 GEMM ``LAUNCHES`` times each, timed on the host from
launch to synchronize, with one subset of ``metric_list``:

- ``all``: what phase 2 collects (bf16 tensor counters);
- ``no_fp64``: without the fp64 instruction counters (``dadd``, ``dmul``, ``dfma``);
- ``no_half``: without the fp16 instruction counters (``hadd``, ``hmul``, ``hfma``);
- ``no_sass``: without any instruction counter (bytes, time and tensor pipe only);
- ``time``: ``gpu__time_duration.sum`` only, the floor a profiled launch costs.

``--gib``: the process also holds that much in ``--pieces`` live tensors (kernel replay saves
and restores what a process holds between passes; a training step holds gigabytes in thousands
of allocations).

    python benchmarks/probes/ncu_metric_passes.py OUT_DIR [--variants all,no_fp64,...] [--gib 20 --pieces 64]

Needs: one CUDA GPU, Nsight Compute's ncu on PATH. OUT_DIR gets ``ncu_metric_passes.json``
and ``ncu_metric_passes.txt``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LAUNCHES = 20
VARIANTS = ("all", "no_fp64", "no_half", "no_sass", "time")
PASSES = re.compile(r"==PROF== Profiling \"([^\"]+)\".*?(\d+) pass")


def child(out: Path, gib: float, pieces: int) -> None:
    import torch

    held = (
        [torch.empty(int(gib * 2**30) // pieces, dtype=torch.uint8, device="cuda") for _ in range(pieces)]
        if gib
        else []
    )

    times = timed_launches(LAUNCHES)
    out.write_text(json.dumps({**times, "held_gib": sum(t.numel() for t in held) / 2**30}))


def timed_launches(launches: int, stamps: list[float] | None = None) -> dict[str, list[float]]:
    """``launches`` times each an 8 MiB fp32 ``mul_`` and a 2048³ bf16 ``mm``, each timed on the
    host from launch to synchronize; ``stamps`` gets the wall clock after each pair."""
    import torch

    x = torch.randn(2 * 1024 * 1024, device="cuda")  # 8 MiB
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {"elementwise": [], "gemm": []}
    for _ in range(launches):
        start = time.perf_counter()
        x.mul_(1.0001)
        torch.cuda.synchronize()
        times["elementwise"].append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.mm(a, b)
        torch.cuda.synchronize()
        times["gemm"].append(time.perf_counter() - start)
        if stamps is not None:
            stamps.append(time.time())
    return times


def subset(variant: str, metrics: list[str]) -> list[str]:
    sass = "smsp__sass_thread_inst_executed_op_"
    if variant == "no_fp64":
        return [m for m in metrics if not m.startswith((sass + "d",))]
    if variant == "no_half":
        return [m for m in metrics if not m.startswith((sass + "h",))]
    if variant == "no_sass":
        return [m for m in metrics if not m.startswith(sass)]
    if variant == "time":
        return ["gpu__time_duration.sum"]
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--gib", type=float, default=0.0)
    parser.add_argument("--pieces", type=int, default=1)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_out:
        child(args.child_out, args.gib, args.pieces)
        return
    from kerneltriage.profile import nsight_compute as ncu_tools

    ncu = ncu_tools.find_ncu()
    if ncu is None:
        sys.exit("ncu not found on PATH")
    everything = ncu_tools.metric_list(ncu_tools.available_metrics(ncu), ["bf16"])
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for variant in args.variants.split(","):
        metrics = subset(variant, everything)
        target = args.out / f"passes_{variant}.json"
        cmd = [ncu, "--clock-control", "none", "--force-overwrite", "-o", str(args.out / f"passes_{variant}")]
        cmd += [
            "--metrics",
            ",".join(metrics),
            sys.executable,
            __file__,
            str(args.out),
            "--child-out",
            str(target),
            "--gib",
            str(args.gib),
            "--pieces",
            str(args.pieces),
        ]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0 or not target.is_file():
            results.append({"variant": variant, "error": done.stderr[-800:] + done.stdout[-800:]})
            continue
        passes: dict[str, set[int]] = {}
        for kernel, n in PASSES.findall(done.stdout + done.stderr):
            passes.setdefault(kernel[:40], set()).add(int(n))
        times = json.loads(target.read_text())
        held = times.pop("held_gib")
        results.append(
            {
                "variant": variant,
                "metrics": len(metrics),
                "held_gib": held,
                "passes": {k: sorted(v) for k, v in passes.items()},
                "launch_median_s": {k: round(statistics.median(v[2:]), 4) for k, v in times.items()},
                "wall_s": round(wall, 2),
            }
        )
    (args.out / "ncu_metric_passes.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"{LAUNCHES} profiled launches each of an 8 MiB fp32 mul_ and a 2048^3 bf16 mm; median of the last {LAUNCHES - 2}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['variant']}: failed: {r['error'][-300:]}")
            continue
        lines.append(
            f"{r['variant']:8s} {r['metrics']:2d} metrics  held {r['held_gib']:.1f} GiB  passes {r['passes']}  per launch "
            + ", ".join(f"{k} {v:.4f} s" for k, v in r["launch_median_s"].items())
            + f"  process {r['wall_s']:.1f} s"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "ncu_metric_passes.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
