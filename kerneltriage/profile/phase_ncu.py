"""Phase 2: the script again under Nsight Compute, on the hot kernels of phase 1 only.

The hot kernels come from the ncu rank's phase-1 trace (``analysis/timeline/hot_kernels.py``). Kernels
that run several problem sizes under one launch configuration get a first pass that profiles
their every launch of one step; the others one launch per configuration. Each pass's report
is exported to CSV; a pass that fails or hangs stops the ones after it, and every hot kernel
left without counters is named, with why.

A single-process script on a machine of several GPUs has its kernels shared among concurrent
ncu processes, one per GPU (``ncu_gpus.py``): each runs its share's passes in that order, and
their exports are merged into the same files. A process that fails loses only its own kernels.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kerneltriage import rundir
from kerneltriage.analysis.rules import load_rules
from kerneltriage.errors import ToolError
from kerneltriage.profile import ncu_gpus, ncu_passes, pairs
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.context import ProfileSession
from kerneltriage.profile.ncu_lanes import GpuLane, LaneBoard, interrupt
from kerneltriage.profile.ncu_pass import NcuPass, PassRun, PassWatch
from kerneltriage.profile.turns import Turn, Turns

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.timeline.hot_kernels import HotKernels
    from kerneltriage.analysis.timeline.one_size import OneSize
    from kerneltriage.ingest.tables import Timeline


@dataclass
class NcuPlan:
    """Phase 2 planned from phase 1's trace (``plan_ncu``): the hot kernels, the metrics, the
    GPUs' shares; its processes may be started before phase 2 runs (``start``), held at their
    gates while the timing processes have the GPU, so that their start-ups overlap."""

    session: ProfileSession
    ncu: str
    hot: HotKernels
    metrics: list[str]
    config: Path
    shares: list[ncu_gpus.Share]
    order: list[tuple]
    # The elementwise sizes the per-configuration pass leaves to scaling (None: every size).
    one_size: OneSize | None = None
    # Each GPU's chain of passes (one chain where phase 2 runs on one GPU), once prepared.
    chains: list[_Chain] = field(default_factory=list)
    lock_dirs: list[str] = field(default_factory=list)

    def prepare(self, *, early: bool) -> None:
        """Each GPU's passes, their commands and watches; their processes started where they
        take turns (``early``: every one, each held at its first CUDA use)."""
        if self.chains:
            return
        if self.shares:
            self.chains = _share_chains(self, early=early)
            return
        session = self.session
        lane = GpuLane(session)
        whole_run = bool(session.manifest.schedule.whole_run)
        passes = ncu_passes.single(self.hot, whole_run, session.options.max_variable_launches, self.one_size)
        watches, turns = _prepare_passes(session, self.ncu, passes, self.metrics, lane, early=early)
        self.chains = [_Chain(lane, watches, turns)]

    def processes(self) -> int:
        """How many ncu processes phase 2 will run: its passes on every GPU."""
        budget = self.session.options.max_variable_launches
        if not self.shares:
            return len(
                ncu_passes.single(
                    self.hot, bool(self.session.manifest.schedule.whole_run), budget, self.one_size
                )
            )
        return sum(
            len(ncu_passes.share(share, str(i), self.hot, budget)) for i, share in enumerate(self.shares)
        )

    def start(self) -> list[Turn]:
        """Start every pass's process of a single-process script, held at its gate; the turns
        they wait in (none for a torchrun job, whose ranks start one process each)."""
        if self.session.command.distributed or self.chains:
            return []
        self.prepare(early=True)
        for c in self.chains:
            if c.ahead and c.turns is not None:
                c.turns.warm_ahead()
        return [t for c in self.chains if c.turns is not None for t in c.turns.turns]

    def close(self) -> None:
        """Stop the processes of passes that did not run; remove the GPUs' lock folders."""
        for c in self.chains:
            if c.turns is not None:
                c.turns.close()
        for lock_dir in self.lock_dirs:
            shutil.rmtree(lock_dir, ignore_errors=True)
        self.lock_dirs = []


@dataclass
class _Chain:
    """One GPU's passes: its lane, their watches, and their processes' turns (None: run one
    after the other as they come)."""

    lane: GpuLane
    watches: list[PassWatch]
    turns: Turns | None
    ahead: bool = False  # on a GPU of its own: warmed up while the timing processes run


