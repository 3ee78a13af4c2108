"""Phase 1: the script under the PyTorch profiler, and what its processes recorded.

The first run follows the asked plan (``step_plan.StepPlan``). A script that ended before the
steps the plan needs runs again: with fewer timing steps when it has room for them, else
recorded whole, as one step. The traces are then finished (module ranges, shapes from the
shapes step), a failed script stops the run with what was kept, the step time is recorded
(``step_time.py``), and with ``--timing-processes`` N, N − 1 more processes of the script
time their plain steps.

With ``--timeline nsys`` phase 1 runs under Nsight Systems instead (``phase_timeline_nsys.py``),
and the PyTorch profiler takes over when nsys cannot give a timeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage import rundir
from kerneltriage.errors import ToolError
from kerneltriage.profile import pairs
from kerneltriage.profile.command import Command
from kerneltriage.profile.context import (
    Options,
    ProfileSession,
    asked_plan,
    plain_bounds,
    too_many_for_host_memory,
)
from kerneltriage.profile.fix_install import EXIT_NOT_APPLIED
from kerneltriage.profile.step_plan import EXIT_NO_GPU, EXIT_NO_TORCH, StepPlan
from kerneltriage.profile.step_time import clean_summary, other_ranks_step_time, record_step_time
from kerneltriage.profile.turns import Turn, Turns

#: Starts the next phase's processes, held at their gates; returns their turns.
StartNext = Callable[[], list[Turn]]

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.timeline.steady import Processes


@dataclass
class TimelineRuns:
    """What the script's runs under the profiler left: the last run's exit code and output,
    the traces and per-process statuses, the steps it ran, and how long the runs took."""

    seconds: float
    code: int
    tail: list[str]
    traces: list[Path]
    statuses: list[dict[str, Any]]
    steps_seen: int


@dataclass(frozen=True)
class _Rerun:
    """Phase 1 once more: with these options, stepped or whole, logged as ``log``; ``said`` to
    the user, ``noted`` in the run's notes."""

    options: Options
    whole_run: bool
    log: str
    said: str
    noted: str


def run_timeline(session: ProfileSession, start_next: StartNext | None = None) -> None:
    """Phase 1 with the PyTorch profiler: the manifest's ``phases.timeline``, the traces,
    the step time; raises ``ToolError`` when the script failed or recorded nothing.
    ``start_next``: called once the timing processes have started, it starts the next phase's
    processes (held at their gates) and returns their turns, which timed steps wait for."""
    options, manifest = session.options, session.manifest
    whole_run = options.step_marker is not None
    config = session.write_config("timeline", whole_run=whole_run)
    session.reporter.phase("timeline", "PyTorch profiler" + (" (CPU only)" if options.cpu else ""))
    seconds, code, tail = session.run(session.command.with_runner(), config, "phase1")
    statuses = session.statuses("timeline")
    manifest.phases.timeline = rundir.TimelinePhase(seconds=round(seconds, 2), exit_code=code)
    session.record_environment(statuses)
    manifest.exit_code = code
    _refuse_setup_failures(code, statuses)
    traces = sorted(session.out.glob("trace*.json.gz"))
    runs = TimelineRuns(seconds, code, tail, traces, statuses, _steps_seen(statuses))
    # A script shorter than the plan: its timing steps fitted to its length first, then, if
    # it is shorter than the warm-up and recorded steps, the whole run recorded.
    for rerun_for in (_fitted_rerun, _whole_rerun):
        if runs.traces or whole_run or runs.code != 0:
            break
        rerun = rerun_for(session.options, runs.steps_seen, bool(session.command.distributed))
        if rerun is not None:
            _run_again(session, runs, rerun)
    if whole_run:
        manifest.schedule.whole_run = True
    finished_from = time.perf_counter()
    _stop_on_failure(session, runs)
    _record_timeline(session, runs)
    session.timeline_record.finish_seconds = round(time.perf_counter() - finished_from, 2)
    time_more_processes(session, runs, whole_run=whole_run, start_next=start_next)
    session.reporter.phase_done(
        "timeline",
        runs.seconds,
        f"{len(runs.traces)} trace(s), steps from {session.timeline_record.step_source or 'the whole run'}",
    )


