"""One rank's report, from what was read: the GPU its trace ran on, its plain steps, its
counters, the triage (``analysis.triage``), and what the run folder adds (``verify.json``).
Several ranks' communication is split into wait and transfer once every rank is reported.

``parallel`` fans the ranks out (worker processes, Dask) and calls this for each; ``api``
calls it for the ranks of a profile read in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneltriage.analysis.gpus import (
    GPUSpec,
    implausible_calibration,
    known_gpus,
    resolve_gpu,
    unresolved_reason,
)
from kerneltriage.analysis.model import Report
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.timeline import plausibility
from kerneltriage.analysis.triage import require_gpu_activity, triage
from kerneltriage.gc_pause import gc_paused
from kerneltriage.ingest.source import LoadedProfile
from kerneltriage.inputs import is_url


def rank_report(
    profile: LoadedProfile,
    rank: int,
    *,
    rules: Rules,
    gpu: str | GPUSpec | None = None,
    step_marker: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """One rank's report from what was read. ``gpu``: a ``--gpu`` key or device name, or a
    ready ``GPUSpec``; left out, the GPU comes from the run's calibration, the trace's name or
    deviceProperties, and without any of them the report has no ceilings (``report.gpu`` is
    None). ``gpu`` and ``step_marker`` are checked by the caller (``api.check_options``)."""
    timeline = profile.timelines[rank]
    require_gpu_activity(timeline)
    properties = timeline.gpu_properties
    doubt = None  # why the run's calibration is not applied
    if isinstance(gpu, GPUSpec):
        spec: GPUSpec | None = gpu
    else:
        calibration = profile.manifest.calibration if profile.manifest else None
        doubt = implausible_calibration(calibration, timeline.gpu_name)
        if doubt:
            calibration = None
        spec = resolve_gpu(timeline.gpu_name, gpu, calibration, properties)
    if progress:
        progress(f"analysing {Path(timeline.source).name}")
    # Counters are measured on one rank (the one ncu profiled); join them there only.
    counters = profile.counters if rank == profile.counters_rank else None
    timing = rank_timing(profile, rank)
    with gc_paused():  # the analysis makes a container per op and instance, and no cycle
        result = triage(
            timeline,
            spec,
            rules,
            counters,
            step_marker=step_marker,
            source=profile.source_info(),
            hot_kernels=profile.hot_kernels,
            timing=timing,
        )
    result.warnings = profile.warnings + result.warnings
    if result.join is not None and counters is not None and profile.tensor_precisions is not None:
        # Tensor-core FLOPs were counted for these precisions only (phase 2 asks for the ones
        # the hot kernels' ops run in): say so beside the coverage.
        result.join["tensor_precisions"] = profile.tensor_precisions
    if result.source.get("timing") is not None and timing:
        # The plain steps themselves: the step time's interval (stragglers across ranks).
        result.source["timing"]["plain_ms"] = list(timing.get("plain_ms") or [])
    if profile.regions and profile.manifest is not None and len(profile.manifest.ranks) > 1:
        from kerneltriage.analysis.compare.exposed import module_parameters

        # The modules' parameter sizes in forward order: which modules DDP's exposed bucket holds.
        params = module_parameters(profile.regions)
        if params:
            result.source["module_parameters"] = params
    if doubt:
        result.warnings.append(doubt)
    elif not isinstance(gpu, GPUSpec) and profile.manifest is not None:
        unusable = plausibility.unusable_calibration(profile.manifest.calibration)
        if unusable:
            result.warnings.append(unusable)
    _verified(result, profile.source_info().get("path"))
    if spec is None:
        # No ceilings: the report still gives shares, idle time, kinds, shapes and a ranking.
        reason = unresolved_reason(timeline.gpu_name, properties)
        result.source["gpu_unresolved"] = reason
        result.notes.insert(0, _no_gpu_note(reason))
    return result


def rank_timing(profile: LoadedProfile, rank: int) -> dict[str, Any] | None:
    """``rank``'s own plain steps, as ``LoadedProfile.step_timing`` gives the first rank's: the
    manifest's ``phases.timeline.step_time`` for that rank, else its
    ``phases.timeline.step_time_ranks`` entry, else (a run made before those) the
    ``step_times`` of its status file ``logs/status.timeline.rank<r>.json``, whose clean steps
    have no busy time (the GPU busy time is then the recorded steps'). None: no plain steps.

    A rank's recorded steps are no measure of its step time: in DDP every rank finishes every
    step together, and a rank waits in its all-reduce while another is being profiled."""
    timing = profile.step_timing(rank)
    if timing is not None or profile.manifest is None:
        return timing
    from kerneltriage import rundir

    phase = profile.manifest.phases.timeline
    if phase is None or (phase.step_time is not None and phase.step_time.rank == rank):
        return None  # the first rank's own record said no
    extra = (phase.model_extra or {}).get("step_time_ranks")
    entry: Any = extra.get(str(rank)) if isinstance(extra, dict) else None
    if entry is None and profile.run_dir is not None:
        entry = _status_step_times(profile.run_dir, rank)
    if not isinstance(entry, dict):
        return None
    try:
        own = rundir.StepTime.model_validate({**entry, "rank": rank})
    except ValueError:
        return None
    # As the first rank's: plain steps, and clean steps that ran (``LoadedProfile.step_timing``).
    if not own.plain_median_ms or "clean_ms" not in own.model_fields_set:
        return None
    return own.to_json()


def _status_step_times(run_dir: Path, rank: int) -> dict[str, Any] | None:
    """The plain, clean and recorded steps' times in a rank's status file (None: none)."""
    import json

    from kerneltriage import rundir

    path = Path(run_dir) / rundir.LOGS / f"status.timeline.rank{rank}.json"
    try:
        times = json.loads(path.read_text()).get("step_times") or {}
    except (OSError, ValueError, AttributeError):
        return None
    keys = ("clock", "clean_profiler", "plain_ms", "clean_ms", "recorded_ms")
    out = {k: times[k] for k in keys if times.get(k) is not None}
    for key in ("plain", "clean", "recorded"):
        if times.get(f"{key}_median_ms"):
            out[f"{key}_median_ms"] = times[f"{key}_median_ms"]
    return out


def _verified(report: Report, path: Any) -> None:
    """Put RUN/verify.json (``kerneltriage verify``) on the report, when the run has one."""
    if not path or is_url(path) or not Path(path).is_dir():
        return
    from kerneltriage.analysis.fixes.verification import attach
    from kerneltriage.errors import RunDirError
    from kerneltriage.verify_record import read  # verify.json, beside the run folder's other files

    try:
        data = read(path)
    except RunDirError as exc:  # the report stands without it
        report.warnings.append(f"{exc}; the report shows no verification")
        return
    if data is not None:
        attach(report, data.to_json())


def _no_gpu_note(reason: str) -> str:
    """The report's note when no GPU row fits the trace."""
    return (
        f"GPU unknown ({reason}): no ceilings, so no headroom and no write or compile verdict; "
        f"pass --gpu KEY, one of: {', '.join(known_gpus())}"
    )


# --- several ranks -------------------------------------------------------------------------


def last_collective(report: Report, timeline: Any, rules: Rules) -> None:
    """The exposed time of each step's last collective, on the report (``source``)."""
    from kerneltriage.analysis.compare.ranks import COMMUNICATION
    from kerneltriage.analysis.compare.ranks import last_collective as last_of

    last = last_of(timeline, lambda name: rules.classify(None, name) == COMMUNICATION)
    if last is not None:
        report.source["last_collective"] = last


def with_waits(reports: dict[int, Report], timelines: dict[int, Any], rules: Rules) -> dict[int, Report]:
    """Several ranks' reports with their communication split into wait and transfer
    (``analysis.ranks.split_communication``), from the ranks' timelines."""
    if len(reports) > 1:
        from kerneltriage.analysis.compare.ranks import split_communication

        split_communication(reports, {r: collectives(timelines[r], rules) for r in reports if r in timelines})
        for r, report in reports.items():
            if r in timelines:
                last_collective(report, timelines[r], rules)
        communication_fixes(reports, rules)
    return reports


def communication_fixes(reports: dict[int, Report], rules: Rules) -> None:
    """DDP's settings on the ranks whose communication is exposed, once their wait for the
    other ranks is known (``analysis.ranks.communication_fix``)."""
    from kerneltriage.analysis.compare.ranks import communication_fix

    for report in reports.values():
        communication_fix(report, rules.recipes)


def collectives(timeline: Any, rules: Rules) -> list[Any]:
    """The rank's collectives (``analysis.ranks.collectives``): their wait for the other ranks
    is known once every rank is read."""
    from kerneltriage.analysis.compare.ranks import COMMUNICATION
    from kerneltriage.analysis.compare.ranks import collectives as of

    return of(timeline, lambda name: rules.classify(None, name) == COMMUNICATION)
