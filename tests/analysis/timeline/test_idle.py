"""GPU idle time and its causes on traces nobody here made (../shared/external-traces, in place).

Expected values come from the trace files themselves (read with the json module) or from HTA's
figures for the same files (benchmarks/results/validation/hta_summary.md).
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kerneltriage.analysis.model import Gap
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute, step_windows
from kerneltriage.analysis.timeline.idle import (
    AFTER_LAST,
    BEFORE_FIRST,
    COMMUNICATION,
    DATA_LOADING,
    DEPENDENCY,
    HOST_BUSY,
    HOST_SYNC,
    STALL,
    IdleFound,
    find_idle,
    idle_gaps,
    unlaunched_busy_ns,
)
from kerneltriage.analysis.triage import idle_by_class, step_walls
from kerneltriage.ingest.kineto import read_trace
from kerneltriage.ingest.tables import CPU_COLUMNS, frame
from tests.helpers import EXTERNAL, corpus, write_trace

QWEN = EXTERNAL / "tracelens-qwen05b-h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
TIMESFORMER = (
    EXTERNAL / "tracelens-timesformer-h100" / "facebook_timesformer-base-finetuned-k400__1016002.json.gz"
)
PT19 = EXTERNAL / "kineto-resnet50-v100-pt19" / "worker0.1623143089861.pt.trace.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
MIN_GAP_NS = 20_000
# HTA 0.5.0 with HTA_DISABLE_NS_ROUNDING=1 on the qwen trace (hta_summary.md): idle 8.07% of
# the span from the first to the last GPU event.
HTA_QWEN_IDLE_PCT = 8.07


@functools.cache
def _events(path: Path) -> list[dict]:
    assert path.is_file(), f"{path} missing"
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@functools.cache
def _analysed(path: Path):
    tl = read_trace(path)
    attr = attribute(tl)
    busy, gaps = idle_gaps(attr, tl, MIN_GAP_NS)
    walls = step_walls(attr)
    return tl, attr, busy, gaps, walls


def _idle_pct(busy: int, walls: list[int]) -> float:
    return 100.0 * (1.0 - busy / sum(walls))


@corpus
def test_windows_are_the_step_walls():
    _, attr, _, _, walls = _analysed(QWEN)
    assert [b - a for a, b in step_windows(attr.steps, attr.kernels)] == walls


@corpus
def test_kernels_launched_before_the_window_keep_the_gpu_busy():
    """509 GPU activities (13.7 ms) of the qwen trace were launched before the profiled window
    and run inside its one step. The GPU is busy then: counting them, idle is near HTA's 8%,
    not the 32% of counting only the step's own launches."""
    events = _events(QWEN)
    launched = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    before = [e for e in events if e.get("cat") in GPU_CATS and e["args"].get("correlation") not in launched]
    assert len(before) == 509
    _, attr, busy, _, walls = _analysed(QWEN)
    warning = next(w for w in attr.warnings if "launched before the profiled window" in w)
    assert f"{len(before)} GPU activities ({sum(e['dur'] for e in before) / 1e3:.1f} ms)" in warning
    idle = _idle_pct(busy, walls)
    assert idle == pytest.approx(HTA_QWEN_IDLE_PCT, abs=2.0)
    # Without them (the step's own launches only), the same step looks host-bound.
    k = attr.in_steps()
    own = _union_ns(k["start"].to_numpy(), (k["start"] + k["dur"]).to_numpy())
    assert _idle_pct(own, walls) > 25.0
    # Their busy time, for a breakdown: the part of the 13.7 ms inside the step's wall.
    ((w0, w1),) = step_windows(attr.steps, attr.kernels)
    clipped = [(max(round(e["ts"] * 1000), w0), min(round((e["ts"] + e["dur"]) * 1000), w1)) for e in before]
    expected = _union_ns(
        np.array([a for a, b in clipped if b > a]), np.array([b for a, b in clipped if b > a])
    )
    assert unlaunched_busy_ns(attr) == pytest.approx(expected, abs=len(before))  # ns rounding


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    total, reach = 0, None
    for s, e in sorted(zip(starts.tolist(), ends.tolist())):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


