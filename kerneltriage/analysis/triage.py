"""From attributed kernels to ranked write-or-skip verdicts. Pure functions over tables.

``triage`` runs the steps, each in a module of its own:

1. Attribute kernels to steps, ops, modules and regions (``attribution.py``); measure the
   step, GPU-busy and idle time (``idle.py``); join ncu counters (``join.py``).
2. Group each step's ops and regions into candidates (``grouping.py``).
3. Assemble each candidate's numbers (``candidates.py``): its roofline (``roofline.py``) and
   shape signatures (``shapes.py``).
4. Test the three conditions and pick a verdict from the rules (``verdict.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.candidates.grouping import group_candidates
from kerneltriage.analysis.candidates.measure import build_candidate
from kerneltriage.analysis.candidates.roofline import raised_roofs, with_raised_roofs
from kerneltriage.analysis.fixes.fix_environment import environment
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.graph_advice import compiled_graph_advice
from kerneltriage.analysis.judge.host_bound import (
    HostTime,
    blocking_ms,
    cap_to_host,
    host_time,
    launches_per_step,
    loading_ms,
    queue_depth,
    step_fix,
)
from kerneltriage.analysis.judge.second_rung import rule_out_applied
from kerneltriage.analysis.judge.verdict import decide, rank_in_order
from kerneltriage.analysis.model import Candidate, Gap, Idle, Report
from kerneltriage.analysis.rules import Rules, Thresholds
from kerneltriage.analysis.timeline import plausibility, steady
from kerneltriage.analysis.timeline.attribution import Attribution, attribute
from kerneltriage.analysis.timeline.compiled import compiled_graphs
from kerneltriage.analysis.timeline.idle import (
    COMMUNICATION,
    HOST_BUSY,
    STALL,
    communication_overlap,
    find_idle,
    unlaunched_busy_ns,
)
from kerneltriage.analysis.timeline.invariants import check_report, clean_timeline
from kerneltriage.analysis.timeline.join import JoinResult, join_counters
from kerneltriage.analysis.timeline.sizes import launch_sizes
from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.ncu_csv import Counters
from kerneltriage.ingest.tables import Timeline


def triage(
    timeline: Timeline,
    gpu: GPUSpec | None,
    rules: Rules,
    counters: Counters | None = None,
    *,
    step_marker: str | None = None,
    source: dict[str, Any] | None = None,
    hot_kernels: list[str] | None = None,
    timing: dict[str, Any] | None = None,
) -> Report:
    """Analyse one timeline (one process/rank) and return the ranked report.

    ``hot_kernels``: base names the ncu phase targeted; the join then also says how much of
    their time has counters. ``timing``: ``profile``'s step timing (``Profile.step_timing``):
    the step time is then its plain steps' and the GPU busy time its clean steps', not the
    recorded steps' (which ran under the CPU-op profiler and module ranges).
    """
    require_gpu_activity(timeline)
    timeline = clean_timeline(timeline)  # duplicated events dropped, with a warning
    timeline = plausibility.drop_kernels_outside(timeline)  # corrupt timestamps, with a warning
    attr = attribute(timeline, step_marker)
    plausibility.check_steps(attr.steps, attr.step_source, timeline.source)
    in_step = _in_step_kernels(attr, timeline)
    warnings = list(rules.warnings) + list(timeline.warnings) + list(attr.warnings)
    warnings += plausibility.check_launches(timeline)
    warnings += plausibility.check_kernels(timeline, attr.kernels)
    join = None if counters is None else _join(timeline, attr.kernels, counters, rules, hot_kernels, warnings)
    source = dict(source or {"trace": timeline.source})
    steps = _step_time(attr, timeline, rules, timing, source, warnings)
    candidates, gpu = _candidates(timeline, attr, in_step, join, counters, gpu, rules, steps, warnings)
    env = environment(gpu, source, timeline.meta)
    decide(candidates, rules, gpu, env)
    rule_out_applied(candidates, source.get("applied_fixes"))  # profile --apply: the second rung
    warnings += cap_to_host(candidates, steps.host)  # a kernel-only fix saves what the host leaves
    warnings += plausibility.check_rates(candidates, gpu)  # after the verdicts' own notes
    compiled = _compiled(timeline, attr, rules, steps, source)
    compiled_graph_advice(compiled, rules, env)
    launches = len(in_step) / max(steps.n_steps, 1)
    fix = step_fix(
        candidates,
        steps.host,
        steps.busy_ms,
        launches,
        bool(compiled),
        rules.recipes,
        env,
        loading=loading_ms(timeline, attr.windows) if steps.host and steps.host.paces_step else 0.0,
    )
    if fix is not None:  # CUDA graphs for a step the host paces: verify's S1
        source["timing"]["host"]["fix"] = fix
        for c in candidates:
            if "saving_before_host" in c.attrs:  # what it saves once the kernels pace the step
                c.note += f"; {fix['id']} (CUDA graphs) first, then profile again: `profile --apply RUN:{fix['id']}`"
    rank_in_order(candidates)
    report = _assemble_report(
        timeline, attr, in_step, gpu, rules, source, steps, join, candidates, compiled, warnings
    )
    return check_report(report, timeline, attr.steps)  # nothing impossible is rendered


def _in_step_kernels(attr: Attribution, timeline: Timeline) -> np.ndarray:
    """Rows of the attributed kernels inside the active steps; none is a trace error."""
    in_step = np.flatnonzero(attr.kernels["step"].to_numpy() >= 0)
    if not len(in_step):
        raise TraceFormatError(
            "no GPU kernel was launched inside the active steps "
            f"({len(attr.steps)} step(s) found from {attr.step_source})",
            path=timeline.source,
        )
    return in_step


def _join(
    timeline: Timeline,
    kernels: pd.DataFrame,
    counters: Counters,
    rules: Rules,
    hot_kernels: list[str] | None,
    warnings: list[str],
) -> JoinResult:
    """The counters joined onto the kernels; their warnings, and one when they cover too
    little of the kernel time, added to ``warnings``."""
    # Sizes only where a capture holds the first launch of each size: they cost a pass over
    # the launching ops, which a 1 GB trace's report need not pay.
    sizes = launch_sizes(timeline, kernels) if counters.first_of_size else None
    join = join_counters(
        kernels,
        counters,
        rules.thresholds.join_max_duration_ratio,
        hot_kernels,
        sizes,
        counters.scaled_kernels,
    )
    warnings += counters.warnings + join.warnings
    if join.time_joined_share < rules.thresholds.join_warn:
        warnings.append(
            f"counters cover {join.time_joined_share:.0%} of kernel time; the rest is placed on "
            "the roofline from shape estimates"
        )
    return join


@dataclass
class _StepTime:
    """The step as measured: its time and spread, GPU busy time, idle causes, communication."""

    n_steps: int
    step_ms: float
    spread_ms: float | None
    busy_ms: float
    gaps: list[Gap]
    comm_ns: float
    exposed_ns: float
    idle: Idle
    interval: tuple[float, float] | None = None  # the step time's 95% interval
    transient: int | None = None  # plain steps cut as a warm-up transient
    settled: bool | None = None
    host: HostTime | None = None  # the host's time to issue a step (timing processes)


def _step_time(
    attr: Attribution,
    timeline: Timeline,
    rules: Rules,
    timing: dict[str, Any] | None,
    source: dict[str, Any],
    warnings: list[str],
) -> _StepTime:
    """Step, busy and idle time of the recorded steps, or of the plain and clean steps of
    ``profile``'s ``timing`` (recorded in ``source``)."""
    n_steps = len(attr.steps)
    walls = step_walls(attr)
    warnings += plausibility.check_kernel_in_step(attr.kernels, walls)
    step_ms = float(np.mean(walls)) / 1e6
    spread_ms = spread(np.asarray(walls) / 1e6)
    interval = _interval(steady.mean_interval(np.asarray(walls) / 1e6)) if len(walls) >= 2 else None
    transient = settled = None
    found = find_idle(attr, timeline, rules.thresholds.gap_us * 1000)
    gaps = found.gaps
    busy_ms = found.busy_ns / n_steps / 1e6
    if timing:
        plausibility.check_step_time(timing, busy_ms, timeline.source, recorded_ms=step_ms)
        plain = steady.steady(timing.get("plain_ms") or [])
        processes = _processes(timing, warnings)
        if processes is not None:
            # Several timing processes: the mean of their steady medians, with the interval a
            # further run of the script falls in (steady.run_interval).
            timing = {**timing, "plain_median_ms": processes.value}
            # No run is shorter than the GPU's own work in a step.
            floor_ms = float(timing.get("gpu_busy_ms") or 0.0)
            low = max(processes.low, floor_ms) if floor_ms < processes.value else processes.low
            interval = _interval((low, processes.high))
        elif plain is not None:
            # The plain steps' steady state: a warm-up transient inside them is cut.
            timing = {**timing, "plain_median_ms": plain.median}
            interval = _interval((plain.low, plain.high)) if len(plain.values) >= 2 else None
        if plain is not None:
            transient = plain.skipped
            # Too few plain steps to tell (fewer than the steady state needs): neither. Where
            # timing processes give the step time, phase 1 timed its fewest plain steps and the
            # processes settle (``profile/context.plain_bounds``).
            enough = len(plain.values) + plain.skipped >= int(steady.settings()["steady"]["min_steps"])
            settled = plain.settled if enough and processes is None else None
            if enough and processes is None:
                _say_unsteady(plain, warnings)
        step_ms, busy_ms, gaps = _timed_as_run(timing, step_ms, busy_ms, gaps, source)
        source["timing"]["processes"] = len(timing.get("processes_plain_ms") or []) if processes else 1
        spread_ms = spread(list(plain.values) if plain is not None else timing.get("plain_ms") or [])
    comm_ns, exposed_ns = communication_overlap(attr, lambda n: rules.classify(None, n) == "communication")
    # The interval a further run of the script falls in, where profile timed the script: the
    # noise the idle time is judged against (a trace alone keeps the steps' spread).
    step_low = interval[0] if timing and interval else None
    idle = idle_by_class(step_ms, busy_ms, spread_ms, gaps, exposed_ns / n_steps / 1e6, rules, step_low)
    host = None
    if timing:
        recorded_ms = float(np.mean(walls)) / 1e6
        host = host_time(
            timing,
            step_ms,
            blocking_ms(timeline, attr.windows),
            recorded_ms,
            launches_per_step(timeline, attr.windows),
            lambda host_ms: queue_depth(timeline, attr.windows, host_ms),
        )
        if host is not None:
            source["timing"]["host"] = host.to_json()
    return _StepTime(
        n_steps,
        step_ms,
        spread_ms,
        busy_ms,
        gaps,
        comm_ns,
        exposed_ns,
        idle,
        interval,
        transient,
        settled,
        host,
    )


