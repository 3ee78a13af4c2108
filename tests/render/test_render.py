"""Terminal, Markdown and JSON renderings of the example's report."""

from __future__ import annotations

import csv
import io
import json

import pytest

from kerneltriage.analysis.gpus import GPUSpec, resolve_gpu
from kerneltriage.api import build_report
from kerneltriage.render import FORMATS, render
from tests.helpers import EXTERNAL, corpus, report

DLRM = EXTERNAL / "hta-dlrm-2rank-a100" / "sampled_rank-0.json.gz"
VLLM = (
    EXTERNAL
    / "tracelens-vllm-graph-capture-mi300x"
    / "graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"
)
NO_GPU_LINE = (
    "GPU: unknown (no name, no deviceProperties) — no ceilings: headroom and write/compile verdicts "
    "need one; pass --gpu KEY"
)

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
    assert "use-builtin" in text and "skip (low-headroom)" in text
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


GPU_KEYS = {
    "name",
    "key",
    "peak_bandwidth_gbs",
    "peak_tflops",
    "ceiling_bandwidth_gbs",
    "ceiling_tflops",
    "achievable",
    "measured_ceilings",
    "launch_floor_us",
    "launch_floor_source",
    "resolved_by",
    "resolution",
    "vendor",
    "compute",
    "memory_gb",
    "sms",
    "l2_mb",
    "source",
}


def test_one_gpu_spec_from_resolution_to_rendering():
    rep = report()
    assert isinstance(rep.gpu, GPUSpec)
    data = json.loads(render(rep, "json"))
    # The documented keys, and only them (the spec's ``measured`` record stays out).
    assert set(data["gpu"]) == GPU_KEYS
    gpu = data["gpu"]
    assert gpu["peak_bandwidth_gbs"] == rep.gpu.peak_bandwidth_gbs == 4800  # the datasheet's
    assert gpu["ceiling_bandwidth_gbs"] == pytest.approx(rep.gpu.ceiling_bandwidth_gbs)
    # datasheet × achievable, raised to what this run's own kernels reached (roofline.py)
    raised = rep.gpu.measured["raised"]["bandwidth"]
    assert raised["from"] == pytest.approx(4800 * gpu["achievable"]["bandwidth"])
    assert gpu["ceiling_bandwidth_gbs"] == raised["to"] > raised["from"]
    assert set(gpu["achievable"]) == {"bandwidth", "tensor", "vector", "source", "label", "estimate"}
    assert gpu["achievable"]["estimate"] is False  # the H200's fractions were measured on an H200
    assert gpu["resolved_by"] == "name" and gpu["launch_floor_us"] == rep.gpu.launch_floor_us
    assert data["thresholds"] == rep.thresholds.to_json()


def test_header_says_which_ceilings_it_used(example_report):
    import dataclasses

    gpu = resolve_gpu("NVIDIA H200")  # the test capture's, by its name: datasheet × achievable
    datasheet = dataclasses.replace(report(), gpu=gpu)
    line = render(datasheet, "terminal", color=False, width=400).splitlines()[1]
    a = gpu.achievable
    assert line == (
        f"GPU: NVIDIA H200 SXM 141GB — ceilings {gpu.ceiling_bandwidth_gbs:.0f} GB/s, "
        f"{gpu.ceiling_tflops['bf16']:.0f} bf16, {gpu.ceiling_tflops['fp32']:.3g} fp32 TFLOP/s "
        f"({a.bandwidth:g} / {a.tensor:g} / {a.vector:g} of datasheet, {a.label})"
    )
    assert "4176 GB/s, 683 bf16, 56.9 fp32" in line and "measured by kerneltriage on an H200" in line
    # The report itself: its GEMMs ran above those roofs, so it raised them and says so.
    line = render(report(), "terminal", color=False, width=400).splitlines()[1]
    assert "ceilings 4389 GB/s, 866 bf16, 56.9 fp32 TFLOP/s (datasheet (NVIDIA H200" in line
    assert "raised by this run's own kernels: bandwidth 4176 → 4389 GB/s, bf16 682.7 → 865.9 TFLOP/s" in line
    calibrated = example_report  # its manifest's calibration: measured ceilings
    text = render(calibrated, "markdown")
    assert (
        "- GPU: NVIDIA H200 SXM 141GB — ceilings 4393 GB/s, 862 bf16, 65.7 fp32 TFLOP/s (measured by " in text
    )
    assert "raised by this run's own kernels: bandwidth 4221 → 4393 GB/s, bf16 678.8 → 862 TFLOP/s" in text
    assert "kerneltriage calibrate 2026-11-21: bandwidth, bf16, fp16_tensor, tf32, fp32;" in text


