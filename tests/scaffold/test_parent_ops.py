"""A `write` verdict on kernels a CUDA graph replays (no op recorded) in a run profiled with
fixes applied: the scaffold takes their ops and shapes from the run before the fixes
(``examples/runs/convnext-t-cudagraphs-h200`` and its parent ``convnext-t-h200``), and says so;
without the parent at hand it says what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

from kerneltriage import api
from kerneltriage.scaffold import scaffold_candidate
from kerneltriage.scaffold.parent_ops import borrowed, parent_run

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"
FIRST = RUNS / "convnext-t-h200"
SECOND = RUNS / "convnext-t-cudagraphs-h200"
# ConvNeXt-T's four stages' depthwise 7×7 convolutions, batch 64
STAGES = ["64x96x56x56", "64x192x28x28", "64x384x14x14", "64x768x7x7"]


def test_the_parent_run_is_found_beside_the_run_it_was_recorded_elsewhere():
    report = api.report(SECOND)
    assert report.source["parent_run"] == "/tmp/x/convnext-t-h200"  # as profile --apply recorded it
    assert parent_run(SECOND, report) == RUNS / "convnext-t-h200"


def test_borrowed_ops_come_from_every_candidate_that_ran_the_kernels_with_shapes_merged():
    second, first = api.report(SECOND), api.report(FIRST)
    cand = second.candidate("C1")
    merged, matched = borrowed(cand, first)
    assert all(c.example and c.kind == "convolution" for c in matched)
    assert matched[0].time_ms_per_step == max(c.time_ms_per_step for c in matched)
    shapes = [s["shape"] for s in merged.shapes.signatures]
    assert len(shapes) == len(set(shapes))  # the same op in two candidates (layouts) counted once
    assert {s.split()[0].removeprefix("arg0=") for s in shapes} == set(STAGES)
    assert abs(sum(s["share"] for s in merged.shapes.signatures) - 1.0) < 1e-6
    assert merged.id == "C1" and merged.verdict == cand.verdict and merged.headroom == cand.headroom
    assert merged.fwd_ms_per_step > 0 and merged.bwd_ms_per_step > 0  # the package gets its backward
    assert borrowed(second.candidate("C6"), first) is None  # a copy kernel no depthwise op ran


def test_scaffold_of_the_replayed_dgrad_is_a_depthwise_convolution_with_the_first_runs_shapes(tmp_path):
    result = scaffold_candidate(SECOND, "C1", tmp_path / "dw")
    assert result.template == "depthwise_conv"
    assert any("its ops and shapes are those of" in m and "convnext-t-h200" in m for m in result.messages)
    bench = (tmp_path / "dw" / "bench.py").read_text()
    for stage in STAGES:
        x = ", ".join(stage.split("x"))
        assert f'"x": ({x})' in bench, stage
    kernel = (tmp_path / "dw" / "kernel.py").read_text()
    assert (
        "_dgrad_kernel" in kernel and "_wgrad_kernel" in kernel
    )  # differentiable: the backward is the point


def test_without_the_parent_run_the_scaffold_says_what_is_missing(tmp_path):
    alone = tmp_path / "convnext-t-cudagraphs-h200"
    shutil.copytree(SECOND, alone)
    result = scaffold_candidate(alone, "C1", tmp_path / "generic")
    assert result.template == "generic"
    assert any("is not at hand: copy it beside" in m for m in result.messages)


def test_a_parent_run_that_cannot_be_read_leaves_the_generic_package_and_says_why(tmp_path):
    shutil.copytree(SECOND, tmp_path / "convnext-t-cudagraphs-h200")
    broken = tmp_path / "convnext-t-h200"
    shutil.copytree(FIRST, broken)
    (broken / "trace.json.gz").write_bytes(b"not a trace")
    result = scaffold_candidate(tmp_path / "convnext-t-cudagraphs-h200", "C1", tmp_path / "out")
    assert result.template == "generic"
    assert any("could not be read for them" in m for m in result.messages)


def test_the_cli_says_where_the_shapes_came_from(tmp_path):
    from click.testing import CliRunner

    from kerneltriage.cli import main

    result = CliRunner().invoke(main, ["scaffold", str(SECOND), "C3", "--out", str(tmp_path / "c3")])
    assert result.exit_code == 0, result.output
    assert "C3: no recorded op launched its kernels (a CUDA graph replays them)" in result.output
    assert "(depthwise_conv template" in result.output
