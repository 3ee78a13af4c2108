"""Train timm's EfficientNet-B0 on synthetic images: a model family kerneltriage's examples do
not hold (batch norm with an activation, depthwise convolutions, squeeze-excite), for measuring
the tool on it.

Channels-last, bf16 autocast, SGD with momentum (foreach), batch 128 × 224². Host-bound on an
H200: about 1,260 kernel launches a step, 28-48 ms a step against 26 ms of GPU work. ``--model``
takes another timm conv net of batch norms the same way (``resnet50``: BatchNorm + ReLU,
bottleneck blocks). Needs a CUDA GPU and timm.

    bash benchmarks/gpu_ladder.sh OUT -- python benchmarks/heldout/train_timm_efficientnet.py
    bash benchmarks/gpu_ladder.sh OUT -- python benchmarks/heldout/train_timm_efficientnet.py --model resnet50

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
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--model", default="efficientnet_b0", help="a timm model name")
    args = p.parse_args()
    import timm

    device = torch.device("cuda")
    model = timm.create_model(args.model, num_classes=1000)
    model = model.to(device).to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    x = torch.randn(args.batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    stats = StepStats(device)
    loss = None
    for _ in range(args.steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
