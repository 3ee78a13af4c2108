"""A small LLaMA-style training loop on synthetic tokens: SDPA with grouped-query attention,
RMSNorm, SwiGLU, rotary position embeddings.

    python examples/train_llama.py
    python examples/train_llama.py --varlen            # a different sequence length every step
    kerneltriage profile -- python examples/train_llama.py --varlen
    python examples/train_llama.py --tiny --device cpu

With ``--varlen`` every step draws its own sequence length, which is what shape stability
looks like when it fails: row-wise ops (norms, SwiGLU) still see a fixed hidden size, while
attention sees a new S×S problem each step.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument(
        "--varlen", action="store_true", help="draw a new sequence length (multiple of 64) every step"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.d, args.layers, args.heads, args.kv_heads, args.seq, args.batch, args.vocab = (
            64,
            2,
            4,
            2,
            128,
            2,
            256,
        )
    return args


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(x, base: float = 10000.0):
    """Rotate pairs of channels by position-dependent angles (x: B, H, S, D)."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k = rotary(q), rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        hidden = 256 * ((8 * d // 3 + 255) // 256)
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(args.d), RMSNorm(args.d)
        self.attn = Attention(args.d, args.heads, args.kv_heads)
        self.mlp = SwiGLU(args.d)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.emb = nn.Embedding(args.vocab, args.d)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.layers))
        self.norm = RMSNorm(args.d)
        self.head = nn.Linear(args.d, args.vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = Llama(args).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    for _ in range(args.steps):
        s = args.seq
        if args.varlen:
            s = 64 * int(torch.randint(max(1, args.seq // 256), args.seq // 64 + 1, (1,), generator=gen))
        idx = torch.randint(0, args.vocab, (args.batch, s), generator=gen).to(device)
        with autocast:
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, args.vocab).float(), torch.roll(idx, 1, 1).view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
