"""``verify`` of torchrun jobs: every rank under the harness, one result per process group
(the slowest rank's steps, every rank's losses), the plan's per-rank runs, the refusal of a job
that needs more GPUs than the machine has, and a two-process gloo DDP job end to end on CPU."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kerneltriage import rundir
from kerneltriage import verify_record as record
from kerneltriage.profile.command import parse_command
from kerneltriage.verify import torchrun
from kerneltriage.verify.plan import Plan, Planned, Settings
from kerneltriage.verify.trials import load_plan, run_verify

ROOT = Path(__file__).resolve().parents[2]
NAIVE = ROOT / "examples" / "runs" / "gpt-naive-h200"
DDP = ROOT / "examples" / "runs" / "gpt-ddp-2gpu-h200"
SCRIPT = Path(__file__).with_name("ddp_train.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _result(step_ms, losses, status="ok", error=None):
    return {
        "status": status,
        "error": error,
        "step_ms": step_ms,
        "steps_seen": 7,
        "losses": [{"step": i + 1, "value": v} for i, v in enumerate(losses)],
        "device": "cpu",
    }


def test_a_group_is_one_result_of_the_slowest_rank():
    both = torchrun.combine(
        {0: _result([10.0, 12.0, 11.0], [2.0, 1.9]), 1: _result([11.0, 11.5], [2.1, 2.0])}
    )
    assert both["status"] == "ok" and both["world_size"] == 2
    assert both["step_ms"] == [11.0, 12.0]  # per step the slower rank; as many steps as both timed
    # Every rank's losses, rank after rank: the loss guard compares each rank with itself.
    assert [(x["rank"], x["value"]) for x in both["losses"]] == [(0, 2.0), (0, 1.9), (1, 2.1), (1, 2.0)]
    assert both["ranks"]["1"]["step_ms"] == [11.0, 11.5]
    failed = torchrun.combine(
        {0: _result([10.0], [2.0]), 1: _result([], [], "failed", "the script exited with 1")}
    )
    assert failed["status"] == "failed" and failed["error"] == "rank 1: the script exited with 1"


def test_a_rank_without_a_result_fails_the_group(tmp_path):
    prefix = tmp_path / "baseline.0"
    Path(torchrun.result_pattern(prefix).format(rank=0)).write_text(json.dumps(_result([1.0], [2.0])))
    out = torchrun.read_group(prefix, 2, 1, "RuntimeError: boom")
    assert out["status"] == "failed"
    assert out["error"] == "rank 1: rank 1 wrote no result (exit code 1): RuntimeError: boom"


def test_a_job_needing_more_gpus_than_the_machine_has_is_refused():
    command = parse_command(["torchrun", "--nproc-per-node", "2", str(SCRIPT)])
    gpu = {"name": "NVIDIA H100 80GB HBM3"}
    assert torchrun.refusal(command, gpu, available=2) is None
    line = torchrun.refusal(command, gpu, available=1)
    assert line is not None and "\n" not in line
    assert line.startswith("the torchrun job starts 2 processes, one GPU each, and this machine has 1 GPU(s)")
    assert torchrun.refusal(command, {}, available=0) is None  # profiled on the CPU (gloo)
    assert torchrun.refusal(parse_command([sys.executable, str(SCRIPT)]), gpu, available=0) is None


def test_the_plan_of_a_torchrun_run_lists_its_per_rank_runs(tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(DDP, run)
    settings = Settings(repeats=1, warmup=3, steps=4)
    monkeypatch.setattr(torchrun, "_gpus", lambda: 0)
    plan, _manifest = load_plan(run, settings)
    note = next(n for n in plan.notes if n.startswith("torchrun job"))
    assert "one process group of 2 ranks (ranks 0, 1)" in note
    assert "--nproc-per-node 2 -m kerneltriage.verify.harness examples/train_gpt.py --ddp" in note
    assert "<label>.<n>.rank<r>.result.json" in note
    # Profiled on two H200s; this machine has none: the fixes the runner applies are refused in
    # one line; a fix it cannot apply keeps its own reason.
    by_id = {c.id: c for c in plan.candidates}
    assert by_id["C5"].apply and not by_id["C5"].verifiable
    assert by_id["C5"].why_not.startswith("the torchrun job starts 2 processes, one GPU each")
    assert by_id["C1"].why_not.startswith("the script's own attention code must be edited")
    monkeypatch.setattr(torchrun, "_gpus", lambda: 2)
    plan, _manifest = load_plan(run, settings)
    assert not any("torchrun job starts" in (c.why_not or "") for c in plan.candidates)
    assert plan.to_run  # the fixes the runner applies to this script run as torchrun jobs


@pytest.mark.slow  # two torchrun jobs of two processes each, plus a warm-up job: about 30 s on 2 cores
def test_a_gloo_ddp_job_goes_through_the_runner(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(NAIVE, run, ignore=shutil.ignore_patterns("logs"))
    shutil.copy(SCRIPT, tmp_path / "ddp_train.py")
    command = [*TORCHRUN, "ddp_train.py"]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(command=command, cwd=str(tmp_path), gpu={})
    (run / "manifest.json").write_text(json.dumps(manifest))
    settings = Settings(repeats=1, max_repeats=1, warmup=2, steps=3, loss_steps=3)
    fix = {"kind": "norm-swap", "classes": ["LayerNorm"]}
    plan = Plan(
        str(run),
        command,
        settings,
        [Planned("C1", "LayerNorm", "use-builtin", 0.05, "r-C1", "fix", fix, None)],
        run_seconds=None,
    )
    data = run_verify(plan, rundir.read_manifest(run))
    assert record.read(run) == data and data.complete
    (c1,) = data.candidates
    assert c1.applied and c1.applied["swapped"] == 1
    assert c1.loss_check.status == "same" and c1.loss_check.steps_compared == 6  # 3 steps × 2 ranks
    assert c1.fixed.steps == 3 and c1.baseline.steps == 3
    logs = run / "logs" / "verify"
    for label in ("baseline.0", "C1.0"):
        results = {r: json.loads((logs / f"{label}.rank{r}.result.json").read_text()) for r in (0, 1)}
        assert all(res["status"] == "ok" and len(res["step_ms"]) == 3 for res in results.values())
        # Each rank ran the fix in its own process.
        if label == "C1.0":
            assert all(res["applied"]["swapped"] == 1 for res in results.values())


def test_world_size_of_commands():
    assert torchrun.world_size(parse_command([sys.executable, str(SCRIPT)])) is None
    assert torchrun.world_size(parse_command([*TORCHRUN, str(SCRIPT)])) == 2
    manifest = SimpleNamespace(command=[*TORCHRUN, "ddp_train.py"], cwd=str(SCRIPT.parent))
    assert torchrun.recorded(manifest).target == ["ddp_train.py"]


def test_the_ddp_fix_sets_every_ddps_settings(tmp_path):
    import torch
    import torch.distributed as dist

    from kerneltriage.recipes.install import check, install

    assert (
        check({"kind": "ddp", "gradient_as_bucket_view": True, "static_graph": True, "bucket_cap_mb": None})
        is None
    )
    assert "bucket_cap_mb must be a number" in check({"kind": "ddp", "bucket_cap_mb": -1})
    assert "not find_unused" in check({"kind": "ddp", "find_unused": True})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        applied = install(
            {"kind": "ddp", "gradient_as_bucket_view": True, "static_graph": True, "bucket_cap_mb": None}
        )
        assert applied.problem == "the script built no torch.nn.parallel.DistributedDataParallel"
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), static_graph=False)
        assert model.gradient_as_bucket_view and model.static_graph  # over the script's own False
        assert applied.done and applied.details == {
            "wrapped": 1,
            "settings": {"gradient_as_bucket_view": True, "static_graph": True},
        }
        applied.remove()
        plain = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        assert not plain.gradient_as_bucket_view and applied.details["wrapped"] == 1
    finally:
        dist.destroy_process_group()
