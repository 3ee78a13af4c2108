"""GPU idle time inside the steps, and what the host was doing during the biggest gaps.

Busy time is the union of the step's kernel intervals (all streams). Idle = step wall time −
busy. A gap between two kernels where the second was launched only after the first had
finished is the host's doing: the CPU work on the launching thread in between (an
``aten::item`` sync, ``nonzero``, the data loader, Python) names the cause. A gap where the
next kernel was already queued is a dependency (another stream, an event).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from kerneltriage.analysis.attribution import Attribution
from kerneltriage.analysis.model import Gap
from kerneltriage.ingest.tables import Timeline


def _union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    order = np.argsort(starts, kind="stable")
    merged: list[list[int]] = []
    for i in order.tolist():
        s, e = int(starts[i]), int(ends[i])
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def idle_gaps(
    attr: Attribution, timeline: Timeline, min_gap_ns: float, top: int = 5
) -> tuple[int, list[Gap]]:
    """(busy ns summed over steps, the biggest gap causes averaged per step)."""
    k = attr.kernels
    host = _HostIndex(timeline)
    busy_total = 0
    by_cause: dict[str, list[float]] = defaultdict(list)
    for step in attr.steps:
        mine = k[k["step"] == step.index]
        if mine.empty:
            continue
        starts = mine["start"].to_numpy()
        ends = starts + mine["dur"].to_numpy()
        spans = _union(starts, ends)
        busy_total += sum(e - s for s, e in spans)
        first_launch: dict[int, tuple[int, int]] = {}
        for s, launch, tid in zip(
            starts.tolist(), mine["launch_start"].tolist(), mine["launch_tid"].tolist()
        ):
            if s not in first_launch or launch < first_launch[s][0]:
                first_launch[s] = (launch, tid)
        for (_, prev_end), (next_start, _) in itertools.pairwise(spans):
            gap = next_start - prev_end
            if gap < min_gap_ns:
                continue
            launch, tid = first_launch.get(next_start, (-1, -1))
            if launch > prev_end:
                cause = host.cause(tid, prev_end, launch)
            else:
                cause = "dependency wait (kernel queued, waiting on another stream or event)"
            by_cause[cause].append(gap / 1e6)
    n = max(1, len(attr.steps))
    gaps = [
        Gap(cause=c, ms_per_step=sum(v) / n, count_per_step=len(v) / n, example_ms=max(v))
        for c, v in by_cause.items()
    ]
    gaps.sort(key=lambda g: -g.ms_per_step)
    return busy_total, gaps[:top]


_SYNC = ("Synchronize", "Memcpy", "cudaStreamWait", "EventSynchronize")


class _HostIndex:
    """Per-thread sorted CPU activity, to ask "what was the host doing between t0 and t1"."""

    def __init__(self, timeline: Timeline):
        self.threads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = {}
        self.runtime: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = {}
        ops = timeline.cpu[timeline.cpu["cat"] == "cpu_op"]
        for tid, g in ops.groupby("tid"):
            self.threads[int(tid)] = self._index(g)
        rt = timeline.runtime
        sync = rt[rt["name"].astype(str).str.contains("|".join(_SYNC))]
        for tid, g in sync.groupby("tid"):
            self.runtime[int(tid)] = self._index(g)

    @staticmethod
    def _index(g):
        order = np.argsort(g["start"].to_numpy(), kind="stable")
        start = g["start"].to_numpy()[order]
        end = start + g["dur"].to_numpy()[order]
        # Longest end so far: lets a bisect find every range that may overlap a window.
        reach = np.maximum.accumulate(end)
        return start, end, reach, [str(n) for n in g["name"].to_numpy()[order]]

    @staticmethod
    def _overlapping(index, t0: int, t1: int) -> list[int]:
        start, end, reach, _ = index
        lo = int(np.searchsorted(reach, t0, side="right"))
        hi = int(np.searchsorted(start, t1, side="left"))
        return [i for i in range(lo, hi) if end[i] > t0]

    def cause(self, tid: int, t0: int, t1: int) -> str:
        """The longest sync call, else the longest op, overlapping (t0, t1) on the thread."""
        rt = self.runtime.get(tid)
        if rt is not None:
            hits = self._overlapping(rt, t0, t1)
            if hits:
                i = max(hits, key=lambda j: rt[1][j] - rt[0][j])
                op = self._enclosing(tid, int(rt[0][i]))
                return f"host sync: {rt[3][i]}" + (f" in {op}" if op else "")
        ops = self.threads.get(tid)
        if ops is not None:
            hits = self._overlapping(ops, t0, t1)
            if hits:
                start, end, _, names = ops
                i = max(hits, key=lambda j: min(end[j], t1) - max(start[j], t0))
                return f"host busy: {names[i]}"
        return "host: no profiled CPU activity (Python, data loading, or untraced work)"

    def _enclosing(self, tid: int, t: int) -> str | None:
        ops = self.threads.get(tid)
        if ops is None:
            return None
        hits = self._overlapping(ops, t - 1, t)
        if not hits:
            return None
        start, end, _, names = ops
        return names[max(hits, key=lambda j: end[j] - start[j])]


def communication_overlap(attr: Attribution, is_comm) -> tuple[float, float]:
    """(communication ns, exposed communication ns) summed over steps.

    Exposed = communication time during which no compute kernel runs on any stream: what a
    step actually waits for. Communication hidden behind compute costs (almost) nothing.
    """
    k = attr.kernels
    total = exposed = 0.0
    for step in attr.steps:
        mine = k[(k["step"] == step.index) & (k["kind"] == "kernel")]
        if mine.empty:
            continue
        comm_mask = mine["name"].map(is_comm).to_numpy(dtype=bool)
        if not comm_mask.any():
            continue
        starts = mine["start"].to_numpy()
        ends = starts + mine["dur"].to_numpy()
        comm = _union(starts[comm_mask], ends[comm_mask])
        compute = _union(starts[~comm_mask], ends[~comm_mask])
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
