"""Library entry points: read a profile, analyse it, return ``Report`` objects.

from kerneltriage.api import build_report
report = build_report("runs/exp1")
for c in report.candidates[:3]:
    print(c.id, c.name, c.verdict, c.expected_saving_share)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kerneltriage.analysis.gpus import GPUSpec, known_gpus, resolve_gpu, unresolved_reason
from kerneltriage.analysis.model import Report
from kerneltriage.analysis.rules import Rules, load_rules
from kerneltriage.analysis.triage import require_gpu_activity, triage
from kerneltriage.ingest.source import Profile, load_profile


def build_reports(
    path: str | Path,
    *,
    ncu: str | Path | None = None,
    rules_file: str | Path | None = None,
    gpu: str | None = None,
    overrides: dict[str, float | None] | None = None,
    step_marker: str | None = None,
    ranks: list[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[int, Report]:
    """One report per rank (a single-process run has rank 0)."""
    say = progress or (lambda _m: None)
    rules = load_rules(rules_file, overrides)
    profile = load_profile(path, ncu=ncu, ranks=ranks, progress=say)
    return {
        rank: report_for(profile, rank, rules=rules, gpu=gpu, step_marker=step_marker, progress=say)
        for rank in profile.timelines
    }


def build_report(path: str | Path, **kwargs) -> Report:
    """The report of the first rank (the only one for a single-process run)."""
    return next(iter(build_reports(path, **kwargs).values()))


def report_for(
    profile: Profile,
    rank: int,
    *,
    rules: Rules,
    gpu: str | GPUSpec | None = None,
    step_marker: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """One rank's report. ``gpu``: a ``--gpu`` key or device name, or a ready ``GPUSpec``;
    left out, the GPU comes from the run's calibration, the trace's name or deviceProperties,
    and without any of them the report has no ceilings (``report.gpu`` is None)."""
    timeline = profile.timelines[rank]
    require_gpu_activity(timeline)
    properties = timeline.gpu_properties
    if isinstance(gpu, GPUSpec):
        spec: GPUSpec | None = gpu
    else:
        calibration = profile.manifest.calibration if profile.manifest else None
        spec = resolve_gpu(timeline.gpu_name, gpu, calibration, properties)
    if progress:
        progress(f"analysing {Path(timeline.source).name}")
    # Counters are measured on one rank (the one ncu profiled); join them there only.
    counters = profile.counters if rank == profile.counters_rank else None
    report = triage(
        timeline,
        spec,
        rules,
        counters,
        step_marker=step_marker,
        source=profile.source_info(),
        hot_kernels=profile.hot_kernels,
    )
    report.warnings = profile.warnings + report.warnings
    if spec is None:
        # No ceilings: the report still gives shares, idle time, kinds, shapes and a ranking.
        reason = unresolved_reason(timeline.gpu_name, properties)
        report.source["gpu_unresolved"] = reason
        report.notes.insert(0, no_gpu_note(reason))
    return report


def no_gpu_note(reason: str) -> str:
    """The report's note when no GPU row fits the trace."""
    return (
        f"GPU unknown ({reason}): no ceilings, so no headroom and no write or compile verdict; "
        f"pass --gpu KEY, one of: {', '.join(known_gpus())}"
    )