def _processes(timing: dict[str, Any], warnings: list[str]) -> steady.Interval | None:
    """The step time over ``profile``'s timing processes (two or more), else None. A process far
    from the others (``steady.outlier_runs``) is left out, as verify leaves out an outlier run;
    steps a process ran above its floor (``steady.level``) are said."""
    over = steady.over_processes(timing.get("processes_plain_ms") or [])
    if over is None:
        return None
    found, out, kept = over.found, over.left_out, over.kept
    disturbed = [(i + 1, f) for i, f in enumerate(found) if f.disturbed and i not in out]
    if disturbed:
        said = "; ".join(
            f"process {i}: {f.disturbed} of {len(f.values)} steps above its {f.median:.2f} ms floor"
            for i, f in disturbed
        )
        warnings.append(
            f"timing: steps ran in slower stretches above a floor that repeats to within 0.2% ({said}); "
            "the GPU's work per step does not change, so the stretches are the machine's other load "
            "delaying launches: the step time is the floor's"
        )
    if out:
        others = float(np.median([f.median for f in kept]))
        said = ", ".join(f"{found[i].median:.2f} ms (process {i + 1})" for i in sorted(out))
        warnings.append(
            f"timing: {said} left out of the step time, far from the other processes' {others:.2f} ms "
            "(a slow stretch of the machine, or a process that never reached its floor)"
        )
    # The interval of a run of the script, not of the processes' mean: a user compares it
    # with the step time their own run prints.
    run = over.run
    target = float(steady.settings()["timing"]["target_half_width"])
    apart = steady.prediction_half_width([f.median for f in kept])
    if run.value > 0 and apart > target * run.value:
        said = ", ".join(f"{f.median:.2f}" for f in kept)
        warnings.append(
            f"timing: processes of the script ran {said} ms a step, so a run of it falls anywhere in "
            f"{run.low:.2f}–{run.high:.2f} ms (95%): the machine's other load moves it by more than "
            f"±{target:.0%}, and a change of step time inside that is not a finding"
        )
    return run


