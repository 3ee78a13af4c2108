"""The Python API (README "Python API", docs/notebook.md) on the runs in examples/runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import kerneltriage
from kerneltriage.analysis import frames
from kerneltriage.analysis.model import KINDS
from kerneltriage.errors import InputError
from kerneltriage.render import render

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "examples" / "runs"
NAIVE = RUNS / "gpt-naive-h200"
SDPA = RUNS / "gpt-sdpa-h200"
DDP = RUNS / "gpt-ddp-2gpu-h200"


@pytest.fixture(scope="module")
def rep():
    return kerneltriage.report(NAIVE)


@pytest.fixture(scope="module")
def prof():
    return kerneltriage.load(NAIVE)


def test_report_is_the_clis_report(rep):
    assert isinstance(rep, kerneltriage.Report) and rep.rank == 0
    cli = json.loads(render(kerneltriage.api.build_report(NAIVE), "json"))
    assert json.loads(render(rep, "json")) == cli
    assert rep.candidates[0].id == "C1" and rep.candidates[0].kind == "attention"


def test_to_frame_is_the_candidates_table_with_the_jsons_names(rep):
    df = rep.to_frame()
    assert list(df.columns) == list(frames.CANDIDATE_COLUMNS)
    assert len(df) == len(rep.candidates)
    data = json.loads(render(rep, "json"))["candidates"]
    for row, c in zip(df.itertuples(index=False), data):
        row = row._asdict()
        for key in ("rank", "id", "name", "kind", "level", "verdict", "reason", "builtin", "module"):
            assert row[key] == c[key] or (pd.isna(row[key]) and c[key] is None), key
        for key in ("time_share", "time_ms_per_step", "expected_saving_share"):
            assert row[key] == pytest.approx(c[key], rel=1e-5)
        if c["headroom"] is None:
            assert pd.isna(row["headroom"])
        else:
            assert row["headroom"] == pytest.approx(c["headroom"], rel=1e-5)
        roof = c["roofline"]
        assert row["headroom_source"] == roof["source"]
        assert row["bound"] == roof["bound"] or (pd.isna(row["bound"]) and roof["bound"] is None)
        for key in ("ceiling_ms", "achieved_gbs", "achieved_tflops", "bytes", "flops"):
            assert (pd.isna(row[key]) and roof[key] is None) or row[key] == pytest.approx(roof[key], rel=1e-5)
        assert row["shapes_distinct"] == c["shapes"]["distinct"]
        assert row["ops"] == " → ".join(c["ops"])
        assert row["kernel_count"] == len(c["kernels"])
        assert row["headroom_passed"] == c["conditions"]["headroom"]["passed"]
    # one scalar per cell: nothing nested left for a spreadsheet
    assert not any(isinstance(v, (list, dict)) for v in df.to_numpy().ravel())
    c1 = df.iloc[0]
    assert c1.headroom_source == "fused estimate" and c1.shapes_distinct == 1 and c1.verdict == "use-builtin"
    assert c1.expected_saving_ms == pytest.approx(rep.candidates[0].expected_saving_ms)


def test_options_are_the_clis_flags():
    strict = kerneltriage.report(NAIVE, min_headroom=1000)
    assert set(strict.to_frame().verdict) == {"skip"} and strict.thresholds.min_headroom == 1000
    other = kerneltriage.report(NAIVE, gpu="H100-SXM")
    assert other.gpu.key == "H100-SXM"
    with pytest.raises(InputError, match="not in the GPU table"):
        kerneltriage.report(NAIVE, gpu="Voodoo5")
    with pytest.raises(InputError, match=r"rank\(s\) 3 not in the run directory \(it has 0\)"):
        kerneltriage.report(NAIVE, rank=3)


def test_kernels_table(prof, rep):
    k = prof.kernels
    assert list(k.columns) == list(frames.KERNEL_COLUMNS)
    tl = prof.loaded.timelines[0]
    assert len(k) == len(tl.kernels) and set(k["rank"]) == {0}
    assert k.dur_us.sum() == pytest.approx(tl.kernels["dur"].sum() / 1e3)
    assert k.start_us.is_monotonic_increasing and k.start_us.min() >= 0
    steps = k[k.step >= 0]
    assert set(steps.step) == set(range(rep.steps))
    assert set(steps.phase) <= {"fwd", "bwd", "opt", "none"} and {"fwd", "bwd", "opt"} <= set(steps.phase)
    # the class is the rules' kind of the kernel: cuBLAS GEMMs are gemm, copies memcpy
    assert set(k["class"]) <= set(KINDS)
    assert (k.loc[k.name.str.startswith("nvjet"), "class"] == "gemm").all()
    assert (k.loc[k.kind != "kernel", "class"] == "memcpy").all() and (k.kind != "kernel").any()
    gemm = steps[steps["class"] == "gemm"]
    fwd, bwd = gemm[gemm.phase == "fwd"], gemm[gemm.phase == "bwd"]
    assert len(fwd) and fwd.op.str.startswith("aten::").all()  # aten::linear, not aten::mm
    assert len(bwd) and bwd.op.str.contains("Backward").all()
    assert gemm.module.notna().any() and gemm.module.dropna().str.contains(":").all()  # path:Class


def test_ops_table(prof):
    ops = prof.ops
    assert list(ops.columns) == list(frames.OP_COLUMNS)
    k = prof.kernels
    # every kernel launched by a top-level op is counted once, in that op's row
    assert ops.kernels.sum() == (k.op != "").sum()
    assert ops.gpu_us.sum() == pytest.approx(k.loc[k.op != "", "dur_us"].sum())
    linear = ops[(ops.name == "aten::linear") & (ops.step == 0)]
    assert len(linear) and (linear.phase == "fwd").all() and (linear.gpu_us > 0).all()
    assert linear.input_shapes.iloc[0].startswith("4x2048x")
    backward = ops[ops.phase == "bwd"]
    assert len(backward) and (backward.forward_op != "").mean() > 0.9  # differentiates a forward op
    assert "aten::linear" in set(backward.forward_op)


def test_profile_reports_reuse_what_was_read(prof, rep):
    again = prof.report()
    assert [c.id for c in again.candidates] == [c.id for c in rep.candidates]
    assert prof.ranks == [0] and prof.default_rank == 0
    with pytest.raises(InputError, match=r"rank 2 is not in the profile \(it has 0\)"):
        prof.report(2)


def test_several_ranks():
    one = kerneltriage.report(DDP)
    assert one.rank == 0 and one.join is not None  # the rank Nsight Compute profiled
    reps = kerneltriage.reports(DDP, ranks=[1])
    assert list(reps) == [1] and reps[1].rank == 1 and reps[1].join is None  # no counters there
    assert reps[1].step_time_ms != pytest.approx(one.step_time_ms)
    prof = kerneltriage.load(DDP)
    assert prof.ranks == [0, 1] and prof.default_rank == 0
    assert set(prof.kernels["rank"]) == {0, 1} and set(prof.ops["rank"]) == {0, 1}
    per_rank = prof.kernels[prof.kernels.step >= 0].groupby("rank").size()
    assert per_rank[0] > 100 and per_rank[1] > 100
    nccl = prof.kernels[prof.kernels["class"] == "communication"]
    assert len(nccl) and nccl.name.str.startswith("ncclDevKernel").all() and set(nccl["rank"]) == {0, 1}


def test_diff():
    d = kerneltriage.diff(NAIVE, SDPA)
    assert isinstance(d, kerneltriage.Diff)
    df = d.to_frame()
    assert list(df.columns) == list(frames.DIFF_COLUMNS) and len(df) == len(d.candidates)
    attention = df[df.kind == "attention"].iloc[0]
    assert attention.ids_before == "C1"
    assert attention.realized_saving_share > 0.5 and attention.predicted_saving_share > 0.5
    assert d.to_json()["schema"] == "kerneltriage.diff/1"


def test_importing_and_reporting_need_no_torch():
    code = (
        "import sys, kerneltriage\n"
        "assert 'pandas' not in sys.modules\n"
        f"rep = kerneltriage.report({str(NAIVE)!r})\n"
        "rep.to_frame()\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'torch imported'\n"
        "print(rep.candidates[0].id)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "C1"


def test_report_is_the_api_function_and_no_module_swaps_its_class():
    """``kerneltriage.report`` is ``kerneltriage.api.report`` whichever renderers are loaded, and
    every kerneltriage module is a plain module."""
    import importlib
    import types

    from kerneltriage import api

    importlib.import_module("kerneltriage.render.html")
    assert kerneltriage.report is api.report
    loaded = [m for name, m in sys.modules.items() if name.partition(".")[0] == "kerneltriage"]
    assert loaded and all(type(m) is types.ModuleType for m in loaded)


BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_the_notebook_page_runs(tmp_path, monkeypatch, capsys):
    """Every python block of docs/notebook.md, in order, in one namespace, from a folder that
    holds the repository's examples (as a notebook opened at the repository's root)."""
    blocks = BLOCK.findall((ROOT / "docs" / "notebook.md").read_text())
    assert len(blocks) >= 10
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/notebook.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "C1 attention (naive, causal)" in out
    assert "headroom   pass" in out
    actionable = [c.id for c in namespace["rep"].candidates if c.verdict != "skip"]
    assert len(actionable) >= 3 and sorted(namespace["actionable"].id) == sorted(actionable)
    assert set(namespace["actionable"].verdict) == {"use-builtin"}
    assert namespace["rep_h100"].gpu.key == "H100-SXM"
    assert sorted(namespace["reps"]) == [0, 1]
    assert namespace["d"].to_frame().realized_saving_share.iloc[0] > 0.5