def plan_ncu(session: ProfileSession, ncu: str, *, early: bool = False) -> NcuPlan | None:
    """Phase 2's plan (the manifest's ``phases.ncu`` as planned); None when phase 1 recorded
    no kernel to profile (said in the warnings). ``early``: its processes will be started
    before phase 2 runs, so a process start costs only its warm-up steps."""
    planned_from = time.perf_counter()
    manifest = session.manifest
    manifest.versions["ncu"] = ncu_tools.ncu_version(ncu) or "unknown"
    hot, timeline = _hot_kernels(session)
    if not hot.names:
        session.warnings.append("phase 1 recorded no GPU kernels in the steps: nothing for ncu to profile")
        return None
    precisions = None if session.options.ncu_set == "full" else hot.tensor_precisions
    metrics = ncu_tools.metric_list(ncu_tools.available_metrics(ncu), precisions)
    whole_run = bool(manifest.schedule.whole_run)
    if session.options.ncu_set == "full" or session.options.ncu_every_counter:
        hot = dataclasses.replace(hot, light=[], light_configs=0)  # every counter on every kernel
    one = ncu_passes.one_size(session, hot, timeline)
    light, _ = ncu_passes.light_split(hot, one)
    config = session.write_config("ncu", whole_run=whole_run, ncu_skip=one.skip if one else None)
    manifest.phases.ncu = rundir.NcuPhase(
        kernels=hot.names,
        expected_configs=hot.configs,
        coverage_of_gpu_time=round(hot.coverage, 4),
        metrics=metrics,
        tensor_precisions=precisions,
        excluded_communication=hot.left_out,
        variable_size_kernels=hot.variable,
        variable_launches_per_step=hot.variable_launches,
        variable_over_budget=hot.over_budget,
        variable_selection="first-of-size" if hot.variable_first_of_size else None,
        kernel_instances=hot.instances or None,
        scaled_kernels=one.scaled if one and one.skip else None,
        scaled_configs=one.skipped if one and one.skip else None,
        light_kernels=light or None,
    )
    start_cost = ncu_gpus.START_COST_GATED if early else ncu_gpus.START_COST_LAUNCHES
    gated = pairs.measure_gates(session, 2)
    second = ncu_gpus.START_COST_BESIDE if gated else None
    ahead = ncu_gpus.START_COST_AHEAD if early and gated else None  # other GPUs warm up ahead
    shares, order = _shares(session, hot, timeline, whole_run, (start_cost, second, ahead), one)
    session.ncu_record.plan_seconds = round(time.perf_counter() - planned_from, 2)
    return NcuPlan(session, ncu, hot, metrics, config, shares, order, one if one and one.skip else None)


def run_ncu(session: ProfileSession, ncu: str, plan: NcuPlan | None = None) -> None:
    """Phase 2 with the ncu at ``ncu``: the manifest's ``phases.ncu`` and the counters' CSVs;
    ``plan``: planned (and maybe started) already."""
    if plan is None:
        plan = plan_ncu(session, ncu)
    if plan is None:
        return
    try:
        _run_plan(session, plan)
    finally:
        plan.close()


def _run_plan(session: ProfileSession, plan: NcuPlan) -> None:
    hot, shares = plan.hot, plan.shares
    precisions = None if session.options.ncu_set == "full" else hot.tensor_precisions
    on = f" on {len(shares)} GPUs at once" if shares else ""
    session.reporter.phase(
        "ncu",
        f"Nsight Compute on {len(hot.names)} hot kernels ({hot.coverage:.0%} of GPU time), "
        f"~{hot.configs} launch configurations{on}, {_tensor_note(precisions)}",
    )
    started = time.perf_counter()
    plan.prepare(early=False)
    for c in plan.chains:
        if c.turns is not None:
            c.turns.resume()  # started early, maybe: their turns count from now
    if shares:
        total_seconds, launches, not_run = _run_chains(session, plan.chains, plan.order, plan.config, started)
    else:
        (one,) = plan.chains
        try:
            total_seconds, launches, not_run = _run_passes(
                session, one.watches, one.turns, plan.config, one.lane, started
            )
        finally:
            session.ncu_record.passes = one.lane.records
        ncu_passes.merge(session, [w.one for w in one.watches], plan.order)
    session.ncu_record.seconds, session.ncu_record.profiled_launches = round(total_seconds, 2), launches
    _hot_without_counters(session, hot, not_run)
    if (session.out / rundir.NCU_CSV).is_file() or (session.out / rundir.NCU_LAUNCHES_CSV).is_file():
        session.reporter.phase_done("ncu", total_seconds, f"{launches} launches profiled{on}")