def _interval(bounds: tuple[float, float]) -> tuple[float, float]:
    return (round(bounds[0], 4), round(bounds[1], 4))


def _say_unsteady(plain: steady.Steady, warnings: list[str]) -> None:
    """A plain-step series that never settled makes the step time uncertain: say so."""
    if plain.settled or len(plain.values) + plain.skipped < steady.MIN_TRUNCATE:
        return
    warnings.append(
        f"the plain steps never settled ({len(plain.values)} steady of {len(plain.values) + plain.skipped}, "
        f"their halves' medians differ by more than the tolerance): the step time "
        f"{plain.median:.2f} ms (95% interval {plain.low:.2f}–{plain.high:.2f}) may still be moving; "
        "profile with more --timing-steps"
    )


def _candidates(
    timeline: Timeline,
    attr: Attribution,
    in_step: np.ndarray,
    join: JoinResult | None,
    counters: Counters | None,
    gpu: GPUSpec | None,
    rules: Rules,
    steps: _StepTime,
    warnings: list[str],
) -> tuple[list[Candidate], GPUSpec | None]:
    """A candidate per group, and the GPU they were placed against: its roofs raised first
    where a kernel was measured above them (the roof was wrong), with a warning each."""
    # Shares are of the step without its single stalls: a one-off must not dilute them all.
    share_step_ms = steps.idle.share_step_ms
    groups = group_candidates(timeline, attr, rules)
    raised = (
        raised_roofs(attr.kernels.take(in_step), join.measured_row, counters, gpu) if join is not None else []
    )
    if raised:
        # A kernel measured above its roof: the roof was wrong. Raise it before placing anything.
        assert gpu is not None  # roofs to raise are a GPU's
        gpu = with_raised_roofs(gpu, raised)
    candidates = [
        build_candidate(g, attr, join, counters, gpu, steps.n_steps, share_step_ms, steps.busy_ms, rules)
        for g in groups.values()
    ]
    if raised:
        holders = {i: c.name for g, c in zip(groups.values(), candidates) for i in g.kernel_index}
        warnings += [r.warning(holders.get(r.launch, "")) for r in raised]
    return candidates, gpu


