"""The step time ``profile`` records from phase 1's status files: each rank's plain, clean and
recorded steps (``rundir.StepTime``), the GPU's busy time from the clean steps' trace, and
the warning when the clean steps' profiler cost more than ``OVERHEAD_WARN``.

The plain steps (nothing installed) time the program as the user runs it; the clean steps
(CUDA-only profiler) give the GPU's busy share; the recorded steps give the attribution, and
their overhead is stated, not used.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from kerneltriage import rundir
from kerneltriage.profile.context import timeline_record
from kerneltriage.profile.step_plan import StepPlan

#: Phase 1 warns when the clean steps (GPU busy time) run this much slower than the same
#: process's plain steps (step time): kernel time barely moves with host time, but a profiler
#: that costs this much may have changed more than the host's pace.
OVERHEAD_WARN = 0.05


def clean_summary(out: Path, status: dict[str, Any], plan: StepPlan, warnings: list[str]) -> dict[str, Any]:
    """The GPU's busy share and kernels per step in the clean steps' trace (empty without one)."""
    from kerneltriage.profile.trace_fixup import summarize_clean

    name = status.get("clean_trace")
    path = out / rundir.LOGS / name if name else None
    if path is None or not path.is_file():
        return {}
    try:
        return summarize_clean(path, plan.timing)
    except Exception as exc:  # the report then takes busy time from the recorded steps
        warnings.append(f"could not read the clean steps' trace {name}: {exc}")
        return {}


def record_step_time(
    times: dict[str, Any],
    plan: StepPlan,
    manifest: rundir.Manifest,
    warnings: list[str],
    clean: dict[str, Any] | None = None,
    rank: int = 0,
) -> None:
    """The step time the report uses and what each pass of phase 1 cost.

    The plain steps (nothing installed) time the program as the user runs it; the report takes
    their median as the step time and the GPU's busy time from the clean steps' trace (the
    busy share there × the clean step). The recorded steps give the attribution, and their
    overhead is stated, not used. The clean steps' overhead is warned about above 5%.
    """
    phase = timeline_record(manifest)
    if plan.whole_run:
        return
    step = step_record(times, clean or {}, rank)
    plain, clean_ms = step["plain_median_ms"], step["clean_median_ms"]
    phase.step_time = rundir.StepTime.model_validate(step)
    if not plain:
        if not plan.timing:
            return  # --timing-steps 0: the recorded steps are timed, as asked
        warnings.append(
            f"the plain step time was not measured: the script ended before its {plan.timing} plain steps "
            f"(it needs {plan.stop_after} steps); "
            "step and idle time in the report are those of the recorded steps, profiler included"
        )
        return
    if clean_ms and step["overhead"] is not None and step["overhead"] > OVERHEAD_WARN:
        message = (
            f"the clean timing steps (CUDA-only profiler) ran {step['overhead']:.0%} slower than plain steps "
            f"({clean_ms:.2f} ms against {plain:.2f} ms): the report's step time is the plain steps', but its "
            "GPU busy time is the kernels' in these steps, and idle time is their difference"
        )
        warnings.append(message)
        manifest.warnings.append(message)


def other_ranks_step_time(
    out: Path,
    statuses: list[dict[str, Any]],
    first: dict[str, Any],
    plan: StepPlan,
    phase: rundir.TimelinePhase,
    warnings: list[str],
) -> None:
    """Every other rank's plain, clean and recorded steps, as the first rank's
    (``phases.timeline.step_time_ranks``, rank -> ``StepTime``): each rank's report takes its
    own plain steps. A rank's recorded steps are no measure of its step time: in DDP it waits
    in its all-reduce while another rank is being profiled."""
    if plan.whole_run:
        return
    by_rank: dict[str, Any] = {}
    for status in statuses:
        rank = status.get("rank", 0)
        if status is first or not status.get("trace"):
            continue
        clean = clean_summary(out, status, plan, warnings)
        step = step_record(status.get("step_times") or {}, clean, rank)
        by_rank[str(rank)] = rundir.StepTime.model_validate(step).to_json()
    if by_rank:
        # An extra key of the open manifest model (older readers keep it as it is).
        setattr(phase, "step_time_ranks", dict(sorted(by_rank.items(), key=lambda kv: int(kv[0]))))  # noqa: B010


def step_record(times: dict[str, Any], clean: dict[str, Any], rank: int) -> dict[str, Any]:
    """One rank's ``StepTime`` mapping from its status file's ``step_times`` and its clean
    steps' summary."""
    recorded, plain = times.get("recorded_median_ms"), times.get("plain_median_ms")
    clean_ms = times.get("clean_median_ms")

    def overhead(ms: float | None) -> float | None:
        return round(ms / plain - 1.0, 4) if ms and plain else None

    step = {
        "rank": rank,
        "clock": times.get("clock"),
        "clean_profiler": times.get("clean_profiler"),
        "recorded_ms": times.get("recorded_ms", []),
        "clean_ms": times.get("clean_ms", []),
        "plain_ms": times.get("plain_ms", []),
        "recorded_median_ms": recorded,
        "clean_median_ms": clean_ms,
        "plain_median_ms": plain,
        # Robust spread of the plain steps (1.4826 × the median absolute deviation): idle time
        # is called out only well above it.
        "plain_spread_ms": _spread(times.get("plain_ms") or []),
        # The clean steps against the plain ones: what the GPU busy time was measured under
        # (None when no clean profiler ran: no GPU, the clean steps ran bare).
        "overhead": overhead(clean_ms) if times.get("clean_profiler") else None,
        # The recorded steps (CPU ops, module ranges) against the plain ones: stated only.
        "attribution_overhead": overhead(recorded),
    }
    if clean.get("gpu_busy_share") is not None and clean_ms:
        step["gpu_busy_ms"] = round(clean["gpu_busy_share"] * clean_ms, 4)
        step.update({f"clean_{k}": v for k, v in clean.items()})
    return step


def _spread(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return round(1.4826 * statistics.median(abs(v - mid) for v in values), 4)
