"""Physical invariants of a timeline and of a report, checked before anything is rendered.

A report is believed: a share of 132% or a saving above the time it saves is a lie, whatever
input caused it. Two checks, one at each end of ``triage``:

- ``clean_timeline``, on what the reader produced: events that appear twice (a trace merged or
  written twice) are dropped, GPU activities of negative duration too, and kernels of one
  stream that overlap (a stream runs one kernel at a time) are measured. Each is a warning
  that names the cause.
- ``check_report``, on the numbers about to be shown: times finite and not negative, step
  windows in order, GPU busy in [0, 100]%, each share in [0, 1], the shares of a step summing
  to at most the streams that ran at once, a saving within its share, bytes and FLOPs not
  negative. A violation means the numbers cannot be trusted: a ``TraceFormatError`` (exit
  code 2) that names the first one, never a report that states it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.model import Report
from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.tables import Timeline

# The fields that make two events of a table the same event. Integer columns are compared first
# (cheap); names only among rows that already agree on them.
_SAME_EVENT: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "kernels": (("device", "stream", "start", "dur", "correlation"), ("name", "kind"), "GPU activity"),
    "cpu": (("pid", "tid", "start", "dur", "ext_id"), ("name", "cat"), "CPU op"),
    "runtime": (("pid", "tid", "start", "dur", "correlation"), ("name",), "CUDA runtime"),
    "gpu_annotations": (("device", "start", "dur", "ext_id"), ("name",), "GPU annotation"),
}
#: Kernels of one stream overlapping for more than this share of kernel time: warned about
#: (clock skew between devices overlaps real traces by well under 1%).
OVERLAP_WARN = 0.01
_EPS = 1e-6


def clean_timeline(timeline: Timeline) -> Timeline:
    """``timeline`` without duplicated events or negative GPU durations; the warnings for what
    was dropped or found are appended to the copy's ``warnings``."""
    warnings: list[str] = []
    tables: dict[str, pd.DataFrame] = {}
    for table, (ints, names, what) in _SAME_EVENT.items():
        df: pd.DataFrame = getattr(timeline, table)
        dup = _duplicated(df, ints, names)
        if dup is not None:
            tables[table] = df[~dup].reset_index(drop=True)
            warnings.append(
                f"dropped {int(dup.sum())} duplicated {what} events (same start, duration and name "
                "on the same stream or thread: a trace written or merged twice?)"
            )
    kernels = tables.get("kernels", timeline.kernels)
    negative = kernels["dur"].to_numpy() < 0
    if negative.any():
        tables["kernels"] = kernels[~negative].reset_index(drop=True)
        warnings.append(f"dropped {int(negative.sum())} GPU activities of negative duration")
    overlap = stream_overlap(tables.get("kernels", kernels))
    if overlap > OVERLAP_WARN:
        warnings.append(
            f"kernels of one stream overlap for {overlap:.1%} of kernel time (a stream runs one kernel "
            "at a time: clocks of several devices merged?); shares may be overstated"
        )
    if not tables and not warnings:
        return timeline
    return dataclasses.replace(timeline, **tables, warnings=[*timeline.warnings, *warnings])


def _duplicated(df: pd.DataFrame, ints: tuple[str, ...], names: tuple[str, ...]) -> pd.Series | None:
    if len(df) < 2:
        return None
    # A hash of the integer columns first (a million rows in one pass): rows whose hash is
    # unique are no duplicate; only the rest are compared, column by column.
    hashed = np.zeros(len(df), dtype=np.uint64)
    for column in ints:
        hashed = hashed * np.uint64(1_000_003) ^ df[column].to_numpy().astype(np.uint64)
    candidates = pd.Series(hashed).duplicated(keep=False).to_numpy()
    if not candidates.any():
        return None
    some = df[candidates]
    maybe = some.duplicated(list(ints), keep=False).to_numpy()
    if not maybe.any():
        return None
    dup = pd.Series(False, index=df.index)
    dup.loc[some.index[maybe]] = some[maybe].duplicated([*ints, *names]).to_numpy()
    return dup if dup.any() else None