def _compiled(
    timeline: Timeline, attr: Attribution, rules: Rules, steps: _StepTime, source: dict[str, Any]
) -> dict[str, Any] | None:
    """The compiled graphs of the trace; Dynamo's own counts where ``profile`` recorded them."""
    idle_scale = float((source.get("timing") or {}).get("idle_scale", 1.0))
    compiled = compiled_graphs(
        timeline, attr, rules, steps.n_steps, steps.idle.share_step_ms, idle_scale=idle_scale
    )
    if source.get("dynamo"):
        # Counted by Dynamo itself in the plain steps: these replace what the trace suggests
        # (a wrapper or resume frame in a trace is not a graph break).
        compiled = dict(compiled or {})
        compiled["dynamo"] = source["dynamo"]
    return compiled


def _assemble_report(
    timeline: Timeline,
    attr: Attribution,
    in_step: np.ndarray,
    gpu: GPUSpec | None,
    rules: Rules,
    source: dict[str, Any],
    steps: _StepTime,
    join: JoinResult | None,
    candidates: list[Candidate],
    compiled: dict[str, Any] | None,
    warnings: list[str],
) -> Report:
    n_steps, step_ms, busy_ms, gaps = steps.n_steps, steps.step_ms, steps.busy_ms, steps.gaps
    k = attr.kernels
    unattributed = in_step[
        (k["op"].to_numpy()[in_step] < 0)
        & k["module"].isna().to_numpy()[in_step]
        & k["region"].isna().to_numpy()[in_step]
    ]
    early_ms = unlaunched_busy_ns(attr) / n_steps / 1e6
    # Work launched before the profiled window that runs inside the steps has no op either.
    unattributed_ms = float(k["dur"].to_numpy()[unattributed].sum()) / n_steps / 1e6 + early_ms
    return Report(
        gpu=gpu,
        source=source,
        steps=n_steps,
        step_source=attr.step_source,
        step_time_ms=step_ms,
        gpu_busy_ms=busy_ms,
        gpu_busy_pct=100.0 * busy_ms / step_ms if step_ms else 0.0,
        idle_pct=max(0.0, 100.0 * (1.0 - busy_ms / step_ms)) if step_ms else 0.0,
        # The biggest causes, and any single stall or cause with a known fix beyond them.
        gaps=gaps[:5]
        + [g for g in gaps[5:] if (g.fix or g.kind == STALL) and g.ms_per_step >= 0.01 * step_ms][:3],
        join=join.to_json() if join else None,
        unattributed_ms_per_step=unattributed_ms,
        unattributed_share=unattributed_ms / busy_ms if busy_ms else 0.0,
        kind_breakdown=_kind_breakdown(candidates, early_ms, step_ms, busy_ms),
        communication_ms_per_step=steps.comm_ns / n_steps / 1e6,
        exposed_communication_ms_per_step=steps.exposed_ns / n_steps / 1e6,
        rank=timeline.rank,
        compiled=compiled,
        idle=steps.idle,
        step_spread_ms=steps.spread_ms,
        step_interval_ms=steps.interval,
        idle_interval_pct=_idle_interval(steps),
        step_transient=steps.transient,
        step_settled=steps.settled,
        unattributed_before_window_ms=early_ms,
        candidates=candidates,
        thresholds=rules.thresholds,
        warnings=warnings,
    )


