"""What each fix of a lone ``aten::layer_norm`` does to a whole training step: the measurements
behind the rules' ``already_alone`` skip of ATen's LayerNorm (``data/rules/default.yaml``).

ATen's ``layer_norm`` is one kernel each way already. A report places it 2× or more below its
roof (the backward above all), so the question is which fix, if any, takes that headroom:

- ``eager``: nothing changed (the baseline);
- ``swap``: ``kerneltriage.kernels.patch(model)`` (every ``nn.LayerNorm`` becomes the built-in);
- ``lnclass``: ``module.compile()`` on every ``LayerNorm`` (the fix the report used to print);
- ``block``: ``module.compile()`` on every module of the class around the norm (GPT-2's
  ``GPT2Block``, BERT's ``BertSelfOutput``, ConvNeXt's ``ConvNeXtBlock``), which fuses its
  neighbours too (and, in GPT-2's block, the GELU chain: not the norm's saving alone).

Models, built from configs (no download), bf16 autocast over fp32 weights, fused AdamW:
``gpt2`` (HF GPT-2-medium-sized: 24 layers, d 1024, 8 × 1024 tokens), ``bert`` (HF BERT-base
MLM, 32 × 512), ``convnext`` (timm ConvNeXt-T, batch 64 of 224²). Each variant runs in a process
of its own, round-robin ``--repeats`` times so that host drift falls on every variant alike;
each process times ``--steps`` steps after ``--warmup`` (synchronized, wall clock) and records
the median, the 10th and 90th percentiles and its first three losses.

    python3 benchmarks/probes/layernorm_fixes.py --out OUT_DIR
    python3 benchmarks/probes/layernorm_fixes.py --out OUT_DIR --models bert --variants eager,swap

Needs a CUDA GPU, torch, triton, transformers and timm. Writes OUT_DIR/layernorm_fixes.jsonl
(one line per process) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BLOCKS = {"gpt2": "GPT2Block", "bert": "BertSelfOutput", "convnext": "ConvNeXtBlock"}


def build(name: str, device):
    """The model and a function that makes one batch and returns its loss."""
    import torch

    if name == "convnext":
        import timm

        model = timm.create_model("convnext_tiny", pretrained=False, num_classes=1000).to(device)

        def loss_of(gen):
            images = torch.randn(64, 3, 224, 224, device=device)
            labels = torch.randint(0, 1000, (64,), device=device)
            return torch.nn.functional.cross_entropy(model(images), labels)

        return model.train(), loss_of
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50257)
        config._attn_implementation = "sdpa"
        model, shape, vocab = GPT2LMHeadModel(config), (8, 1024), 50257
    else:
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            attn_implementation="sdpa",
        )
        model, shape, vocab = BertForMaskedLM(config), (32, 512), 30522
    model = model.to(device)

    def loss_of(gen):
        ids = torch.randint(1000, vocab, shape, generator=gen).to(device, non_blocking=True)
        return model(input_ids=ids, labels=ids).loss

    return model.train(), loss_of


def one_process(args: argparse.Namespace) -> None:
    """One variant of one model, timed; prints a JSON line."""
    import torch

    torch.manual_seed(0)
    device = torch.device("cuda")
    model, loss_of = build(args.model, device)
    if args.variant == "swap":
        from kerneltriage.kernels import patch

        print(patch(model), file=sys.stderr)
    elif args.variant in ("lnclass", "block"):
        torch._dynamo.config.cache_size_limit = 64  # one compiled forward per instance
        cls = BLOCKS[args.model] if args.variant == "block" else "LayerNorm"
        for module in model.modules():
            if type(module).__name__ == cls:
                module.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(1)
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(gen)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        if i < 3:
            losses.append(loss.item())
    steady = sorted(times[args.warmup :])
    row = {
        "model": args.model,
        "variant": args.variant,
        "median_ms": statistics.median(steady),
        "p10_ms": steady[len(steady) // 10],
        "p90_ms": steady[(9 * len(steady)) // 10],
        "losses": losses,
        "step_ms": [round(t, 3) for t in times],
    }
    print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="output folder (the driver)")
    p.add_argument("--models", default="gpt2,bert,convnext")
    p.add_argument("--variants", default="eager,swap,lnclass,block")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one process may take")
    p.add_argument("--model", help=argparse.SUPPRESS)  # one process
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model:
        one_process(args)
        return
    if args.out is None:
        p.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "layernorm_fixes.jsonl"
    rows = []
    for model in args.models.split(","):
        for r in range(args.repeats):
            for variant in args.variants.split(","):
                cmd = [sys.executable, __file__, "--model", model, "--variant", variant]
                cmd += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"{model} {variant} round {r + 1}: past {args.timeout:.0f} s", file=sys.stderr)
                    continue
                lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
                if done.returncode or not lines:
                    print(f"{model} {variant} round {r + 1}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                    continue
                row = json.loads(lines[-1])
                rows.append(row)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{model:9} {variant:8} round {r + 1}: {row['median_ms']:.2f} ms", flush=True)
    print("\nmodel     variant   medians (ms)")
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            meds = [f"{x['median_ms']:.2f}" for x in rows if x["model"] == model and x["variant"] == variant]
            print(f"{model:9} {variant:8}  {', '.join(meds)}")


if __name__ == "__main__":
    main()
