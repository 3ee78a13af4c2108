"""Plausibility of a trace's numbers before they are analysed: what the trace says about itself
that cannot all be true. Each finding is a named warning (the report says what to distrust)
or, where no honest report can follow, a ``TraceFormatError`` (exit code 2) naming it.

- kernel launches with no kernel at all: the GPU side of the trace was not recorded;
- kernels without a launch (no correlation id): their op, module and candidate are unknown;
- kernels of zero total duration: there is no GPU time to share out;
- a kernel longer than every step of the trace together: a corrupt duration;
- a step time (profile's plain steps) shorter than the GPU work of its own kernels.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.timeline.attribution import name_mask
from kerneltriage.analysis.vocabulary import Reason, Verdict
from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.tables import Timeline

#: Runtime and driver calls that launch a kernel.
_LAUNCH = re.compile(r"^(cuda|cu|hip)(Launch|LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")
#: Launches or kernel time without their counterpart above this share are warned about.
MISSING_WARN = 0.2
#: A step time below this share of its own kernels' busy time is contradicted by them (the
#: recorded steps ran under the profiler, which slows the host, not the kernels, by this much).
STEP_CONTRADICTED = 0.5
#: A plain step (no profiler) this many times longer than the recorded steps is not the same
#: program's step.
PLAIN_SLOWER = 10.0
#: A candidate's achieved rate above its GPU's fastest datasheet peak times this (FLOPs) or its
#: memory bandwidth times ``BYTES_MARGIN`` (bytes: caches serve several times faster than DRAM,
#: and estimated bytes count each tensor once) is impossible.
RATE_MARGIN = 2.0
BYTES_MARGIN = 10.0
#: GPU activities further than this multiple of the host's recorded span (and at least
#: ``OUTSIDE_MIN_NS``) from it carry corrupt timestamps (a GPU runs behind its host by a queue
#: of launches, seconds at most).
OUTSIDE_TOLERANCE = 1.0
OUTSIDE_MIN_NS = 60 * 10**9
#: Steps shorter than this (median) cannot hold one kernel launch: not a training loop's steps.
MIN_STEP_NS = 1_000
#: Steps overlapping by more than this share of the shorter one (and ``OVERLAP_TOLERANCE_NS``)
#: are refused; clock rounding overlaps real ones by a microsecond at most.
STEP_OVERLAP_SHARE = 0.01
OVERLAP_TOLERANCE_NS = 10_000


def drop_kernels_outside(timeline: Timeline) -> Timeline:
    """``timeline`` without GPU activities that lie far outside the host's recording (more than
    ``OUTSIDE_TOLERANCE`` × its span, and ``OUTSIDE_MIN_NS``, before its first host event or
    after its last): the profiler records the GPU only around the host's window, so such a
    timestamp is corrupt. Judged relative to the trace; a warning names the first one."""
    kernels = timeline.kernels
    starts, ends = [], []
    for table in (timeline.cpu, timeline.runtime):
        if not table.empty:
            starts.append(int(table["start"].min()))
            ends.append(int((table["start"] + table["dur"].clip(lower=0)).max()))
    if kernels.empty or not starts:
        return timeline
    first, last = min(starts), max(ends)
    slack = max(OUTSIDE_MIN_NS, OUTSIDE_TOLERANCE * (last - first))
    k_start = kernels["start"].to_numpy()
    k_end = k_start + kernels["dur"].clip(lower=0).to_numpy()
    outside = (k_end < first - slack) | (k_start > last + slack)
    if not outside.any():
        return timeline
    i = int(np.flatnonzero(outside)[0])
    where = k_start[i] - last if k_start[i] > last else first - k_end[i]
    side = "after the last" if k_start[i] > last else "before the first"
    warning = (
        f"dropped {int(outside.sum())} GPU activities timed far outside the recording (kernel "
        f"{str(kernels['name'].iloc[i])[:60]!r} starts {_human(float(where))} {side} host event of a "
        f"{_human(float(last - first))} recording): corrupt timestamps"
    )
    return dataclasses.replace(
        timeline,
        kernels=kernels[~outside].reset_index(drop=True),
        warnings=[*timeline.warnings, warning],
    )


def check_launches(timeline: Timeline) -> list[str]:
    """Kernel launches against kernel events: none at all is refused, many missing warned."""
    runtime = timeline.runtime
    if runtime.empty:
        return []
    is_launch = name_mask(runtime["name"], _LAUNCH.match)
    if not is_launch.any():
        return []
    n_launches = int(is_launch.sum())
    kernels = timeline.kernels
    correlations = kernels["correlation"].to_numpy()[(kernels["kind"] == "kernel").to_numpy()]
    if not len(correlations):
        raise TraceFormatError(
            f"{n_launches} kernel launches but no kernel event: the GPU side of the trace was not "
            "recorded (CUPTI activity lost or filtered); idle time and shares would be invented",
            path=timeline.source,
        )
    matched = pd.Series(runtime["correlation"].to_numpy()[is_launch]).isin(correlations)
    missing = 1.0 - float(matched.mean())
    if missing > MISSING_WARN and (correlations > 0).any():
        return [
            f"{missing:.0%} of the {n_launches} kernel launches have no kernel event in the trace "
            "(CUPTI activity lost?); GPU busy time and shares are understated"
        ]
    return []


def check_kernels(timeline: Timeline, kernels: pd.DataFrame) -> list[str]:
    """The kernels (the attribution's table: ``step``, ``launch_start`` -1 when no launch in
    the trace names one): their total duration in the steps, the longest of them against the
    host's recording, and the share of kernel time without a launch."""
    source = timeline.source
    compute = (kernels["kind"] == "kernel").to_numpy()
    dur = kernels["dur"].to_numpy()
    in_step = compute & (kernels["step"].to_numpy() >= 0)
    if in_step.any() and float(dur[in_step].sum()) <= 0:
        raise TraceFormatError(
            f"the {int(in_step.sum())} kernels inside the steps have zero total duration (durations zero "
            "or missing): there is no GPU time to share out",
            path=source,
        )
    all_dur = timeline.kernels["dur"]
    longest_at = int(np.argmax(all_dur.to_numpy()))
    longest_dur = all_dur.iloc[longest_at]
    recorded = _host_span(timeline)
    if recorded and float(longest_dur) > recorded:
        # The profiler waits for the GPU before it stops: no kernel outlasts the host's record.
        name = timeline.kernels["name"].iloc[longest_at]
        raise TraceFormatError(
            f"kernel {str(name)[:60]!r} lasts {_human(float(longest_dur))}, longer than "
            f"the whole recording ({_human(recorded)} of host events) and so longer than its step: "
            "a corrupt duration",
            path=source,
        )
    warnings = []
    total = float(dur[compute].sum())
    unlaunched = (
        float(dur[compute & (kernels["launch_start"].to_numpy() < 0)].sum()) / total if total > 0 else 0.0
    )
    if unlaunched > MISSING_WARN:
        warnings.append(
            f"{unlaunched:.0%} of kernel time has no launch in the trace (kernels without a "
            "correlation id, or launched before the profiler started): its ops, modules and "
            "candidates are unknown, so the candidates cover only the rest"
        )
    return warnings