def _idle_interval(steps: _StepTime) -> tuple[float, float] | None:
    return idle_interval(steps.interval, steps.busy_ms)


def idle_interval(interval: tuple[float, float] | None, busy_ms: float) -> tuple[float, float] | None:
    """The idle share's interval: busy time over the step time's interval."""
    if interval is None:
        return None
    low, high = interval
    share = [max(0.0, 100.0 * (1.0 - busy_ms / t)) if t > 0 else 0.0 for t in (low, high)]
    return (round(share[0], 2), round(share[1], 2))


def _kind_breakdown(
    candidates: list[Candidate], early_ms: float, step_ms: float, busy_ms: float
) -> dict[str, float]:
    """Step time per kind, biggest first: the candidates' kinds, work launched before the
    window, idle."""
    breakdown: dict[str, float] = defaultdict(float)
    for c in candidates:
        breakdown[c.kind] += c.time_ms_per_step
    if early_ms > 0:
        # GPU work launched before the profiled window that ran inside a step: busy, but no
        # op of the trace launched it, so no candidate holds it.
        breakdown["launched before the window"] = early_ms
    breakdown["idle"] = max(0.0, step_ms - busy_ms)
    return dict(sorted(breakdown.items(), key=lambda kv: -kv[1]))


def spread(values) -> float | None:
    """The interquartile range of step times (ms); None for fewer than two steps."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return None
    q1, q3 = np.percentile(values, [25, 75])
    return float(q3 - q1)


def idle_by_class(
    step_ms: float,
    busy_ms: float,
    spread_ms: float | None,
    gaps: list[Gap],
    exposed_ms: float,
    rules: Rules,
    step_low_ms: float | None = None,
) -> Idle:
    """``idle_of`` with the rules' thresholds."""
    return idle_of(step_ms, busy_ms, spread_ms, gaps, exposed_ms, rules.thresholds, step_low_ms)


