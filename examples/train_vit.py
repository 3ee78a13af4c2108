"""Train a timm ViT-B/16 image classifier from random init on synthetic images.

A vision training script written the way many are: ``timm.create_model`` (no download: random
weights), fp32 weights under bf16 autocast, fused AdamW, batch 64 of 224×224 images. Its
attention runs through ``F.scaled_dot_product_attention`` at S = 197, D = 64: a launch-heavy
model whose step is a few hundred small kernels.

    python examples/train_vit.py
    python examples/train_vit.py --compile
    kerneltriage profile -- python examples/train_vit.py

Needs a CUDA GPU, torch and timm (``pip install timm``). ``KT_EXAMPLE_STATS=FILE`` appends the
step times and torch.compile's counts at exit (``stepstats.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # stepstats.py, beside this file
from stepstats import StepStats


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        import timm
    except ImportError:
        sys.exit("train_vit.py needs timm: pip install timm")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = timm.create_model(args.model, pretrained=False, num_classes=1000).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    step_model = torch.compile(model) if args.compile else model
    # Synthetic batches made on the device: a CPU-side randn of 64 images costs more than the step.
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    stats = StepStats(device)
    amp = device.type == "cuda"
    loss = None
    for _ in range(args.steps):
        images = torch.randn(args.batch, 3, 224, 224, generator=gen, device=device)
        labels = torch.randint(0, 1000, (args.batch,), generator=gen, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(step_model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