def _refuse_setup_failures(code: int, statuses: list[dict[str, Any]]) -> None:
    """The runner's own exit codes: no GPU, no torch, a fix not applied (``profile --apply``)."""
    if code == EXIT_NO_GPU:
        raise ToolError(
            "no CUDA GPU is visible to the script's Python",
            hint="run on a machine with a GPU, use `kerneltriage report` on an existing trace, "
            "or pass --cpu for a CPU-only dry run of the set-up",
        )
    if code == EXIT_NO_TORCH:
        raise ToolError(
            next((s["error"] for s in statuses if s.get("error")), "no torch in the script's Python"),
            hint="install PyTorch there, e.g. pip install torch; "
            "`kerneltriage report` reads traces made elsewhere",
        )
    if code == EXIT_NOT_APPLIED:  # profile --apply: one line naming the fix
        raise ToolError(next((s["error"] for s in statuses if s.get("error")), "a fix could not be applied"))


def _steps_seen(statuses: list[dict[str, Any]]) -> int:
    return max((s.get("steps_seen", 0) for s in statuses), default=0)


# --- a script too short for the plan: run it again -----------------------------------------


def fitted_timing(options: Options, steps_seen: int, distributed: bool = False) -> tuple[int, int] | None:
    """(timing steps, plain steps) that a script of ``steps_seen`` steps leaves room for, when
    it ran at least the warm-up and recorded steps but left no trace: fewer plain steps first
    (down to ``--timing-steps``), then fewer timing steps (None: no timing steps were asked, or
    the script is too short for any). A script long enough for the plan's fewest plain steps
    left no trace because its plain steps went on past its end, unsettled: again with as many
    plain steps as fit, fixed."""
    asked = asked_plan(options, distributed=distributed)
    if not options.timing_steps:
        return None
    if steps_seen >= asked.stop_after:
        most = plain_bounds(options, distributed)[1]
        return options.timing_steps, min(most, asked.plain_count + steps_seen - asked.stop_after)
    if steps_seen < StepPlan(options.warmup, options.steps, 0).stop_after:
        return None
    t = options.timing_steps
    for plain in range(asked.plain_count - 1, t - 1, -1):
        if StepPlan(options.warmup, options.steps, t, plain=plain).stop_after <= steps_seen:
            return t, plain
    fits = [
        t
        for t in range(options.timing_steps - 1, 1, -1)
        if StepPlan(options.warmup, options.steps, t).stop_after <= steps_seen
    ]
    return (fits[0], fits[0]) if fits else (0, 0)


def _fitted_rerun(options: Options, steps_seen: int, distributed: bool) -> _Rerun | None:
    """The script ended before the recorded steps (they follow the plain, clean and shapes
    steps): again with as many timing steps as its length allows."""
    fits = fitted_timing(options, steps_seen, distributed)
    if fits is None:
        return None
    fitted, plain = fits
    asked = asked_plan(options, distributed=distributed)
    if steps_seen >= asked.stop_after:
        message = (
            f"the script ended after {steps_seen} steps while its plain steps were still settling: "
            f"profiled again with {plain} plain steps, fixed"
        )
    else:
        message = (
            f"the script ran {steps_seen} steps; --warmup {options.warmup}, {asked.plain_count} plain and "
            f"{options.timing_steps} clean timing steps and --steps {options.steps} need {asked.stop_after}: "
            f"profiled again with {plain} plain and {fitted} clean steps"
            + (
                ""
                if fitted
                else " (no plain steps: step and idle time are the recorded steps', profiler included)"
            )
        )
    options = dataclasses.replace(options, timing_steps=fitted, plain_min=plain, plain_max=plain)
    return _Rerun(options, whole_run=False, log="phase1-fit", said=message, noted=message)