def _tensor_note(precisions: list[str] | None) -> str:
    """What the tensor-core counters cover, for the phase line."""
    if precisions is None:
        return "tensor-core counters for every precision"
    if not precisions:
        return "no tensor-core counters (no hot kernel runs on tensor cores)"
    return f"tensor-core counters for {', '.join(precisions)} only (the precisions the hot ops run in)"


def _hot_kernels(session: ProfileSession) -> tuple[HotKernels, Timeline]:
    """The hot kernels of the ncu rank's phase-1 trace, and that trace."""
    options, out = session.options, session.out
    rank_trace = out / (
        rundir.TRACE if not session.command.distributed else f"trace.rank{options.ncu_rank}.json.gz"
    )
    if not rank_trace.is_file() and (out / rundir.TRACE_NSYS).is_file():
        rank_trace = out / rundir.TRACE_NSYS
    if not rank_trace.is_file():
        raise ToolError(
            f"no phase-1 trace for rank {options.ncu_rank} ({rank_trace.name}) to pick hot kernels from"
        )
    from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels
    from kerneltriage.ingest.source import read_timeline

    timeline = read_timeline(rank_trace)
    phase1 = session.manifest.phases.timeline
    hot = select_hot_kernels(
        timeline,
        load_rules(options.rules_file),
        coverage=options.coverage,
        max_kernels=options.max_kernels,
        max_variable_launches=options.max_variable_launches,
        # The runner marks the first call of each op signature in an eager single process;
        # a compiled program would run eagerly under its dispatch mode (first_of_size.py).
        first_of_size=not session.command.distributed
        and not session.manifest.schedule.whole_run
        and not (phase1 is not None and phase1.dynamo),
    )
    return hot, timeline


def _shares(
    session: ProfileSession,
    hot: HotKernels,
    timeline: Timeline,
    whole_run: bool,
    start_cost: tuple[float, float | None, float | None],
    one: OneSize | None = None,
) -> tuple[list[ncu_gpus.Share], list[tuple]]:
    """Each GPU's share of the hot kernels when phase 2 is split over several (at least two
    shares; none: one ncu process at a time), and the step's launch order their exports are
    merged in. ``start_cost``: what a process start costs, a GPU's second, and another GPU's
    first when warmed up ahead (``plan_shares``).
    Why several visible GPUs go unused is recorded."""
    if session.options.ncu_gpus == 1 or len(hot.names) < 2:
        return [], []
    gpus = ncu_gpus.visible_gpus()
    if len(gpus) < 2:
        return [], []
    asked, distributed = session.options.ncu_gpus, session.command.distributed
    choice = ncu_gpus.choose_gpus(asked, distributed, [0], gpus)
    step = ncu_gpus.StepLaunches({}, {}, [], [])
    if choice.gpus:  # the step is counted only for a split that may happen
        step = ncu_gpus.step_launches(timeline, hot)
        choice = ncu_gpus.choose_gpus(asked, distributed, step.devices, gpus)
    if choice.gpus and (
        sum(step.configs.values()) != hot.configs
        or (not whole_run and sum(step.launches.get(n, 0) for n in hot.variable) != hot.variable_every)
    ):
        choice = ncu_gpus.GpuChoice(reason="the hot kernels' launches could not be counted per kernel")
    if choice.reason:
        session.ncu_record.single_gpu_reason = choice.reason
        return [], []
    if one is not None and one.skipped_by_base:
        # Configurations left to scaling cost no launch: the split balances what is profiled.
        configs = {n: max(1, c - one.skipped_by_base.get(n, 0)) for n, c in step.configs.items()}
        step = dataclasses.replace(step, configs=configs)
    light = ncu_passes.light_split(hot, one)
    first, second, ahead = start_cost
    shares = ncu_gpus.plan_shares(hot, step, choice.gpus, whole_run, first, second, light=light, ahead=ahead)
    if len(shares) < 2:
        return [], []
    session.ncu_record.gpus = [share.gpu.device for share in shares]
    return shares, step.order


