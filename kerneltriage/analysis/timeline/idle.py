"""GPU idle time inside the steps, what the host was doing during it, and its cause class.

A step's wall is an interval (``attribution.step_windows``): its CPU range, or its GPU period
when that is longer. Busy time is the part of that interval during which any GPU activity runs,
on any stream, whoever launched it: work launched before the profiled window keeps the GPU busy
too. Idle = wall − busy.

Each stretch of idle time gets a cause, named after what spans it, and a class
(``CAUSE_CLASSES``):

- **host sync**: a blocking runtime call (a synchronize, a copy, a free) on the thread that
  launched the next kernel covers most of the gap; named with the op that made it;
- **dependency wait**: the next kernel was already queued for most of the gap (launched before
  it, or before the profiled window): it waited on another stream, an event or a graph;
- **host busy** / **data loading**: the next kernel was launched late; named after the op on the
  launching thread that overlaps the time before the launch most (data loading when that op or
  an annotation around it is a data loader's, ``data/idle_causes.yaml``);
- **before the first kernel / after the last**: the host had not launched the step's work yet,
  or had nothing left to launch. The CPU ops, annotations and, when the trace has them, Python
  frames running then are named, with the time they cover;
- **single stall**: one gap between kernels longer than the median step's busy time. It is
  reported on its own (a one-off, not the step's pattern), whatever spans it.

A cause whose spanning op has a known fix (``data/idle_causes.yaml``: DDP's buffer broadcast,
a device-to-host read) carries it.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from kerneltriage.analysis.model import Gap
from kerneltriage.analysis.timeline.attribution import Attribution, is_step_range
from kerneltriage.ingest.tables import Timeline
from kerneltriage.resources import load_yaml

#: Causes of the idle time at a step's edges; the report prints them apart from gap counts.
BEFORE_FIRST = "host before the first kernel"
AFTER_LAST = "host after the last kernel"
_NO_OP = "in no profiled op (Python, data loading or untraced work)"
# A Python frame is named for an edge when it covers at least this share of the edge's time.
_FRAME_COVER = 0.5

HOST_BUSY = "host busy"
HOST_SYNC = "host sync"
DEPENDENCY = "dependency wait"
STALL = "single stall"
COMMUNICATION = "exposed communication"
DATA_LOADING = "data loading"
#: The classes a headline may name; ``COMMUNICATION`` is GPU time, not idle (``Report``).
CAUSE_CLASSES = (HOST_BUSY, HOST_SYNC, DEPENDENCY, STALL, COMMUNICATION, DATA_LOADING)
# A call or op spans a gap when it covers at least this share of it; a kernel waited queued
# when it was in the queue for at least this share of the gap.
_SPAN = 0.5
_QUEUED = "dependency wait (kernel queued, waiting on another stream or event)"


@dataclass(frozen=True)
class _Fix:
    op: re.Pattern[str]
    within: re.Pattern[str] | None
    name: str
    fix: str


@cache
def _causes() -> tuple[tuple[re.Pattern[str], ...], tuple[_Fix, ...]]:
    data = load_yaml("idle_causes.yaml")
    loading = tuple(re.compile(p) for p in data.get("data_loading") or [])
    fixes = tuple(
        _Fix(re.compile(f["op"]), re.compile(f["within"]) if f.get("within") else None, f["name"], f["fix"])
        for f in data.get("fixes") or []
    )
    return loading, fixes


def is_data_loading(name: str) -> bool:
    return any(p.search(name) for p in _causes()[0])


def known_fix(op: str | None, around: list[str]) -> _Fix | None:
    """The fix of ``data/idle_causes.yaml`` for host work in ``op`` with ``around`` (the
    annotations and ops enclosing it), or None."""
    if not op:
        return None
    for f in _causes()[1]:
        if f.op.search(op) and (f.within is None or any(f.within.search(a) for a in around)):
            return f
    return None


def union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[Any, Any]]:
    """The intervals ``[starts[i], ends[i]]`` merged where they overlap or touch, in start
    order (the numbers keep their type: ns as ints, µs as floats)."""
    starts, ends = np.asarray(starts), np.asarray(ends)
    if not len(starts):
        return []
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    if (
        (e < s).any()
        or (s.dtype.kind == "f" and np.isnan(s).any())
        or (e.dtype.kind == "f" and np.isnan(e).any())
    ):
        return _union_in_order(s, e)
    # An interval opens a new merged one when it starts after every earlier interval ended;
    # with no interval ending before it starts, the running end is the merged one's end.
    reach = np.maximum.accumulate(e)
    opens = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))
    closes = np.append(opens[1:] - 1, len(s) - 1)
    return list(zip(s[opens].tolist(), reach[closes].tolist()))


def _union_in_order(s: np.ndarray, e: np.ndarray) -> list[tuple[Any, Any]]:
    """``union`` of intervals sorted by start, one at a time (any interval, reversed or NaN)."""
    merged: list[list[Any]] = []
    for a, b in zip(s.tolist(), e.tolist()):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


@dataclass
class IdleFound:
    """What ``find_idle`` measured: GPU-busy ns summed over the steps, the median step's busy
    ns, and every idle cause averaged per step, biggest first (single stalls included, with
    ``kind == STALL``)."""

    busy_ns: int
    busy_median_ns: float
    gaps: list[Gap]


def idle_gaps(
    attr: Attribution, timeline: Timeline, min_gap_ns: float, top: int = 5
) -> tuple[int, list[Gap]]:
    """(busy ns summed over steps, the biggest idle causes averaged per step)."""
    found = find_idle(attr, timeline, min_gap_ns)
    return found.busy_ns, found.gaps[:top]


def find_idle(attr: Attribution, timeline: Timeline, min_gap_ns: float) -> IdleFound:
    """Busy time and every idle cause of the steps (see the module's docstring)."""
    k = attr.kernels
    host = _HostIndex(timeline, attr)
    starts_all = k["start"].to_numpy()
    ends_all = starts_all + k["dur"].to_numpy()
    launches_all = k["launch_start"].to_numpy()
    tids_all = k["launch_tid"].to_numpy()
    overlapping = _Overlapping(starts_all, ends_all)
    busy_steps: list[int] = []
    # (step, length ns, cause, class, fix) of every gap between kernels.
    between: list[tuple[int, int, str, str, _Fix | None]] = []
    edges: dict[str, list[tuple[int, int]]] = {BEFORE_FIRST: [], AFTER_LAST: []}
    for step_i, (w0, w1) in enumerate(attr.windows):
        sel = overlapping(w0, w1)
        if len(sel) == 0:
            busy_steps.append(0)
            if w1 - w0 >= min_gap_ns:
                edges[BEFORE_FIRST].append((w0, w1))
            continue
        starts, ends = starts_all[sel], ends_all[sel]
        spans = union(np.maximum(starts, w0), np.minimum(ends, w1))
        busy_steps.append(sum(e - s for s, e in spans))
        if spans[0][0] - w0 >= min_gap_ns:
            edges[BEFORE_FIRST].append((w0, spans[0][0]))
        if w1 - spans[-1][1] >= min_gap_ns:
            edges[AFTER_LAST].append((spans[-1][1], w1))
        for (_, prev_end), (next_start, _) in itertools.pairwise(spans):
            if next_start - prev_end < min_gap_ns:
                continue
            # The kernel that ended the gap: of those starting then, the first launched.
            starting = np.flatnonzero(starts == next_start)
            first = sel[starting[int(np.argmin(launches_all[sel[starting]]))]] if len(starting) else -1
            launch, tid = (int(launches_all[first]), int(tids_all[first])) if first >= 0 else (-1, -1)
            cause, kind, fix = host.classify(tid, prev_end, next_start, launch)
            between.append((step_i, next_start - prev_end, cause, kind, fix))
    n = max(1, len(attr.steps))
    busy_median = float(np.median(busy_steps)) if busy_steps else 0.0
    stalls = _single_stalls(between, edges, attr.windows, busy_median)
    by_cause: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, tuple[str, _Fix | None]] = {}
    for j, (step_i, length, cause, kind, fix) in enumerate(between):
        if j in stalls:
            # One gap longer than a step's GPU work and than the rest of its step's idle: a
            # one-off, reported on its own so that it neither hides as one more instance of its
            # cause nor dilutes every share.
            cause, kind = f"{STALL} in {attr.steps[step_i].name}: {cause}", STALL
        by_cause[cause].append(length / 1e6)
        meta[cause] = (kind, fix)
    gaps = [
        Gap(
            cause=c,
            ms_per_step=sum(v) / n,
            count_per_step=len(v) / n,
            example_ms=max(v),
            kind=meta[c][0],
            fix=_fix_text(meta[c][1]),
        )
        for c, v in by_cause.items()
    ]
    for label, intervals in edges.items():
        if intervals:
            lengths = [(b - a) / 1e6 for a, b in intervals]
            text, kind = host.describe(intervals, n)
            gaps.append(
                Gap(
                    cause=f"{label}: {_ms(sum(lengths) / n)} per step ({text})",
                    ms_per_step=sum(lengths) / n,
                    count_per_step=len(lengths) / n,
                    example_ms=max(lengths),
                    kind=kind,
                )
            )
    gaps.sort(key=lambda g: -g.ms_per_step)
    return IdleFound(busy_ns=sum(busy_steps), busy_median_ns=busy_median, gaps=gaps)


