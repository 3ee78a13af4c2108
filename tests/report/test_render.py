"""Terminal, Markdown and JSON renderings of the example's report."""

from __future__ import annotations

import json

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.report import render
from tests.helpers import report

REQUIRED_CANDIDATE_KEYS = {
    "rank",
    "id",
    "name",
    "kind",
    "level",
    "time_share",
    "time_ms_per_step",
    "kernels",
    "roofline",
    "headroom",
    "shapes",
    "conditions",
    "verdict",
    "reason",
    "builtin",
    "expected_saving_share",
}


def test_json_follows_the_documented_schema():
    data = json.loads(render(report(), "json"))
    assert data["schema"] == "kerneltriage.report/1"
    assert {"name", "peak_bandwidth_gbs", "peak_tflops", "source"} <= set(data["gpu"])
    assert {"steps", "step_time_ms", "gpu_busy_pct", "candidates"} <= set(data)
    for c in data["candidates"]:
        assert set(c) >= REQUIRED_CANDIDATE_KEYS
        assert c["level"] in ("region", "op", "kernel")
        assert c["verdict"] in ("write", "use-builtin", "compile", "skip")
        assert {
            "bytes",
            "flops",
            "intensity",
            "achieved_gbs",
            "achieved_tflops",
            "bound",
            "ceiling_ms",
            "source",
        } <= set(c["roofline"])
        assert {"distinct", "dominant_coverage", "varying_dims"} <= set(c["shapes"])
        for cond in ("headroom", "hotness", "stability"):
            assert {"value", "threshold", "passed"} <= set(c["conditions"][cond])
    assert [c["rank"] for c in data["candidates"]] == list(range(1, len(data["candidates"]) + 1))
    assert json.dumps(data)  # no NaN sneaks through


def test_top_limits_candidates():
    assert len(json.loads(render(report(), "json", top=3))["candidates"]) == 3


def test_terminal_names_the_verdicts_and_conditions():
    text = render(report(), "terminal", run_ref="examples/runs/gpt-naive-h200", color=False, width=160)
    assert "NVIDIA H200" in text and "step time" in text
    assert "attention (naive, causal)" in text
    assert "use-builtin" in text and "skip (library-at-roof)" in text
    assert "✓  headroom" in text and "fused ceiling" in text
    assert "kerneltriage scaffold examples/runs/gpt-naive-h200 C1" in text
    assert "launched before the profiled window" in text  # warnings are shown


def test_markdown_is_a_pasteable_table():
    text = render(report(), "markdown", top=5)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    assert lines[header + 1].startswith("|---:")
    rows = [line for line in lines[header + 2 :] if line.startswith("| ")]
    assert len(rows) >= 5
    assert rows[0].count("|") == lines[header].count("|")
    assert "### C1" in text


def test_one_gpu_spec_from_resolution_to_rendering():
    rep = report()
    assert isinstance(rep.gpu, GPUSpec)
    data = json.loads(render(rep, "json"))
    # The documented keys, and only them (the spec's ``measured`` record stays out).
    assert set(data["gpu"]) == {"name", "key", "peak_bandwidth_gbs", "peak_tflops", "sms", "l2_mb", "source"}
    assert data["gpu"]["peak_bandwidth_gbs"] == rep.gpu.peak_bandwidth_gbs
    assert data["thresholds"] == rep.thresholds.to_json()
