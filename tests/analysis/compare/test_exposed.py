"""Exposed communication: each step's collectives by their launch, the DDP bucket whose all-reduce
ends the step (the shipped 2-GPU DDP run), and the FSDP settings a report offers where FSDP's
all-gathers are exposed (two-rank synthetic FSDP2 traces)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kerneltriage.analysis.compare.exposed import (
    bucket_modules,
    collective_kind,
    communication_fix,
    kernel_dtype,
    module_parameters,
)
from kerneltriage.analysis.fixes.fix_recipes import load_recipes
from kerneltriage.api import build_reports
from kerneltriage.ingest.schemas import read_regions
from tests.helpers import EXAMPLE_RUN, write_trace

DDP = EXAMPLE_RUN.parent / "gpt-ddp-2gpu-h200"
RECIPES = load_recipes()


@pytest.fixture(scope="module")
def ddp():
    return build_reports(DDP)


def _copy(report):
    out = dataclasses.replace(report, candidates=[dataclasses.replace(c) for c in report.candidates])
    out.source = dict(out.source)
    return out


def test_collective_kinds_and_dtypes_from_kernel_names():
    assert (
        collective_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
        == "all-reduce"
    )
    assert collective_kind("ncclKernel_AllGather_RING_LL_Sum_int8(ncclDevComm*)") == "all-gather"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce-scatter"
    assert collective_kind("nccl:_all_gather_base") == "all-gather"
    assert collective_kind("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "other"
    assert kernel_dtype("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)") == ("float32", 4)
    assert kernel_dtype("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)") == (
        "float32",
        4,
    )
    assert kernel_dtype("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == ("bfloat16", 2)
    assert kernel_dtype("ncclDevKernel_AllGather_RING_LL") is None


def test_the_last_bucket_of_the_ddp_run_is_read_from_the_trace(ddp):
    # Each step launches 8 all-reduces: the LM head's 32,768,000 gradients first, the embedding's
    # (and block 0's first norm) last. The GPU runs behind the host, so only the launch says which
    # step a kernel is of: by start on the GPU, a step's window also held the step before's last
    # buckets (9 a step, the last one a middle bucket).
    for rep in ddp.values():
        last = rep.source["last_collective"]
        assert last["collectives_per_step"] == 8 and last["collective"] == "all-reduce"
        assert (last["elements"], last["dtype"], last["bytes"]) == (32_769_024, "float32", 131_076_096)
        # Only all-reduces here, and their exposed time is the report's exposed communication.
        assert last["exposed_ms_by_collective"] == {
            "all-reduce": pytest.approx(rep.exposed_communication_ms_per_step)
        }
        assert 0.1 < last["exposed_ms"] < rep.exposed_communication_ms_per_step
        assert (
            last["data_parallel"] == "DistributedDataParallel"
        )  # its DistributedDataParallel.forward ranges
        (c,) = [c for c in rep.candidates if c.kind == "communication"]
        assert "the step's last collective (of 8) is exposed" in c.note
        assert "in DDP the last bucket, 125.0 MB (32,769,024 float32 gradients)" in c.note
        assert not c.fix  # under min_share exposed: named, no fix


def test_an_all_reduce_without_ddp_ranges_is_not_named_a_bucket(ddp):
    rep = _copy(ddp[0])
    rep.source["last_collective"] = {
        k: v for k, v in rep.source["last_collective"].items() if k != "data_parallel"
    }
    (c,) = [c for c in rep.candidates if c.kind == "communication"]
    c.note = None
    communication_fix(rep, RECIPES)
    assert c.note is None  # a tensor-parallel all-reduce has no bucket


def test_the_last_bucket_names_the_modules_whose_gradients_it_holds(ddp):
    modules = module_parameters(read_regions(DDP / "regions.jsonl", []))
    assert modules[0] == ["module.emb", 131_072_000] and modules[-1] == ["module.head", 131_072_000]
    # DDP's buckets, filled in the backward's order (the forward's reversed) at its 1 MB first
    # cap and 25 MB cap, are the all-reduces the trace records, the last one included.
    sizes, filled, cap = [], 0, 1 << 20
    for _path, size in reversed(modules):
        filled += size
        if filled >= cap:
            sizes.append(filled // 4)
            filled, cap = 0, 25 << 20
    assert sizes == [32_768_000, 8_389_632, 8_390_656, 8_389_632, 8_389_632, 8_390_656, 8_389_632, 32_769_024]
    assert bucket_modules(131_076_096, modules) == (
        [("module.emb", 131_072_000), ("module.blocks.0.n1", 4096)],
        True,
    )
    assert bucket_modules(131_076_000, modules) == (
        [("module.emb", 131_072_000), ("module.blocks.0.n1", 4000)],
        False,
    )
    assert bucket_modules(10**12, modules) == ([], False)  # more than the modules recorded hold

    rep = _copy(ddp[0])
    rep.source["module_parameters"] = modules
    rep.exposed_communication_ms_per_step = 3.0
    rep.source["communication"] = {"wait_ms_per_step": 0.5, "transfer_ms_per_step": 3.0}
    (c,) = [c for c in rep.candidates if c.kind == "communication"]
    c.note = None
    communication_fix(rep, RECIPES)
    assert c.recipe["id"] == "ddp-exposed-communication"
    assert (
        "in DDP the last bucket, 125.0 MB (32,769,024 float32 gradients): the parameters of module.emb (125.0 MB), "
        "module.blocks.0.n1 (4 KB)" in c.note
    )
    # The embedding alone fills it: bucket_cap_mb cannot split a parameter.
    assert "bucket_cap_mb: module.emb's parameters are 125.0 MB of the bucket's 125.0 MB" in c.note
    assert c.note.count("the step's last collective") == 1


def test_without_the_modules_the_bucket_cap_reasoning_gives_the_bucket_size(ddp):
    rep = _copy(ddp[0])
    rep.source.pop("module_parameters", None)  # a run made before regions.jsonl held them
    rep.exposed_communication_ms_per_step = 3.0
    communication_fix(rep, RECIPES)
    (c,) = [c for c in rep.candidates if c.kind == "communication"]
    assert "bucket_cap_mb: the last bucket is 125.0 MB; a cap below that splits it" in c.note


def test_the_report_names_the_modules_in_the_exposed_bucket(ddp):
    # The shipped run's regions.jsonl records the modules' parameter sizes; the report passes
    # them on, so the note names what the last bucket holds.
    assert ddp[0].source.get("module_parameters")
    (c,) = [c for c in ddp[0].candidates if c.kind == "communication" and "last bucket" in (c.note or "")]
    assert "module.emb (125.0 MB)" in c.note


# --- FSDP2: two synthetic ranks -----------------------------------------------------------------

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


class _Trace:
    """A Kineto trace of FSDP2 steps: per layer an all-gather on the communication stream, then
    the layer's GEMMs on the compute stream; the backward's reduce-scatters beside its GEMMs."""

    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[dict] = []
        self.correlation = 0

    def _x(self, name, cat, ts, dur, pid, tid, **args):
        self.events.append(
            {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}
        )

    def cpu(self, name, ts, dur, cat="user_annotation"):
        self._x(name, cat, ts, dur, 1, 1, **{"External id": 0})

    def kernel(self, name, op, launch, start, dur, stream):
        self.correlation += 1
        c = self.correlation
        self._x(op, "cpu_op", launch - 2, 4, 1, 1, **{"External id": c})
        self._x("cudaLaunchKernel", "cuda_runtime", launch, 1, 1, 1, correlation=c, **{"External id": c})
        self._x(name, "kernel", start, dur, 0, stream, correlation=c, device=0, stream=stream)

    def step(self, n: int, t0: float, exposed_gather: bool) -> None:
        """One 10 ms step of 4 layers: forward 4 ms, backward 6 ms (µs). An exposed all-gather
        runs 300 µs before its layer's GEMM starts; a hidden one runs under the previous GEMM."""
        self.cpu(f"ProfilerStep#{n}", t0, 10_000)
        t = t0
        for layer in range(4):
            self.cpu(f"FSDP::pre_forward (layers.{layer})", t, 20)
            if exposed_gather:
                self.kernel(ALL_GATHER, "record_param_comms", t + 3, t + 10, 300, 20)
                self.kernel(GEMM, "aten::mm", t + 8, t + 320, 680, 7)
            else:
                self.kernel(ALL_GATHER, "record_param_comms", t + 3, t + 100, 300, 20)
                self.kernel(GEMM, "aten::mm", t + 8, t + 10, 990, 7)
            t += 1000
        for layer in reversed(range(4)):
            self.cpu(f"FSDP::pre_backward (layers.{layer})", t, 20)
            self.kernel(GEMM, "aten::mm", t + 3, t + 10, 1400, 7)
            self.kernel(REDUCE_SCATTER, "record_param_comms", t + 8, t + 500, 400, 20)
            t += 1500

    def write(self, folder: Path) -> None:
        data = {
            "traceEvents": self.events,
            "deviceProperties": [
                {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}
            ],
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": 2},
        }
        write_trace(folder / f"rank{self.rank}.trace.json", data, compress=False)