def idle_of(
    step_ms: float,
    busy_ms: float,
    spread_ms: float | None,
    gaps: list[Gap],
    exposed_ms: float,
    t: Thresholds,
    step_low_ms: float | None = None,
) -> Idle:
    """The step's idle time by cause class, the class that leads, and whether idle and exposed
    communication together are clearly above the noise: ``idle_warn`` of the step, and where
    the step time has an interval (``step_low_ms``, its low end) still so at that end; else
    ``idle_noise`` times the steps' spread. A host-paced step's spread is its idle time moving
    (an FSDP2 job on two H100s: steps 150-315 ms, GPU busy 89 ms of them): the interval says
    whether idle stays above the cut-off, the spread only that it moves."""
    idle_ms = max(0.0, step_ms - busy_ms)
    classes: dict[str, float] = defaultdict(float)
    for g in gaps:
        classes[g.kind or HOST_BUSY] += g.ms_per_step
    if exposed_ms > 0:
        classes[COMMUNICATION] += exposed_ms
    waiting = idle_ms + exposed_ms
    above = step_ms > 0 and waiting >= t.idle_warn * step_ms
    if step_low_ms is not None and 0 < step_low_ms <= step_ms:
        above = above and max(0.0, step_low_ms - busy_ms) + exposed_ms >= t.idle_warn * step_low_ms
    else:
        above = above and waiting >= t.idle_noise * (spread_ms or 0.0)
    lead = max(classes, key=lambda c: classes[c]) if classes else None
    mine = [g for g in gaps if g.kind == lead]
    stall_ms = min(sum(g.ms_per_step for g in gaps if g.kind == STALL), idle_ms)
    return Idle(
        ms_per_step=idle_ms,
        spread_ms=spread_ms,
        share=idle_ms / step_ms if step_ms else 0.0,
        above_noise=bool(above),
        classes=dict(sorted(classes.items(), key=lambda kv: -kv[1])),
        lead=lead,
        lead_cause=mine[0].cause if mine else None,
        lead_fix=next((g.fix for g in mine if g.fix), None),
        stall_ms_per_step=stall_ms,
        share_step_ms=step_ms - stall_ms,
    )


def _timed_as_run(
    timing: dict[str, Any], step_ms: float, busy_ms: float, gaps: list, source: dict[str, Any]
) -> tuple[float, float, list]:
    """Step and busy time from ``profile``'s plain and clean steps. The idle causes are found
    in the recorded steps; their sizes are scaled to the idle time of the program as run."""
    plain = float(timing["plain_median_ms"])
    busy = min(plain, float(timing.get("gpu_busy_ms") or busy_ms))
    recorded_idle, idle = step_ms - busy_ms, plain - busy
    scale = idle / recorded_idle if recorded_idle > 0 else 0.0
    by_class: dict[str, float] = defaultdict(float)
    for g in gaps:
        g.recorded_ms_per_step = g.ms_per_step
        by_class[g.kind or HOST_BUSY] += g.ms_per_step
        g.ms_per_step *= scale
    source["timing"] = {
        "step_ms": plain,
        "gpu_busy_from": "clean steps" if timing.get("gpu_busy_ms") else "recorded steps",
        "recorded_step_ms": step_ms,
        # The recorded steps' busy time and idle causes by class, all of them (the report keeps
        # the biggest gaps): what a rank's idle is made again from once its wait is known.
        "recorded_busy_ms": busy_ms,
        "recorded_idle_by_class": dict(by_class),
        # What the recorded steps' idle causes (``gaps``) were multiplied by.
        "idle_scale": scale,
        "steps": {k: len(timing.get(f"{k}_ms") or []) for k in ("plain", "clean", "recorded")},
        **{k: timing.get(k) for k in _TIMING_KEYS},
    }
    return plain, busy, gaps


_TIMING_KEYS = (
    "clock",
    "clean_profiler",
    "plain_median_ms",
    "clean_median_ms",
    "recorded_median_ms",
    "overhead",
    "attribution_overhead",
    "gpu_busy_ms",
)


def step_walls(attr: Attribution) -> list[int]:
    """Wall time of each step (ns): the longer of its CPU range and its GPU period.

    With an asynchronous GPU the CPU range says little: a script that never synchronizes
    launches steps ahead of the GPU (its ranges are short), and one that synchronizes spends
    its range waiting for the previous step. The GPU period runs from the step's first kernel
    to the next step's first kernel (the last step: to its last kernel's end): the length of
    the step's window (``attribution.step_windows``).
    """
    return [end - start for start, end in attr.windows]


def require_gpu_activity(timeline: Timeline) -> None:
    if timeline.kernels.empty:
        raise TraceFormatError(
            "the trace holds no GPU kernels (a CPU-only run?); kerneltriage needs CUDA activity",
            path=timeline.source,
        )
