"""Train a Hugging Face ``MixtralForCausalLM`` (a mixture of experts) from random init.

A Mixtral-class MoE as transformers 5 trains one: the model class built from a config (no
download), 8 experts with top-2 routing, the experts run through ``torch.nn.functional.
grouped_mm`` (``experts_implementation="grouped_mm"``: one grouped GEMM per projection over
all experts, tokens sorted by expert around it), AdamW, bf16 weights on the GPU, SDPA
attention. Default size: 8 layers, hidden 1024, expert width 1792, 16 query / 4 key-value
heads, a 32,000-token vocabulary, batch 4 × 2048 tokens.

    python examples/train_hf_mixtral.py
    kerneltriage profile -- python examples/train_hf_mixtral.py
    python examples/train_hf_mixtral.py --tiny --device cpu        # seconds on a CPU, for tests

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
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=1792, help="each expert's width")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--experts-implementation", default="grouped_mm", choices=("grouped_mm", "eager"))
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = 2, 64, 96, 4, 2
        args.experts, args.vocab, args.seq, args.batch = 4, 256, 32, 2
    return args


def build_model(args, device):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=args.seq,
        router_aux_loss_coef=0.01,
        output_router_logits=True,  # the load-balancing loss, as MoE training uses
        attn_implementation="sdpa",
        experts_implementation=args.experts_implementation,
    )
    config.use_cache = False  # training: no KV cache
    with device:  # random init on the device itself
        model = MixtralForCausalLM(config)
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
        loss = model(input_ids=ids, labels=ids).loss  # LM loss + the router's auxiliary loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
