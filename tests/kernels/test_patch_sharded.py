"""``patch`` on a model sharded with FSDP2 (``fully_shard``): the norm's weight is a DTensor
between forwards and FSDP2 gathers it onto the module it registered, so the swap must keep that
module. One process, a gloo group of one: DTensors as in a multi-GPU job."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels import patch
from kerneltriage.kernels._common import check_device
from tests.helpers import tiny_llama


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sharded(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _loss_and_grads(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def test_a_sharded_norm_is_swapped_in_place_and_keeps_the_math(group, device):
    plain = tiny_llama().to(device)
    fused = copy.deepcopy(plain)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    want_loss, want_grads = _loss_and_grads(_sharded(plain), ids)

    model = _sharded(fused)
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert norms and all(hasattr(m.weight, "_local_tensor") for m in norms)  # sharded between forwards
    report = patch(model, only=["LlamaRMSNorm"])
    assert len(report.swapped) == 5  # two per layer and the final norm
    after = [m for _, m in model.named_modules() if m in norms]
    assert after == norms  # the same module objects, FSDP2's hooks and parameters on them
    assert all(
        type(m).__name__ == "LlamaRMSNorm" and type(m).__module__.startswith("kerneltriage") for m in norms
    )

    got_loss, got_grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_dtensor_is_refused_by_the_kernels(group):
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    mesh = DeviceMesh("cpu", [0])
    shard = distribute_tensor(torch.ones(8), mesh, [Shard(0)])
    with pytest.raises(KernelInputError, match="DTensor"):
        check_device(torch.ones(2, 8), shard, name="rms_norm")