class _Overlapping:
    """The activities overlapping a window, in row order, without a pass over all of them:
    sorted by start, with the latest end so far (``reach``), a window's candidates are one
    slice."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        self.order = np.argsort(starts, kind="stable")
        self.starts = starts[self.order]
        self.reach = np.maximum.accumulate(ends[self.order]) if len(ends) else ends
        self.ends = ends

    def __call__(self, w0: int, w1: int) -> np.ndarray:
        lo = int(np.searchsorted(self.reach, w0, side="right"))
        hi = int(np.searchsorted(self.starts, w1, side="left"))
        rows = self.order[lo:hi]
        return np.sort(rows[self.ends[rows] > w0])


def _single_stalls(
    between: list[tuple[int, int, str, str, _Fix | None]],
    edges: dict[str, list[tuple[int, int]]],
    windows: list[tuple[int, int]],
    busy_median: float,
) -> set[int]:
    """Indices (into ``between``) of the single stalls: per step, its longest gap between
    kernels when that is longer than the median step's busy time and than all the step's other
    idle time together (a step whose GPU idles in many long gaps has no single stall)."""
    idle_of: dict[int, int] = defaultdict(int)
    longest: dict[int, int] = {}
    for j, (step_i, length, *_) in enumerate(between):
        idle_of[step_i] += length
        if step_i not in longest or length > between[longest[step_i]][1]:
            longest[step_i] = j
    edge_list = list(itertools.chain.from_iterable(edges.values()))
    for (a, b), step_i in zip(edge_list, _first_window([a for a, _ in edge_list], windows)):
        if step_i >= 0:
            idle_of[step_i] += b - a
    return {
        j
        for step_i, j in longest.items()
        if busy_median > 0 and between[j][1] > busy_median and between[j][1] > idle_of[step_i] - between[j][1]
    }


def _first_window(times: list[int], windows: list[tuple[int, int]]) -> list[int]:
    """For each time, the first window (w0 <= t < w1) holding it (-1: none)."""
    if not times or not windows:
        return [-1] * len(times)
    w0 = np.array([w[0] for w in windows])
    w1 = np.array([w[1] for w in windows])
    t = np.asarray(times)
    if (np.diff(w0) >= 0).all() and (np.diff(w1) >= 0).all():
        # In order: the windows holding t are those from the first ending after it, while they
        # start at or before it.
        at = np.searchsorted(w1, t, side="right")
        ok = (at < len(windows)) & (w0[np.minimum(at, len(windows) - 1)] <= t)
        return np.where(ok, at, -1).tolist()
    out = []
    for x in times:
        out.append(next((i for i, (a, b) in enumerate(windows) if a <= x < b), -1))
    return out


def _fix_text(fix: _Fix | None) -> str | None:
    return f"{fix.name}; fix: {fix.fix}" if fix else None


def unlaunched_busy_ns(attr: Attribution) -> int:
    """GPU-busy time (ns, summed over steps) of activities whose launch is not in the trace
    (launched before the profiled window) running inside the steps' walls. It is part of
    ``idle_gaps``' busy time but of no candidate: a time breakdown shows it apart."""
    k = attr.kernels
    early = k["launch_start"].to_numpy() < 0
    if not early.any():
        return 0
    starts = k["start"].to_numpy()[early]
    ends = starts + k["dur"].to_numpy()[early]
    total = 0
    for w0, w1 in attr.windows:
        sel = (starts < w1) & (ends > w0)
        if sel.any():
            total += sum(e - s for s, e in union(np.maximum(starts[sel], w0), np.minimum(ends[sel], w1)))
    return total