def _fsdp_reports(tmp_path: Path, exposed_gather: bool) -> dict:
    folder = tmp_path / ("exposed" if exposed_gather else "hidden")
    folder.mkdir()
    for rank in (0, 1):
        trace = _Trace(rank)
        for n in range(3):
            trace.step(n + 1, 1_000_000 + 10_000 * n, exposed_gather)
        trace.write(folder)
    return build_reports(folder, gpu="H100-SXM")


def test_an_exposed_fsdp2_all_gather_gets_the_prefetch_recipe(tmp_path):
    reps = _fsdp_reports(tmp_path, exposed_gather=True)
    for rep in reps.values():
        last = rep.source["last_collective"]
        assert last["data_parallel"] == "fully_shard"
        # 4 all-gathers of 300 µs a step with no GEMM beside them; the reduce-scatters hidden.
        assert last["exposed_ms_by_collective"]["all-gather"] == pytest.approx(1.2)
        assert last["exposed_ms_by_collective"]["reduce-scatter"] == pytest.approx(0.0)
        (gather,) = [c for c in rep.candidates if c.name.startswith("ncclDevKernel_AllGather")]
        assert gather.verdict == "skip" and gather.reason == "communication"
        assert gather.recipe["id"] == "fsdp-explicit-prefetch"
        assert gather.recipe["apply"] == {"kind": "fsdp-prefetch", "forward": 2, "backward": 1}
        assert "set_modules_to_forward_prefetch(layers[i + 1 : i + 3])" in gather.fix
        # The alternative, with its memory cost.
        assert "# or: " in gather.fix and "set_reshard_after_forward(False, recurse=False)" in gather.fix
        assert "full (unsharded) parameters in memory" in gather.fix
        # Predicted: at most the all-gathers' exposed time.
        assert gather.expected_saving_share == pytest.approx(1.2 / rep.step_time_ms)
        assert gather.expected_saving_share <= rep.exposed_communication_ms_per_step / rep.step_time_ms + 1e-9
        assert "the all-gathers' exposed time (1.20 ms per step" in gather.attrs["saving_basis"]
        assert "FSDP's collectives exposed 1.20 ms per step" in gather.note
        (scatter,) = [c for c in rep.candidates if c.name.startswith("ncclDevKernel_ReduceScatter")]
        assert scatter.fix is None
        # No DDP settings on an FSDP job.
        assert not any(c.recipe and c.recipe.get("id", "").startswith("ddp") for c in rep.candidates)
        assert [c.rank for c in rep.candidates] == list(range(1, len(rep.candidates) + 1))


