"""Train a Hugging Face Gemma2-class ``Gemma2ForCausalLM`` from random init on synthetic tokens.

The attention variant SDPA cannot run fused: attention-logit softcapping (50), a sliding window
(1024) on every other layer, GQA (16 query / 8 key-value heads), head dim 128 and a custom
scale (``query_pre_attn_scalar``), and a final-logit softcap (30). Weights in bf16, random
init from a config (no download), batch 2 × 2048 tokens, 8 layers of hidden 2048.

    python examples/train_hf_gemma2.py                       # eager attention, as configured
    python examples/train_hf_gemma2.py --attn kerneltriage   # the built-in flash attention
    python examples/train_hf_gemma2.py --attn flex_attention
    kerneltriage profile -- python examples/train_hf_gemma2.py
    python examples/train_hf_gemma2.py --tiny --device cpu   # seconds on a CPU, for tests

``--attn sdpa`` drops the softcap (transformers warns): not the same model. ``--loss-log FILE``
writes every step's loss; ``KT_EXAMPLE_STATS=FILE`` appends the step times (``stepstats.py``).
"""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--attn", choices=["eager", "sdpa", "flex_attention", "kerneltriage"], default="eager")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-log", help="write every step's loss to this JSON file")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = 2, 64, 128, 4, 2
        args.head_dim, args.window, args.vocab, args.seq, args.batch = 16, 8, 256, 24, 2
    return args


def build_model(args, device):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        query_pre_attn_scalar=args.head_dim,
        sliding_window=args.window,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        max_position_embeddings=max(args.seq, 8192),
        attn_implementation="eager" if args.attn == "kerneltriage" else args.attn,
    )
    config.use_cache = False
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with device:
        model = Gemma2ForCausalLM(config)
    model = model.to(dtype=dtype)
    if args.attn == "kerneltriage":
        from kerneltriage.kernels.hf_attention import use_flash_attention

        print("kerneltriage attention:", use_flash_attention(model))
    return model


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    stats = StepStats(device)
    losses = []
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(
            device, non_blocking=True
        )
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
        if args.loss_log:
            losses.append(loss.detach())
    if args.loss_log:
        with open(args.loss_log, "w") as f:
            json.dump([float(x) for x in losses], f)
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
