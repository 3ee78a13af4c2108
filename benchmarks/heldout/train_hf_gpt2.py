"""Train a Hugging Face ``GPT2LMHeadModel`` (GPT-2-medium-sized) from random init on synthetic
tokens: a model family kerneltriage's examples do not hold, for measuring the tool on it.

24 layers, d 1024, 16 heads, the 50257-token vocabulary (an unaligned N for the tied
``lm_head``), GPT-2's tanh GELU written in eager ops, SDPA attention; fp32 weights, bf16 autocast,
fused AdamW; batch 8 × 1024. About 123 ms a step on an H200. Needs a CUDA GPU and transformers.

    bash benchmarks/gpu_ladder.sh OUT -- python benchmarks/heldout/train_hf_gpt2.py

``KT_EXAMPLE_STATS=FILE`` appends, at exit, the step times (``examples/stepstats.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from stepstats import StepStats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    args = p.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=args.seq, vocab_size=50257)
    config._attn_implementation = "sdpa"
    device = torch.device("cuda")
    model = GPT2LMHeadModel(config).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(0)
    stats = StepStats(device)
    loss = None
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=gen).to(
            device, non_blocking=True
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
