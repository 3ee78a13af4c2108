"""The ladder's second rung on real runs: ConvNeXt-T on an H200 (``examples/runs/convnext-t-h200``)
and the same script profiled again with its verified CUDA-graph fix applied
(``convnext-t-cudagraphs-h200``, ``profile --apply``). The graph replays cuDNN's depthwise
backward kernels without their ops: they are still judged as depthwise convolutions, get
`write`, and say which cheaper option this run ruled out."""

from __future__ import annotations

import functools
from pathlib import Path

from kerneltriage import api
from kerneltriage.analysis.judge.second_rung import rule_out_applied
from kerneltriage.analysis.model import Report
from kerneltriage.analysis.vocabulary import Verdict

RUNS = Path(__file__).resolve().parents[3] / "examples" / "runs"
FIRST = RUNS / "convnext-t-h200"
SECOND = RUNS / "convnext-t-cudagraphs-h200"


@functools.cache
def _report(run: Path) -> Report:
    return api.report(run)


def _by_kernel(report: Report, start: str):
    """The hottest candidate whose kernels start with ``start``."""
    return max(
        (c for c in report.candidates if c.kernels and c.kernels[0].name.startswith(start)),
        key=lambda c: c.time_ms_per_step,
    )


def test_the_graph_replayed_depthwise_backward_is_a_depthwise_convolution_to_write():
    report = _report(SECOND)
    assert report.source["applied_fixes"][0]["id"] == "S1"
    for start in ("dgrad2d_c1_k1_nhwc", "wgrad2d_c1_k1_nhwc"):
        cand = _by_kernel(report, start)
        assert not cand.example  # a CUDA graph replay: no op launched it
        assert (cand.kind, cand.verdict) == ("convolution", Verdict.WRITE), start
        assert cand.builtin is None
        assert f"depthwise convolution ({cand.kernels[0].name}, replayed without its op" in cand.note
        assert "100% of its time in its backward" in cand.note
        # the saving is the backward's, at the headroom ncu measured on this very run
        assert cand.roofline.source == "ncu"
        assert abs(cand.expected_saving_share - cand.time_share * (1 - 1 / cand.headroom)) < 1e-9


def test_a_write_of_the_second_rung_says_what_this_run_ruled_out():
    report = _report(SECOND)
    writes = [c for c in report.candidates if c.verdict == Verdict.WRITE and c.headroom]
    assert len(writes) >= 2
    for cand in writes:
        assert (
            "ruled out by this run, profiled with S1 (compile-cuda-graphs, verified at 38.9%) applied: "
            f"it still runs {cand.headroom:.1f}× below its roof"
        ) in cand.note
    # the forward kernel is the autotuner's to try first, and nothing is said to rule it out
    forward = _by_kernel(report, "conv2d_c1_k1_nhwc")
    assert forward.verdict == Verdict.USE_BUILTIN and "cudnn.benchmark" in forward.builtin
    assert "ruled out by this run" not in forward.note


def test_the_first_rung_rules_nothing_out():
    report = _report(FIRST)
    assert any(c.verdict == Verdict.WRITE for c in report.candidates)
    assert not any("ruled out by this run" in c.note for c in report.candidates)


def test_an_unverified_fix_is_named_without_a_saving():
    report = _report(SECOND)
    cand = _by_kernel(report, "dgrad2d_c1_k1_nhwc")
    fresh = type(cand)(**{**cand.__dict__, "note": ""})
    rule_out_applied([fresh], [{"id": "S1", "recipe_id": "compile-cuda-graphs", "status": "inconclusive"}])
    assert fresh.note == (
        f"ruled out by this run, profiled with S1 (compile-cuda-graphs) applied: it still runs {fresh.headroom:.1f}× below its roof"
    )
    rule_out_applied([fresh], None)  # a first run: nothing added
    assert fresh.note.count("ruled out") == 1


def test_an_aten_kernel_left_in_a_compiled_graph_is_not_told_to_compile_again():
    """A copy the compiled graph still runs through ATen (`direct_copy_kernel_cuda`): the rules
    say compile for an elementwise kernel, but the model is compiled already."""
    (cand,) = [
        c for c in _report(SECOND).candidates if c.name == "elementwise_kernel<direct_copy_kernel_cuda>"
    ]
    assert cand.compiled and not cand.inductor
    assert (cand.verdict, cand.builtin) == (Verdict.WRITE, None)
    assert cand.note.startswith(
        "already in a compiled graph, where Inductor left this op to ATen or a library"
    )
    assert (cand.recipe or {}).get("id") not in ("compile-model", "compile-module-class")
