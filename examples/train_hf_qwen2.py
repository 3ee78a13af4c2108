"""Train a Hugging Face ``Qwen2ForCausalLM`` from random init on synthetic tokens.

A Qwen2-class causal LM as many scripts train one: transformers' model class built from a
config (no download), AdamW, bf16 weights on the GPU, SDPA attention, a 151,936-token
vocabulary (the cross-entropy over it is a large share of the step). Default size: 16 layers,
hidden 1024, 16 query / 4 key-value heads, batch 4 × 2048 tokens, about 90 ms a step on an
H100. Its step times show a slow stretch some steps after the start (steps of 106–124 ms
among 89 ms ones on an H100), which a fixed three-step warm-up does not cover.

    python examples/train_hf_qwen2.py
    kerneltriage profile -- python examples/train_hf_qwen2.py
    python examples/train_hf_qwen2.py --tiny --device cpu        # seconds on a CPU, for tests

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
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = 2, 64, 128, 4, 2
        args.vocab, args.seq, args.batch = 256, 32, 2
    return args


def build_model(args, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    config.use_cache = False  # training: no KV cache
    with device:  # random init on the device itself
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    stats = StepStats(device)
    loss = None
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(
            device, non_blocking=True
        )
        loss = model(input_ids=ids, labels=ids).loss  # the model shifts the labels itself
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
