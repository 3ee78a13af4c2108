"""Train a Hugging Face ``BertForMaskedLM`` (BERT-base) from random init on synthetic tokens.

An encoder pre-training script written the way many are: transformers' model class from a
config (no download), fp32 weights under bf16 autocast, fused AdamW, batch 32 × 512 tokens,
15% of the positions masked (label -100 elsewhere), SDPA attention. The MLM head computes
logits over the 30522-token vocabulary at every position.

    python examples/train_bert_mlm.py
    kerneltriage profile -- python examples/train_bert_mlm.py
    python examples/train_bert_mlm.py --tiny --device cpu        # seconds on a CPU, for tests

``KT_EXAMPLE_STATS=FILE`` appends the step times and torch.compile's counts at exit
(``stepstats.py``).
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
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.intermediate = 2, 64, 4, 128
        args.vocab, args.seq, args.batch = 512, 32, 2
    return args


def main(argv=None):
    from transformers import BertConfig, BertForMaskedLM

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    config = BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate,
        max_position_embeddings=max(512, args.seq),
        attn_implementation="sdpa",
    )
    with device:
        model = BertForMaskedLM(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    step_model = torch.compile(model) if args.compile else model
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    stats = StepStats(device)
    amp = device.type == "cuda"
    mask_id = 103 if args.vocab > 103 else 0
    loss = None
    for _ in range(args.steps):
        ids = torch.randint(
            1000 if args.vocab > 2000 else 1, args.vocab, (args.batch, args.seq), generator=gen
        )
        masked = torch.rand(args.batch, args.seq, generator=gen) < 0.15
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        inputs = torch.where(masked, torch.full_like(ids, mask_id), ids)
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = step_model(input_ids=inputs, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
