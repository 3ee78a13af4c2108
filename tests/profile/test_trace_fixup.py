"""Shapes copied from the shapes step onto the timed steps (trace_fixup.copy_shapes) pair each
op with the same op of the same module, on the shipped example runs' real traces (an eager
model profiled on an H100: the timed trace and the one-step shapes trace of its logs)."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneltriage.analysis.timeline.attribution import PROFILER_STEP
from kerneltriage.annotate import MODULE_PREFIX
from kerneltriage.profile.trace_fixup import SHAPE_ARGS, align, copy_shapes

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"
EXAMPLES = ("hf-llama-h100", "gpt2-eager-h100", "convnext-t-h100", "gemma2-h100", "bert-mlm-h100")
LLAMA = "hf-llama-h100"
Event = dict[str, Any]


@functools.cache
def _raw(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


def _events(path: Path) -> list[Event]:
    """A fresh parse each call: copy_shapes writes into the events."""
    return orjson.loads(_raw(path))["traceEvents"]


def _timed(run: str) -> list[Event]:
    return _events(RUNS / run / "trace.json.gz")


def _source(run: str) -> list[Event]:
    return _events(RUNS / run / "logs" / "shapes.rank0.json.gz")


@functools.cache
def _fixed(run: str) -> tuple[list[Event], list[Event], dict[str, Any]]:
    """The shipped trace (finished by an earlier fixup) fixed again, with its shapes trace."""
    timed, source = _timed(run), _source(run)
    return timed, source, copy_shapes(timed, source)


def _steps(events: list[Event]) -> list[tuple[float, float]]:
    return sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and PROFILER_STEP.match(e.get("name", ""))
    )


def _is_module(e: Event) -> bool:
    return e.get("name", "").startswith(MODULE_PREFIX)


def _by_module(events: list[Event], window: tuple[float, float] | None = None) -> dict[Any, list]:
    """(op name, Input Dims) of the ops in ``window`` (all if None), in order, grouped by their
    innermost module range; ops in none are grouped by thread."""
    out: dict[Any, list] = {}
    threads: dict[Any, list[Event]] = {}
    for e in events:
        if e.get("ph") == "X" and (e.get("cat") == "cpu_op" or _is_module(e)):
            threads.setdefault(e["tid"], []).append(e)
    for tid, evs in threads.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[Event] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if _is_module(e):
                stack.append(e)
            elif window is None or window[0] <= e["ts"] < window[1]:
                group = stack[-1]["name"] if stack else ("thread", tid)
                out.setdefault(group, []).append((e["name"], e.get("args", {}).get("Input Dims")))
    return out


def _mm_dims(events: list[Event], module: str, window: tuple[float, float] | None) -> list:
    return [dims for name, dims in _by_module(events, window).get(module, []) if name == "aten::mm"]


def test_the_llama_gate_and_v_projections_get_their_own_shapes_in_every_step():
    timed, source, _ = _fixed(LLAMA)
    steps = _steps(timed)
    assert len(steps) == 3
    gate = f"{MODULE_PREFIX}model.layers.0.mlp.gate_proj:Linear"
    v = f"{MODULE_PREFIX}model.layers.1.self_attn.v_proj:Linear"
    # 4 × 2048 tokens; hidden 2048 → intermediate 5632; GQA: 4 KV heads of 128.
    assert _mm_dims(source, gate, None) == [[[8192, 2048], [2048, 5632]]]
    assert _mm_dims(source, v, None) == [[[8192, 2048], [2048, 512]]]
    want, got = _by_module(source), [_by_module(timed, w) for w in steps]
    for layer in range(8):
        for module in (f"model.layers.{layer}.mlp.gate_proj", f"model.layers.{layer}.self_attn.v_proj"):
            mm = [op for op in want[f"{MODULE_PREFIX}{module}:Linear"] if op[0] == "aten::mm"]
            assert len(mm) == 1 and all(mm[0] in step[f"{MODULE_PREFIX}{module}:Linear"] for step in got)


def test_the_shipped_first_step_has_its_own_projections_shapes():
    # An earlier fixup also aligned the GPU's copy of ProfilerStep#1, which starts in the middle
    # of the first step: the ops after it got shapes of ops earlier in the shapes step (the
    # gate_proj GEMM read as 2048 x 2048). The shipped trace was fixed again; a refix keeps it.
    shipped = _timed(LLAMA)
    first = _steps(shipped)[0]
    gate = f"{MODULE_PREFIX}model.layers.0.mlp.gate_proj:Linear"
    assert _mm_dims(shipped, gate, first) == [[[8192, 2048], [2048, 5632]]]
    fixed, _, stats = _fixed(LLAMA)
    assert _mm_dims(fixed, gate, first) == [[[8192, 2048], [2048, 5632]]]
    assert stats["steps"] == 3 and stats["ops"] == stats["ops_with_shapes"] == 13431


@pytest.mark.parametrize("run", EXAMPLES)
def test_every_modules_ops_get_that_modules_shapes_in_every_step(run):
    timed, source, stats = _fixed(run)
    assert stats["ops_with_shapes"] == stats["ops"] > 10000
    want = _by_module(source)
    modules = [m for m in want if isinstance(m, str)]
    assert len(modules) > 50
    for window in _steps(timed):
        got = _by_module(timed, window)
        # Every module ran in every step, and the autograd thread's ops match too.
        assert set(got) == set(want)
        assert not [m for m in want if got[m] != want[m]]
        assert sum(dims is not None for ops in got.values() for _, dims in ops) > 4000


@pytest.mark.parametrize("run", [LLAMA, "convnext-t-h100"])
def test_fixing_a_fixed_trace_again_changes_nothing(run):
    once, source, stats = _fixed(run)
    again = orjson.loads(orjson.dumps(once))
    assert copy_shapes(again, source) == stats
    assert orjson.dumps(again) == orjson.dumps(once)
    # Fixing the bare trace (shape args stripped) gives the same trace too.
    bare = _timed(run)
    for e in bare:
        if e.get("cat") == "cpu_op":
            for k in SHAPE_ARGS:
                e.get("args", {}).pop(k, None)
    assert copy_shapes(bare, source) == stats and orjson.dumps(bare) == orjson.dumps(once)
    # The shapes trace is only read.
    assert orjson.dumps(source) == orjson.dumps(_source(run))


def test_a_module_that_did_not_run_in_a_step_costs_no_other_op_its_shapes():
    """The first step without layer 0's MLP (its 29 forward ops and the 86 ops of their backward
    nodes gone): gaps where ``aten::mm``, ``aten::mul``… of other modules are near, and a
    pairing by name slips onto them."""
    timed = _timed(LLAMA)
    first = _steps(timed)[0]
    mlp = next(e for e in timed if e["name"] == f"{MODULE_PREFIX}model.layers.0.mlp:LlamaMLP")
    assert first[0] <= mlp["ts"] < first[1]
    inside = lambda e: e["tid"] == mlp["tid"] and mlp["ts"] <= e["ts"] < mlp["ts"] + mlp["dur"]
    ops = [i for i, e in enumerate(timed) if e.get("cat") == "cpu_op"]
    seqs = {timed[i]["args"].get("Sequence number") for i in ops if inside(timed[i])} - {None}
    # A backward node's ops: its evaluate_function range carries its forward op's number.
    nodes = [
        timed[i]
        for i in ops
        if timed[i]["args"].get("Sequence number") in seqs and timed[i]["tid"] != mlp["tid"]
    ]
    gone = {i for i in ops if inside(timed[i]) or any(_within(timed[i], n) for n in nodes)}
    assert sum(inside(timed[i]) for i in gone) == 29 and len(gone) == 29 + 86
    kept = [i for i in range(len(timed)) if i not in gone]
    trace = [timed[i] for i in kept]
    copy_shapes(trace, _source(LLAMA))
    fixed, _, _ = _fixed(LLAMA)
    dims = lambda e: e.get("args", {}).get("Input Dims")
    assert sum(dims(e) is not None for e in trace) == 13431 - sum(dims(fixed[i]) is not None for i in gone)
    assert [dims(e) for e in trace] == [dims(fixed[i]) for i in kept]


def _within(e: Event, outer: Event) -> bool:
    return e["tid"] == outer["tid"] and outer["ts"] <= e["ts"] < outer["ts"] + outer["dur"]


def _op(name: str, ts: float, dur: float = 1.0, tid: int = 1, cat: str = "cpu_op", **args: Any) -> Event:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": dict(args)}


def _module(path: str, ts: float, dur: float, cat: str) -> Event:
    return _op(f"{MODULE_PREFIX}{path}:Linear", ts, dur, cat=cat)


def test_an_extra_op_in_one_module_takes_no_other_modules_shapes():
    def dims(n: int) -> dict[str, Any]:
        return {"Input Dims": [[n, n]]}

    # The shapes step: modules a, b, c with one aten::mm each (their module ranges cpu_op).
    source = [_module(p, 10.0 * k, 5.0, "cpu_op") for k, p in enumerate("abc")] + [
        _op("aten::mm", 10.0 * k + 1, **dims(k + 1)) for k in range(3)
    ]
    step = _op("ProfilerStep#4", 100.0, 50.0, cat="user_annotation")
    # The timed step (module ranges relabelled): a ran one more aten::mm, which carries stale
    # shapes from an earlier fixup.
    timed = [step] + [_module(p, 100.0 + 10 * k, 5.0, "user_annotation") for k, p in enumerate("abc")]
    mms = [_op("aten::mm", t) for t in (101.0, 103.0, 111.0, 121.0)]
    mms[1]["args"].update(dims(7))
    timed += mms
    # By name alone the pairing slips: a's extra mm would take b's shapes, b's mm c's.
    assert align(["aten::mm"] * 3, ["aten::mm"] * 4) == [(0, 0), (1, 1), (2, 2)]
    stats = copy_shapes(timed, source)
    assert [m["args"].get("Input Dims") for m in mms] == [[[1, 1]], None, [[2, 2]], [[3, 3]]]
    assert stats["ops"] == 4 and stats["ops_with_shapes"] == 3 and stats["missing"] == {"aten::mm": 1}


def test_a_backward_op_is_paired_through_its_forward_ops_module():
    def node(seq: int, ts: float, tid: int = 2, **args: Any) -> list[Event]:
        wrapper = "autograd::engine::evaluate_function: MmBackward0"
        fwd = {"Sequence number": seq, "Fwd thread id": 1}
        return [_op(wrapper, ts, 4.0, tid, **fwd), _op("aten::mm", ts + 1, tid=tid, **args)]

    # The shapes step: forward mm in modules a (seq 1) and b (seq 2); backward runs b, then a.
    source = [
        _module("a", 0.0, 5.0, "cpu_op"),
        _op("aten::mm", 1.0, **{"Sequence number": 1, "Fwd thread id": 0}),
        _module("b", 10.0, 5.0, "cpu_op"),
        _op("aten::mm", 11.0, **{"Sequence number": 2, "Fwd thread id": 0}),
        *node(2, 20.0, **{"Input Dims": [[2, 2]]}),
        *node(1, 30.0, **{"Input Dims": [[1, 1]]}),
    ]
    # A timed step where module b did not run: a's backward mm must not take b's shapes.
    timed = [
        _op("ProfilerStep#4", 100.0, 50.0, cat="user_annotation"),
        _module("a", 100.0, 5.0, "user_annotation"),
        _op("aten::mm", 101.0, **{"Sequence number": 11, "Fwd thread id": 0}),
        *node(11, 120.0),
    ]
    copy_shapes(timed, source)
    assert timed[-1]["args"]["Input Dims"] == [[1, 1]]


def _align_one_at_a_time(a: list[str], b: list[str], lookahead: int) -> list[tuple[int, int]]:
    """align's definition, one item at a time: equal items pair; where they differ, the
    nearest common key within ``lookahead`` resumes the pairing, else both move on."""
    pairs, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        near = [
            (di, k - di)
            for k in range(1, lookahead)
            for di in range(k + 1)
            if i + di < len(a) and j + k - di < len(b) and a[i + di] == b[j + k - di]
        ]
        i, j = (i + near[0][0], j + near[0][1]) if near else (i + 1, j + 1)
    return pairs


@given(
    st.lists(st.sampled_from("abc"), max_size=300),
    st.lists(st.tuples(st.integers(0, 300), st.sampled_from(["x", "a", None])), max_size=6),
    st.integers(1, 8),
)
@settings(max_examples=300, deadline=None)
def test_align_pairs_long_equal_runs_as_one_item_at_a_time_would(a, edits, lookahead):
    # A recorded step is the shapes step's sequence with a few ops added, swapped or missing:
    # long equal runs, which align compares in slices, between the differences.
    b = list(a)
    for at, what in edits:
        at = min(at, len(b))
        if what is None:
            del b[at : at + 1]
        else:
            b.insert(at, what)
    assert align(a, b, lookahead) == _align_one_at_a_time(a, b, lookahead)
    assert align(b, a, lookahead) == _align_one_at_a_time(b, a, lookahead)