def _share_chains(plan: NcuPlan, *, early: bool) -> list[_Chain]:
    """Each GPU's passes as a chain of its own, their processes' turns started where ``early``
    (or where a GPU runs two passes); the lock folders go with the plan."""
    session, hot = plan.session, plan.hot
    board = LaneBoard(session)
    labels = [s.gpu.device for s in plan.shares]
    if not all(label.isdigit() for label in labels):
        labels = [str(i) for i in range(len(plan.shares))]  # UUIDs in file names: numbered instead
    chains = []
    for share, label in zip(plan.shares, labels):
        lock_dir = tempfile.mkdtemp(prefix=f"kerneltriage-ncu{label}-")
        plan.lock_dirs.append(lock_dir)
        lane = GpuLane(session, share.gpu, board, ncu_gpus.apart_env(lock_dir))
        passes = ncu_passes.share(share, label, hot, session.options.max_variable_launches, plan.one_size)
        lane.total = sum(one.expected for one in passes)
        board.lanes.append(lane)
        ahead = early and share.ahead
        watches, turns = _prepare_passes(
            session, plan.ncu, passes, plan.metrics, lane, early=early, ahead=ahead
        )
        chains.append(_Chain(lane, watches, turns, ahead))
    return chains


def _run_chains(
    session: ProfileSession,
    chains: list[_Chain],
    order: list[tuple],
    config: Path,
    started: float,
) -> tuple[float, int, dict[str, str]]:
    """The GPUs' pass chains, one thread each, all at once; their records; then each policy's
    exports merged into its file in the step's launch order. (seconds of the whole, launches
    profiled, kernel -> why it has no counters.)"""
    results: list[tuple[float, int, dict[str, str]] | BaseException | None] = [None] * len(chains)

    def chain(i: int) -> None:
        c = chains[i]
        try:
            results[i] = _run_passes(session, c.watches, c.turns, config, c.lane, started)
        except BaseException as exc:  # a Ctrl-C passed on, or a child that could not start
            results[i] = exc

    threads = [threading.Thread(target=chain, args=(i,), name=f"ncu-gpu-{i}") for i in range(len(chains))]
    for t in threads:
        t.start()
    try:
        # Not join(): a join that Ctrl-C interrupts can leave its thread marked as ended.
        while any(t.is_alive() for t in threads):
            time.sleep(0.05)
    except KeyboardInterrupt:
        # Each chain's run_child stops its process group as a Ctrl-C stops one process.
        for t in threads:
            if t.is_alive():
                interrupt(t)
        while any(t.is_alive() for t in threads):
            time.sleep(0.05)
        raise
    finally:
        session.ncu_record.passes = [r for c in chains for r in c.lane.records]
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed
    launches = 0
    not_run: dict[str, str] = {}
    for result in results:
        assert isinstance(result, tuple)
        launches += result[1]
        not_run.update(result[2])
    # A failed light pass loses no kernel another GPU's pass counted (its export exists).
    passes = [w.one for c in chains for w in c.watches]
    counted = {k for p in passes if not p.light and (session.out / p.csv_name).is_file() for k in p.kernels}
    not_run = {k: why for k, why in not_run.items() if k not in counted}
    ncu_passes.merge(session, passes, order)
    return time.perf_counter() - started, launches, not_run


