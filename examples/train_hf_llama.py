"""Train a Hugging Face ``LlamaForCausalLM`` from random init on synthetic tokens.

A training script written the way many are: transformers' model class, built from a config
(no download: random weights, random tokens), AdamW, bf16 weights on the GPU, SDPA attention.
The default size is the one the profiling issue was measured with: 8 layers, hidden 2048,
16 query / 4 key-value heads (GQA), batch 4 × 2048 tokens, about 60 ms a step on an H100.

    python examples/train_hf_llama.py
    python examples/train_hf_llama.py --compile                  # torch.compile the model
    kerneltriage profile -- python examples/train_hf_llama.py
    python examples/train_hf_llama.py --tiny --device cpu        # seconds on a CPU, for tests

``KT_EXAMPLE_STATS=FILE`` appends, at exit, the step times (without synchronizing) and
torch.compile's graph and graph-break counts (``stepstats.py``).
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
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="weights (default: bf16 on a GPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = 2, 64, 128, 4, 2
        args.vocab, args.seq, args.batch = 256, 32, 2
    if args.dtype is None:
        args.dtype = "bf16" if torch.device(args.device).type == "cuda" else "fp32"
    return args


def build_model(args, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq,
        attn_implementation="sdpa",
    )
    config.use_cache = False  # training: no KV cache
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with device:  # random init on the device itself: seconds, not a minute on the CPU
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    step_model = torch.compile(model) if args.compile else model
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    stats = StepStats(device)
    loss = None
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(
            device, non_blocking=True
        )
        loss = step_model(input_ids=ids, labels=ids).loss  # the model shifts the labels itself
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
