"""A small GPT training loop on synthetic tokens: the kind of script kerneltriage triages.

Attention is written naively by default (matmul → mask → softmax → matmul, the S×S scores
materialized) and RMSNorm eagerly (float cast, pow, mean, rsqrt, mul): both show up as
kernel candidates. Flags swap in SDPA and kerneltriage's built-in Triton kernels, so the
same script measures before and after:

    python examples/train_gpt.py                          # naive attention, eager RMSNorm
    python examples/train_gpt.py --attn sdpa
    python examples/train_gpt.py --attn builtin --norm builtin
    python examples/train_gpt.py --compile                # the whole model under torch.compile
    kerneltriage profile -- python examples/train_gpt.py
    torchrun --nproc-per-node 2 examples/train_gpt.py --ddp
    python examples/train_gpt.py --tiny --device cpu      # seconds on a CPU, for tests

No downloads: tokens are random. ``--loss-log`` writes the loss of every step (JSON) and
``--time`` prints the median step time after the first few steps (it synchronizes every step).
``KT_EXAMPLE_STATS=FILE`` appends, at exit, the step times (without synchronizing) and
torch.compile's graph and graph-break counts (``stepstats.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # stepstats.py, beside this file
from stepstats import StepStats


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--attn", choices=["naive", "sdpa", "builtin"], default="naive")
    p.add_argument("--norm", choices=["eager", "builtin"], default="eager")
    p.add_argument(
        "--loss",
        choices=["eager", "liger"],
        default="eager",
        help="liger: Liger's cross-entropy kernel on the bf16 logits (needs liger-kernel)",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel (launch with torchrun)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-log", help="write every step's loss to this JSON file")
    p.add_argument("--time", action="store_true", help="print the median step time")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args(argv)
    if args.tiny:
        args.d, args.layers, args.heads, args.seq, args.batch, args.vocab = 64, 2, 4, 64, 2, 256
    return args


class RMSNorm(nn.Module):
    """Eager RMSNorm, as many codebases write it: five elementwise/reduction kernels."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kind: str):
        super().__init__()
        self.heads, self.kind = heads, kind
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.kind == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.kind == "builtin":
            from kerneltriage.kernels import flash_attention

            y = flash_attention(q, k, v, causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, attn: str, norm: str):
        super().__init__()
        self.fused = norm == "builtin"
        if self.fused:
            from kerneltriage.kernels import RMSNorm as FastRMSNorm

            self.n1, self.n2 = FastRMSNorm(d, eps=1e-6), FastRMSNorm(d, eps=1e-6)
        else:
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.attn = Attention(d, heads, attn)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        if self.fused:
            from kerneltriage.kernels import fused_add_rms_norm

            # x + attn(…) and the second norm in one pass: (normed, new residual). The residual
            # stream stays in its own dtype (fp32 under autocast), as in the eager block.
            h, x = fused_add_rms_norm(self.attn(self.n1(x)).to(x.dtype), x, self.n2.weight, eps=1e-6)
            return x + self.down(F.gelu(self.up(h)))
        x = x + self.attn(self.n1(x))
        return x + self.down(F.gelu(self.up(self.n2(x))))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.emb = nn.Embedding(args.vocab, args.d)
        self.blocks = nn.ModuleList(
            Block(args.d, args.heads, args.attn, args.norm) for _ in range(args.layers)
        )
        self.nf = RMSNorm(args.d)
        self.head = nn.Linear(args.d, args.vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.nf(x))


def main(argv=None):
    args = parse_args(argv)
    rank, world = 0, 1
    if args.ddp:
        import torch.distributed as dist

        backend = "nccl" if args.device.startswith("cuda") else "gloo"
        dist.init_process_group(backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            args.device = f"cuda:{torch.cuda.current_device()}"
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = GPT(args).to(device)
    if args.compile:
        model = torch.compile(model)
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=fused)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1000 * rank)
    if args.loss == "liger":
        from liger_kernel.transformers import LigerCrossEntropyLoss

        liger_ce = LigerCrossEntropyLoss()
    stats = StepStats(device)
    losses, times = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(
            device, non_blocking=True
        )
        with autocast:
            logits = model(idx)
            # Next-token loss on a learnable pattern: predict the previous token.
            target = torch.roll(idx, 1, dims=1)
            if args.loss == "liger":
                loss = liger_ce(logits.view(-1, args.vocab), target.view(-1))
            else:
                loss = F.cross_entropy(logits.view(-1, args.vocab).float(), target.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
        if args.loss_log or args.time:
            losses.append(loss.item())  # syncs: only when asked for
            times.append(time.perf_counter() - start)
    if rank == 0:
        if args.loss_log:
            with open(args.loss_log, "w") as f:
                json.dump({"attn": args.attn, "norm": args.norm, "world": world, "loss": losses}, f)
        if args.time and len(times) > 3:
            ms = 1000 * statistics.median(times[3:])
            print(f"step_ms {ms:.2f} attn={args.attn} norm={args.norm} world={world}")
        print(f"final loss {loss.item():.4f}")
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