def _prepare_passes(
    session: ProfileSession,
    ncu: str,
    passes: list[NcuPass],
    metrics: list[str],
    lane: GpuLane,
    *,
    early: bool = False,
    ahead: bool = False,
) -> tuple[list[PassWatch], Turns | None]:
    """Each pass's ncu command (written to ``logs/``) and watch; the turns of its processes,
    started and held at their first CUDA use, where a single-process script runs several
    passes (the next pass's start-up overlaps this one's replays) or its passes start ``early``.
    ``ahead``: each process gets a measure gate, to warm up before phase 2 (``Turns.warm_ahead``)."""
    whole_run = bool(session.manifest.schedule.whole_run)
    watches = []
    for one in passes:
        cmd = lane.command(
            ncu_tools.ncu_command(
                ncu,
                session.out / one.stem,
                one.kernels,
                ncu_tools.light_metrics(metrics) if one.light else metrics,
                session.command.with_runner(),
                nvtx=not whole_run,
                full_set=session.options.ncu_set == "full",
                every_launch=one.every_launch,
                first_of_size=one.first_of_size,
                instances=one.instances,
                skip=bool(one.skip),
            )
        )
        (session.logs / f"{one.stem}_command.txt").write_text(" ".join(cmd) + "\n")
        watches.append(PassWatch(session, ncu, cmd, one, lane))
    if session.command.distributed or not (len(passes) > 1 or early):
        return watches, None
    measure = pairs.measure_gates(session, 2 if ahead else len(passes))
    turns = Turns(
        [
            lane.turn(
                w.cmd,
                session.write_config(
                    "ncu",
                    whole_run=whole_run,
                    name=w.one.stem,
                    ncu_take=_take(w.one),
                    ncu_skip=w.one.skip,
                    measure_gate=measure,
                ),
                w.log_name,
                w.on_line,
                session.options.ncu_timeout,
            )
            for w in watches
        ],
        quiet=False,
        # An ncu pass's process beside the profiling one holds its memory, waiting: as many as fit.
        together=max(2, pairs.processes_fit(session, len(passes))),
    )
    return watches, turns


def _run_passes(
    session: ProfileSession,
    watches: list[PassWatch],
    turns: Turns | None,
    config: Path,
    lane: GpuLane,
    started: float,
) -> tuple[float, int, dict[str, str]]:
    """Run the passes in order, up to the first whose process fails; each pass's report is
    exported to CSV while the next one profiles (ncu reads a report on the CPU; run in
    between, this put 0.7-1.5 s between two passes on an H200). Returns (seconds, launches
    profiled, kernel -> why it has no counters: the kernels of a failed pass, and of those a
    failed process kept from running)."""
    whole_run = bool(session.manifest.schedule.whole_run)
    ran: list[tuple[PassWatch, float, Future[PassRun]]] = []
    overlap = pairs.two_processes_fit(session)
    try:
        for watch in watches:
            one = watch.one
            start_s = time.perf_counter() - started
            if turns is not None:
                seconds, code, tail = turns.next(pairs.status_written(session, one.stem) if overlap else None)
            else:
                own = config
                if one.first_of_size:
                    # A config and status of its own: other GPUs' processes read config.ncu.json.
                    own = session.write_config(
                        "ncu", whole_run=whole_run, name=one.stem, ncu_take=_take(one), gated=False
                    )
                seconds, code, tail = lane.run(
                    watch.cmd, own, watch.log_name, watch.on_line, session.options.ncu_timeout
                )
            run = watch.check(seconds, code, tail)
            lane.finished = lane.done = lane.finished + run.launches
            if one.first_of_size:
                _check_take(session, one.stem)
            ran.append((watch, start_s, _in_background(watch.export, run) if run.ok else _done(run)))
            if not run.ok:
                break
    finally:
        if turns is not None:
            turns.close()
    total_seconds = 0.0
    launches = 0
    not_run: dict[str, str] = {}
    counted: set[str] = set()
    for watch, start_s, outcome in ran:
        one, result = watch.one, outcome.result()  # an export still running is waited for
        total_seconds += result.seconds
        launches += result.launches
        if lane.gpu is None:  # the keys of one process chain, as before GPUs were split
            session.ncu_record.record_pass(
                one.stem, seconds=round(result.seconds, 2), exit_code=result.exit_code
            )
        lane.records.append(
            rundir.NcuPassRecord(
                stem=one.stem,
                gpu=lane.gpu.device if lane.gpu else None,
                kernels=one.kernels,
                expected=one.expected,
                launches=result.launches,
                start_s=round(start_s, 2),
                seconds=round(result.seconds, 2),
                exit_code=result.exit_code,
                profiling_s=round(result.profiling, 2) if result.profiling is not None else None,
            )
        )
        if result.ok:
            counted.update(one.kernels)
        else:
            # The light pass takes every per-configuration kernel: those the full pass counted keep theirs.
            failed_here = [k for k in one.kernels if k not in counted]
            not_run.update(dict.fromkeys(failed_here, f"its ncu pass ({one.stem}) failed"))
    if ran and len(ran) < len(watches):  # a process failed: the passes after it never ran
        failed = ran[-1][0].one.stem
        for later in watches[len(ran) :]:
            why = f"its ncu pass ({later.one.stem}) did not run (the {failed} pass failed)"
            not_run.update(dict.fromkeys(later.one.kernels, why))
    return total_seconds, launches, not_run