@corpus
def test_host_time_before_the_first_kernel_is_named():
    """timesformer's one step spends ~218 ms on the CPU (video preprocessing) before its first
    kernel: the idle explanation says so, with the ops the host ran then."""
    events = _events(TIMESFORMER)
    step = next(
        e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep")
    )
    first = min(e["ts"] for e in events if e.get("cat") in GPU_CATS)
    head_ms = (first - step["ts"]) / 1e3
    assert head_ms >= 200
    # The top-level CPU op that covers most of that time, from the raw events.
    ops = [
        e for e in events if e.get("cat") == "cpu_op" and e["ts"] < first and e["ts"] + e["dur"] > step["ts"]
    ]
    longest = max(ops, key=lambda e: min(e["ts"] + e["dur"], first) - max(e["ts"], step["ts"]))
    _, _, busy, gaps, walls = _analysed(TIMESFORMER)
    head = next(g for g in gaps if g.cause.startswith(BEFORE_FIRST))
    assert head.ms_per_step == pytest.approx(head_ms, abs=0.01)
    assert head is gaps[0]
    assert longest["name"] in head.cause
    assert "in no profiled op" in head.cause  # most of it is Python, which no op covers
    assert any(g.cause.startswith(AFTER_LAST) for g in gaps)
    # The edges and the gaps between kernels add up to the step's idle time.
    idle_ms = (sum(walls) - busy) / 1e6
    assert sum(g.ms_per_step for g in gaps) == pytest.approx(idle_ms, rel=0.01)


