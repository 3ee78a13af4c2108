"""verify's rounds on synthetic runs (no process is started: ``_run_one`` is replaced by a
generator of step times): the warm-up process, more rounds while a status is inconclusive,
the budget and the per-run limit, a shared fix judged once."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from kerneltriage import api, rundir
from kerneltriage.verify import trials
from kerneltriage.verify.plan import Plan, Planned, Settings, make_plan

ROOT = Path(__file__).resolve().parents[2]
NAIVE = ROOT / "examples" / "runs" / "gpt-naive-h200"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(NAIVE, run, ignore=shutil.ignore_patterns("logs"))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(command=[sys.executable, "train.py"], cwd=str(tmp_path))
    (run / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "train.py").write_text("pass\n")
    return run


def planned(cid: str, predicted: float, apply: dict | None = None) -> Planned:
    apply = apply or {"kind": "tf32", "id": cid}
    return Planned(cid, f"candidate {cid}", "use-builtin", predicted, "r-" + cid, "fix", apply, None)


class FakeRuns:
    """Each label's process medians in order (a list per label); steps scatter 0.3% around them.
    A run takes its label's ``seconds`` (1 s unless given; a list: each run's in turn)."""

    def __init__(
        self, medians: dict[str, list[float]], seconds: dict[str, float | list[float]] | None = None
    ):
        self.medians = {k: list(v) for k, v in medians.items()}
        self.seconds = seconds or {}
        self.calls: list[str] = []
        self.rng = np.random.default_rng(0)
        self.clock = 0.0

    def __call__(self, command, cwd, env, settings, apply, prefix, timeout=None):
        label = "baseline" if apply is None else apply["id"]
        self.calls.append(Path(prefix).name)
        took = self.seconds.get(label, 1.0)
        if isinstance(took, list):  # each run's seconds in turn, the last one repeated
            took = took.pop(0) if len(took) > 1 else took[0]
        self.clock += min(took, timeout or float("inf"))
        if took > (timeout or float("inf")):
            return {"status": "timed-out", "error": f"ran past its {timeout:.0f} s limit", "step_ms": []}
        queue = self.medians[label]
        mid = queue.pop(0) if len(queue) > 1 else queue[0]
        steps = list(mid * (1 + self.rng.normal(0, 0.003, settings.steps)))
        return {"status": "ok", "step_ms": steps, "losses": [{"step": 1, "value": 2.0}], "device": "cpu"}


def verify(run: Path, monkeypatch, fake: FakeRuns, candidates: list[Planned], **settings) -> dict:
    monkeypatch.setattr(trials, "_run_one", fake)
    monkeypatch.setattr(trials.Trials, "elapsed", lambda self: fake.clock)
    manifest = rundir.open_run(run).manifest
    plan = Plan(str(run), list(manifest.command), Settings(steps=20, **settings), candidates, run_seconds=1.0)
    data = trials.run_verify(plan, manifest)
    return {c.id: c for c in data.candidates} | {"_file": data}


def test_an_outlier_first_process_is_a_warm_up_run_and_decides_nothing(run, monkeypatch):
    # T5-base: the first process ran at 205.75 ms, the others at 179; a compile fix at 178.4
    # has no real effect and must not be verified against the outlier.
    fake = FakeRuns({"baseline": [205.75, 179.06, 178.9, 179.1], "C1": [178.3, 178.5, 178.4]})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.063)], repeats=3, max_repeats=3)
    assert fake.calls[0] == "warm-up.0"
    assert out["_file"].warmup_run["median_ms"] == pytest.approx(205.75, rel=0.01)
    assert out["C1"].baseline.runs == 3 and out["C1"].baseline.median_ms == pytest.approx(179.0, rel=0.002)
    assert out["C1"].status == "refuted"


def test_inconclusive_fixes_get_more_rounds_until_conclusive(run, monkeypatch):
    base = [87.0, 89.57, 84.44, 86.0, 85.0, 87.0, 84.9, 86.1, 85.5]
    fake = FakeRuns({"baseline": base, "C1": [80.5, 81.0, 79.0, 78.5, 80.0, 79.7, 79.2], "C2": [60.0]})
    out = verify(
        run, monkeypatch, fake, [planned("C1", 0.101), planned("C2", 0.25)], repeats=2, max_repeats=8
    )
    assert out["C2"].status == "verified" and out["C2"].fixed.runs == 2  # conclusive at once
    assert out["C1"].status == "verified" and out["C1"].fixed.runs > 2  # more rounds decided it
    assert out["C1"].realized_low <= out["C1"].realized_saving_share <= out["C1"].realized_high
    assert out["_file"].complete


def test_a_fix_past_its_run_limit_is_not_measured_while_the_others_are(run, monkeypatch):
    fake = FakeRuns({"baseline": [50.0], "C1": [45.0], "C2": [40.0]}, seconds={"C1": 900.0})
    out = verify(
        run,
        monkeypatch,
        fake,
        [
            planned("C1", 0.1, {"kind": "compile-model", "mode": "max-autotune", "id": "C1"}),
            planned("C2", 0.2),
        ],
        repeats=3,
        max_repeats=3,
        run_timeout_s=300.0,
        budget_s=3600.0,
    )
    assert out["C1"].status == "not verified" and "not measured within the budget" in out["C1"].why
    assert out["C2"].status == "verified" and out["C2"].fixed.runs == 3
    assert sum(call.startswith("C1.") for call in fake.calls) == 1  # not run again after its timeout


def test_the_budget_stops_new_rounds(run, monkeypatch):
    fake = FakeRuns({"baseline": [50.0, 52.5] * 10, "C1": [48.5, 51.0] * 10}, seconds={"C1": 10.0})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.06)], repeats=2, max_repeats=10, budget_s=60.0)
    assert out["C1"].status == "inconclusive"
    # 1 s warm-up, then rounds of 11 s: five fit in 60 s, a sixth would end past it.
    assert len([c for c in fake.calls if c.startswith("C1.")]) == 5 and fake.clock <= 60.0


def test_a_shared_fix_is_judged_once_against_its_whole_prediction():
    report = api.report(NAIVE)
    manifest = rundir.open_run(NAIVE).manifest
    candidates = copy.deepcopy(report.candidates[:2])
    for c in candidates:  # one module-class compile covers both; each row carries the whole
        c.recipe = {"id": "compile-module", "apply": {"kind": "compile-module", "classes": ["Block"]}}
        c.attrs["fix_saving_share"] = 0.275
    plan = make_plan(str(NAIVE), manifest, candidates, Settings(), ids=[c.id for c in candidates])
    first, second = plan.candidates
    assert second.run_as == first.id and first.predicted == second.predicted == pytest.approx(0.275)
    assert "counted once" in first.notes[-1]
    for c in candidates:  # two norm swaps: their own slices add
        c.recipe = {"id": "builtin-norm", "apply": {"kind": "norm-swap", "classes": ["RMSNorm"]}}
        c.attrs.pop("fix_saving_share")
    plan = make_plan(str(NAIVE), manifest, candidates, Settings(), ids=[c.id for c in candidates])
    total = sum(c.expected_saving_share for c in candidates)
    assert plan.candidates[0].predicted == pytest.approx(total)


def test_verify_ends_within_its_budget_when_a_fix_compiles_past_it(run, monkeypatch):
    # A max-autotune compile that would take 15 minutes, a 10-minute budget, no --run-timeout:
    # the compile is stopped at half the budget, runs last in its round, and the cheap fix still
    # gets its three rounds.
    fake = FakeRuns({"baseline": [50.0], "C1": [45.0], "C2": [40.0]}, seconds={"C1": 900.0, "C2": 5.0})
    autotune = {"kind": "compile-model", "mode": "max-autotune", "id": "C1"}
    out = verify(
        run, monkeypatch, fake, [planned("C1", 0.1, autotune), planned("C2", 0.2)], repeats=3, budget_s=600.0
    )
    assert fake.clock <= 600.0
    assert fake.calls.index("C1.0") > fake.calls.index("C2.0")  # the long compile last in its round
    assert out["C1"].status == "not verified" and "not measured within the budget" in out["C1"].why
    assert out["C2"].status == "verified" and out["C2"].fixed.runs == 3


def test_an_outlier_counted_run_is_left_out_and_one_run_a_side_decides_nothing(run, monkeypatch):
    fake = FakeRuns({"baseline": [28.72, 38.97, 28.56, 28.74], "C1": [26.0, 26.1, 25.9], "C2": [40.48]})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.1), planned("C2", 0.16)], repeats=3, max_repeats=3)
    assert out["C1"].baseline.outlier_runs_ms == [pytest.approx(38.97, rel=0.01)]
    assert out["C1"].baseline.runs == 2 and "left out as outliers" in out["C1"].why
    assert out["C1"].status == "verified"  # 9.4% saved against 28.65 ms, not 30% against a mean of 32
    assert out["C1"].realized_saving_share == pytest.approx(1 - 26.0 / 28.65, abs=0.01)
    one = verify(
        run,
        monkeypatch,
        FakeRuns({"baseline": [28.72, 38.97], "C2": [40.48]}),
        [planned("C2", 0.16)],
        repeats=1,
        max_repeats=1,
    )
    assert one["C2"].status == "inconclusive" and "one run of a side" in one["C2"].why


def test_a_fix_the_budget_leaves_no_time_for_is_not_run_rather_than_timed_out(run, monkeypatch):
    # The DDP job of two GPUs with a 1.5-minute budget: the baseline and the first fix took the
    # budget; the next fix must not start with a 1 s limit and read as "ran past its 1 s limit".
    fake = FakeRuns({"baseline": [95.0], "C1": [85.0], "C2": [80.0]}, seconds={"baseline": 40.0, "C1": 45.0})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.1), planned("C2", 0.15)], repeats=3, budget_s=90.0)
    assert "C2.0" not in fake.calls
    assert out["C2"].status == "not verified" and out["C2"].why == "not run within the budget"
    # The budget that would give each fix its two runs a side is said.
    note = next(n for n in out["_file"].notes if "--budget" in n)
    assert "C1" in note and "C2" in note
    minutes = int(note.rsplit("--budget ", 1)[1])
    # Only the warm-up and one baseline run (40 s each) fitted: 40 s + 2 × 3 runs of at least
    # 40 s ≈ 4.7 min, with a tenth to spare
    assert 5 <= minutes <= 7


def test_a_budget_that_gave_every_fix_its_runs_says_nothing_of_the_budget(run, monkeypatch):
    fake = FakeRuns({"baseline": [50.0, 50.1, 49.9], "C1": [40.0, 40.1, 39.9]})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.2)], repeats=3, budget_s=600.0)
    assert out["C1"].status == "verified"
    assert not [n for n in out["_file"].notes if "--budget" in n]


def test_a_run_starts_only_where_it_would_end_within_the_budget_with_a_margin(run, monkeypatch):
    # An HF GPT-2-class LM on an H200: a compile fix's runs took 31.5 then 34.6 s. Its second run
    # started with 36 s of the budget left, was stopped at 34 s and read "1 of its 2 runs failed".
    # 20 s warm-up, then baseline 20 s and C1 30 s a round: 90 s in when round 2's C1 is due; 30 s
    # would fit the 120 s budget exactly, 1.2 × 30 s does not, so it is not started.
    fake = FakeRuns({"baseline": [50.0], "C1": [40.0]}, seconds={"baseline": 20.0, "C1": [30.0, 34.0]})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.2)], repeats=3, budget_s=120.0)
    assert fake.calls.count("C1.1") == 0 and fake.clock <= 120.0
    assert out["C1"].status == "inconclusive" and "one run of a side" in out["C1"].why
    assert "failed" not in out["C1"].why
    assert any("--budget" in n for n in out["_file"].notes)


def test_a_run_the_budgets_end_stops_is_not_counted_as_a_failure(run, monkeypatch):
    # Round 2's C1 fits with its margin (90 + 36 ≤ 130 s) but runs 50 s: the budget's end stops it
    # at 40 s. That is no sign of a broken fix: not "failed", and the run it finished still counts.
    fake = FakeRuns({"baseline": [50.0], "C1": [40.0]}, seconds={"baseline": 20.0, "C1": [30.0, 50.0]})
    out = verify(run, monkeypatch, fake, [planned("C1", 0.2)], repeats=3, budget_s=130.0)
    assert "C1.1" in fake.calls and fake.clock <= 130.0
    why = out["C1"].why
    assert out["C1"].fixed.runs == 1 and "failed" not in why
    assert "its last run was stopped at the budget's end (40 s were left) and is not counted" in why
