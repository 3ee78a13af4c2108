"""What each of phase 2's ncu passes profiles (``phase_ncu.py``): on one GPU (``single``) or one
GPU's share of several (``share``), every launch of the kernels that run several sizes under one
configuration, one launch per configuration of the rest; where memory-bound kernels are many
(``light_split``), a light pass without the instruction counters that takes every
per-configuration kernel, whose rows the others' fill (``merge``); and the elementwise sizes a
pass may leave to scaling (``one_size``, ``analysis/timeline/one_size.py``)."""

from __future__ import annotations

import gzip
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


#: The memory-bound kernels' configurations (``HotKernels.light``) get a pass of their own,
#: without the instruction counters (``nsight_compute.light_metrics``), from this many on: one
#: of their launches then costs 0.04 s instead of 0.2-0.5 s (an H200, 2026-11-28:
#: ``benchmarks/probes/ncu_metric_passes.py`` and BENCHMARKS.md), and the pass's own process
#: adds 3-15 launches' worth of start. Fewer stay in the per-configuration pass.
LIGHT_MIN_CONFIGS = 16


def light_split(hot: HotKernels, one: OneSize | None = None) -> tuple[list[str], int]:
    """The memory-bound per-configuration kernels that get a pass of their own and the
    configurations it profiles (none under ``LIGHT_MIN_CONFIGS``; those left to scaling
    by ``one`` are not profiled)."""
    skipped = one.skipped_by_base if one is not None else {}
    count = hot.light_configs - sum(skipped.get(n, 0) for n in hot.light)
    if not hot.light or count < LIGHT_MIN_CONFIGS:
        return [], 0
    return list(hot.light), count


def single(hot: HotKernels, whole_run: bool, budget: int, one: OneSize | None = None) -> list[NcuPass]:
    skip, skipped = (one.skip, one.skipped) if one is not None else (None, 0)
    light, light_count = light_split(hot, one)
    # Kernels that run several problem sizes under one configuration: every launch, in a first
    # pass; the per-configuration passes then leave them out (they run only if it went well).
    every = [] if whole_run else hot.variable
    passes = []
    if every:
        passes.append(
            NcuPass(
                "ncu.launches",
                rundir.NCU_LAUNCHES_CSV,
                every,
                _launch_cap(hot, budget),
                hot.variable_launches,
                hot.variable_first_of_size,
            )
        )
    rest = [n for n in hot.names if n not in every and n not in light]
    if rest:
        passes.append(
            NcuPass(
                "ncu",
                # With a light pass, both exports go to logs/ and merge into ncu.csv.gz.
                f"{rundir.LOGS}/{rundir.NCU_CSV}" if light else rundir.NCU_CSV,
                rest,
                None,
                hot.configs - (hot.variable_configs if every else 0) - skipped - light_count,
                instances=_of(hot, rest),
                skip=skip,
            )
        )
    if light:
        # Every per-configuration kernel, in one pass's launch order: the other pass's rows, with
        # their instruction counters, then take their places (``ncu_gpus.fill_in``).
        every_config = [n for n in hot.names if n in rest or n in light]
        full_count = passes[-1].expected if rest else 0
        passes.append(
            _light_pass(
                "ncu.light",
                f"{rundir.LOGS}/ncu.light.csv.gz",
                hot,
                every_config,
                light_count + full_count,
                skip,
            )
        )
    return passes


def _light_pass(
    stem: str, csv_name: str, hot: HotKernels, light: list[str], count: int, skip: list | None
) -> NcuPass:
    return NcuPass(stem, csv_name, light, None, count, instances=_of(hot, light), skip=skip, light=True)


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
    skip = one.skip if one is not None else None
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
                skip=skip,
            )
        )
    if share.light:
        stem = f"ncu.light.gpu{label}"
        passes.append(
            _light_pass(stem, f"{rundir.LOGS}/{stem}.csv.gz", hot, share.light, share.light_count, skip)
        )
    return passes


def merge(session: ProfileSession, passes: list[NcuPass], order: list[tuple]) -> None:
    """The passes' exports as the run's files, in the step's launch order: the every-launch
    passes' in ``ncu.launches.csv.gz``; the per-configuration ones' in ``ncu.csv.gz``, where a
    light pass took every configuration, each full row in place of its light row
    (``ncu_gpus.fill_in``: one process's launch order, the memory-bound kernels' FLOP cells
    empty), else merged by ``order`` (several GPUs' parts). A pass writes its export only when
    it went well; one alone is the file as it wrote it."""

    if all(p.csv_name in (rundir.NCU_CSV, rundir.NCU_LAUNCHES_CSV) for p in passes):
        return  # every pass wrote its run file itself: nothing to merge

    def read(of: list[NcuPass]) -> list[str]:
        files = [session.out / one.csv_name for one in of]
        return [gzip.decompress(f.read_bytes()).decode() for f in files if f.is_file()]

    every = read([p for p in passes if p.every_launch is not None])
    full = read([p for p in passes if p.every_launch is None and not p.light])
    light = read([p for p in passes if p.light])
    if every and any(p.csv_name != rundir.NCU_LAUNCHES_CSV for p in passes if p.every_launch is not None):
        _write(session, rundir.NCU_LAUNCHES_CSV, ncu_gpus.merge_exports(every, order))
    merged = ncu_gpus.merge_exports(full, order) if full else ""
    if light:
        merged = ncu_gpus.fill_in(light[0], merged)
    if merged and any(p.csv_name != rundir.NCU_CSV for p in passes if p.every_launch is None):
        _write(session, rundir.NCU_CSV, merged)


def _write(session: ProfileSession, name: str, text: str) -> None:
    with gzip.open(session.out / name, "wt") as f:
        f.write(text)