def _whole_rerun(options: Options, steps_seen: int, distributed: bool) -> _Rerun | None:
    """No step boundary fired often enough: again, recording the whole run as one step."""
    if steps_seen >= options.warmup + options.steps:
        return None
    reason = (
        "no step boundary was seen (no torch.optim step, no kerneltriage.step())"
        if steps_seen == 0
        else f"only {steps_seen} steps ran, fewer than --warmup {options.warmup} + --steps {options.steps}"
    )
    return _Rerun(
        options,
        whole_run=True,
        log="phase1-whole",
        said=f"{reason}; profiling the whole run instead",
        noted=f"{reason}: the whole run was profiled as one step",
    )


def _run_again(session: ProfileSession, runs: TimelineRuns, rerun: _Rerun) -> None:
    """Phase 1 once more, as ``rerun`` says: its traces, statuses, steps and exit code replace
    the earlier run's in ``runs``; its seconds add to the phase's; its options are the
    session's from now on."""
    session.reporter.warn(rerun.said)
    session.warnings.append(rerun.noted)
    session.options = rerun.options
    if rerun.whole_run:
        session.manifest.schedule.whole_run = True
    else:
        session.manifest.schedule.timing_steps = rerun.options.timing_steps
    config = session.write_config("timeline", whole_run=rerun.whole_run)
    seconds, runs.code, runs.tail = session.run(session.command.with_runner(), config, rerun.log)
    runs.seconds += seconds
    session.timeline_record.seconds = round(runs.seconds, 2)
    session.manifest.exit_code = runs.code
    runs.traces = sorted(session.out.glob("trace*.json.gz"))
    runs.statuses = session.statuses("timeline")
    runs.steps_seen = _steps_seen(runs.statuses)


# --- what the runs recorded ----------------------------------------------------------------


def _stop_on_failure(session: ProfileSession, runs: TimelineRuns) -> None:
    """Fix up what was recorded, then raise ``ToolError`` if the script failed or left no trace."""
    failed = _failed_ranks(session.command, runs.statuses)
    for rank, why in failed.items():
        session.warnings.append(f"rank {rank} failed: {why}")
    if runs.traces:
        _finish_traces(session, runs.statuses)  # before any failure: what is kept must read right
    if runs.code != 0:
        detail = "\n".join(runs.tail)
        if failed:
            detail = "; ".join(f"rank {r}: {w}" for r, w in failed.items()) + "\n" + detail
        if not runs.traces:
            raise ToolError(
                f"the script failed (exit code {runs.code}) before any step was recorded; its last output:\n{detail}"
            )
        session.manifest.ranks = sorted(s.get("rank", 0) for s in runs.statuses if s.get("trace")) or [0]
        kept = ", ".join(t.name for t in runs.traces)
        raise ToolError(
            f"the script failed (exit code {runs.code}); what was recorded is kept ({kept}): "
            f"`kerneltriage report` can read it. Last output:\n{detail}"
        )
    if not runs.traces:
        raise ToolError("the profiler wrote no trace (see the logs folder of the run directory)")


def _failed_ranks(command: Command, statuses: list[dict[str, Any]]) -> dict[int, str]:
    """Ranks that failed or never reported (killed when torchrun tore the job down)."""
    failed = {
        s.get("rank", 0): s.get("error") or s.get("status")
        for s in statuses
        if s.get("status") not in ("ok", None)
    }
    expected = command.world_size
    if expected:
        seen = {s.get("rank", 0) for s in statuses}
        for rank in range(expected):
            if rank not in seen:
                failed.setdefault(rank, "wrote no status: killed, or died before the profiler started")
    return dict(sorted(failed.items()))


