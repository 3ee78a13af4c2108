"""A tiny DDP training script for ``verify`` of a torchrun job on CPU (gloo):
``python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_train.py``."""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


model = nn.parallel.DistributedDataParallel(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.5)
g = torch.Generator().manual_seed(1 + rank)  # each rank its own shard
x, y = torch.randn(64, 16, generator=g) * 0.01, torch.randint(0, 4, (64,), generator=g)
for _step in range(50):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
