"""What each of phase 2's ncu passes profiles (``phase_ncu.py``): on one GPU (``single``) or one
GPU's share of several (``share``), every launch of the kernels that run several sizes under one
configuration, one launch per configuration of the rest; and the elementwise sizes a pass may
leave to scaling (``one_size``, ``analysis/timeline/one_size.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerneltriage import rundir
from kerneltriage.profile import ncu_gpus
from kerneltriage.profile.context import ProfileSession
from kerneltriage.profile.ncu_pass import NcuPass

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.timeline.hot_kernels import HotKernels
    from kerneltriage.analysis.timeline.one_size import OneSize
    from kerneltriage.ingest.tables import Timeline


#: Where the GPU is not in the table: a launch this long moves more than L2 holds (an H100's
#: 50 MB at 3.35 TB/s take 15 us).
_LARGE_NS = 15_000.0


def one_size(session: ProfileSession, hot: HotKernels, timeline: Timeline) -> OneSize | None:
    """The elementwise sizes phase 2 may leave to scaling (``one_size.py``): in an eager
    single-process step, unless ``--ncu-every-size``; None where every size is profiled."""
    options, manifest = session.options, session.manifest
    phase1 = manifest.phases.timeline
    if (
        options.ncu_every_size
        or session.command.distributed
        or manifest.schedule.whole_run
        or (phase1 is not None and phase1.dynamo)
    ):
        return None
    from kerneltriage.analysis.gpus import resolve_gpu
    from kerneltriage.analysis.timeline.one_size import one_size_per_instantiation

    spec = resolve_gpu(str(manifest.gpu.get("name") or "") or None)
    # GB/s is bytes a nanosecond.
    large_ns = spec.l2_mb * 1e6 / spec.peak_bandwidth_gbs if spec is not None else _LARGE_NS
    return one_size_per_instantiation(timeline, hot, large_ns)


def single(hot: HotKernels, whole_run: bool, budget: int, one: OneSize | None = None) -> list[NcuPass]:
    skip, skipped = (one.skip, one.skipped) if one is not None else (None, 0)
    if not hot.variable or whole_run:
        return [
            NcuPass(
                "ncu",
                rundir.NCU_CSV,
                hot.names,
                None,
                hot.configs - skipped,
                instances=_of(hot, hot.names),
                skip=skip,
            )
        ]
    # Kernels that run several problem sizes under one configuration: every launch, in a first
    # pass; the per-configuration pass then leaves them out (it runs only if the first went well).
    rest = [n for n in hot.names if n not in hot.variable]
    passes = [
        NcuPass(
            "ncu.launches",
            rundir.NCU_LAUNCHES_CSV,
            hot.variable,
            _launch_cap(hot, budget),
            hot.variable_launches,
            hot.variable_first_of_size,
        )
    ]
    if rest:
        passes.append(
            NcuPass(
                "ncu",
                rundir.NCU_CSV,
                rest,
                None,
                hot.configs - hot.variable_configs - skipped,
                instances=_of(hot, rest),
                skip=skip,
            )
        )
    return passes


def _of(hot: HotKernels, kernels: list[str]) -> dict[str, list[str]] | None:
    """The instantiations wanted of ``kernels`` that are wanted in part."""
    return {n: hot.instances[n] for n in kernels if n in hot.instances} or None


def _launch_cap(hot: HotKernels, budget: int) -> int:
    """The every-launch pass's ``--launch-count``. Taking the first launch of each problem size,
    the runner's range decides which launches are profiled; the cap is every launch of the
    step, within the budget, in case the process takes its whole step instead (a compiled
    program: ``first_of_size.py``)."""
    if not hot.variable_first_of_size:
        return hot.variable_launches
    return max(hot.variable_launches, min(hot.variable_every, budget))


def share(
    share: ncu_gpus.Share, label: str, hot: HotKernels, budget: int, one: OneSize | None = None
) -> list[NcuPass]:
    """One GPU's passes, as ``_ncu_passes`` orders them; their exports go to ``logs/`` until
    they are merged."""
    passes = []
    if share.variable:
        stem = f"ncu.launches.gpu{label}"
        v = share.variable_launches
        passes.append(
            NcuPass(
                stem,
                f"{rundir.LOGS}/{stem}.csv.gz",
                share.variable,
                _launch_cap(hot, budget),
                v,
                hot.variable_first_of_size,
            )
        )
    if share.configs:
        stem = f"ncu.gpu{label}"
        passes.append(
            NcuPass(
                stem,
                f"{rundir.LOGS}/{stem}.csv.gz",
                share.configs,
                None,
                share.config_count,
                instances=_of(hot, share.configs),
                skip=one.skip if one is not None else None,
            )
        )
    return passes