def stream_overlap(kernels: pd.DataFrame) -> float:
    """The share of kernel time during which an earlier kernel of the same stream still ran."""
    if len(kernels) < 2:
        return 0.0
    device, stream = kernels["device"].to_numpy(), kernels["stream"].to_numpy()
    order = np.lexsort((kernels["start"].to_numpy(), stream, device))
    device, stream = device[order], stream[order]
    start = kernels["start"].to_numpy()[order]
    dur = kernels["dur"].to_numpy()[order]
    end = start + dur
    # The latest end so far on each stream (streams one after another: offset so that a stream's
    # ends all lie above the one before's), then the one before each kernel.
    first = np.ones(len(order), dtype=bool)
    first[1:] = (device[1:] != device[:-1]) | (stream[1:] != stream[:-1])
    span = int(end.max()) - int(end.min()) + 1
    offset = np.cumsum(first) * span
    reach = np.maximum.accumulate(end - end.min() + offset) - offset + end.min()
    previous = np.empty(len(order), dtype=np.int64)
    previous[1:] = reach[:-1]
    overlap = np.where(first, 0, np.minimum(np.maximum(previous - start, 0), dur))
    total = float(dur.sum())
    return float(overlap.sum()) / total if total > 0 else 0.0


def check_report(report: Report, timeline: Timeline, steps: list[Any]) -> Report:
    """``report`` if its numbers are physically possible; else a ``TraceFormatError`` naming the
    first impossible one. ``steps``: the attribution's step windows (start, dur)."""
    where = timeline.source

    def refuse(what: str) -> None:
        raise TraceFormatError(f"the numbers cannot be trusted: {what}", path=where)

    previous_start = -math.inf
    for s in steps:
        if s.dur < 0 or s.start < previous_start:
            refuse(f"step windows out of order (step {s.index}: start {s.start}, duration {s.dur} ns)")
        previous_start = s.start
    if not (math.isfinite(report.step_time_ms) and report.step_time_ms > 0):
        refuse(f"step time {report.step_time_ms} ms")
    for name in ("gpu_busy_pct", "idle_pct"):
        value = getattr(report, name)
        if not (-_EPS <= value <= 100 + _EPS):
            refuse(f"{name.replace('_', ' ')} {value:.4g}%, outside 0-100%")
    for name in ("gpu_busy_ms", "unattributed_ms_per_step", "communication_ms_per_step"):
        _time(getattr(report, name), name, refuse)
    for kind, ms in report.kind_breakdown.items():
        _time(ms, f"time of {kind}", refuse)
    streams = max(1, timeline.kernels.groupby(["device", "stream"]).ngroups)
    # A share above the whole step is possible only where several streams ran at once, or where
    # the step time is that of the program as run (profile's plain steps), not of the trace.
    lenient = streams > 1 or "timing" in report.source
    total = 0.0
    for c in report.candidates:
        for name in ("time_ms_per_step", "fwd_ms_per_step", "bwd_ms_per_step"):
            _time(getattr(c, name), f"{c.id} {name}", refuse)
        for name in ("time_share", "gpu_share"):
            value = getattr(c, name)
            if not (value >= -_EPS and (lenient or value <= 1 + _EPS)) or not math.isfinite(value):
                refuse(f"{c.id} ({c.name}) has {name.replace('_', ' ')} {value:.4g}, outside [0, 1]")
        saving = c.expected_saving_share
        if not (-_EPS <= saving <= c.time_share + _EPS):
            refuse(
                f"{c.id} ({c.name}) would save {saving:.4g} of the step, more than its share {c.time_share:.4g}"
            )
        r = c.roofline
        for name in ("bytes", "flops", "measured_dram_bytes", "ceiling_ms"):
            value = getattr(r, name)
            if value is not None and not (value >= 0):  # NaN is "not measured" only as None
                if isinstance(value, float) and math.isnan(value):
                    continue
                refuse(f"{c.id} ({c.name}) has roofline {name} {value:.4g}, below zero")
        total += c.time_share
    if total > streams + _EPS and "timing" not in report.source:
        refuse(
            f"the candidates' shares of the step sum to {total:.3g}, more than the {streams} stream(s) "
            "that ran kernels could fill"
        )
    return report


def _time(value: float, name: str, refuse: Any) -> None:
    if not (math.isfinite(value) and value >= 0):
        refuse(f"{name} is {value} ms")