@corpus
def test_python_frames_name_the_host_time_when_the_trace_has_them():
    """The reader leaves Python frames out today; when a timeline holds them (cat
    python_function), the edge names the innermost frame that covers most of the time no op
    covers. Here the frames are the trace's own, added from the raw events."""
    events = _events(TIMESFORMER)
    tl = read_trace(TIMESFORMER)
    py = [e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"]
    rows = {
        "name": [e["name"] for e in py],
        "cat": ["python_function"] * len(py),
        "start": [round(e["ts"] * 1000) for e in py],
        "dur": [round(e["dur"] * 1000) for e in py],
        "pid": [int(e["pid"]) for e in py],
        "tid": [int(e["tid"]) for e in py],
        "finished": [True] * len(py),
    }
    tl.cpu = pd.concat([tl.cpu, frame(rows, CPU_COLUMNS)], ignore_index=True)
    attr = attribute(tl)
    _, gaps = idle_gaps(attr, tl, MIN_GAP_NS)
    head = next(g for g in gaps if g.cause.startswith(BEFORE_FIRST))
    named = [n for n in {e["name"] for e in py} if f"Python {n} " in head.cause]
    assert len(named) == 1
    named = named[0]
    step = next(
        e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep")
    )
    first = min(e["ts"] for e in events if e.get("cat") in GPU_CATS)
    covered = sum(
        max(0.0, min(e["ts"] + e["dur"], first) - max(e["ts"], step["ts"])) for e in py if e["name"] == named
    )
    assert covered >= 0.5 * (first - step["ts"]) * 0.9  # most of the 218 ms
    # Deeper than the pipeline's entry point: a frame that starts after the step does.
    assert min(e["ts"] for e in py if e["name"] == named) > step["ts"]


@corpus
def test_profiler_steps_are_never_an_idle_cause():
    """PyTorch 1.9 writes ProfilerStep#N as an op-like "Operator" event; the biggest gaps were
    blamed on "host busy: ProfilerStep#9". A step range is the step, not what the host did."""
    _, attr, _, gaps, _ = _analysed(PT19)
    assert len(attr.steps) == 6
    assert gaps and not any("ProfilerStep" in g.cause for g in gaps)


# --- Cause classes, on small traces built here: each gap is made by one known host activity ---


class _Trace:
    """A kineto trace of ``steps`` ProfilerSteps of 1 ms (µs timestamps), one CPU thread."""

    def __init__(self, steps: int = 3):
        self.events: list[dict] = [
            self._event(f"ProfilerStep#{i}", "user_annotation", i * 1000, 1000) for i in range(steps)
        ]
        self.correlation = 0

    @staticmethod
    def _event(name: str, cat: str, ts: float, dur: float, **args) -> dict:
        gpu = cat in GPU_CATS
        return {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": ts,
            "dur": dur,
            "pid": 0 if gpu else 100,
            "tid": 7 if gpu else 1,
            "args": args,
        }

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.events.append(self._event(name, cat, ts, dur))

    def runtime(self, name: str, ts: float, dur: float) -> None:
        self.events.append(self._event(name, "cuda_runtime", ts, dur))

    def kernel(self, launch_at: float, start: float, dur: float, op: str = "aten::add") -> None:
        """A kernel launched (by ``op``) at ``launch_at`` that runs from ``start``."""
        self.correlation += 1
        c = self.correlation
        self.events.append(self._event(op, "cpu_op", launch_at - 1, 7, **{"External id": c}))
        self.events.append(
            self._event("cudaLaunchKernel", "cuda_runtime", launch_at, 5, correlation=c, **{"External id": c})
        )
        self.events.append(
            self._event(f"kernel_{c}", "kernel", start, dur, correlation=c, device=0, stream=7)
        )

    def gaps(self, tmp_path: Path) -> tuple[IdleFound, list[Gap]]:
        path = write_trace(tmp_path / "t.json.gz", {"traceEvents": self.events})
        tl = read_trace(path)
        found = find_idle(attribute(tl), tl, MIN_GAP_NS)
        return found, [g for g in found.gaps if not g.cause.startswith((BEFORE_FIRST, AFTER_LAST))]


def _two_kernels_per_step(t: _Trace, steps: int = 3, second_at: float = 450) -> None:
    """Each step: a kernel at +10..+210 µs, then one launched at +``second_at``."""
    for i in range(steps):
        t.kernel(i * 1000 + 5, i * 1000 + 10, 200)
        t.kernel(i * 1000 + second_at, i * 1000 + second_at + 8, 200)


def test_a_short_stream_wait_is_not_a_host_sync_the_op_that_spans_the_gap_is(tmp_path):
    """A 2 µs cudaStreamWaitEvent inside a 230 µs gap is not what the host waited on (the CNN
    DDP trace's "host sync: cudaStreamWaitEvent"): the op that spans the gap is. Inside DDP's
    forward, unflatten_dense_tensors is its buffer broadcast, and the fix is named."""
    t = _Trace()
    _two_kernels_per_step(t)
    for i in range(3):
        t.op("DistributedDataParallel.forward", i * 1000 + 1, 998, cat="user_annotation")
        t.op("aten::unflatten_dense_tensors", i * 1000 + 215, 230)
        t.runtime("cudaStreamWaitEvent", i * 1000 + 216, 2)
    _, gaps = t.gaps(tmp_path)
    (gap,) = gaps
    assert gap.kind == HOST_BUSY and gap.cause == "host busy: aten::unflatten_dense_tensors"
    assert gap.count_per_step == 1 and gap.ms_per_step == pytest.approx(0.248, abs=1e-3)
    assert "broadcast_buffers=False" in gap.fix
    # The same op outside DDP's forward: no DDP fix.
    t = _Trace()
    _two_kernels_per_step(t)
    for i in range(3):
        t.op("aten::unflatten_dense_tensors", i * 1000 + 215, 230)
    _, (gap,) = t.gaps(tmp_path)
    assert gap.cause == "host busy: aten::unflatten_dense_tensors" and gap.fix is None


def test_a_blocking_call_that_spans_the_gap_is_a_host_sync_in_its_op(tmp_path):
    t = _Trace()
    _two_kernels_per_step(t)
    for i in range(3):
        t.op("aten::item", i * 1000 + 212, 235)
        t.runtime("cudaStreamSynchronize", i * 1000 + 214, 230)
    _, (gap,) = t.gaps(tmp_path)
    assert gap.kind == HOST_SYNC and gap.cause == "host sync: cudaStreamSynchronize in aten::item"
    assert "device-to-host read" in gap.fix


def test_a_kernel_queued_before_the_gap_waits_on_a_dependency(tmp_path):
    """Launched at +20 µs, it ran at +458 µs: the GPU waited on something other than the host,
    whatever the host did meanwhile."""
    t = _Trace()
    for i in range(3):
        t.kernel(i * 1000 + 5, i * 1000 + 10, 200)
        t.kernel(i * 1000 + 20, i * 1000 + 458, 200)
        t.op("aten::batch_norm", i * 1000 + 215, 230)
    _, (gap,) = t.gaps(tmp_path)
    assert gap.kind == DEPENDENCY and gap.cause.startswith("dependency wait")


def test_data_loading_is_its_own_class(tmp_path):
    t = _Trace()
    _two_kernels_per_step(t)
    for i in range(3):
        t.op(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            i * 1000 + 212,
            230,
            "user_annotation",
        )
        t.op("aten::stack", i * 1000 + 220, 200)
    _, (gap,) = t.gaps(tmp_path)
    assert gap.kind == DATA_LOADING and "DataLoader" in gap.cause


def test_one_gap_longer_than_a_steps_busy_time_is_a_single_stall(tmp_path):
    """Every step busy 400 µs; one step's second kernel waits 580 µs behind a blocking copy. It
    is a stall of its own, not one more "host sync" of every step; the other steps' 230 µs
    gaps keep their cause."""
    t = _Trace()
    for i in range(3):
        late = 790 if i == 1 else 450
        t.kernel(i * 1000 + 5, i * 1000 + 10, 200)
        t.kernel(i * 1000 + late, i * 1000 + late + 8, 200)
        t.op("aten::to", i * 1000 + 212, late - 215)
        t.runtime("cudaMemcpy", i * 1000 + 213, late - 217)
    found, gaps = t.gaps(tmp_path)
    assert found.busy_median_ns == 400_000
    stall = next(g for g in gaps if g.kind == STALL)
    assert stall.cause == "single stall in ProfilerStep#1: host sync: cudaMemcpy in aten::to"
    assert stall.example_ms == pytest.approx(0.588, abs=1e-3) and stall.count_per_step == pytest.approx(1 / 3)
    rest = next(g for g in gaps if g.kind == HOST_SYNC)
    assert rest.count_per_step == pytest.approx(2 / 3) and rest.example_ms == pytest.approx(0.248, abs=1e-3)


def test_the_headline_needs_idle_above_the_share_and_the_noise():
    rules = load_rules()
    t = rules.thresholds
    gaps = [Gap("host busy: aten::conv2d", 15.0, 10, 2.0, kind=HOST_BUSY)]
    # 15 ms idle of a 100 ms step: past idle_warn; noise of the steps 2 ms → clearly above.
    idle = idle_by_class(100.0, 85.0, 2.0, gaps, 0.0, rules)
    assert idle.above_noise and idle.lead == HOST_BUSY and idle.lead_cause == "host busy: aten::conv2d"
    # The same idle when the steps themselves spread by 6 ms: 15 < 3 × 6, noise.
    assert t.idle_noise * 6.0 > 15.0
    assert not idle_by_class(100.0, 85.0, 6.0, gaps, 0.0, rules).above_noise
    # Under idle_warn of the step: a line, whatever the spread.
    assert not idle_by_class(100.0, 100.0 - 100 * t.idle_warn + 1, None, gaps, 0.0, rules).above_noise
    # Exposed communication adds to what the step waits for, and leads when largest.
    idle = idle_by_class(100.0, 94.0, 1.0, [Gap("host busy: x", 6.0, 1, 6.0, kind=HOST_BUSY)], 12.0, rules)
    assert idle.above_noise and idle.lead == COMMUNICATION
    assert idle.classes == {COMMUNICATION: 12.0, HOST_BUSY: 6.0}


def test_a_stall_is_left_out_of_the_step_the_shares_are_of():
    rules = load_rules()
    gaps = [
        Gap("single stall in s: host sync: hipMemcpyWithStream in aten::to", 490.0, 1, 490.0, kind=STALL),
        Gap("host busy: aten::max", 5.0, 3, 2.0, kind=HOST_BUSY),
    ]
    idle = idle_by_class(1000.0, 505.0, None, gaps, 0.0, rules)
    assert idle.lead == STALL and idle.stall_ms_per_step == 490.0
    assert idle.share_step_ms == pytest.approx(510.0)


def test_where_profile_timed_the_script_idle_is_judged_at_the_low_end_of_the_step_interval():
    rules = load_rules()
    gaps = [Gap("host busy: aten::mul_", 120.0, 390, 0.05, kind=HOST_BUSY)]
    # An FSDP2 job on two H100s: steps 150-315 ms, GPU busy 89 ms of a 221 ms step. Its spread
    # (63 ms) is the idle time moving; at the interval's low end (187 ms) idle is still 52%.
    assert not idle_by_class(221.0, 89.0, 62.7, gaps, 0.0, rules).above_noise
    assert idle_by_class(221.0, 89.0, 62.7, gaps, 0.0, rules, step_low_ms=186.7).above_noise
    # A narrow spread does not make idle a headline that the interval's low end leaves under
    # idle_warn: 12 of 100 ms, but 9 of 97.
    assert idle_by_class(100.0, 88.0, 1.0, gaps, 0.0, rules).above_noise
    assert not idle_by_class(100.0, 88.0, 1.0, gaps, 0.0, rules, step_low_ms=97.0).above_noise


def test_the_optimizers_for_loop_is_named_with_its_fix():
    from kerneltriage.analysis.timeline.idle import known_fix

    for op in ("aten::mul_", "aten::addcdiv_", "aten::add_", "aten::div"):
        fix = known_fix(op, ["ProfilerStep#12", "Optimizer.step#AdamW.step"])
        assert fix is not None and "fused=True" in fix.fix and "for-loop" in fix.name
    assert known_fix("aten::add_", ["ProfilerStep#12", "Optimizer.step#SGD.step"]) is not None
    assert known_fix("aten::mul_", ["ProfilerStep#12", "nn.Module: Linear"]) is None  # the model's own
    assert known_fix("aten::_fused_adamw_", ["Optimizer.step#AdamW.step"]) is None  # already fused


@corpus
def test_a_corpus_trace_with_an_sgd_for_loop_gets_the_fused_optimizer():
    from kerneltriage import api

    report = api.report(EXTERNAL / "hta-compiled-2rank-v100")
    loop = [g for g in report.gaps if g.fix and "for-loop" in g.fix]
    assert loop and all(g.cause.startswith("host busy: aten::") for g in loop)
    assert sum(g.ms_per_step for g in loop) > 5.0  # 6.88 ms a step in 237 gaps of aten::add_
