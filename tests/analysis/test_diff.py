"""`kerneltriage diff` on real captures: the 2-GPU training run before and after a fix, and
the H200 example against itself."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kerneltriage.analysis.diff import compare, main_shape
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
