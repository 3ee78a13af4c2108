"""``verify --plan`` and the pieces that judge a fix (pure): plans from recipes in the
contract's shape, the loss guard, the verdicts, verify.json's schema and the report's use."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from kerneltriage import api, rundir
from kerneltriage import verify_record as record
from kerneltriage.analysis.fixes.verification import attach
from kerneltriage.errors import InputError, RunDirError
from kerneltriage.verify import outcome
from kerneltriage.verify.plan import Settings, describe, make_plan

ROOT = Path(__file__).resolve().parents[2]
NAIVE = ROOT / "examples" / "runs" / "gpt-naive-h200"


@pytest.fixture(scope="module")
def naive():
    return api.report(NAIVE), rundir.read_manifest(NAIVE)


def recipe(rid, apply=None, why_not=None, blocked=None):
    return {
        "id": rid,
        "params": {},
        "scope": "module-class",
        "covers": {"instances_per_step": 8, "of_candidate": 8},
        "blocked": blocked,
        "apply": apply,
        "apply_why_not": why_not,
    }


def test_plan_without_recipes_says_every_fix_needs_a_hand(naive):
    report, manifest = naive
    candidates = copy.deepcopy(report.candidates)
    assert any(c.recipe for c in candidates)  # the report's own recipes, taken away
    for c in candidates:
        c.recipe = None
    plan = make_plan(str(NAIVE), manifest, candidates, Settings(), step_ms=report.step_time_ms)
    actionable = [c.id for c in report.candidates if c.verdict != "skip"]
    assert [c.id for c in plan.candidates] == actionable and plan.runs == 0
    assert all(f"--by-hand {c.id}" in c.why_not for c in plan.candidates)
    assert describe(plan)[-1] == "nothing to run: no candidate can be verified here"


def test_plan_with_recipes_in_the_contracts_shape(naive):
    report, manifest = naive
    candidates = copy.deepcopy(report.candidates)
    by_id = {c.id: c for c in candidates}
    by_id["C1"].recipe = recipe(
        "sdpa-for-naive-attention", why_not="the script's own attention code must be edited"
    )
    by_id["C2"].recipe = recipe(
        "liger-fused-linear-ce",
        apply={"kind": "liger", "arch": "llama", "kernel": "fused_linear_cross_entropy"},
    )
    norm = next(c for c in candidates if c.name.startswith("residual add + RMSNorm"))
    norm.recipe = recipe("builtin-norm", apply={"kind": "norm-swap", "classes": ["RMSNorm"]})
    plan = make_plan(
        str(NAIVE),
        manifest,
        candidates,
        Settings(repeats=2, steps=10),
        step_ms=report.step_time_ms,
        ids=["C1", "C2", norm.id.lower()],  # ids in any case
    )
    c1, c2, c3 = plan.candidates
    assert c1.why_not == "the script's own attention code must be edited" and not c1.verifiable
    assert c2.verifiable and "needs liger_kernel" in c2.notes[0]
    assert c3.how == "runner: norm-swap" and c3.recipe_id == "builtin-norm"
    assert plan.runs == 2 * 3 + 1  # a warm-up run, then baseline + two fixes, twice each
    # One run: phase 1's start-up (its seconds less its steps) plus 13 steps at the step time.
    tl = manifest.phases.timeline.to_json()
    one = tl["seconds"] - tl["steps_seen"] * report.step_time_ms / 1000 + 13 * report.step_time_ms / 1000
    assert plan.seconds == pytest.approx(7 * one)  # neither fix compiles
    text = "\n".join(describe(plan))
    assert "applied  by the runner: norm-swap (classes=['RMSNorm'])" in text
    assert "7 runs (1 warm-up + 2 × baseline + 2 × 2 fixes, interleaved), about" in text
    assert "an inconclusive fix gets more rounds, up to 10" in text
    # The budget as given, not rounded: 3.5 minutes read "4 min" before.
    plan.settings.budget_s = 210.0
    assert "within a budget of 3.5 min;" in "\n".join(describe(plan))
    plan.settings.budget_s = 1200.0
    assert "within a budget of 20 min;" in "\n".join(describe(plan))


def test_plan_refuses_blocked_unknown_kinds_and_unknown_ids(naive):
    report, manifest = naive
    candidates = copy.deepcopy(report.candidates)
    candidates[0].recipe = recipe("x", blocked="softcap 50.0: SDPA cannot carry a logit softcap")
    candidates[1].recipe = recipe("y", apply={"kind": "rewrite"})
    plan = make_plan(str(NAIVE), manifest, candidates, Settings(), ids=[candidates[0].id, candidates[1].id])
    assert plan.candidates[0].why_not == "no fix offered: softcap 50.0: SDPA cannot carry a logit softcap"
    assert plan.candidates[1].why_not.startswith("unknown apply kind 'rewrite': the runner cannot apply it")
    with pytest.raises(InputError, match="no candidate C99"):
        make_plan(str(NAIVE), manifest, candidates, Settings(), ids=["C99"])


def test_a_skip_carrying_a_runner_setting_is_planned_and_a_bare_skip_is_not(naive):
    # An FSDP job's exposed all-gather: the verdict stays skip (communication), the recipe is a
    # setting the runner applies; verify measures it like any fix.
    report, manifest = naive
    candidates = copy.deepcopy(report.candidates)
    skips = [c for c in candidates if c.verdict == "skip"]
    setting, bare = skips[0], skips[1]
    setting.recipe = recipe(
        "fsdp-explicit-prefetch", apply={"kind": "fsdp-prefetch", "forward": 2, "backward": 1}
    )
    bare.recipe = None
    plan = make_plan(str(NAIVE), manifest, candidates, Settings(), step_ms=report.step_time_ms)
    planned = {c.id: c for c in plan.candidates}
    assert setting.id in planned and planned[setting.id].apply == {
        "kind": "fsdp-prefetch",
        "forward": 2,
        "backward": 1,
    }
    assert bare.id not in planned
    asked = make_plan(str(NAIVE), manifest, candidates, Settings(), ids=[bare.id])
    assert asked.candidates[0].why_not == "its verdict is skip: there is no fix to verify"


def test_loss_guard():
    base = [[10.5896, 10.0653, 9.6383], [10.5896, 10.0653, 9.6383]]
    same = outcome.compare_losses(base, [[10.5897, 10.0655, 9.6382]], 0.005)
    assert same.status == "same" and same.max_rel_diff < 1e-4 and same.steps_compared == 3
    wrong = outcome.compare_losses(base, [[10.5897, 9.71, 9.02]], 0.005)
    assert wrong.status == "differs" and wrong.max_rel_diff == pytest.approx(0.0641, abs=1e-3)
    noisy = outcome.compare_losses([[10.0, 9.0], [10.5, 9.4]], [[10.0, 9.0]], 0.005)
    assert noisy.status == "inconclusive"
    assert outcome.compare_losses(base, [[]], 0.005).status == "not measured"


def test_verdicts():
    from kerneltriage.analysis.timeline.steady import Interval

    same = outcome.compare_losses([[1.0]], [[1.0]], 0.005)
    differs = outcome.compare_losses([[1.0]], [[1.1]], 0.005)
    assert outcome.judge(0.173, Interval(0.182, 0.170, 0.190), same)[0] == "verified"
    status, why = outcome.judge(0.095, Interval(0.011, 0.005, 0.02), same)
    assert status == "refuted" and why.endswith("the whole interval lies below 0.5× the prediction")
    assert outcome.judge(0.096, Interval(-0.62, -0.65, -0.6), same)[1].endswith("the step got slower")
    # An interval straddling half the prediction: inconclusive, never refuted.
    status, why = outcome.judge(0.101, Interval(0.041, 0.01, 0.09), same)
    assert status == "inconclusive" and "more runs would tell" in why
    assert outcome.judge(0.447, Interval(0.419, 0.4, 0.43), differs)[0] == "changes-results"
    base = outcome.timing([[92.0, 92.2, 91.9], [92.1, 92.3]])
    fixed = outcome.timing([[75.3, 75.2], [75.4, 75.3]])
    # A side's time: the mean of its processes' medians, inside its interval.
    assert base.median_ms == pytest.approx((92.0 + 92.2) / 2) and base.runs == 2 and base.steps == 5
    assert base.low_ms <= base.median_ms <= base.high_ms
    saved = outcome.realized([[92.0, 92.2, 91.9], [92.1, 92.3]], [[75.3, 75.2], [75.4, 75.3]])
    assert saved.value == pytest.approx(1 - fixed.median_ms / base.median_ms, abs=1e-4)
    assert saved.low <= saved.value <= saved.high


def _file(entries):
    return record.VerifyFile(
        run="r",
        settings=record.RecordedSettings(
            repeats=3, warmup=3, steps=20, loss_steps=3, loss_rtol=0.005, seed=0
        ),
        candidates=entries,
    )


def _entry(cid, name, status, predicted, realized):
    timing = record.Timing(median_ms=40.0, spread_ms=0.4, run_medians_ms=[40.0], steps=20, runs=1)
    return record.CandidateResult(
        id=cid,
        name=name,
        how="runner: norm-swap",
        status=status,
        predicted_saving_share=predicted,
        realized_saving_share=realized,
        baseline=timing,
        fixed=timing,
        loss_check=outcome.compare_losses([[1.0]], [[1.0]], 0.005),
        why="",
    )


def test_verify_json_round_trips_and_is_validated(tmp_path):
    data = _file([_entry("C1", "attention", "verified", 0.65, 0.6)])
    record.write(tmp_path, data)
    raw = json.loads((tmp_path / "verify.json").read_text())
    assert raw["schema"] == "kerneltriage.verify/1"
    assert record.read(tmp_path) == data
    raw["candidates"][0]["status"] = "probably"
    (tmp_path / "verify.json").write_text(json.dumps(raw))
    with pytest.raises(RunDirError, match=r"verify\.json: candidates\.0\.status"):
        record.read(tmp_path)
    raw["schema"] = "kerneltriage.verify/0"
    (tmp_path / "verify.json").write_text(json.dumps(raw))
    with pytest.raises(RunDirError, match=r"expected .kerneltriage\.verify/1."):
        record.read(tmp_path)


def test_the_report_ranks_by_realized_and_drops_refuted_fixes(naive):
    from kerneltriage.render import render
    from kerneltriage.render.html import _summary

    report = copy.deepcopy(naive[0])
    c1, c2 = report.candidate("C1"), report.candidate("C2")
    norm = next(c for c in report.candidates if c.name.startswith("residual add + RMSNorm"))
    assert norm.expected_saving_share < 0.03 < c2.expected_saving_share
    data = _file(
        [
            _entry("C1", c1.name, "refuted", c1.expected_saving_share, 0.01),
            _entry("C2", c2.name, "verified", c2.expected_saving_share, 0.03),
            _entry(norm.id, norm.name, "verified", norm.expected_saving_share, 0.05),
            _entry("C4", "not this report's C4", "verified", 0.1, 0.1),
        ]
    ).to_json()
    attach(report, data)
    order = [c.id for c in report.candidates]
    # by realized saving where verified (5% before 3%, though predicted the other way round),
    # else by the prediction
    assert order[0] == norm.id and order.index(norm.id) < order.index(c2.id)
    realized = {norm.id: 0.05, c2.id: 0.03}
    acted = [c for c in report.candidates if c.acted_on]
    assert acted == sorted(acted, key=lambda c: -realized.get(c.id, c.expected_saving_share))
    assert order.index("C1") > max(order.index(c.id) for c in report.candidates if c.acted_on)
    assert "C1" not in [s["id"] for s in _summary(report, report.candidates)]
    assert any("verify.json has C4" in w for w in report.warnings)
    text = render(report, "terminal", width=200, color=False)
    assert "verify     ✗ refuted · predicted 65.2% · realized 1.0% (40.00 ms ±0.20 → 40.00 ms ±0.20)" in text
    assert "| 5.0% ✓ |" in render(report, "markdown")
    frame = report.to_frame()
    assert frame.set_index("id").loc["C1", "verification_status"] == "refuted"
    assert frame.set_index("id").loc[norm.id, "realized_saving_share"] == 0.05
    assert json.loads(render(report, "json"))["candidates"][0]["verification"]["status"] == "verified"


def test_diff_shows_what_verify_measured_on_the_run_before(tmp_path):
    from kerneltriage.api import diff, report
    from kerneltriage.render.diff_render import render_diff

    run = tmp_path / "naive"
    shutil.copytree(NAIVE, run)
    attention = next(c for c in report(run).candidates if c.kind == "attention")
    record.write(run, _file([_entry(attention.id, attention.name, "verified", 0.652, 0.631)]))
    d = diff(run, NAIVE.parent / "gpt-sdpa-h200")
    match = next(m for m in d.candidates if attention.id in m.ids["before"])
    assert match.verified and match.verified[0]["status"] == "verified"
    text = render_diff(d, "terminal")
    assert "verify (before)" in text and "63.1% ✓" in text
    md = render_diff(d, "markdown")
    assert "| verify (before) |" in md
    # Without verify.json the column is not there.
    assert "verify (before)" not in render_diff(diff(NAIVE, NAIVE.parent / "gpt-sdpa-h200"), "terminal")


def test_a_run_is_estimated_from_one_process_start_up_not_the_whole_timing_phase():
    # Qwen2-class on an H100: the timeline phase took 70.25 s over phase 1 (50 steps seen) and
    # two timing processes (3 warm-up + 20 plain steps each) at 93.4 ms a step; a verify run of
    # the script took 25 s. Counting the whole phase as one start-up made it 68 s.
    from kerneltriage.verify.plan import run_seconds

    manifest = rundir.Manifest(command=["python", "train.py"])
    manifest.schedule.warmup = 3
    manifest.phases.timeline = rundir.TimelinePhase(
        seconds=70.25,
        steps_seen=50,
        step_time=rundir.StepTime(
            plain_median_ms=93.4, processes_plain_ms=[[93.4] * 25, [93.4] * 20, [93.4] * 20]
        ),
    )
    settings = Settings(warmup=3, steps=20)
    one = run_seconds(manifest, settings, None)
    assert one is not None and 20.0 <= one <= 25.0
    # One process only: the phase is phase 1's start-up and steps, as before.
    manifest.phases.timeline.step_time.processes_plain_ms = []
    assert run_seconds(manifest, settings, None) == pytest.approx(70.25 - 50 * 0.0934 + 23 * 0.0934)


def test_a_runs_estimate_adds_what_its_compile_takes():
    # A module-class compile measured 1-19 s on H100s and H200s (47 s once), a whole model's
    # 25-40 s, max-autotune past 5-10 minutes (measurement.yaml, compile_seconds).
    from kerneltriage.verify.plan import Plan, Planned

    fixes = {
        "C1": {"kind": "compile-module", "classes": ["LayerNorm"], "mode": None},
        "C2": {"kind": "compile-model", "mode": None},
        "C3": {"kind": "compile-model", "mode": "max-autotune"},
        "C4": {"kind": "norm-swap", "classes": ["RMSNorm"]},
    }
    planned = [Planned(i, i, "compile", 0.1, "r", "fix", a, None) for i, a in fixes.items()]
    plan = Plan("run", ["python", "train.py"], Settings(), planned, run_seconds=20.0)
    assert [plan.run_estimate(i) for i in fixes] == [40.0, 65.0, 620.0, 20.0]
    assert plan.run_estimate(None) == 20.0  # the baseline compiles nothing