def test_fsdp2_collectives_hidden_behind_compute_get_no_recipe(tmp_path):
    reps = _fsdp_reports(tmp_path, exposed_gather=False)
    for rep in reps.values():
        assert rep.source["last_collective"]["data_parallel"] == "fully_shard"
        assert rep.exposed_communication_ms_per_step == pytest.approx(0.0)
        assert not any(c.fix for c in rep.candidates if c.kind == "communication")


def test_fsdp1_gets_its_constructor_settings_by_hand(tmp_path):
    reps = _fsdp_reports(tmp_path, exposed_gather=True)
    rep = _copy(reps[0])
    rep.source["last_collective"] = {
        **rep.source["last_collective"],
        "data_parallel": "FullyShardedDataParallel",
    }
    for c in rep.candidates:
        c.fix = c.recipe = None
    communication_fix(rep, RECIPES)
    (gather,) = [c for c in rep.candidates if c.name.startswith("ncclDevKernel_AllGather")]
    assert gather.recipe["id"] == "fsdp1-prefetch" and gather.recipe["apply"] is None
    assert "forward_prefetch=True" in gather.fix and "apply by hand" in gather.recipe["apply_why_not"]


def test_all_gathers_without_fsdp_ranges_get_no_fsdp_recipe(tmp_path):
    # Tensor parallelism all-gathers too: without FSDP's ranges nothing says FSDP ran.
    reps = _fsdp_reports(tmp_path, exposed_gather=True)
    rep = _copy(reps[0])
    rep.source["last_collective"] = {
        k: v for k, v in rep.source["last_collective"].items() if k != "data_parallel"
    }
    for c in rep.candidates:
        c.fix = c.recipe = None
    communication_fix(rep, RECIPES)
    assert not any(c.fix for c in rep.candidates if c.kind == "communication")


def test_the_report_json_carries_the_last_collective(tmp_path, ddp):
    from kerneltriage.analysis.model import json_safe

    data = json.loads(json.dumps(json_safe(ddp[0].source["last_collective"])))
    assert set(data) >= {
        "exposed_ms",
        "collectives_per_step",
        "elements",
        "bytes",
        "exposed_ms_by_collective",
    }
