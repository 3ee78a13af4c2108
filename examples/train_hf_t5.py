"""Train a Hugging Face ``T5ForConditionalGeneration`` (T5-base size) from random init.

An encoder-decoder as many scripts train one: transformers' model class built from a config
(no download), fp32 weights under bf16 autocast, AdamW, batch 32 of 512 source and 128 target
tokens. T5's attention adds a learned relative position bias to the scores, and its norms are
``T5LayerNorm`` (no mean, no bias, the variance in fp32): two places where a fix must keep
the model's math.

    python examples/train_hf_t5.py
    kerneltriage profile -- python examples/train_hf_t5.py
    python examples/train_hf_t5.py --tiny --device cpu        # seconds on a CPU, for tests

``KT_EXAMPLE_STATS=FILE`` appends, at exit, the step times (``stepstats.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # stepstats.py, beside this file
from stepstats import StepStats


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--d-ff", type=int, default=3072)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32128)
    p.add_argument("--src", type=int, default=512)
    p.add_argument("--tgt", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.d_model, args.d_ff, args.heads = 2, 64, 128, 4
        args.vocab, args.src, args.tgt, args.batch = 256, 32, 16, 2
    return args


def build_model(args, device):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=args.vocab,
        d_model=args.d_model,
        d_kv=args.d_model // args.heads,
        d_ff=args.d_ff,
        num_layers=args.layers,
        num_decoder_layers=args.layers,
        num_heads=args.heads,
        decoder_start_token_id=0,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    config.use_cache = False  # training: no KV cache
    with device:  # random init on the device itself
        return T5ForConditionalGeneration(config)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    stats = StepStats(device)
    amp = device.type == "cuda"
    loss = None
    for _ in range(args.steps):
        src = torch.randint(0, args.vocab, (args.batch, args.src), generator=gen).to(
            device, non_blocking=True
        )
        tgt = torch.randint(0, args.vocab, (args.batch, args.tgt), generator=gen).to(
            device, non_blocking=True
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=src, labels=tgt).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
