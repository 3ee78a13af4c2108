"""Reports across ranks: a 2-GPU DDP run profiled on H200s, and the 2-GPU nsys training capture."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from click.testing import CliRunner

from kerneltriage.analysis.ranks import summarize
from kerneltriage.api import build_reports
from kerneltriage.cli import main
from tests.helpers import DATA, EXAMPLE_RUN

DDP = EXAMPLE_RUN.parent / "gpt-ddp-2gpu-h200"


@pytest.fixture(scope="module")
def ddp():
    return build_reports(DDP)


def test_every_rank_is_reported(ddp):
    assert sorted(ddp) == [0, 1]
    for rep in ddp.values():
        assert rep.candidates[0].kind == "attention" and rep.candidates[0].verdict == "use-builtin"
        comm = [c for c in rep.candidates if c.kind == "communication"]
        assert comm and all("nccl" in c.name.lower() for c in comm)
        assert all(c.verdict == "skip" and c.reason == "communication" for c in comm)
        # DDP overlaps its all-reduce with the backward: most of it is hidden.
        assert 0 < rep.exposed_communication_ms_per_step < rep.communication_ms_per_step
        assert rep.communication_ms_per_step == pytest.approx(sum(c.time_ms_per_step for c in comm), rel=0.05)


def test_summary_across_ranks(ddp):
    s = summarize(ddp)
    assert [r.rank for r in s.ranks] == [0, 1]
    top = s.candidates[0]
    assert top.kind == "attention" and set(top.ids) == {0, 1}
    assert 1.0 <= top.skew < 1.05  # the same work on both ranks
    assert not s.stragglers


def test_stragglers_are_flagged():
    reps = build_reports(DATA / "nsys" / "mfu_2gpu_before.sqlite", gpu="H100-SXM")
    s = summarize(reps)
    comm = next(c for c in s.candidates if c.kind == "communication")
    assert comm.skew > 1.25
    assert any("rank 0" in line and comm.name in line for line in s.stragglers)


def test_cli_json_for_several_ranks():
    result = CliRunner().invoke(main, ["report", str(DDP), "--format", "json", "--top", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "kerneltriage.report-ranks/1"
    assert set(data["ranks"]) == {"0", "1"} and data["summary"]["schema"] == "kerneltriage.ranks/1"
    # Counters were taken on rank 0 (--ncu-rank), NCCL left out: they join there, nowhere else.
    join = data["ranks"]["0"]["join"]
    assert join["hot_kernels_joined"] == join["hot_kernels"] and join["hot_time_joined_share"] >= 0.95
    assert data["ranks"]["1"]["join"] is None
    one = CliRunner().invoke(main, ["report", str(DDP), "--rank", "1", "--format", "json"])
    assert json.loads(one.output)["rank"] == 1 and json.loads(one.output)["join"] is None
    manifest = json.loads((DDP / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert manifest["phases"]["ncu"]["excluded_communication"] == ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]


def test_a_missing_rank_trace_reports_the_ranks_present(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DDP, run)
    (run / "trace.rank1.json.gz").unlink()
    result = CliRunner().invoke(main, ["report", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["rank"] == 0 and data["join"]["hot_kernels_joined"] == 15
    assert any("rank(s) [1] are missing" in w for w in data["warnings"])


def test_ranks_with_different_step_counts_are_flagged(ddp):
    uneven = {0: ddp[0], 1: dataclasses.replace(ddp[1], steps=ddp[1].steps - 1)}
    assert any("different numbers of steps" in w for w in summarize(uneven).warnings)
    assert not any("different numbers of steps" in w for w in summarize(ddp).warnings)
