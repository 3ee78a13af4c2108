"""`kerneltriage diff` on real captures: the 2-GPU training run before and after a fix, and
the H200 example against itself."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from kerneltriage.analysis.compare.diff import compare, main_shape
from kerneltriage.api import build_report
from kerneltriage.cli import main
from tests.helpers import DATA, EXAMPLE_RUN, NCU_PER_CONFIG, TRACE

BEFORE = DATA / "nsys" / "mfu_2gpu_before.sqlite"
AFTER = DATA / "nsys" / "mfu_2gpu_after.sqlite"


@pytest.fixture(scope="module")
def nsys_diff():
    return compare(
        build_report(BEFORE, gpu="H100-SXM", ranks=[0]), build_report(AFTER, gpu="H100-SXM", ranks=[0])
    )


def test_a_run_against_itself_changes_nothing():
    rep = build_report(EXAMPLE_RUN)
    d = compare(rep, rep)
    assert d.step_saving_share == 0
    assert all(m.realized_saving_share == 0 for m in d.candidates)
    assert all(m.ids["before"] == m.ids["after"] for m in d.candidates)
    assert not d.new_hot_spots and not d.regressions and not d.warnings
    # Every predicted saving is carried over from the report.
    c1 = next(m for m in d.candidates if m.ids["before"] == ["C1"])
    assert c1.predicted_saving_share == pytest.approx(rep.candidate("C1").expected_saving_share)


def test_before_and_after_the_fix(nsys_diff):
    d = nsys_diff
    b, a = d.step_time_ms["before"], d.step_time_ms["after"]
    assert d.gpu_busy_ms["after"] < d.gpu_busy_ms["before"]
    comm = next(m for m in d.candidates if m.kind == "communication")
    assert comm.time_ms_per_step["after"] < comm.time_ms_per_step["before"]
    assert comm.realized_saving_share == pytest.approx(
        (comm.time_ms_per_step["before"] - comm.time_ms_per_step["after"]) / b
    )
    kinds = d.kinds
    assert kinds["communication"]["after"] < kinds["communication"]["before"]
    assert sum(v["before"] for k, v in kinds.items() if k != "idle") == pytest.approx(
        d.gpu_busy_ms["before"], rel=0.02
    )
    assert a > 0


def test_candidates_match_by_what_they_compute():
    rep = build_report(EXAMPLE_RUN)
    attention = rep.candidates[0]
    assert main_shape(attention) == (4, 16, 2048, 64)
    head = next(c for c in rep.candidates if c.kind == "gemm" and "32000" in c.name)
    assert main_shape(head) == ((4, 2048, 1024), (32000, 1024))


def test_not_comparable_runs_are_flagged():
    rep = build_report(EXAMPLE_RUN)
    other = build_report(EXAMPLE_RUN, gpu="H100-SXM")
    d = compare(rep, other)
    assert any("different GPUs" in w for w in d.warnings)


def test_cli_formats(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        main, ["diff", str(EXAMPLE_RUN), str(TRACE), "--ncu-after", str(NCU_PER_CONFIG), "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "kerneltriage.diff/1"
    assert {"before", "after"} == set(data["step_time_ms"]) == set(data["gpu_busy_ms"])
    for c in data["candidates"]:
        assert {"name", "kind", "time_ms_per_step", "predicted_saving_share", "realized_saving_share"} <= set(
            c
        )
    assert "warnings" in data
    md = runner.invoke(main, ["diff", str(BEFORE), str(AFTER), "--gpu", "H100-SXM", "--format", "markdown"])
    assert md.exit_code == 0 and "| candidate | kind | before | after |" in md.output
    page = tmp_path / "d.html"
    html = runner.invoke(
        main, ["diff", str(BEFORE), str(AFTER), "--gpu", "H100-SXM", "--format", "html", "-o", str(page)]
    )
    assert html.exit_code == 0 and "<table>" in page.read_text() and "http" not in page.read_text()
    bad = runner.invoke(main, ["diff", str(EXAMPLE_RUN), str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "no such file" in bad.output


RUNS = EXAMPLE_RUN.parent


def test_naive_attention_replaced_by_sdpa_realizes_the_prediction():
    """examples/runs: the same GPT profiled on an H200 with naive attention and with SDPA."""
    before = build_report(RUNS / "gpt-naive-h200")
    after = build_report(RUNS / "gpt-sdpa-h200")
    d = compare(before, after)
    attention = next(m for m in d.candidates if m.kind == "attention")
    assert attention.ids["before"] == [before.candidates[0].id]  # the top candidate before
    assert attention.how in ("module and shape", "module")  # the naive region ↔ the SDPA op
    assert attention.predicted_saving_share > 0.5
    # Realized: within a few points of the prediction (the fused ceiling is a lower bound).
    assert (
        0.8 * attention.predicted_saving_share
        < attention.realized_saving_share
        <= attention.predicted_saving_share
    )
    assert 0 < attention.ceiling_reached < 1
    assert d.step_saving_share == pytest.approx(attention.realized_saving_share, abs=0.03)
    norms = [m for m in d.candidates if m.kind == "norm"]
    assert norms and all(abs(m.realized_saving_share) < 0.01 for m in norms)  # untouched
    assert not d.warnings


def test_built_in_kernels_realize_attention_and_norm_savings():
    before = build_report(RUNS / "gpt-naive-h200")
    after = build_report(RUNS / "gpt-builtin-h200")
    d = compare(before, after)
    norm = next(
        m
        for m in d.candidates
        if m.ids["before"] == [c.id for c in before.candidates if c.variant == "fused_add_rmsnorm"]
    )
    assert norm.realized_saving_share > 0.5 * norm.predicted_saving_share
    assert d.kinds["norm"]["after"] < 0.5 * d.kinds["norm"]["before"]
    assert d.kinds["attention"]["after"] < 0.1 * d.kinds["attention"]["before"]


def test_ceilings_from_different_sources_are_flagged():
    """The same run against itself with the datasheet ceilings instead of the calibrated ones:
    the diff says its 'of ceiling' figures are not comparable."""
    import dataclasses

    from kerneltriage.analysis.gpus import spec_for

    rep = build_report(EXAMPLE_RUN)
    datasheet = dataclasses.replace(rep, gpu=spec_for("H200", "name", "the trace's device name"))
    assert rep.gpu.name == datasheet.gpu.name and rep.gpu.resolved_by == "calibration"
    d = compare(rep, datasheet)
    assert any("ceilings come from different sources" in w for w in d.warnings), d.warnings


# --- the second rung: AFTER profiled with BEFORE's verified fixes (profile --apply) -----------


def _ladder_pair(tmp_path, measured: bool = True):
    """gpt-naive-h200 with a verify.json (C1 verified; C4 and C5 one norm swap, measured in one
    run) → gpt-sdpa-h200 as if profiled with those fixes applied. ``measured=False``: the fixes
    were named by hand, none measured alone."""
    import shutil

    from kerneltriage import rundir
    from kerneltriage import verify_record as record

    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(RUNS / "gpt-naive-h200", first)
    shutil.copytree(RUNS / "gpt-sdpa-h200", second)
    norm = {"kind": "norm-swap", "classes": ["RMSNorm"]}
    sdpa = {"kind": "hf-attention"}  # a stand-in: the pair's fix was pasted by hand
    entries = [
        ("C1", "sdpa-for-naive-attention", sdpa, 0.6525, 0.63),
        ("C4", "builtin-norm", norm, 0.0583, 0.05),
        ("C5", "builtin-norm", norm, 0.0583, 0.05),
    ]
    if not measured:
        entries = [(cid, rid, apply, p, None) for cid, rid, apply, p, _ in entries]
    settings = {"repeats": 3, "warmup": 3, "steps": 10, "loss_steps": 3, "loss_rtol": 0.005, "seed": 0}
    record.write(
        first,
        record.VerifyFile.model_validate(
            {
                "schema": record.SCHEMA,
                "settings": settings,
                "candidates": [
                    {
                        "id": cid,
                        "recipe_id": rid,
                        "how": f"runner: {apply['kind']}",
                        "apply": apply,
                        "predicted_saving_share": p,
                        "realized_saving_share": r,
                        "status": "verified",
                    }
                    for cid, rid, apply, p, r in entries
                ],
            }
        ),
    )
    manifest = rundir.read_manifest(second)
    manifest.applied_fixes = [
        rundir.AppliedFix(
            id=cid,
            recipe_id=rid,
            apply=apply,
            predicted_saving_share=p,
            realized_saving_share=r,
            status="verified",
        )
        for cid, rid, apply, p, r in entries
    ]
    manifest.parent_run = str(first)
    rundir.write_manifest(second, manifest)
    return first, second


def test_the_fixes_applied_after_are_set_against_their_savings_alone(tmp_path):
    first, second = _ladder_pair(tmp_path)
    d = compare(build_report(first), build_report(second), (str(first), str(second)))
    lad = d.ladder
    assert (
        lad is not None
        and lad["before_is_parent"]
        and not any("profiled with the fixes" in w for w in d.warnings)
    )
    assert [r["id"] for r in lad["fixes"]] == ["C1", "C4", "C5"]
    c1 = lad["fixes"][0]
    assert (c1["predicted_saving_share"], c1["realized_saving_share"], c1["status"]) == (
        0.6525,
        0.63,
        "verified",
    )
    assert c1["pair_realized_saving_share"] == pytest.approx(
        next(m.realized_saving_share for m in d.candidates if "C1" in m.ids["before"])
    )
    assert lad["fixes"][1]["applied_with"] == ["C5"]
    # One norm swap, measured once: it counts once in the sums.
    assert lad["sum_realized_saving_share"] == pytest.approx(0.63 + 0.05)
    assert lad["sum_predicted_saving_share"] == pytest.approx(0.6525 + 0.0583)
    combined = (47.973764333333335 - 17.249647) / 47.973764333333335
    assert (
        lad["combined_realized_saving_share"] == pytest.approx(combined) == pytest.approx(d.step_saving_share)
    )
    assert lad["interaction_share"] == pytest.approx(combined - 0.68)  # they overlap: < 0


def test_fixes_none_measured_alone_are_not_summed_as_zero(tmp_path):
    first, second = _ladder_pair(tmp_path, measured=False)
    d = compare(build_report(first), build_report(second), (str(first), str(second)))
    assert d.ladder is not None and d.ladder["sum_realized_saving_share"] is None
    assert d.ladder["interaction_share"] is None and d.ladder["unmeasured"] == ["C1", "C4"]
    out = " ".join(CliRunner().invoke(main, ["diff", str(first), str(second)]).output.split())
    assert "none was measured alone (verify), predicted 71.1%; not measured alone: C1, C4" in out
    assert "sum to 0.0%" not in out


def test_every_diff_format_shows_the_fixes_and_their_combination(tmp_path):
    first, second = _ladder_pair(tmp_path)
    runner = CliRunner()
    term = runner.invoke(main, ["diff", str(first), str(second)])
    assert term.exit_code == 0, term.output
    assert "Fixes applied (profile --apply" in term.output
    assert "C1 " in term.output and "alone 63.0% (verify)" in term.output
    assert "alone they sum to 68.0% (verify), predicted 71.1%" in " ".join(term.output.split())
    assert "they overlap, 4.0% of the step less together than the sum" in " ".join(term.output.split())
    csv_out = runner.invoke(main, ["diff", str(first), str(second), "--format", "csv"]).output
    frame = pd.read_csv(io.StringIO(csv_out), keep_default_na=False)
    covered = frame[frame["fixes_applied"] != ""]
    assert set(", ".join(covered["fixes_applied"]).split(", ")) == {"C1", "C4", "C5"}
    c1 = covered[covered["fixes_applied"].str.contains("C1")].iloc[0]
    assert (float(c1["fixes_predicted_share"]), float(c1["fixes_realized_alone_share"])) == pytest.approx(
        (0.6525, 0.63)
    )
    data = json.loads(runner.invoke(main, ["diff", str(first), str(second), "--format", "json"]).output)
    assert data["ladder"]["sum_realized_saving_share"] == pytest.approx(0.68)
    assert [r["id"] for r in data["ladder"]["fixes"]] == ["C1", "C4", "C5"]
    md = runner.invoke(main, ["diff", str(first), str(second), "--format", "markdown"]).output
    assert "- C4 " in md and "applied as one with C5" in md and "- together: 64.0% of the step" in md
    page = tmp_path / "d.html"
    runner.invoke(main, ["diff", str(first), str(second), "--format", "html", "-o", str(page)])
    html = page.read_text()
    assert 'id="ladder"' in html and "alone they sum to 68.0%" in html
    # The second run's report says how it was profiled, and links the first.
    report = runner.invoke(main, ["report", str(second), "--top", "1"]).output
    assert "Fixes applied: profiled with C1 (sdpa-for-naive-attention), C4 (builtin-norm)" in report
    assert f"the run before them: {first}" in " ".join(report.split())
    page = tmp_path / "r.html"
    runner.invoke(main, ["report", str(second), "--format", "html", "-o", str(page)])
    assert "<dt>fixes applied</dt>" in page.read_text() and "C4 (builtin-norm)" in page.read_text()


def test_a_diff_against_another_run_than_the_parent_is_flagged(tmp_path):
    first, second = _ladder_pair(tmp_path)
    d = compare(build_report(EXAMPLE_RUN), build_report(second), (str(EXAMPLE_RUN), str(second)))
    assert d.ladder is not None and not d.ladder["before_is_parent"]
    assert any(f"profiled with the fixes of {first}" in w for w in d.warnings)
    assert compare(build_report(EXAMPLE_RUN), build_report(EXAMPLE_RUN)).ladder is None
