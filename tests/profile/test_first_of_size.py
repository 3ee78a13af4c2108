"""The ncu process's range around the first call of each op signature (first_of_size.py), on
CPU: which ops it takes, forward and backward, that the model's math is unchanged, and the
runner's ncu pass that uses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltriage import rundir
from kerneltriage.profile import first_of_size as fos
from kerneltriage.profile.step_plan import TAKE_RANGE
from tests.helpers import ncu_runner_config, nvtx_shim

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in range(3)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 4))


def _step(model: torch.nn.Module) -> list[torch.Tensor]:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    model.zero_grad()
    model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def _step_under(mode: fos.FirstOfSize, model: torch.nn.Module) -> list[torch.Tensor]:
    """One step with ``mode`` on; its gradients."""
    mode.start()
    try:
        return _step(model)
    finally:
        mode.stop()


class _Ranges:
    def __init__(self) -> None:
        self.open: list[int] = []
        self.names: list[str] = []

    def start(self, name: str) -> int:
        self.names.append(name)
        self.open.append(len(self.names))
        return self.open[-1]

    def end(self, handle: int) -> None:
        self.open.remove(handle)


def test_identical_layers_are_taken_once_forward_and_backward():
    model = _model()
    plain = _step(model)
    ranges = _Ranges()
    take = fos.FirstOfSize(torch, ranges.start, ranges.end)
    marked = _step_under(take, model)
    # The math is the model's own.
    assert all(torch.equal(a, b) for a, b in zip(plain, marked))
    assert take.status()["mode"] == "first-of-size"
    ops = {key[0] for key in take.seen}
    # The backward ran on the autograd engine's thread, under the same mode.
    assert any("threshold_backward" in op for op in ops) and any("addmm" in op for op in ops)
    # Three identical layers: their ops are taken once; every taken op had a range of its own.
    assert take.taken == len(take.seen) == len(ranges.names) and not ranges.open
    assert set(ranges.names) == {TAKE_RANGE}
    assert take.calls >= 2 * take.taken
    addmm = [key for key in take.seen if "addmm" in key[0]]
    assert len(addmm) == 2  # the 16 -> 16 layers' (one signature) and the 16 -> 4 head's
    # Another step under a fresh mode takes the same ops again.
    again = fos.FirstOfSize(torch, ranges.start, ranges.end)
    again.start()
    _step(model)
    again.stop()
    assert again.seen == take.seen


def test_a_compiled_program_takes_its_whole_step(monkeypatch):
    # Dynamo runs compiled code eagerly under a dispatch mode: a process that compiled takes
    # its whole step in one range instead, and says so.
    monkeypatch.setattr(fos, "dynamo_graphs", lambda: 2)
    ranges = _Ranges()
    take = fos.FirstOfSize(torch, ranges.start, ranges.end)
    take.start()
    _step(_model())
    assert ranges.open == [1]
    take.stop()
    assert not ranges.open and ranges.names == [TAKE_RANGE]
    assert take.status() == {"mode": "step", "ops": 0, "taken": 0, "trim": False}


def test_the_runner_takes_the_first_of_each_size_in_its_ncu_step(tmp_path):
    # The runner, in an ncu process of the every-launch pass, on a real training script (tiny
    # GPT on CPU): NVTX is recorded by a shim, as the CPU build of torch has none.
    log = tmp_path / "nvtx.txt"
    shim = nvtx_shim(tmp_path / "shim.py", repr(str(log)))
    out = tmp_path / "run"
    config = ncu_runner_config(out, ncu_take="first-of-size")
    env = dict(os.environ, KERNELTRIAGE_PROFILE=str(config), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "kerneltriage.profile.runner", str(shim)]
    proc = subprocess.run(
        [*cmd, "--tiny", "--device", "cpu", "--steps", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = json.loads((out / rundir.LOGS / "status.ncu.rank0.json").read_text())
    take = status["ncu_take"]
    assert take["mode"] == "first-of-size"
    # The tiny GPT's layers repeat: most op calls of the step are a size seen before.
    assert 0 < take["taken"] < take["ops"] / 2
    lines = log.read_text().splitlines()
    assert lines[0] == "start kerneltriage.ncu"
    assert lines.count(f"start {TAKE_RANGE}") == take["taken"]
    assert lines.count("end") == take["taken"] + 1


def test_trim_empties_the_cache_before_each_new_signature_and_takes_no_range(monkeypatch):
    # Every ncu pass trims the step's GPU memory (kernel replay saves and restores all of it)
    # before the first call of each op signature, the calls that launch what ncu has not yet
    # profiled; a repeated call needs none. The per-configuration pass takes no range of its own.
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    model = _model()
    plain = _step(model)
    ranges = _Ranges()
    trim = fos.FirstOfSize(torch, ranges.start, ranges.end, take=False, trim=True)
    trimmed = _step_under(trim, model)
    assert all(torch.equal(a, b) for a, b in zip(plain, trimmed))
    # The three hidden layers repeat: their later calls (forward and backward) are not trimmed.
    assert 0 < len(emptied) == trim.trims < trim.calls and not ranges.names
    assert trim.status() == {"mode": "trim", "ops": trim.calls, "taken": 0, "trim": True, "trims": trim.trims}
    # Both at once (the every-launch pass): the calls trimmed are the calls taken.
    emptied.clear()
    both = fos.FirstOfSize(torch, ranges.start, ranges.end, take=True, trim=True)
    both.start()
    _step(model)
    both.stop()
    assert len(emptied) == both.taken == len(ranges.names) > 0
    assert len(emptied) == trim.trims


def test_trim_leaves_a_cuda_graph_capture_alone(monkeypatch):
    # Freeing memory while a stream captures a CUDA graph is an error: no trim then.
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    trim = fos.FirstOfSize(torch, take=False, trim=True)
    trim.start()
    try:
        _step(_model())
    finally:
        trim.stop()
    assert trim.calls > 0 and not emptied


def test_skipped_ops_are_named_as_the_trace_names_them(tmp_path):
    # The per-configuration pass leaves out the calls of op keys chosen from phase 1's trace
    # (one_size.py): the process must name an op call as the trace's Input Dims do.
    from kerneltriage.analysis.timeline.one_size import op_key
    from kerneltriage.profile.step_plan import SKIP_RANGE

    model = _model()
    plain = _step(model)
    trace = tmp_path / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(model)
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    keys = {
        op_key(e["name"], e["args"]["Input Dims"])
        for e in events
        if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})
    }
    skip = {k for k in keys if k[0] in ("aten::addmm", "aten::threshold_backward")}
    # Two sizes of addmm (the 16 -> 16 layers', the head's), one of threshold_backward.
    assert len(skip) == 3, sorted(skip)
    ranges = _Ranges()
    leave = fos.FirstOfSize(torch, ranges.start, ranges.end, take=False, skip=skip)
    left_out = _step_under(leave, model)
    assert all(torch.equal(a, b) for a, b in zip(plain, left_out))
    # Four linear layers forward (addmm), three ReLUs backward: each call in a range of its own.
    assert leave.skipped == 7 == len(ranges.names) and set(ranges.names) == {SKIP_RANGE}
    assert not ranges.open and leave.status()["skipped"] == 7