def _finish_traces(session: ProfileSession, statuses: list[dict[str, Any]]) -> None:
    """Module ranges relabelled, shapes from the shapes step copied in (``trace_fixup``)."""
    from kerneltriage.profile.trace_fixup import finish_trace

    out = session.out
    done: dict[str, Any] = {}
    for status in statuses:
        if not status.get("trace") or not (out / status["trace"]).is_file():
            continue
        shapes = session.logs / status["shapes_trace"] if status.get("shapes_trace") else None
        started = time.perf_counter()
        try:
            stats = finish_trace(out / status["trace"], shapes if shapes and shapes.is_file() else None)
        except Exception as exc:  # the trace as recorded is still worth a report
            session.warnings.append(f"could not finish {status['trace']} (module ranges, shapes): {exc}")
            continue
        stats["seconds"] = round(time.perf_counter() - started, 2)
        done[status["trace"]] = stats
        if stats.get("ops") and stats["ops_with_shapes"] < 0.99 * stats["ops"]:
            lacking = ", ".join(f"{name} ×{n}" for name, n in (stats.get("missing") or {}).items())
            message = (
                f"{status['trace']}: input shapes found for {stats['ops_with_shapes']} of {stats['ops']} ops; "
                f"the recorded steps ran ops the shapes step did not ({lacking or 'unnamed'}): "
                "those are estimated without their shapes"
            )
            session.warnings.append(message)
            session.manifest.warnings.append(message)
    session.timeline_record.trace_fixup = done


def _record_timeline(session: ProfileSession, runs: TimelineRuns) -> None:
    """What the first rank's run says about its steps: where they came from, Dynamo's counts,
    the plain and clean steps' times."""
    manifest, warnings = session.manifest, session.warnings
    statuses = runs.statuses
    first = min(statuses, key=lambda s: s.get("rank", 0), default={})
    # The plain steps the process ran: more than asked when their times took long to settle.
    plan = dataclasses.replace(
        asked_plan(session.options, bool(manifest.schedule.whole_run)), plain=first.get("plain_steps") or None
    )
    phase = session.timeline_record
    if first.get("plain_extended"):
        phase.plain_extended = int(first["plain_extended"])
    hooked_steps = 1 if plan.whole_run else max(1, plan.last_recorded - plan.hooks_from + 1)
    phase.steps_seen = runs.steps_seen
    phase.step_source = next((s.get("step_source") for s in statuses if s.get("step_source")), None)
    phase.module_calls_per_step = round(first.get("module_calls", 0) / hooked_steps, 1)
    phase.traces = [t.name for t in runs.traces]
    dynamo = first.get("dynamo") or {}
    if dynamo.get("plain") or dynamo.get("end"):
        phase.dynamo = dynamo
        _dynamo_drift(dynamo, warnings)
    _check_plain_steps(first.get("phases") or [], warnings)
    clean = clean_summary(session.out, first, plan, warnings)
    record_step_time(
        first.get("step_times") or {}, plan, manifest, warnings, clean, rank=first.get("rank", 0)
    )
    other_ranks_step_time(session.out, statuses, first, plan, phase, warnings)
    manifest.ranks = sorted(s.get("rank", 0) for s in statuses if s.get("trace")) or [0]


def _dynamo_drift(dynamo: dict[str, Any], warnings: list[str]) -> None:
    """Graphs compiled after the plain steps (while kerneltriage's profilers and hooks ran) are
    the program's, or kerneltriage's doing: either way the report should say so."""
    plain, end = dynamo.get("plain") or {}, dynamo.get("end") or {}
    if not plain or not end:
        return
    extra = end.get("recompiles", 0) - plain.get("recompiles", 0)
    if extra > 0:
        reasons = [r["reason"] for r in (end.get("recompile_reasons") or [])[plain.get("recompiles", 0) :]]
        warnings.append(
            f"Dynamo recompiled {extra} time(s) after the plain steps, while profiling"
            + (f" ({'; '.join(reasons[:2])})" if reasons else "")
            + ": the report's torch.compile counts are those of the plain steps"
        )


def _check_plain_steps(phases: list[dict[str, Any]], warnings: list[str]) -> None:
    """The plain steps must have run before any profiler existed in the process."""
    bad = [
        p["step"]
        for p in phases
        if p.get("phase") == "plain" and (p.get("profilers_created") or p.get("profiler_enabled"))
    ]
    if bad:
        warnings.append(
            f"plain steps {bad} ran after a profiler existed in the process: their step time may carry its residue"
        )