def _ms(x: float) -> str:
    return f"{x:.0f} ms" if x >= 100 else (f"{x:.1f} ms" if x >= 1 else f"{x * 1000:.0f} µs")


# Runtime calls that can hold the host until the GPU has drained (a synchronize, a copy to or
# from pageable memory, a free). cudaStreamWaitEvent is not one: it queues a wait on the GPU and
# returns in microseconds.
_SYNC = ("Synchronize", "Memcpy", "cudaFree", "hipFree")


class _Rows:
    """CPU rows as the host index holds them: sorted by start, with the latest end so far and
    their names, for one thread or for all."""

    def __init__(self, start: np.ndarray, dur: np.ndarray, tid: np.ndarray, names: np.ndarray, missing: bool):
        self.start, self.dur, self.tid, self.names = start, dur, tid, names
        self.missing = missing  # some rows have no name (NaN): spelled as str() spells it

    def index(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        return self._sorted(rows[np.argsort(self.start[rows], kind="stable")])

    def by_thread(self, rows: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]]:
        """``index`` of each thread's rows, by thread id (in id order)."""
        if not len(rows):
            return {}
        # By thread, then start (in row order where equal): one sort of one number when the
        # threads' spans fit in it.
        tid, start = self.tid[rows], self.start[rows]
        span = int(start.max()) - int(start.min()) + 1
        if int(tid.max()) - int(tid.min()) < 2**62 // span:
            rows = rows[np.argsort((tid - tid.min()) * span + (start - start.min()), kind="stable")]
        else:
            rows = rows[np.lexsort((start, tid))]
        tids = self.tid[rows]
        cuts = np.flatnonzero(tids[1:] != tids[:-1]) + 1
        return {
            int(part_tid): self._sorted(part)
            for part_tid, part in zip(tids[np.concatenate(([0], cuts))].tolist(), np.split(rows, cuts))
        }

    def _sorted(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        start = self.start[rows]
        end = start + self.dur[rows]
        # Longest end so far: lets a bisect find every range that may overlap a window.
        reach = np.maximum.accumulate(end) if len(end) else end
        names = self.names[rows].tolist()
        return start, end, reach, [str(n) for n in names] if self.missing else names


class _HostIndex:
    """Per-thread sorted CPU activity, to ask "what was the host doing between t0 and t1"."""

    def __init__(self, timeline: Timeline, attr: Attribution):
        self.threads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = {}
        self.annotations: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = {}
        self.runtime: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = {}
        cpu = timeline.cpu
        missing = bool((attr.cpu_name_codes < 0).any())
        self._rows = _Rows(
            cpu["start"].to_numpy(), cpu["dur"].to_numpy(), cpu["tid"].to_numpy(), attr.cpu_names, missing
        )
        is_op = attr.cpu_is_op
        self.threads = self._rows.by_thread(np.flatnonzero(is_op))
        # Annotations other than the steps themselves: a step range covers every gap.
        ann = np.flatnonzero(attr.cpu_is_annotation & ~attr.cpu_name_mask(is_step_range))
        self.annotations = self._rows.by_thread(ann)
        rt = timeline.runtime
        sync = rt[rt["name"].astype(str).str.contains("|".join(_SYNC))]
        for tid, g in sync.groupby("tid"):
            self.runtime[int(tid)] = self._index(g)
        # For the step edges: top-level ops of every thread, and Python frames when the reader
        # kept them (cat "python_function").
        top = np.flatnonzero(is_op & (attr.cpu_root == np.arange(len(cpu))))
        self.top = self._rows.index(top) if len(top) else None
        self.ann_all = self._rows.index(ann) if len(ann) else None
        py = np.flatnonzero((cpu["cat"] == "python_function").to_numpy())
        self.python = self._rows.index(py) if len(py) else None

    @staticmethod
    def _index(g):
        order = np.argsort(g["start"].to_numpy(), kind="stable")
        start = g["start"].to_numpy()[order]
        end = start + g["dur"].to_numpy()[order]
        # Longest end so far: lets a bisect find every range that may overlap a window.
        reach = np.maximum.accumulate(end)
        return start, end, reach, [str(n) for n in g["name"].to_numpy()[order]]

    @staticmethod
    def _overlapping(index, t0: int, t1: int) -> np.ndarray:
        """Rows overlapping (t0, t1). One long range early on (a whole-step op) keeps ``reach``
        high, so the candidate slice can be long: filter it in numpy, not in Python."""
        start, end, reach, _ = index
        lo = int(np.searchsorted(reach, t0, side="right"))
        hi = int(np.searchsorted(start, t1, side="left"))
        if hi <= lo:
            return np.empty(0, dtype=np.int64)
        return lo + np.flatnonzero(end[lo:hi] > t0)

    @staticmethod
    def _longest(index, hits: np.ndarray, t0: int | None = None, t1: int | None = None) -> int:
        """The hit with the longest duration, or the longest overlap with (t0, t1)."""
        start, end, _, _ = index
        s, e = start[hits], end[hits]
        if t0 is not None and t1 is not None:
            s, e = np.maximum(s, t0), np.minimum(e, t1)
        return int(hits[int(np.argmax(e - s))])

    def classify(self, tid: int, t0: int, t1: int, launch: int) -> tuple[str, str, _Fix | None]:
        """(cause, class, fix) of the idle gap (t0, t1) before a kernel launched at ``launch``
        (-1: before the profiled window) from thread ``tid``: see the module's docstring."""
        gap = t1 - t0
        rt = self.runtime.get(tid)
        if rt is not None:
            hits = self._overlapping(rt, t0, t1)
            if len(hits):
                i = self._longest(rt, hits, t0, t1)
                if min(int(rt[1][i]), t1) - max(int(rt[0][i]), t0) >= _SPAN * gap:
                    op = self._enclosing(tid, int(rt[0][i]))
                    cause = f"{HOST_SYNC}: {rt[3][i]}" + (f" in {op}" if op else "")
                    return cause, HOST_SYNC, known_fix(op, self._around(tid, t0, t1))
        if launch < 0 or t1 - max(launch, t0) >= _SPAN * gap:
            return _QUEUED, DEPENDENCY, None
        # Launched late: what the launching thread did before the launch.
        end = min(launch, t1)
        around = self._around(tid, t0, end)
        loading = next((a for a in around if is_data_loading(a)), None)
        for table in (self.threads, self.annotations):
            index = table.get(tid)
            if index is None:
                continue
            hits = self._overlapping(index, t0, end)
            if len(hits):
                name = index[3][self._longest(index, hits, t0, end)]
                if loading or is_data_loading(name):
                    return f"{DATA_LOADING}: {loading or name}", DATA_LOADING, None
                return f"{HOST_BUSY}: {name}", HOST_BUSY, known_fix(name, around)
        return "host: no profiled CPU activity (Python, data loading, or untraced work)", HOST_BUSY, None

    def _around(self, tid: int, t0: int, t1: int) -> list[str]:
        """Names of the annotations and ops on the thread that overlap (t0, t1)."""
        names: list[str] = []
        for table in (self.annotations, self.threads):
            index = table.get(tid)
            if index is not None:
                names += [index[3][i] for i in self._overlapping(index, t0, t1).tolist()]
        return names

    def _enclosing(self, tid: int, t: int) -> str | None:
        ops = self.threads.get(tid)
        if ops is None:
            return None
        hits = self._overlapping(ops, t - 1, t)
        return ops[3][self._longest(ops, hits)] if len(hits) else None

    @classmethod
    def _cover(
        cls, index, intervals: list[tuple[int, int]]
    ) -> tuple[dict[str, int], list[tuple[int, int, str]]]:
        """Time (ns) each name overlaps the intervals, and the overlapped pieces (start, end,
        name)."""
        by_name: dict[str, int] = defaultdict(int)
        pieces: list[tuple[int, int, str]] = []
        if index is None:
            return by_name, pieces
        start, end, _, names = index
        for t0, t1 in intervals:
            hits = cls._overlapping(index, t0, t1)
            lo, hi = np.maximum(start[hits], t0).tolist(), np.minimum(end[hits], t1).tolist()
            for i, a, b in zip(hits.tolist(), lo, hi):
                by_name[names[i]] += b - a
                pieces.append((a, b, names[i]))
        return by_name, pieces

    def describe(self, intervals: list[tuple[int, int]], n: int) -> tuple[str, str]:
        """What the host ran during the intervals (n steps' worth): the top-level CPU ops and
        annotations by time covered, a Python frame, and the time no op or annotation covers;
        and the class: data loading when a data loader's ops or annotations cover most of it."""
        total = sum(b - a for a, b in intervals)
        ops, op_pieces = self._cover(self.top, intervals)
        anns, ann_pieces = self._cover(self.ann_all, intervals)
        parts = [f"{name} {_ms(t / n / 1e6)}" for name, t in sorted(ops.items(), key=lambda kv: -kv[1])[:3]]
        parts += [
            f"user annotation {name} {_ms(t / n / 1e6)}"
            for name, t in sorted(anns.items(), key=lambda kv: -kv[1])[:2]
        ]
        pieces = op_pieces + ann_pieces
        covered = (
            sum(e - s for s, e in union(np.array([p[0] for p in pieces]), np.array([p[1] for p in pieces])))
            if pieces
            else 0
        )
        frame = self._python_frame(intervals, total - covered)
        if frame:
            parts.append(f"Python {frame[0]} {_ms(frame[1] / n / 1e6)}")
        uncovered = total - covered
        if uncovered >= 0.01 * total:
            parts.append(f"{_ms(uncovered / n / 1e6)} {_NO_OP}")
        loading = [p for p in pieces if is_data_loading(p[2])]
        loading_ns = (
            sum(e - s for s, e in union(np.array([p[0] for p in loading]), np.array([p[1] for p in loading])))
            if loading
            else 0
        )
        kind = DATA_LOADING if loading_ns >= _SPAN * total else HOST_BUSY
        return ("; ".join(parts) if parts else _NO_OP), kind

    def _python_frame(self, intervals: list[tuple[int, int]], uncovered: int) -> tuple[str, int] | None:
        """The innermost Python frame that covers most of the time no op covers."""
        if self.python is None or uncovered <= 0:
            return None
        start, end, _, names = self.python
        cover: dict[int, int] = defaultdict(int)
        for t0, t1 in intervals:
            hits = self._overlapping(self.python, t0, t1)
            overlap = np.minimum(end[hits], t1) - np.maximum(start[hits], t0)
            for i, t in zip(hits.tolist(), overlap.tolist()):
                cover[i] += t
        # Per frame name (a function called in every step); the innermost starts last.
        by_name: dict[str, tuple[int, int]] = {}
        for i, t in cover.items():
            total, latest = by_name.get(names[i], (0, -1))
            by_name[names[i]] = (total + t, max(latest, int(start[i])))
        wide = [(latest, name, t) for name, (t, latest) in by_name.items() if t >= _FRAME_COVER * uncovered]
        if not wide:
            return None
        _, name, t = max(wide)
        return name, t


def communication_overlap(attr: Attribution, is_comm) -> tuple[float, float]:
    """(communication ns, exposed communication ns) summed over steps.

    Exposed = communication time during which no compute kernel runs on any stream: what a
    step actually waits for. Communication hidden behind compute costs (almost) nothing.
    """
    k = attr.kernels
    total = exposed = 0.0
    rows = np.flatnonzero((k["step"] >= 0).to_numpy() & (k["kind"] == "kernel").to_numpy())
    comm_all = attr.kernel_name_mask(is_comm)[rows]
    if not comm_all.any():
        return total, exposed
    steps = k["step"].to_numpy()[rows]
    order = np.argsort(steps, kind="stable")
    held, first = np.unique(steps[order], return_index=True)
    of_step = dict(zip(held.tolist(), np.split(order, first[1:])))
    starts_all = k["start"].to_numpy()[rows]
    ends_all = starts_all + k["dur"].to_numpy()[rows]
    for step in attr.steps:
        mine = of_step.get(step.index)
        if mine is None:
            continue
        comm_mask = comm_all[mine]
        if not comm_mask.any():
            continue
        starts, ends = starts_all[mine], ends_all[mine]
        comm = union(starts[comm_mask], ends[comm_mask])
        compute = union(starts[~comm_mask], ends[~comm_mask])
        total += sum(e - s for s, e in comm)
        exposed += sum(e - s for s, e in comm) - _intersection(comm, compute)
    return total, exposed


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the overlap of two sorted, disjoint interval lists."""
    i = j = 0
    out = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out
