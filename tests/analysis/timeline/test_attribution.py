"""Attribution on the real capture: steps by launch, ops, backward → forward, carried-over work."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from kerneltriage.analysis.timeline.attribution import attribute, find_steps
from kerneltriage.ingest.kineto import read_trace
from tests.helpers import EXTERNAL, corpus, raw_trace, timeline, write_trace


@pytest.fixture(scope="module")
def attr():
    return attribute(timeline())


def test_active_steps_are_the_two_profiler_steps(attr):
    assert attr.step_source == "ProfilerStep"
    assert [s.name for s in attr.steps] == ["ProfilerStep#2", "ProfilerStep#3"]
    raw = {e["name"]: e for e in raw_trace()["traceEvents"] if e.get("cat") == "user_annotation"}
    assert attr.steps[0].start == round(raw["ProfilerStep#2"]["ts"] * 1000)
    assert attr.steps[0].dur == round(raw["ProfilerStep#2"]["dur"] * 1000)


def test_kernels_are_assigned_by_launch_not_by_run_time(attr):
    k = attr.kernels
    # The warm-up step's 400 activities run inside ProfilerStep#2's window but were launched
    # before it: they have no launch record and belong to no step.
    carried = k[k["launch_start"] < 0]
    assert len(carried) == 400
    assert (carried["step"] == -1).all()
    assert attr.carried_over_ns == int(carried["dur"].sum())
    assert any("launched before the profiled window" in w for w in attr.warnings)
    # Every step launched the same 510 activities.
    assert k[k["step"] >= 0].groupby("step").size().tolist() == [510, 510]


def test_every_in_step_kernel_reaches_a_forward_op(attr):
    k = attr.kernels[attr.kernels["step"] >= 0]
    assert (k["op"] >= 0).all()
    assert (k.loc[k["phase"] != "opt", "fwd_root"] >= 0).all()


def test_backward_kernels_map_to_the_forward_op(attr):
    tl = timeline()
    names = tl.cpu["name"].astype(str)
    k = attr.kernels
    softmax_bwd = k[k["name"].str.contains("SoftMaxBackward") & (k["step"] >= 0)]
    assert len(softmax_bwd) > 0
    assert (softmax_bwd["phase"] == "bwd").all()
    assert set(names[softmax_bwd["fwd_root"]]) <= {"aten::softmax", "aten::cross_entropy_loss"}
    # The top-level op, not the innermost: the projection GEMMs belong to aten::linear.
    nvjet_fwd = k[k["name"].str.startswith("nvjet") & (k["phase"] == "fwd") & (k["step"] >= 0)]
    assert set(names[nvjet_fwd["root"]]) == {"aten::linear", "aten::matmul"}


def test_optimizer_kernels_are_their_own_phase(attr):
    k = attr.kernels
    opt = k[(k["phase"] == "opt") & (k["step"] >= 0)]
    assert len(opt) == 14
    assert opt["name"].str.contains("multi_tensor_apply").all()


def _without(data: dict, prefix: str) -> dict:
    data = copy.deepcopy(data)
    data["traceEvents"] = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith(prefix)]
    return data


def test_optimizer_steps_when_there_is_no_profiler_step(tmp_path):
    data = _without(raw_trace(), "ProfilerStep")
    # The capture's last optimizer range is still open (finished: false). Close it with the
    # duration of the previous optimizer step so that two finished ranges bound one step.
    opts = [
        e
        for e in data["traceEvents"]
        if e.get("name") == "Optimizer.step#AdamW.step" and e.get("cat") == "user_annotation"
    ]
    assert [e["args"].get("finished", True) for e in opts] == [True, False]
    opts[1]["args"].pop("finished")
    opts[1]["dur"] = opts[0]["dur"]
    steps, source, _ = find_steps(read_trace(write_trace(tmp_path / "opt.json.gz", data)))
    assert source == "optimizer steps" and len(steps) == 1
    ends = [round(e["ts"] * 1000) + round(e["dur"] * 1000) for e in opts]
    assert (steps[0].start, steps[0].end) == (ends[0], ends[1])


def test_whole_trace_when_no_step_is_marked(tmp_path):
    data = _without(raw_trace(), "ProfilerStep")
    steps, source, warnings = find_steps(read_trace(write_trace(tmp_path / "noprof.json.gz", data)))
    # One finished optimizer range is not enough to bound a step; the open one is said.
    assert source == "whole trace" and len(steps) == 1
    assert any("still open" in w for w in warnings)
    assert any("whole trace is one step" in w for w in warnings)


def test_kerneltriage_step_ranges(tmp_path):
    data = copy.deepcopy(raw_trace())
    for e in data["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep") or str(e.get("name", "")).startswith(
            "Optimizer.step"
        ):
            e["name"] = "kerneltriage.step" if e["name"].startswith("ProfilerStep") else "renamed"
    steps, source, _ = find_steps(read_trace(write_trace(tmp_path / "kt.json.gz", data)))
    assert source == "kerneltriage.step" and len(steps) == 2


def test_step_marker_overrides(tmp_path):
    steps, source, _ = find_steps(timeline(), marker=r"^Optimizer\.zero_grad")
    assert source.startswith("--step-marker") and len(steps) == 2
    assert all(s.dur < 1_000_000 for s in steps)  # zero_grad ranges are short


# --- Traces nobody here made (the corpus: tests/helpers.py, read in place) ---------------------

PT19 = EXTERNAL / "kineto-resnet50-v100-pt19" / "worker0.1623143089861.pt.trace.json.gz"
MINITOY = EXTERNAL / "hta-minitoy-mi250-rocm62" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"


@functools.cache
def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@functools.cache
def _external(path: Path):
    assert path.is_file(), f"{path} missing"
    tl = read_trace(path)
    return tl, attribute(tl)


@corpus
def test_pytorch_1_9_profiler_steps_are_steps_in_any_category():
    """PyTorch 1.9 writes ProfilerStep#N (and every record_function range) as category
    "Operator". They are the steps, never ops: all six of the file's ranges, in order. (HTA
    0.5.0 counts 5: it drops the last step by design, include_last_profiler_step=False.)"""
    events = _events(PT19)
    ranges = sorted(
        (e for e in events if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))), key=lambda e: e["ts"]
    )
    assert {e["cat"] for e in ranges} == {"Operator"}
    tl, attr = _external(PT19)
    assert attr.step_source == "ProfilerStep"
    assert [s.name for s in attr.steps] == [e["name"] for e in ranges]
    assert len(attr.steps) == 6
    assert [s.dur for s in attr.steps] == [round(e["dur"] * 1000) for e in ranges]
    # No kernel's op or top-level op is a ProfilerStep, an optimizer or a data-loader range.
    names = tl.cpu["name"].astype(str).to_numpy()
    k = attr.in_steps()
    for column in ("op", "root", "fwd_root"):
        rows = k.loc[k[column] >= 0, column].to_numpy()
        assert not any(
            re.match(r"ProfilerStep#|Optimizer\.|enumerate\(DataLoader\)", n) for n in set(names[rows])
        )


@corpus
def test_pytorch_1_9_backward_and_optimizer_phases():
    """Old-format backward top-level ops are the autograd nodes themselves (CudnnConvolutionBackward
    on the backward thread); their kernels reach the forward op through the sequence number.
    Optimizer.step#SGD.step and Optimizer.zero_grad#SGD.zero_grad are ranges around the
    optimizer's kernels."""
    tl, attr = _external(PT19)
    k = attr.in_steps()
    names = tl.cpu["name"].astype(str).to_numpy()
    bwd = k[k["phase"] == "bwd"]
    assert len(bwd) > 1000
    assert set(names[bwd["root"]]) <= {
        n
        for n in set(names)
        if n.endswith(("Backward", "Backward0", "Backward1")) or n == "torch::autograd::AccumulateGrad"
    }
    # Every backward kernel but AccumulateGrad's (no forward op) reaches a forward aten op.
    mapped = bwd[names[bwd["root"]] != "torch::autograd::AccumulateGrad"]
    assert (mapped["fwd_root"] >= 0).all()
    assert set(names[mapped["fwd_root"]]) >= {"aten::conv2d", "aten::batch_norm", "aten::linear"}
    # Optimizer kernels: exactly the kernels launched inside the Optimizer.* ranges.
    events = _events(PT19)
    opt_ranges = [
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000))
        for e in events
        if re.match(r"Optimizer\.(step|zero_grad)#", str(e.get("name", "")))
    ]
    launch = k["launch_start"].to_numpy()
    inside = np.zeros(len(k), dtype=bool)
    for a, b in opt_ranges:
        inside |= (launch >= a) & (launch < b)
    assert inside.sum() > 0
    assert ((k["phase"] == "opt").to_numpy() == inside).all()


@corpus
def test_a_stub_profiler_step_is_dropped():
    """The MI250 toy trace ends with a 49 µs ProfilerStep#2 opened just before the profiler
    stopped: under a tenth of the median, it is a stub, not a step. The step time is then
    ProfilerStep#1's (HTA: 9.29 ms)."""
    ranges = {
        e["name"]: e
        for e in _events(MINITOY)
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep")
    }
    assert set(ranges) == {"ProfilerStep#1", "ProfilerStep#2"}
    assert ranges["ProfilerStep#2"]["dur"] < 0.1 * ranges["ProfilerStep#1"]["dur"]
    _, attr = _external(MINITOY)
    assert [s.name for s in attr.steps] == ["ProfilerStep#1"]
    assert any("ProfilerStep#2" in w and "stub" in w for w in attr.warnings)
    from kerneltriage.analysis.triage import step_walls

    walls = step_walls(attr)
    assert len(walls) == 1 and walls[0] >= round(ranges["ProfilerStep#1"]["dur"] * 1000)
    assert np.mean(walls) / 1e6 == pytest.approx(9.29, abs=0.01)  # HTA's iteration time