# --- more processes for the step time ------------------------------------------------------


def time_more_processes(
    session: ProfileSession,
    runs: TimelineRuns,
    *,
    whole_run: bool,
    start_next: StartNext | None = None,
) -> None:
    """``--timing-processes`` N: N − 1 more processes of the script, each timing its warm-up
    and plain steps only, so that the report's step time and its interval span processes; then
    more, started ``MORE_AT_ONCE`` at a time and timed one by one, up to
    ``--max-timing-processes``, while the interval a further run of the script falls in
    (``steady.run_interval``) is wider than measurement.yaml's target. Not
    for a CPU dry run, a torchrun job (its ranks time one process each) or a whole-run record."""
    options = session.options
    step = session.timeline_record.step_time
    if (
        options.timing_processes <= 1
        or options.cpu
        or session.command.distributed
        or whole_run
        or step is None
        or not step.plain_ms
    ):
        return
    series = [list(step.plain_ms)]
    host: list[float] = []
    target, most, reach_factor = _more_processes_settings(
        options.timing_processes, options.max_timing_processes
    )
    # The asked processes start together, each held at its first CUDA use, and get the GPU in
    # turn (``turns.py``): their start-ups overlap, their timed steps never do. The first
    # processes one more batch would start come with them, held at their gates until the
    # interval says whether they are needed (a process stopped at its gate cost no wall time;
    # one started later pays its 10-17 s start-up alone).
    # Two at a time where two fit on the GPU: both start up and warm up at once, each held
    # before its plain steps until the GPU is its own (``turns.py``, measure gates).
    paired = pairs.measure_gates(session, 2)
    batch = Turns(
        [
            session.turn(
                session.command.with_runner(),
                session.write_config("timing", whole_run=False, name=f"timing{i}", measure_gate=paired),
                f"timing{i}",
            )
            for i in range(1, options.timing_processes + spare_processes(session))
        ],
        quiet=True,
    )
    batches = [batch]
    others: list[Turn] = []
    i = 0
    try:
        if start_next is not None:
            # Phase 2's processes start up while these do; timed steps wait for them to be
            # at their gates, so no start-up shares the host with a timed step.
            others = start_next()
            batch.also_wait_for(others)
        while True:
            i += 1
            if i >= options.timing_processes:
                from kerneltriage.analysis.timeline.steady import over_processes

                over = over_processes(series)
                wide = _wide_interval(over, target)
                if i >= most or wide is None:
                    break
                reach = _reachable(over, most)
                if reach is not None and reach > reach_factor * target:
                    session.warnings.append(
                        f"the {i} timing processes put a run of the script within ±{wide:.1%} of its step "
                        f"time; their spread would leave ±{reach:.1%} even at {most} processes (the target "
                        f"is ±{target:.0%}), so no more were timed: runs of this script differ from process "
                        "to process (a shared or host-paced machine)"
                    )
                    break
                session.reporter.phase(
                    "timing",
                    f"process {i + 1} (at most {most}): the {i} so far put a run of the script within "
                    f"±{wide:.1%} of its step time, wider than ±{target:.0%}",
                )
                name = f"timing{i}"
                if batch.index >= len(batch):
                    # More processes, a few at once: their start-ups overlap, and one not
                    # needed once the interval narrows is stopped at its gate.
                    batch = Turns(
                        [
                            session.turn(
                                session.command.with_runner(),
                                session.write_config(
                                    "timing", whole_run=False, name=f"timing{j}", measure_gate=paired
                                ),
                                f"timing{j}",
                            )
                            for j in range(i, min(most, i + MORE_AT_ONCE))
                        ],
                        quiet=True,
                    )
                    batch.also_wait_for(others)
                    batches.append(batch)
                seconds, code, _ = batch.next(_done_when(session, batch, name))
            else:
                session.reporter.phase(
                    "timing", f"process {i + 1} of {options.timing_processes}: warm-up and plain steps"
                )
                name = f"timing{i}"
                seconds, code, _ = batch.next(_done_when(session, batch, name))
            runs.seconds += seconds
            first = min(session.statuses(name), key=lambda s: s.get("rank", 0), default={})
            plain = (first.get("step_times") or {}).get("plain_ms") or []
            if code != 0 or not plain:
                session.warnings.append(
                    f"timing process {i + 1} timed no plain step (exit code {code}): the step time spans "
                    f"{len(series)} process(es)"
                )
                break
            series.append([float(t) for t in plain])
            host += [float(t) for t in first.get("host_issue_ms") or []]
            session.reporter.phase_done("timing", seconds, f"{len(plain)} plain steps")
    finally:
        for started in batches:
            started.close()
    step.processes_plain_ms = series
    step.host_issue_ms = host
    session.timeline_record.seconds = round(runs.seconds, 2)


