"""The CPU rows of a trace as a tree per thread: which row holds which (by time), each row's
depth, the innermost row running at a moment, and the forward op a backward op differentiates.

Rows nest by interval containment on their thread; partial overlaps (an annotation a hook opened
inside another) pop the outlasted range, and a child may end a little after its parent from
timestamp rounding (``NEST_TOLERANCE_NS``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

NEST_TOLERANCE_NS = 1000


def nest(cpu: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Parent row of every cpu row on its thread (-1: top level), by interval containment,
    and its depth (0: top level; a parent is one level above its children)."""
    n = len(cpu)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent, np.zeros(0, dtype=np.int64)
    start = cpu["start"].to_numpy()
    end = start + cpu["dur"].to_numpy()
    pid = cpu["pid"].to_numpy()
    tid = cpu["tid"].to_numpy()
    # Sorted by thread, then start, longest first: a parent always precedes its children. In
    # that order the ranges holding a row are its predecessor's chain of parents, innermost
    # first; the first of them that holds the row is its parent. A range holds a row that starts
    # before it ends and ends by its end (a child may end a little after its parent from
    # timestamp rounding, hence the tolerance); a range that ended before the row starts, or
    # that the row outlasts (annotations overlap partly: ProfilerStep#N+1 starts inside the
    # optimizer step whose hook started it), holds no later row either.
    order = np.lexsort((-cpu["dur"].to_numpy(), start, tid, pid))
    sorted_pid, sorted_tid = pid[order], tid[order]
    starts, ends = start[order], end[order]
    tolerance = NEST_TOLERANCE_NS
    same_thread = np.zeros(n, dtype=bool)
    same_thread[1:] = (sorted_pid[1:] == sorted_pid[:-1]) & (sorted_tid[1:] == sorted_tid[:-1])
    # Most rows are held by their predecessor itself: found at once, in numpy.
    previous_end = np.empty(n, dtype=np.int64)
    previous_end[0], previous_end[1:] = 0, ends[:-1]
    held = same_thread & (previous_end > starts) & (ends <= previous_end + tolerance)
    up = np.where(held, np.arange(n) - 1, -1).tolist()  # parent, as a position in this order
    # The rest climb their predecessor's parents (known by then: they come earlier).
    end_at = ends.tolist()
    rest = np.flatnonzero(same_thread & ~held)
    for i, s, e in zip(rest.tolist(), starts[rest].tolist(), ends[rest].tolist()):
        c = up[i - 1]
        while c >= 0 and (end_at[c] <= s or e > end_at[c] + tolerance):
            c = up[c]
        up[i] = c
    at = np.array(up, dtype=np.int64)
    parent[order] = np.where(at >= 0, order[np.maximum(at, 0)], -1)
    # Depth: how many parents up to the top (a few passes, one per level).
    depth = np.zeros(n, dtype=np.int64)
    above = parent.copy()
    held = np.flatnonzero(above >= 0)
    while len(held):
        depth[held] += 1
        above[held] = parent[above[held]]
        held = held[above[held] >= 0]
    return parent, depth


def levels(depth: np.ndarray) -> list[np.ndarray]:
    """The rows of each nesting depth, outermost first (each in row order)."""
    if not len(depth):
        return []
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    return [by_depth[a:b] for a, b in itertools.pairwise(bounds.tolist())]


def forward_of(
    root: np.ndarray, is_op: np.ndarray, is_bwd_root: np.ndarray, seqs: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """Backward top-level op → forward top-level op, through the autograd sequence number: the
    forward op of that number that started last before the backward op (the first in row order
    among those that started together); -1 when there is none.

    A backward top-level op without a number takes that of its first op (in row order) that has
    one."""
    n = len(root)
    fwd_of = np.full(n, -1, dtype=np.int64)
    bwd = np.flatnonzero(is_bwd_root)
    if not len(bwd):
        return fwd_of
    seq = seqs[bwd].copy()
    unnumbered = seq < 0
    if unnumbered.any():
        numbered = np.flatnonzero((root >= 0) & (seqs >= 0))
        held, first = np.unique(root[numbered], return_index=True)
        seq_of_root = np.full(n, -1, dtype=np.int64)
        seq_of_root[held] = seqs[numbered[first]]
        seq[unnumbered] = seq_of_root[bwd[unnumbered]]
    forward = np.flatnonzero(is_op & (seqs >= 0))
    forward = forward[(root[forward] >= 0) & ~is_bwd_root[np.maximum(root[forward], 0)]]
    if not len(forward):
        return fwd_of
    # One sortable key per (number, start): the last forward op at or before a backward op's
    # key is its forward op (of those that started together, the first in row order).
    seq_values = np.unique(seqs[forward])
    origin = int(min(starts[forward].min(), starts[bwd].min()))
    width = int(max(starts[forward].max(), starts[bwd].max())) - origin + 1
    if (len(seq_values) + 1) * width < 2**62:

        def key(s: np.ndarray, t: np.ndarray) -> np.ndarray:
            return np.searchsorted(seq_values, s) * width + (t - origin)

    else:  # a span too long for one number: starts by their rank
        start_values = np.unique(np.concatenate([starts[forward], starts[bwd]]))
        width = len(start_values) + 1

        def key(s: np.ndarray, t: np.ndarray) -> np.ndarray:
            return np.searchsorted(seq_values, s) * width + np.searchsorted(start_values, t)

    forward = forward[::-1]  # rows descending, kept so among equal keys by the stable sort
    keys = key(seqs[forward], starts[forward])
    order = np.argsort(keys, kind="stable")
    forward, keys = forward[order], keys[order]
    at = np.searchsorted(keys, key(seq, starts[bwd]), side="right") - 1
    found = (at >= 0) & (seq >= 0)
    found[found] = seqs[forward[at[found]]] == seq[found]
    fwd_of[bwd[found]] = root[forward[at[found]]]
    return fwd_of


def innermost_at(
    cpu: pd.DataFrame,
    is_op: np.ndarray,
    parent: np.ndarray,
    tids: np.ndarray,
    times: np.ndarray,
    ops_only: bool = True,
) -> np.ndarray:
    """For each (thread, time): the innermost cpu row on that thread holding the time (-1).

    The latest row starting at or before ``t`` holds ``t`` unless it already ended; then the
    innermost holder is its nearest ancestor that still holds ``t`` (rows nest per thread).
    """
    out = np.full(len(times), -1, dtype=np.int64)
    if len(cpu) == 0 or len(times) == 0:
        return out
    start = cpu["start"].to_numpy()
    end = start + cpu["dur"].to_numpy()
    tid_all = cpu["tid"].to_numpy()
    for tid in np.unique(tids):
        rows = np.flatnonzero(tid_all == tid)
        if len(rows) == 0:
            continue
        rows = rows[np.argsort(start[rows], kind="stable")]
        want = np.flatnonzero((tids == tid) & (times >= 0))
        pos = np.searchsorted(start[rows], times[want], side="right") - 1
        for j, p in zip(want.tolist(), pos.tolist()):
            if p < 0:
                continue
            t = times[j]
            r = int(rows[p])
            while r >= 0 and (end[r] < t or (ops_only and not is_op[r])):
                r = int(parent[r])
            out[j] = r
    return out
