"""``kerneltriage calibrate --run``: the run's GEMM shapes (pure, from the shipped H100 run's
trace), the best shape per precision, and recording into a run's manifest. The measurement
itself needs a GPU (benchmarks/calibrate_run.sh; figures in BENCHMARKS.md)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage import rundir
from kerneltriage.analysis.gpus import resolve_gpu
from kerneltriage.cli import main
from kerneltriage.ingest.source import load_profile
from kerneltriage.profile import calibrate as cal

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"
EAGER = RUNS / "gpt2-eager-h100"  # GPT-2 124M: d 768, 4·d MLP, vocab 50304, 8 × 1024 tokens, bf16


@pytest.fixture(scope="module")
def eager_timeline():
    profile = load_profile(EAGER)
    return profile.timelines[0]


def test_the_runs_gemm_shapes_are_its_linears_forward_and_backward(eager_timeline):
    shapes = cal.gemm_shapes(eager_timeline)
    assert 0 < len(shapes) <= cal.RUN_SHAPES
    assert all(s.precision == "bf16" and s.batch == 1 and s.count > 0 for s in shapes)
    # most FLOPs over the run first
    totals = [s.flops * s.count for s in shapes]
    assert totals == sorted(totals, reverse=True)
    mnk = {(s.m, s.n, s.k) for s in shapes}
    tokens, d, vocab = 8 * 1024, 768, 50304
    assert (tokens, d, 4 * d) in mnk  # MLP down projection, forward
    assert (tokens, 4 * d, d) in mnk  # MLP up projection, forward
    assert (tokens, vocab, d) in mnk  # LM head, forward
    assert (tokens, d, vocab) in mnk  # LM head, backward dX
    assert (vocab, d, tokens) in mnk  # LM head, backward dW
    assert shapes[0].label == "8192x768x3072"
    # all shapes, not only the first eight, are the model's
    every = cal.gemm_shapes(eager_timeline, limit=100)
    dims = {d, 3 * d, 4 * d, vocab, tokens}
    assert all({s.m, s.n, s.k} <= dims for s in every)


def test_autocast_float_linears_are_not_tensor_core_shapes(eager_timeline):
    # Under autocast aten::linear records float inputs before the cast; its bf16 mm is the GEMM.
    cpu = eager_timeline.cpu
    linear = cpu[cpu["name"] == "aten::linear"]
    floats = [i for i in linear["types"].unique() if "float" in (eager_timeline.arg(int(i)) or [])]
    assert floats  # the trace has them
    assert all(s.precision in ("bf16", "fp16_tensor") for s in cal.gemm_shapes(eager_timeline, limit=100))


@pytest.mark.parametrize(
    ("name", "dims", "expected"),
    [
        ("aten::linear", [[8, 1024, 768], [2304, 768], []], (1, 8192, 2304, 768)),
        ("aten::mm", [[8192, 768], [768, 3072]], (1, 8192, 3072, 768)),
        ("aten::addmm", [[3072], [8192, 768], [768, 3072], [], []], (1, 8192, 3072, 768)),
        ("aten::bmm", [[64, 2048, 64], [64, 64, 2048]], (64, 2048, 2048, 64)),
        ("aten::baddbmm", [[64, 2048, 2048], [64, 2048, 64], [64, 64, 2048], [], []], (64, 2048, 2048, 64)),
        ("aten::matmul", [[4, 2048, 1024], [1024, 32000]], (1, 8192, 32000, 1024)),
        ("aten::matmul", [[4, 16, 2048, 64], [4, 16, 64, 2048]], (64, 2048, 2048, 64)),
        ("aten::mm", [[8192, 768]], None),
        ("aten::matmul", [[768], [768]], None),
    ],
)
def test_shapes_of_each_gemm_op(name, dims, expected):
    assert cal._mnk(name, dims) == expected


def test_the_best_shape_sets_the_peak():
    result = {
        "matmul": [
            {"precision": "bf16", "shape": "8192x8192x8192", "tflops": 680.0, "from": "standard"},
            {"precision": "bf16", "shape": "8192x768x3072", "tflops": 693.4, "from": "run"},
            {"precision": "tf32", "shape": "4096x4096x4096", "tflops": 364.9, "from": "standard"},
        ]
    }
    best = cal.best_shapes(result)
    assert best["bf16"]["shape"] == "8192x768x3072" and best["tf32"]["tflops"] == 364.9


def _run_copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(EAGER / rundir.MANIFEST, run / rundir.MANIFEST)
    return run


def test_recorded_in_the_run_only_for_its_gpu(tmp_path):
    run = _run_copy(tmp_path)
    gpu = json.loads((run / rundir.MANIFEST).read_text())["gpu"]["name"]
    other = {"gpu": "NVIDIA H200", "peak_tflops": {"bf16": 860.0}, "hbm_gbs": 4300.0}
    assert "it ran on NVIDIA H100 80GB HBM3" in cal.record_in_run(run, other)
    assert rundir.read_manifest(run).calibration == {}
    mine = {"gpu": gpu, "date": "2026-11-22", "peak_tflops": {"bf16": 738.9, "fp32": 65.7}, "hbm_gbs": 2998.3}
    assert "its report uses these ceilings" in cal.record_in_run(run, mine)
    manifest = rundir.read_manifest(run)
    assert manifest.calibration == mine and manifest.command  # the rest is kept
    spec = resolve_gpu(gpu, None, manifest.calibration)
    assert spec.resolved_by == "calibration" and spec.ceiling_tflops["bf16"] == 738.9
    assert "not a run directory" in cal.record_in_run(EAGER / rundir.TRACE, mine)


def test_cli_calibrate_run_needs_a_gpu(tmp_path, monkeypatch):
    """Without CUDA, `calibrate --run` is a one-line error after reading the run's shapes."""
    import types

    # A torch that sees no GPU (on any machine; importing the real one costs seconds here).
    no_gpu = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", no_gpu)
    had_testing = "triton.testing" in sys.modules
    seen = {}
    real = cal.gemm_shapes

    def spy(timeline, limit=cal.RUN_SHAPES):
        seen["shapes"] = real(timeline, limit)
        return seen["shapes"]

    monkeypatch.setattr(cal, "gemm_shapes", spy)
    result = CliRunner().invoke(main, ["calibrate", "--run", str(EAGER)])
    assert result.exit_code != 0
    assert "calibrate needs a CUDA GPU" in result.output and "Traceback" not in result.output
    assert seen["shapes"][0].label == "8192x768x3072"
    # it stopped before importing triton.testing (which would have kept the stand-in torch)
    assert ("triton.testing" in sys.modules) == had_testing
    help_text = CliRunner().invoke(main, ["calibrate", "--help"]).output
    assert "--run" in help_text and "kerneltriage calibrate --run runs/exp1" in help_text