@pytest.fixture(scope="module")
def no_gpu_report(external_traces):
    """A real trace with no name and no deviceProperties (DLRM on two A100s, HTA's test data)."""
    return build_report(DLRM)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_report_without_a_gpu_renders_in_every_format(no_gpu_report, fmt):
    rep = no_gpu_report
    assert rep.gpu is None and rep.candidates
    text = render(rep, fmt, color=False, width=400)
    if fmt in ("terminal", "markdown"):
        assert NO_GPU_LINE in text
        assert "Steps: " in text and "communication" in text  # shares, kinds and ranking still hold
    elif fmt == "json":
        data = json.loads(text)
        assert data["gpu"] is None
        assert data["notes"][0].startswith("GPU unknown (no name, no deviceProperties): no ceilings")
        assert "--gpu KEY" in data["notes"][0] and "H100-SXM" in data["notes"][0]
        assert data["source"]["gpu_unresolved"] == "no name, no deviceProperties"
        assert data["kind_breakdown"] and data["candidates"][0]["time_share"] > 0
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert len(rows) == len(rep.candidates) and rows[0]["id"] == rep.candidates[0].id
        assert all(r["headroom"] == "" and r["bound"] == "" for r in rows)  # no ceilings, no headroom
        assert float(rows[0]["time_share"]) == pytest.approx(rep.candidates[0].time_share, rel=1e-5)
    else:
        assert (
            'id="no-ceilings"' in text and "no ceilings: headroom and write/compile verdicts need one" in text
        )
        assert "kt-no-ceilings" in text and "unknown (no name, no deviceProperties)" in text
        assert text.count('<g id="kt-kind-') >= 2  # the time breakdown needs no ceiling
    assert all(c.verdict not in ("write", "compile") for c in rep.candidates)


def test_plot_without_a_gpu(no_gpu_report, tmp_path):
    from kerneltriage.render.roofline_chart import roofline_figure, save_roofline
    from kerneltriage.render.roofline_layout import roofline_data

    data = roofline_data(no_gpu_report)
    assert data.bandwidth_tbs is None and data.roofs == {} and data.ceilings.startswith("no ceilings")
    fig = roofline_figure(no_gpu_report)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("No roofs: the GPU is unknown") for t in texts)
    assert not any("roof " in t or "ceiling " in t for t in texts)  # no roof lines, no roof labels
    for suffix in (".png", ".svg"):
        path = save_roofline(no_gpu_report, tmp_path / f"roofline{suffix}")
        assert path.stat().st_size > 1000
    assert 'id="kt-no-ceilings"' in (tmp_path / "roofline.svg").read_text()


@corpus
def test_header_says_how_a_nameless_gpu_was_found():
    rep = build_report(VLLM)
    assert rep.gpu.key == "MI300X" and rep.gpu.resolved_by == "deviceProperties"
    lines = render(rep, "terminal", color=False, width=400).splitlines()
    assert lines[1].startswith("GPU: AMD Instinct MI300X — ceilings 4240 GB/s, 654 bf16, 114 fp32 TFLOP/s")
    assert lines[2] == "GPU row: inferred from deviceProperties: compute 9.4, 304 CUs, 192 GB → MI300X row"


def test_the_idle_headline_counts_every_gap_its_fix_covers(example_report):
    """The optimizer's for-loop spans mul_, addcdiv_, div and add_ gaps: one fix, their sum."""
    import copy

    from kerneltriage.analysis.model import Gap
    from kerneltriage.analysis.rules import load_rules
    from kerneltriage.analysis.triage import idle_by_class
    from kerneltriage.render.text import idle_headline

    report = copy.deepcopy(example_report)
    loop = "the optimizer's for-loop; fix: fused=True"
    report.gaps = [
        Gap("host busy: aten::mul_", 21.0, 391, 0.05, kind="host busy", fix=loop),
        Gap("host busy: aten::addcdiv_", 15.0, 192, 0.08, kind="host busy", fix=loop),
        Gap("host busy: aten::linear", 9.0, 10, 0.9, kind="host busy"),
    ]
    step = report.step_time_ms
    report.idle = idle_by_class(step, step - 45.0, None, report.gaps, 0.0, load_rules())
    text = idle_headline(report)
    assert "aten::mul_, aten::addcdiv_ (36.00 ms per step together) is the optimizer's for-loop" in text
    report.gaps = report.gaps[1:]
    assert "aten::addcdiv_ (15.00 ms per step) is the optimizer's for-loop" in idle_headline(report)


def test_a_skip_with_a_note_says_why_in_the_terminal():
    # ConvNeXt-T's LayerNorms are ATen's one kernel each, skipped as no fix of their own was
    # measured to take their headroom: the reader needs that note, not the bare code.
    from kerneltriage import api

    rep = api.report("examples/runs/convnext-t-h200")
    norm = next(c for c in rep.candidates if c.id == "C1")
    assert (norm.verdict, norm.reason) == ("skip", "already-fused")
    text = render(rep, "terminal", color=False, width=400)
    detail = text[text.index("C1  aten::layer_norm") :]
    assert "why        already-fused; aten::layer_norm is one fused kernel already" in detail
    assert "slowed BERT-base's" in detail and "fix  " not in detail.split("\n\n")[0]
