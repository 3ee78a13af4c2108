"""FSDP2's overlap recipes (``fsdp-explicit-prefetch``, ``fsdp-keep-last-layer-gathered``) through
verify's runner and ``kerneltriage.apply``, on the CPU under gloo: the settings take effect (the
forward prefetches run, the last layer stays gathered after its forward) and the loss and the
gradients stay those of the model without them, step after step; a model that is not FSDP2 is
refused, FSDP1 with its own settings named."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from kerneltriage.analysis.fixes.fix_recipes import load_recipes  # noqa: E402
from kerneltriage.recipes.install import ApplyFailed, check, install  # noqa: E402

RECIPES = {r.id: r for r in load_recipes()}
PREFETCH = RECIPES["fsdp-explicit-prefetch"].apply
RESHARD = RECIPES["fsdp-keep-last-layer-gathered"].apply
STEPS = 3


class Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, vocab: int = 32, width: int = 16, layers: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def sharded(layers: bool = True) -> Net:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    if layers:
        for layer in model.layers:
            fully_shard(layer)
    fully_shard(model)
    return model


def train(model: Net, rank: int) -> dict:
    """``STEPS`` SGD steps on this rank's own tokens: each step's loss and full gradients, the
    forward prefetches FSDP2 ran, and which layers held plain (gathered) weights after forward."""
    from torch.distributed.tensor import DTensor

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(100 + rank)
    out: dict = {"loss": [], "grads": [], "prefetches": 0, "gathered_after_forward": None}
    for _ in range(STEPS):
        ids = torch.randint(0, 32, (24,), generator=g)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            logits = model(ids)
            if out["gathered_after_forward"] is None:
                out["gathered_after_forward"] = [
                    not isinstance(layer.up.weight, DTensor) for layer in model.layers
                ]
            loss = nn.functional.cross_entropy(logits, ids.roll(1))
            loss.backward()
        out["prefetches"] += sum("forward_prefetch" in e.name for e in prof.events())
        out["loss"].append(loss.detach().clone())
        out["grads"].append({n: p.grad.full_tensor().clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return out


def _ranks(rank: int, world: int, init: str, out: str) -> None:
    """One rank: the model without a fix, then with each FSDP recipe applied by the runner."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        results = {"eager": train(sharded(), rank)}
        for name, mapping in (("prefetch", PREFETCH), ("reshard", RESHARD)):
            applied = install(mapping)
            results[name] = train(sharded(), rank)
            results[name]["details"] = dict(applied.details)
            results[name]["done"] = applied.done
            applied.remove()
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks():
    import torch.multiprocessing as mp

    folder = Path(tempfile.mkdtemp())
    try:
        init = f"file://{folder / 'rendezvous'}"
        mp.spawn(_ranks, args=(2, init, str(folder)), nprocs=2, join=True)
        yield {r: torch.load(folder / f"rank{r}.pt", weights_only=False) for r in (0, 1)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _same_math(got: dict, want: dict) -> None:
    for step in range(STEPS):
        torch.testing.assert_close(got["loss"][step], want["loss"][step], rtol=0, atol=0)
        assert got["grads"][step].keys() == want["grads"][step].keys()
        for name, grad in want["grads"][step].items():
            torch.testing.assert_close(
                got["grads"][step][name], grad, rtol=0, atol=0, msg=f"step {step}: {name}"
            )


@pytest.mark.slow
def test_explicit_prefetch_runs_the_next_layers_all_gathers_early_and_keeps_the_math(two_ranks):
    for results in two_ranks.values():
        eager, fixed = results["eager"], results["prefetch"]
        assert eager["prefetches"] == 0  # FSDP2 prefetches nothing in forward by default
        # Layers 0-2 each prefetch the next one or two: 2 + 2 + 1 a step.
        assert fixed["prefetches"] == 5 * STEPS
        assert fixed["done"] and fixed["details"] == {
            "layers": 4,
            "first": "layers.0",
            "last": "layers.3",
            "forward": 2,
            "backward": 1,
            "root": "FSDPNet",
        }
        _same_math(fixed, eager)
        assert eager["loss"][0] != eager["loss"][-1]  # the steps trained: the math is compared on new weights


@pytest.mark.slow
def test_the_last_layer_stays_gathered_after_its_forward_and_keeps_the_math(two_ranks):
    for results in two_ranks.values():
        eager, fixed = results["eager"], results["reshard"]
        assert eager["gathered_after_forward"] == [False, False, False, False]
        assert fixed["gathered_after_forward"] == [False, False, False, True]
        # The last layer's up and down, weights and biases, gathered in fp32 (no mixed precision).
        assert fixed["details"]["kept"] == ["layers.3"]
        assert fixed["details"]["gathered_bytes"] == 4 * (16 * 32 + 32 + 32 * 16 + 16)
        _same_math(fixed, eager)


# --- one rank, in this process ------------------------------------------------------------------


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_fsdp_kinds_are_checked():
    assert check(PREFETCH) is None and check(RESHARD) is None
    assert "forward must be a whole number of layers, at least 1" in check({**PREFETCH, "forward": 0})
    assert "backward must be a whole number" in check({**PREFETCH, "backward": True})
    assert "takes last, not layers" in check({**RESHARD, "layers": 2})


def test_a_model_without_fsdp2_is_refused(group):
    applied = install(PREFETCH)
    try:
        with pytest.raises(ApplyFailed, match="found no FSDPModule under Net: the model is not sharded"):
            Net()(torch.arange(4))
    finally:
        applied.remove()
    applied = install(RESHARD)
    try:
        with pytest.raises(ApplyFailed, match="has a single FSDPModule, the root: fully_shard each layer"):
            sharded(layers=False)(torch.arange(4))
    finally:
        applied.remove()


def test_fsdp1_is_refused_with_its_own_settings(group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = FullyShardedDataParallel(Net(), device_id=torch.device("cpu"))
    for mapping, setting in (
        (PREFETCH, "forward_prefetch=True"),
        (RESHARD, "ShardingStrategy.SHARD_GRAD_OP"),
    ):
        applied = install(mapping)
        try:
            with pytest.raises(ApplyFailed, match="FSDP1's FullyShardedDataParallel") as refused:
                model(torch.arange(4))
            assert setting in str(refused.value)
        finally:
            applied.remove()


def test_kerneltriage_apply_sets_the_prefetch_on_a_users_model(group, tmp_path):
    import kerneltriage
    from kerneltriage import rundir
    from kerneltriage import verify_record as record

    run = tmp_path / "run"
    run.mkdir()
    shipped = Path(__file__).resolve().parents[2] / "examples" / "runs" / "gpt-ddp-2gpu-h200"
    shutil.copy(shipped / rundir.MANIFEST, run / rundir.MANIFEST)
    fix = {
        "id": "C3",
        "name": "ncclDevKernel_AllGather_RING_LL",
        "recipe_id": "fsdp-explicit-prefetch",
        "how": "runner: fsdp-prefetch",
        "apply": PREFETCH,
        "predicted_saving_share": 0.05,
        "realized_saving_share": 0.04,
        "status": "verified",
    }
    settings = {"repeats": 1, "warmup": 1, "steps": 3, "loss_steps": 2, "loss_rtol": 0.005, "seed": 0}
    record.write(
        run,
        record.VerifyFile.model_validate(
            {"schema": record.SCHEMA, "settings": settings, "candidates": [fix]}
        ),
    )

    model = sharded()
    handle = kerneltriage.apply(model, run=run)
    try:
        assert handle.refused == [] and handle.ids == ["C3"]
        assert handle.applied[0]["kind"] == "fsdp-prefetch" and handle.applied[0]["done"]
        states = [layer._get_fsdp_state() for layer in model.layers]
        assert [len(s._states_to_forward_prefetch) for s in states] == [2, 2, 1, 0]
        assert [len(s._states_to_backward_prefetch) for s in states] == [0, 1, 1, 1]
        assert states[0]._states_to_forward_prefetch == states[1:3]
        assert states[3]._states_to_backward_prefetch == [states[2]]
    finally:
        handle.remove()

    plain = Net()
    handle = kerneltriage.apply(plain, run=run)
    try:
        assert handle.applied == []
        ((cid, why),) = handle.refused
        assert cid == "C3" and "found no FSDPModule under Net" in why
    finally:
        handle.remove()