def check_kernel_in_step(kernels: pd.DataFrame, walls_ns: Any) -> list[str]:
    """A kernel inside the steps that lasts longer than the longest step: the steps' host
    ranges do not bound the GPU's work (nothing in the step waits for it), so the shares of a
    step are shares of a window the GPU outran."""
    compute = np.flatnonzero((kernels["kind"] == "kernel").to_numpy() & (kernels["step"].to_numpy() >= 0))
    if not len(compute) or not len(walls_ns):
        return []
    dur = kernels["dur"].to_numpy()
    longest = int(compute[np.argmax(dur[compute])])
    widest = float(max(walls_ns))
    if widest <= 0 or float(dur[longest]) <= widest:
        return []
    name = kernels["name"].iloc[longest]
    return [
        f"kernel {str(name)[:60]!r} lasts {_human(float(dur[longest]))}, longer than the longest "
        f"step ({_human(widest)}): the steps' host ranges do not bound the GPU's work (nothing in a step "
        "waits for it), so shares of the step can exceed what the step shows"
    ]


def check_steps(steps: list[Any], step_source: str, source: str) -> None:
    """The steps' windows (``attribution.Step``: ``name``, ``start``, ``end`` in ns), judged
    against each other, never as absolute times: steps shorter than a kernel launch, or steps
    that begin before the previous one ends, are not a training loop's; refused by name."""
    if not steps:
        return
    durations = np.array([s.end - s.start for s in steps], dtype=np.float64)
    median = float(np.median(durations))
    if len(steps) > 1 and median < MIN_STEP_NS:
        raise TraceFormatError(
            f"the {len(steps)} steps ({step_source}) last {median:.3g} ns each (median), shorter than "
            f"one kernel launch ({MIN_STEP_NS / 1000:.0f} µs): these markers are not a training step's",
            path=source,
            hint="pass --step-marker to name the step ranges",
        )
    ordered = sorted(steps, key=lambda s: (s.start, s.end))
    overlapping = 0
    first: str | None = None
    reach, holder = ordered[0].end, ordered[0]
    for s in ordered[1:]:
        overlap = reach - s.start
        tolerance = max(
            OVERLAP_TOLERANCE_NS, STEP_OVERLAP_SHARE * min(s.end - s.start, holder.end - holder.start)
        )
        if overlap > tolerance:
            overlapping += 1
            if first is None:
                first = f"{s.name} starts {_human(float(overlap))} before {holder.name} ends"
        if s.end > reach:
            reach, holder = s.end, s
    if overlapping:
        raise TraceFormatError(
            f"{overlapping} of the {len(steps)} steps ({step_source}) overlap the one before ({first}): "
            "a step cannot begin before the previous one ends, so no time or share of a step can be trusted",
            path=source,
            hint="pass --step-marker to name the step ranges",
        )