def _in_background(export: Callable[[PassRun], PassRun], run: PassRun) -> Future[PassRun]:
    """``export(run)`` in a daemon thread: an export that never ends holds neither the next pass
    nor, after a Ctrl-C, the exit."""
    future: Future[PassRun] = Future()

    def work() -> None:
        try:
            future.set_result(export(run))
        except BaseException as exc:  # handed to whoever waits for the result
            future.set_exception(exc)

    threading.Thread(target=work, name="ncu-export", daemon=True).start()
    return future


def _done(run: PassRun) -> Future[PassRun]:
    future: Future[PassRun] = Future()
    future.set_result(run)
    return future


def _take(one: NcuPass) -> str | None:
    return "first-of-size" if one.first_of_size else None


def _check_take(session: ProfileSession, status_name: str) -> None:
    """What the every-launch process took: the first call of each op signature, or (a compiled
    program) its whole step, whose rows the join reads as consecutive launches."""
    path = session.logs / f"status.{status_name}.rank{session.options.ncu_rank}.json"
    try:
        took = (json.loads(path.read_text()).get("ncu_take") or {}).get("mode")
    except (OSError, ValueError):
        took = None
    if took != "first-of-size":
        session.ncu_record.variable_selection = None


def _hot_without_counters(session: ProfileSession, hot: HotKernels, not_run: dict[str, str]) -> None:
    """Name every hot kernel that phase 2 left without counters, or with counters for some of
    its launches only, and why."""
    from kerneltriage.analysis.timeline.hot_kernels import short_name, without_counter_rows
    from kerneltriage.ingest.ncu_csv import read_counters

    budget = session.options.max_variable_launches
    exports = []
    for csv_name in (rundir.NCU_LAUNCHES_CSV, rundir.NCU_CSV):
        if (session.out / csv_name).is_file():
            try:
                exports.append(read_counters(session.out / csv_name).rows)
            except Exception:  # an unreadable export: the report says so when it reads it
                continue
    unprofiled = set(without_counter_rows(hot.names, exports))
    missing: dict[str, str] = {}
    for name in hot.names:
        if name in not_run:
            missing[name] = not_run[name]
        elif name in unprofiled:
            missing[name] = (
                "ncu profiled no launch of it: the profiled step of phase 2 did not run it "
                "(a different program from phase 1's, or a kernel name ncu spells otherwise)"
            )
    unit = "problem sizes" if hot.variable_first_of_size else "launches"
    for name, count in hot.over_budget.items():
        missing.setdefault(
            name,
            f"runs several problem sizes under one launch configuration, {count} {unit} a step, over "
            f"the every-launch budget ({budget} a step, {hot.variable_launches} taken by hotter kernels): "
            "one launch per configuration was profiled, launches of its other sizes get no counters",
        )
    session.ncu_record.hot_without_counters = missing
    if missing:
        session.warnings.append(
            "hot kernels without counters from phase 2: "
            + "; ".join(f"{short_name(name)} ({why})" for name, why in missing.items())
        )
    # The report's join names kernels without counter rows itself; what only this side knows
    # (the launch budget, a failed pass) goes to the report through the manifest.
    known_here = {n: why for n, why in missing.items() if n in not_run or n in hot.over_budget}
    if known_here:
        session.manifest.warnings.append(
            "hot kernels left without (some) counters by phase 2: "
            + "; ".join(f"{short_name(name)} ({why})" for name, why in known_here.items())
        )
