"""Reports across ranks: a 2-GPU DDP run profiled on H200s, and the 2-GPU nsys training capture."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from click.testing import CliRunner

from kerneltriage.analysis.compare.ranks import (
    communication_fix,
    communication_waits,
    slower_beyond_noise,
    summarize,
)
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


def test_a_collective_waiting_for_its_peer_is_no_straggler():
    # Rank 0's SendRecv kernels run 17.1 ms a step against rank 1's 8.1 ms: rank 0 starts them
    # early and spins until rank 1 arrives. Matched across the ranks, that is wait, not work.
    reps = build_reports(DATA / "nsys" / "mfu_2gpu_before.sqlite", gpu="H100-SXM")
    comm = {r: rep.source["communication"] for r, rep in reps.items()}
    assert reps[0].communication_ms_per_step == pytest.approx(17.07, abs=0.05)
    assert comm[0]["wait_ms_per_step"] == pytest.approx(11.33, abs=0.05)
    assert comm[0]["transfer_ms_per_step"] == pytest.approx(comm[1]["transfer_ms_per_step"], rel=0.05)
    assert comm[1]["arrived_last"] > comm[0]["arrived_last"]  # rank 1 is the one waited for
    (send,) = [c for c in reps[0].candidates if c.kind == "communication"]
    assert "about 66% of its kernel time (11.33 ms per step) is waiting for other ranks" in send.note
    (other,) = [c for c in reps[1].candidates if c.kind == "communication"]
    assert "about 27% of its kernel time (2.21 ms per step)" in other.note
    s = summarize(reps)
    across = next(c for c in s.candidates if c.kind == "communication")
    assert across.skew < 1.05  # the transfer, not the kernel time with its wait
    assert not any(across.name in line for line in s.stragglers)
    assert next((r.wait_ms, r.transfer_ms) for r in s.ranks) == pytest.approx((11.33, 5.74), abs=0.05)


def test_collectives_are_matched_across_clock_offsets_and_shifts():
    # Rank 1's clock runs 5 s ahead and its trace holds one collective more at the start.
    a = [("nccl_AllReduce", 1000 + 100_000 * i, 1000 + 100_000 * i + 30_000) for i in range(5)]
    b = [("nccl_AllReduce", 5e9 - 50_000, 5e9 - 40_000)] + [
        ("nccl_AllReduce", int(5e9) + 21_000 + 100_000 * i, int(5e9) + 1000 + 100_000 * i + 30_000)
        for i in range(5)
    ]
    waits = communication_waits({0: a, 1: [(n, int(s), int(e)) for n, s, e in b]})
    assert waits[0].matched == waits[1].matched == 5
    # Rank 0 started 20 µs before rank 1 each time: 20 of its 30 µs were wait.
    assert waits[0].wait_fraction == pytest.approx(2 / 3)
    assert waits[1].wait_ns == 0 and waits[1].last == 5


def _report(rank, step_ms, plain_ms=None):
    from types import SimpleNamespace

    timing = {"plain_median_ms": step_ms, "plain_ms": plain_ms} if plain_ms else None
    return SimpleNamespace(
        rank=rank,
        step_time_ms=step_ms,
        gpu_busy_pct=90.0,
        communication_ms_per_step=0.0,
        exposed_communication_ms_per_step=0.0,
        source={"timing": timing} if timing else {},
        steps=3,
        candidates=[],
        thresholds=SimpleNamespace(min_share=0.03),
        step_interval_ms=None,
    )


def test_stragglers_are_judged_on_plain_steps_and_their_noise():
    steady = [100.0, 100.2, 99.9, 100.1, 100.0]
    slow = [v * 1.2 for v in steady]
    s = summarize({0: _report(0, 100.0, steady), 1: _report(1, 100.0, steady), 2: _report(2, 120.0, slow)})
    assert s.stragglers == [
        "rank 2: step 120.00 ms vs 100.00 ms, the median of the other ranks (plain steps)"
    ]
    # 20% slower by its median, but its steps scatter across the others': noise, not a straggler.
    noisy = [80.0, 150.0, 120.0, 90.0, 140.0]
    s = summarize({0: _report(0, 100.0, steady), 1: _report(1, 100.0, steady), 2: _report(2, 120.0, noisy)})
    assert s.stragglers == []
    # A rank timed only on its recorded steps (with the wait for ranks being profiled) is not judged.
    s = summarize({0: _report(0, 100.0, steady), 1: _report(1, 130.0)})
    assert s.stragglers == [] and any("rank(s) 1 have no plain steps" in w for w in s.warnings)
    assert [r.timed_on for r in s.ranks] == ["plain steps", "recorded steps"]


def test_slower_beyond_noise():
    assert slower_beyond_noise((120.0, 118.0, 122.0), (100.0, 99.0, 101.0))
    assert not slower_beyond_noise((120.0, 100.5, 140.0), (100.0, 99.0, 101.0))  # intervals overlap
    assert not slower_beyond_noise((105.0, 104.9, 105.1), (100.0, 99.9, 100.1))  # under 10%


def _with_plain_steps(run, plain):
    """The DDP run with plain steps in every rank's status file (``profile`` writes them)."""
    for rank, values in plain.items():
        path = run / "logs" / f"status.timeline.rank{rank}.json"
        status = json.loads(path.read_text())
        ordered = sorted(values)
        status["step_times"] = {
            "clock": "cuda events",
            "clean_profiler": "cuda activity",
            "plain_ms": values,
            "plain_median_ms": ordered[len(ordered) // 2],
            "clean_ms": [],
            "recorded_ms": [],
        }
        path.write_text(json.dumps(status))


def _with_step_time(run, plain, busy):
    """The DDP run with each rank's plain steps and clean steps' GPU busy time in the manifest,
    as ``profile`` records them (``step_time`` for rank 0, ``step_time_ranks`` for the others)."""
    manifest = json.loads((run / "manifest.json").read_text())
    timeline = manifest["phases"]["timeline"]
    for rank, values in plain.items():
        entry = {
            "rank": rank,
            "plain_ms": values,
            "plain_median_ms": sorted(values)[len(values) // 2],
            "clean_ms": [60.0, 60.5, 61.0],
            "gpu_busy_ms": busy[rank],
            "clock": "cuda events",
            "clean_profiler": "cuda activity",
        }
        if rank == 0:
            timeline["step_time"] = entry
        else:
            timeline.setdefault("step_time_ranks", {})[str(rank)] = entry
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_every_rank_takes_its_own_plain_steps(tmp_path, ddp):
    # The recorded steps differ (50.93 and 52.68 ms: rank 1 waited on rank 0 while profiled);
    # the plain steps, nothing installed, agree.
    assert ddp[1].step_time_ms - ddp[0].step_time_ms > 1.5
    run = tmp_path / "run"
    shutil.copytree(DDP, run)
    _with_plain_steps(run, {0: [53.1, 53.0, 53.2, 53.05, 53.1], 1: [53.1, 53.0, 53.15, 53.1, 53.05]})
    reps = build_reports(run)
    assert reps[0].step_time_ms == pytest.approx(53.1) and reps[1].step_time_ms == pytest.approx(53.1)
    for rep in reps.values():
        assert rep.source["timing"]["plain_ms"] and rep.source["timing"]["recorded_step_ms"] > 50
        assert rep.idle_pct == pytest.approx(100.0 * (1 - rep.gpu_busy_ms / rep.step_time_ms))
    s = summarize(reps)
    assert [r.step_time_ms for r in s.ranks] == pytest.approx([53.1, 53.1])
    assert {r.timed_on for r in s.ranks} == {"plain steps"} and not s.stragglers
    # A rank whose plain steps are slower beyond their noise is one.
    _with_plain_steps(run, {1: [63.1, 63.0, 63.15, 63.1, 63.05]})
    s = summarize(build_reports(run))
    assert s.stragglers == ["rank 1: step 63.10 ms vs 53.10 ms, the median of the other ranks (plain steps)"]


def test_other_ranks_plain_steps_from_the_manifest(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DDP, run)
    manifest = json.loads((run / "manifest.json").read_text())
    timeline = manifest["phases"]["timeline"]
    timeline["step_time"] = {"rank": 0, "plain_ms": [52.0, 52.2], "plain_median_ms": 52.1, "clean_ms": []}
    timeline["step_time_ranks"] = {
        "1": {"rank": 1, "plain_ms": [52.3, 52.1], "plain_median_ms": 52.2, "clean_ms": []}
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    reps = build_reports(run)
    assert [reps[r].step_time_ms for r in (0, 1)] == pytest.approx([52.1, 52.2])


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


def _ddp_recipe():
    """fixes.yaml's DDP recipe alone (parsed as the shipped file parses it)."""
    import yaml

    from kerneltriage.analysis.fixes.fix_recipes import fixes_path, parse_recipes

    entries = yaml.safe_load(fixes_path().read_text())["recipes"]
    return parse_recipes([e for e in entries if e["id"] == "ddp-exposed-communication"], "fixes.yaml")


def test_exposed_communication_gets_ddps_settings(ddp):
    rep = dataclasses.replace(ddp[0], candidates=[dataclasses.replace(c) for c in ddp[0].candidates])
    rep.source = dict(rep.source)
    communication_fix(rep, _ddp_recipe())  # 0.83 of 50.93 ms exposed: under min_share, no fix
    assert not any(c.fix for c in rep.candidates if c.kind == "communication")
    rep.exposed_communication_ms_per_step = 3.0
    rep.source["communication"] = {"wait_ms_per_step": 0.5, "transfer_ms_per_step": 3.0}
    communication_fix(rep, _ddp_recipe())
    (c,) = [c for c in rep.candidates if c.kind == "communication"]
    assert c.verdict == "skip" and c.recipe["id"] == "ddp-exposed-communication"
    assert "gradient_as_bucket_view=True, static_graph=True" in c.fix and "bucket_cap_mb=" in c.fix
    assert c.recipe["apply"] == {
        "kind": "ddp",
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "bucket_cap_mb": None,
    }
    # 3.0 ms exposed less the 0.5 / 3.52 of the collectives' time spent waiting for rank 1.
    assert "communication exposed 2.57 ms per step (5.1% of the step" in c.note
    # Each of the 3 steps launches 8 all-reduces and ends with the last bucket's, after the
    # backward's last kernel (test_exposed.py: which bucket, and how big).
    assert rep.source["last_collective"]["collectives_per_step"] == 8
    assert 0.1 < rep.source["last_collective"]["exposed_ms"] < ddp[0].exposed_communication_ms_per_step
    assert "the step's last collective (of 8) is exposed 0.55 ms: in DDP the last bucket, 125.0 MB" in c.note


def test_the_wait_for_a_rank_in_a_profiled_step_is_left_out_when_the_ranks_run_in_step(tmp_path, ddp):
    # Rank 0's all-reduces spend 1.36 of their 3.52 ms a step waiting for rank 1 in the recorded
    # steps. With plain steps in step on both ranks, that wait is the profiler's: rank 0's
    # collectives count their transfer only, and its exposed communication loses the wait.
    run = tmp_path / "run"
    shutil.copytree(DDP, run)
    _with_plain_steps(run, {0: [53.1, 53.0, 53.2, 53.05, 53.1], 1: [53.1, 53.0, 53.15, 53.1, 53.05]})
    reps = build_reports(run)
    comm = reps[0].source["communication"]
    assert comm["wait_left_out"] and comm["wait_ms_per_step"] == pytest.approx(1.362, abs=0.01)
    before = {c.name: c for c in ddp[0].candidates if c.kind == "communication"}
    for c in (c for c in reps[0].candidates if c.kind == "communication"):
        keep = 1 - comm["wait_ms_per_step"] / reps[0].communication_ms_per_step
        assert c.time_ms_per_step == pytest.approx(before[c.name].time_ms_per_step * keep)
        assert "waiting for other ranks left out" in c.note
    assert reps[0].exposed_communication_ms_per_step == pytest.approx(
        max(0.0, ddp[0].exposed_communication_ms_per_step - comm["wait_ms_per_step"])
    )
    assert any("still in a profiled step" in n for n in reps[0].notes)
    assert [c.rank for c in reps[0].candidates] == list(range(1, len(reps[0].candidates) + 1))
    assert "wait_left_out" not in reps[1].source["communication"]  # rank 1 did not wait
    # Without plain steps (the shipped run), the recorded wait stays counted.
    assert "wait_left_out" not in ddp[0].source["communication"]


def test_the_left_out_wait_leaves_gpu_busy_too_and_idle_follows(tmp_path):
    """The clean steps that measure busy time are profiled too: the rank that waited for its
    peer there read its waiting collectives as busy (an FSDP2 rank: 100% busy, 0% idle, its
    peer 40%). With the wait left out, busy loses it, and idle, its interval, its causes
    (scaled from the recorded steps' gaps, all of them) and its headline follow."""
    run = tmp_path / "run"
    shutil.copytree(DDP, run)
    plain = {0: [53.1, 53.0, 53.2, 53.05, 53.1], 1: [53.1, 53.0, 53.15, 53.1, 53.05]}
    _with_step_time(run, plain, busy={0: 52.0, 1: 50.0})
    reps = build_reports(run)
    r0, r1 = reps[0], reps[1]
    wait = r0.source["communication"]["wait_ms_per_step"]
    assert wait == pytest.approx(1.362, abs=0.01)
    assert r0.gpu_busy_ms == pytest.approx(52.0 - wait) and r1.gpu_busy_ms == pytest.approx(50.0)
    assert r0.idle_pct == pytest.approx(100.0 * (1 - r0.gpu_busy_ms / r0.step_time_ms))
    assert r0.kind_breakdown["idle"] == pytest.approx(r0.step_time_ms - r0.gpu_busy_ms)
    low = r0.step_interval_ms[0]
    assert min(r0.idle_interval_pct) == pytest.approx(100.0 * (1 - r0.gpu_busy_ms / low), abs=0.01)
    timing = r0.source["timing"]
    scale = (r0.step_time_ms - r0.gpu_busy_ms) / (timing["recorded_step_ms"] - timing["recorded_busy_ms"])
    assert timing["idle_scale"] == pytest.approx(scale)
    assert all(g.ms_per_step == pytest.approx(g.recorded_ms_per_step * scale) for g in r0.gaps)
    # Every recorded cause counts, the gaps the report keeps and the others.
    idle_causes = sum(v for k, v in r0.idle.classes.items() if k != "exposed communication")
    assert idle_causes == pytest.approx(sum(timing["recorded_idle_by_class"].values()) * scale)
    assert r0.idle.classes.get("exposed communication", 0.0) == pytest.approx(
        r0.exposed_communication_ms_per_step
    )
    assert any("and of GPU busy" in n for n in r0.notes)
    from kerneltriage.render.text import communication_line

    assert communication_line(r0).endswith(
        "of it waiting for a rank still in a profiled step, left out"
    ) and "left out" not in (communication_line(r1) or "")
    # Without the clean steps' busy time (plain steps in the status files only), busy is the
    # recorded steps', which hold the same wait.
    plain_only = tmp_path / "plain"
    shutil.copytree(DDP, plain_only)
    _with_plain_steps(plain_only, plain)
    again = build_reports(plain_only)[0]
    recorded = again.source["timing"]["recorded_busy_ms"]
    assert again.gpu_busy_ms == pytest.approx(min(again.step_time_ms, recorded - wait))
    assert any("and of GPU busy" in n for n in again.notes)
    # A trace without profile's timing keeps its busy time: nothing is left out.
    assert "wait_left_out" not in build_reports(DDP)[0].source["communication"]