def check_step_time(
    timing: dict[str, Any], busy_ms: float, source: str, recorded_ms: float | None = None
) -> None:
    """A step time from ``profile``'s plain steps that its own kernels contradict, or that is
    far longer than the recorded steps (which ran under the profiler, so they are the slower)."""
    plain = float(timing["plain_median_ms"])
    if plain < STEP_CONTRADICTED * busy_ms:
        raise TraceFormatError(
            f"the manifest's step time ({plain:.4g} ms) is contradicted by the trace's own kernels "
            f"({busy_ms:.4g} ms of GPU work per step): phases.timeline.step_time is wrong",
            path=source,
        )
    if recorded_ms is not None and recorded_ms > 0 and plain > PLAIN_SLOWER * recorded_ms:
        raise TraceFormatError(
            f"the manifest's step time ({plain:.4g} ms) is {plain / recorded_ms:.3g}× the recorded steps' "
            f"({recorded_ms:.4g} ms), which ran under the profiler and so cannot be the faster: "
            "phases.timeline.step_time is wrong",
            path=source,
        )


def check_rates(candidates: list[Any], gpu: Any) -> list[str]:
    """Candidates whose achieved rate (their FLOPs or bytes over their measured time) is above
    what the GPU can do: the GPU's fastest datasheet peak × ``RATE_MARGIN`` (bytes: × ``BYTES_MARGIN``,
    since a cache serves faster than memory), or, with no GPU known, what no GPU reaches.
    Their FLOPs or bytes (from recorded shapes, or counters) cannot be right: each such row is
    skipped (``estimate-failed``) with a note that says why, and one warning names every one
    with the field and the value."""
    if gpu is not None:
        flop_limit = max(gpu.peak_tflops.values(), default=0.0) * RATE_MARGIN
        byte_limit = float(gpu.peak_bandwidth_gbs) * BYTES_MARGIN
        basis = f"{gpu.key}'s datasheet"
    else:
        flop_limit, byte_limit, basis = 1e6, 1e6, "any GPU"  # TFLOP/s, GB/s: what none reaches
    found = []
    for c in candidates:
        r = c.roofline
        said = []
        if flop_limit > 0 and r.achieved_tflops is not None and r.achieved_tflops > flop_limit:
            said.append(f"achieved_tflops {r.achieved_tflops:.3g} TFLOP/s (over {flop_limit:.4g})")
        if byte_limit > 0 and r.achieved_gbs is not None and r.achieved_gbs > byte_limit:
            said.append(f"achieved_gbs {r.achieved_gbs:.3g} GB/s (over {byte_limit:.4g})")
        if not said:
            continue
        # No verdict is built on numbers that cannot be right (as for a failed estimate).
        c.verdict, c.reason = Verdict.SKIP, Reason.ESTIMATE_FAILED
        c.expected_saving_share = 0.0
        c.note = f"implausible: {' and '.join(said)}, more than {basis} allows; its FLOPs/bytes ({r.source}) cannot be right"
        found.append(f"{c.id} ({c.name[:60]}): {' and '.join(said)}")
    if not found:
        return []
    return [
        f"{len(found)} candidate(s) run faster than {basis} allows, so their FLOPs or bytes (from the "
        f"recorded shapes or counters) cannot be right; their rows say 'implausible': {'; '.join(found[:3])}"
        + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    ]


def unusable_calibration(calibration: dict[str, Any] | None) -> str | None:
    """The measurements of a run's calibration that cannot be ceilings (zero, negative, not a
    finite number), named with their values; None when there are none. They are ignored (the
    datasheet's ceiling stands in), and the report says so."""
    if not isinstance(calibration, dict):
        return None
    given = [("hbm_gbs", calibration.get("hbm_gbs"))]
    peaks = calibration.get("peak_tflops")
    if isinstance(peaks, dict):
        given += [(f"peak_tflops.{k}", v) for k, v in peaks.items()]
    bad = [
        f"{name} {value!r}"
        for name, value in given
        if value is not None
        and not (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
    ]
    if not bad:
        return None
    return (
        f"the run's calibration gives {', '.join(bad)}: not a positive rate, so ignored "
        "(the datasheet ceiling stands in)"
    )


def _host_span(timeline: Timeline) -> float:
    """ns from the first host event (CPU op, runtime call) to the end of the last one."""
    starts, ends = [], []
    for table in (timeline.cpu, timeline.runtime):
        if not table.empty:
            starts.append(float(table["start"].min()))
            ends.append(float((table["start"] + table["dur"].clip(lower=0)).max()))
    return max(ends) - min(starts) if starts else 0.0


def _human(ns: float) -> str:
    seconds = ns / 1e9
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{ns / 1e6:.3g} ms"