def _done_when(session: ProfileSession, batch: Turns, name: str) -> Callable[[], bool] | None:
    """When the next timing process's steps are done (its status written), where the one after
    it starts with it; None otherwise (a spare is started only once it is needed)."""
    return pairs.status_written(session, name) if batch.pairs_with_next() else None


def import_statistics_in_background() -> None:
    """Import scipy.stats (0.5-0.6 s) while phase 1 runs: the step time's interval after phase 1
    and between timing turns needs it, and there nothing else may run meanwhile."""

    def work() -> None:
        with contextlib.suppress(ImportError):
            import scipy.stats  # noqa: F401

    threading.Thread(target=work, name="import-statistics", daemon=True).start()


#: Processes started at once when the interval is still wide: each start-up (10-15 s for a
#: Hugging Face model on an H200) overlaps the others', and the steps are 1-6 s a process.
MORE_AT_ONCE = 2


#: Phase 2's processes (its two passes on one GPU) that spare timing processes leave room for.
SPARE_ROOM_FOR = 2


def spare_processes(session: ProfileSession) -> int:
    """Timing processes started with the asked ones in case the interval needs them (the first
    ``MORE_AT_ONCE``, within ``--max-timing-processes``); 0 where none more may be timed, or
    where they would not fit in the host's memory beside the asked ones and phase 2's
    (``SPARE_ROOM_FOR``: its processes start while these wait, and come first)."""
    options = session.options
    if options.timing_processes <= 1 or options.cpu or session.command.distributed:
        return 0
    _, most, _ = _more_processes_settings(options.timing_processes, options.max_timing_processes)
    spare = max(0, min(MORE_AT_ONCE, most - options.timing_processes))
    if spare and too_many_for_host_memory(session, options.timing_processes - 1 + spare + SPARE_ROOM_FOR):
        return 0
    return spare


def _more_processes_settings(asked: int, most: int | None) -> tuple[float, int, float]:
    """measurement.yaml's ``timing``: the half-width past which one more process is timed, the
    most processes in all (``most`` where given; never fewer than asked), and how far beyond
    the target the spread so far may leave a further run at the most processes."""
    from kerneltriage.analysis.timeline.steady import settings

    conf = settings()["timing"]
    return (
        float(conf["target_half_width"]),
        max(asked, most or int(conf["max_processes"])),
        float(conf["reach_factor"]),
    )


def _reachable(over: Processes | None, most: int) -> float | None:
    """The relative half-width a further run's interval would have at ``most`` processes of
    the same spread as the kept ones so far (None: too few to tell)."""
    from kerneltriage.analysis.timeline import steady

    if over is None or len(over.kept) < 2:
        return None
    levels = [f.median for f in over.kept]
    mean = sum(levels) / len(levels)
    if mean <= 0:
        return None
    return steady.projected_half_width(levels, most) / mean


def _wide_interval(over: Processes | None, target: float) -> float | None:
    """The relative half-width of the interval a further run falls in (``over``: the processes
    so far), where it is wider than ``target`` (None: narrow enough, or too few to tell)."""
    if over is None or over.run.value <= 0:
        return None
    run = over.run  # a process left out as an outlier widens it too: a reason to time another
    half = max(run.high - run.value, run.value - run.low) / run.value
    return half if half > target else None
