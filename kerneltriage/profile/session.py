"""``kerneltriage profile``: run the user's command twice and write one run directory.

Phase 1 runs the command under the PyTorch profiler (through ``runner.py``); phase 2 runs it
again under Nsight Compute on the hot kernels of phase 1. The manifest is written at the
start and after every phase (atomically), so an interrupted or failed run leaves a directory
that says what it holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gzip
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kerneltriage
from kerneltriage import rundir
from kerneltriage.analysis.rules import load_rules
from kerneltriage.errors import InputError, ToolError
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.command import Command, parse_command
from kerneltriage.profile.fix_install import EXIT_NOT_APPLIED
from kerneltriage.profile.runner import CONFIG_ENV
from kerneltriage.profile.step_plan import CAPTURE_RANGE, EXIT_NO_GPU, EXIT_NO_TORCH, StepPlan

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.hot_kernels import HotKernels

#: Phase 1 warns when the clean steps (GPU busy time) run this much slower than the same
#: process's plain steps (step time): kernel time barely moves with host time, but a profiler
#: that costs this much may have changed more than the host's pace.
OVERHEAD_WARN = 0.05

TIMED_OUT = -999
_ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_COMPILE_DEBUG",
    "NCCL_DEBUG",
    "OMP_NUM_THREADS",
    "WORLD_SIZE",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
)


@dataclass
class Options:
    out: Path | None = None
    force: bool = False
    warmup: int = 3
    steps: int = 3
    ncu: bool = True
    max_kernels: int = 64
    coverage: float = 0.95
    ncu_set: str = "roofline"  # or "full"
    run_to_end: bool = False
    step_marker: str | None = None
    cpu: bool = False
    ncu_rank: int = 0
    timeline: str = "torch"
    calibrate: bool = False
    ncu_timeout: float = 900.0  # seconds for each ncu pass
    rules_file: Path | None = None  # --rules: merged over the shipped rules (hot-kernel selection)
    # Clean steps (CUDA-only profiler) and as many plain steps (nothing installed) after the
    # recorded ones (``hooks.StepPlan``): the plain steps give the step time the report uses, the
    # clean steps the GPU's busy time.
    timing_steps: int = 5
    # Plain steps: at least ``plain_min``, more until the step times settle, at most
    # ``plain_max`` (None: measurement.yaml's). A script too short for them gets a fixed count.
    plain_min: int | None = None
    plain_max: int | None = None
    # Processes whose plain steps give the step time: phase 1 and this many less one more
    # processes that run only the warm-up and plain steps (processes of one script differ by
    # up to 9% on an H100, more than one process's steps do). 1: phase 1 alone.
    timing_processes: int = 3
    # Launches per step the every-launch ncu pass may profile (about 0.32 s each on an H200
    # with the roofline metric set: 256 launches ≈ 80 s).
    max_variable_launches: int = 256
    # profile --apply (kerneltriage/ladder.py): the fixes installed before the script runs, as
    # the manifest's ``applied_fixes`` entries ({id, recipe_id, apply, …}), and the run they
    # came from.
    applied_fixes: list[dict[str, Any]] = field(default_factory=list)
    parent_run: str | None = None


class Reporter:
    """What the session tells the user; the CLI renders it (progress bars, lines)."""

    def phase(self, name: str, detail: str = "") -> None: ...

    def phase_done(self, name: str, seconds: float, detail: str = "") -> None: ...

    def output(self, line: str, stream: str) -> None:
        print(line, file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)

    def ncu_progress(self, done: int, total: int, kernel: str) -> None: ...

    def warn(self, message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)


@dataclass
class Result:
    run_dir: Path
    manifest: rundir.Manifest
    warnings: list[str] = field(default_factory=list)


def default_out(command: Command) -> Path:
    stem = Path(command.script).stem.replace(".", "_") or "run"
    return Path("runs") / f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _prepare_out(out: Path, force: bool) -> Path:
    """The folder the run is written to: ``out`` itself, or, when ``--force`` replaces a run, a
    new folder beside it that ``_replace_run`` swaps in once the run is complete (a failed or
    interrupted run leaves the old one as it was)."""
    try:
        if out.exists():
            if not out.is_dir():
                raise InputError("exists and is not a directory", path=str(out))
            if any(out.iterdir()):
                if not force:
                    raise InputError(
                        "output directory exists and is not empty",
                        path=str(out),
                        hint="pass --force to replace it, or choose another --out",
                    )
                if not (out / rundir.MANIFEST).is_file():
                    raise InputError(
                        "--force replaces only kerneltriage run directories; this one has no manifest.json",
                        path=str(out),
                    )
                stage = out.parent / f".{out.name}.kerneltriage-{os.getpid()}.new"
                (stage / rundir.LOGS).mkdir(parents=True)
                return stage
        (out / rundir.LOGS).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from kerneltriage.inputs import os_reason

        raise InputError(f"cannot create the run directory ({os_reason(exc)})", path=str(out)) from None
    return out


def _replace_run(stage: Path, out: Path, complete: bool) -> None:
    """Swap a complete new run (``stage``) in for the old ``out``; an incomplete one is removed,
    and the old run stays."""
    if stage == out:
        return
    if not complete:
        shutil.rmtree(stage, ignore_errors=True)
        return
    aside = out.parent / f".{out.name}.kerneltriage-{os.getpid()}.old"
    os.rename(out, aside)
    try:
        os.rename(stage, out)
    except BaseException:
        os.rename(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def run_profile(argv: list[str], options: Options, reporter: Reporter | None = None) -> Result:
    """Profile ``argv`` (the user's command) and return the run directory."""
    say = reporter or Reporter()
    command = parse_command(argv)
    if options.steps < 1 or options.warmup < 0:
        raise InputError("--steps must be at least 1 and --warmup at least 0")
    load_rules(options.rules_file)  # a bad rules file fails now, not after phase 1
    target = Path(options.out) if options.out else default_out(command)
    out = _prepare_out(target, options.force)
    manifest = rundir.Manifest(
        kerneltriage_version=kerneltriage.__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=list(argv),
        cwd=os.getcwd(),
        env={k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
        schedule=rundir.Schedule(
            warmup=options.warmup,
            steps=options.steps,
            step_marker=options.step_marker,
            run_to_end=options.run_to_end,
            ncu_rank=options.ncu_rank,
        ),
        status="running",
    )
    if options.applied_fixes:
        manifest.applied_fixes = [rundir.AppliedFix.model_validate(f) for f in options.applied_fixes]
        manifest.parent_run = options.parent_run
    rundir.write_manifest(out, manifest)
    warnings: list[str] = []
    try:
        if options.calibrate and not options.cpu:
            _phase_calibrate(command, out, manifest, say, warnings)
        if options.timeline == "nsys" and not options.cpu:
            if not _phase_timeline_nsys(command, options, out, manifest, say, warnings):
                _phase_timeline(command, options, out, manifest, say, warnings)
        else:
            _phase_timeline(command, options, out, manifest, say, warnings)
        if not manifest.calibration and manifest.gpu.get("name"):
            manifest.calibration = _cached_calibration(manifest.gpu["name"]) or {}
        if options.ncu and not options.cpu:
            _phase_ncu(command, options, out, manifest, say, warnings)
        elif options.cpu:
            manifest.notes.append("--cpu dry run: CPU ops only, no GPU kernels and no counters")
        manifest.status = "ok"
    except KeyboardInterrupt:
        manifest.status = "interrupted"
        manifest.notes.append("interrupted by the user (Ctrl-C); files written so far are kept")
        raise
    except BaseException as exc:
        if manifest.status == "running":
            manifest.status = "failed"
            manifest.notes.append(str(exc))
        raise
    finally:
        manifest.notes.extend(w for w in warnings if w not in manifest.notes)
        rundir.write_manifest(out, manifest)
        _replace_run(out, target, manifest.status == "ok")
    return Result(target, manifest, warnings)


# --- phase 1 ------------------------------------------------------------------------------


@dataclass
class _TimelineRuns:
    """What the script's runs under the profiler left: the last run's exit code and output,
    the traces and per-process statuses, and how long the runs took."""

    seconds: float
    code: int
    tail: list[str]
    traces: list[Path]
    statuses: list[dict[str, Any]]
    steps_seen: int


def _phase_timeline(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
) -> None:
    whole_run = options.step_marker is not None
    config = _write_config(out, "timeline", options, command, whole_run=whole_run)
    say.phase("timeline", "PyTorch profiler" + (" (CPU only)" if options.cpu else ""))
    seconds, code, tail = _run(command.with_runner(), config, out / rundir.LOGS / "phase1", say, manifest)
    statuses = _statuses(out, "timeline")
    manifest.phases.timeline = rundir.TimelinePhase(seconds=round(seconds, 2), exit_code=code)
    _record_environment(manifest, statuses)
    manifest.exit_code = code
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
    traces = sorted(out.glob("trace*.json.gz"))
    runs = _TimelineRuns(seconds, code, tail, traces, statuses, _steps_seen(statuses))
    options = _rerun_fitted(command, options, out, manifest, say, warnings, runs, whole_run)
    _rerun_whole(command, options, out, manifest, say, warnings, runs, whole_run)
    if whole_run:
        manifest.schedule.whole_run = True
    _stop_on_failure(command, out, manifest, warnings, runs)
    _record_timeline(out, options, manifest, warnings, runs)
    _time_more_processes(command, options, out, manifest, say, warnings, runs, whole_run)
    say.phase_done(
        "timeline",
        runs.seconds,
        f"{len(runs.traces)} trace(s), steps from {_timeline(manifest).step_source or 'the whole run'}",
    )


def _time_more_processes(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
    runs: _TimelineRuns,
    whole_run: bool,
) -> None:
    """``--timing-processes`` N: N − 1 more processes of the script, each timing its warm-up
    and plain steps only, so that the report's step time and its interval span processes. Not
    for a CPU dry run, a torchrun job (its ranks time one process each) or a whole-run record."""
    step = _timeline(manifest).step_time
    if (
        options.timing_processes <= 1
        or options.cpu
        or command.distributed
        or whole_run
        or step is None
        or not step.plain_ms
    ):
        return
    series = [list(step.plain_ms)]
    for i in range(1, options.timing_processes):
        say.phase("timing", f"process {i + 1} of {options.timing_processes}: warm-up and plain steps")
        config = _write_config(out, "timing", options, command, whole_run=False)
        seconds, code, _ = _run(
            command.with_runner(), config, out / rundir.LOGS / f"timing{i}", say, manifest
        )
        runs.seconds += seconds
        first = min(_statuses(out, "timing"), key=lambda s: s.get("rank", 0), default={})
        plain = (first.get("step_times") or {}).get("plain_ms") or []
        if code != 0 or not plain:
            warnings.append(
                f"timing process {i + 1} timed no plain step (exit code {code}): the step time spans "
                f"{len(series)} process(es)"
            )
            break
        series.append([float(t) for t in plain])
        say.phase_done("timing", seconds, f"{len(plain)} plain steps")
    step.processes_plain_ms = series
    _timeline(manifest).seconds = round(runs.seconds, 2)


def _steps_seen(statuses: list[dict[str, Any]]) -> int:
    return max((s.get("steps_seen", 0) for s in statuses), default=0)


def _rerun_fitted(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
    runs: _TimelineRuns,
    whole_run: bool,
) -> Options:
    """The script ended before the recorded steps (they follow the plain, clean and shapes
    steps): run it again with as many timing steps as its length allows. The options used."""
    ok = not runs.traces and not whole_run and runs.code == 0
    fits = _fitted_timing(options, runs.steps_seen) if ok else None
    if fits is None:
        return options
    fitted, plain = fits
    asked = _plan(options)
    message = (
        f"the script ran {runs.steps_seen} steps; --warmup {options.warmup}, {asked.plain_count} plain and "
        f"{options.timing_steps} clean timing steps and --steps {options.steps} need {asked.stop_after}: "
        f"profiled again with {plain} plain and {fitted} clean steps"
        + (
            ""
            if fitted
            else " (no plain steps: step and idle time are the recorded steps', profiler included)"
        )
    )
    say.warn(message)
    warnings.append(message)
    options = dataclasses.replace(options, timing_steps=fitted, plain_min=plain, plain_max=plain)
    manifest.schedule.timing_steps = fitted
    runs.seconds += _run_timeline_again(command, options, out, manifest, say, runs, "phase1-fit", False)
    runs.steps_seen = _steps_seen(runs.statuses)
    return options


def _rerun_whole(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
    runs: _TimelineRuns,
    whole_run: bool,
) -> None:
    """No step boundary fired often enough: record the whole run instead, and say so."""
    if runs.traces or whole_run or runs.code != 0 or runs.steps_seen >= options.warmup + options.steps:
        return
    reason = (
        "no step boundary was seen (no torch.optim step, no kerneltriage.step())"
        if runs.steps_seen == 0
        else f"only {runs.steps_seen} steps ran, fewer than --warmup {options.warmup} + --steps {options.steps}"
    )
    say.warn(f"{reason}; profiling the whole run instead")
    warnings.append(f"{reason}: the whole run was profiled as one step")
    manifest.schedule.whole_run = True
    _run_timeline_again(command, options, out, manifest, say, runs, "phase1-whole", True)


def _run_timeline_again(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    runs: _TimelineRuns,
    log: str,
    whole_run: bool,
) -> float:
    """Phase 1 once more with ``options``: its traces, statuses and exit code replace the
    first run's in ``runs``; the manifest's timeline time adds its seconds (returned)."""
    config = _write_config(out, "timeline", options, command, whole_run=whole_run)
    seconds, runs.code, runs.tail = _run(
        command.with_runner(), config, out / rundir.LOGS / log, say, manifest
    )
    _timeline(manifest).seconds = round(runs.seconds + seconds, 2)
    manifest.exit_code = runs.code
    runs.traces = sorted(out.glob("trace*.json.gz"))
    runs.statuses = _statuses(out, "timeline")
    return seconds


def _stop_on_failure(
    command: Command, out: Path, manifest: rundir.Manifest, warnings: list[str], runs: _TimelineRuns
) -> None:
    """Fix up what was recorded, then raise ``ToolError`` if the script failed or left no trace."""
    failed = _failed_ranks(command, runs.statuses)
    for rank, why in failed.items():
        warnings.append(f"rank {rank} failed: {why}")
    if runs.traces:
        _finish_traces(
            out, runs.statuses, manifest, warnings
        )  # before any failure: what is kept must read right
    if runs.code != 0:
        detail = "\n".join(runs.tail)
        if failed:
            detail = "; ".join(f"rank {r}: {w}" for r, w in failed.items()) + "\n" + detail
        if not runs.traces:
            raise ToolError(
                f"the script failed (exit code {runs.code}) before any step was recorded; its last output:\n{detail}"
            )
        manifest.ranks = sorted(s.get("rank", 0) for s in runs.statuses if s.get("trace")) or [0]
        kept = ", ".join(t.name for t in runs.traces)
        raise ToolError(
            f"the script failed (exit code {runs.code}); what was recorded is kept ({kept}): "
            f"`kerneltriage report` can read it. Last output:\n{detail}"
        )
    if not runs.traces:
        raise ToolError("the profiler wrote no trace (see the logs folder of the run directory)")


def _record_timeline(
    out: Path, options: Options, manifest: rundir.Manifest, warnings: list[str], runs: _TimelineRuns
) -> None:
    """What the first rank's run says about its steps: where they came from, Dynamo's counts,
    the plain and clean steps' times."""
    statuses = runs.statuses
    first = min(statuses, key=lambda s: s.get("rank", 0), default={})
    # The plain steps the process ran: more than asked when their times took long to settle.
    plan = dataclasses.replace(
        _plan(options, bool(manifest.schedule.whole_run)), plain=first.get("plain_steps") or None
    )
    if first.get("plain_extended"):
        phase = _timeline(manifest)
        phase.plain_extended = int(first["plain_extended"])
    hooked_steps = 1 if plan.whole_run else max(1, plan.last_recorded - plan.hooks_from + 1)
    phase = _timeline(manifest)
    phase.steps_seen = runs.steps_seen
    phase.step_source = next((s.get("step_source") for s in statuses if s.get("step_source")), None)
    phase.module_calls_per_step = round(first.get("module_calls", 0) / hooked_steps, 1)
    phase.traces = [t.name for t in runs.traces]
    dynamo = first.get("dynamo") or {}
    if dynamo.get("plain") or dynamo.get("end"):
        phase.dynamo = dynamo
        _dynamo_drift(dynamo, warnings)
    _check_plain_steps(first.get("phases") or [], warnings)
    clean = _clean_summary(out, first, plan, warnings)
    _step_time(first.get("step_times") or {}, plan, manifest, warnings, clean, rank=first.get("rank", 0))
    _other_ranks_step_time(out, statuses, first, plan, phase, warnings)
    manifest.ranks = sorted(s.get("rank", 0) for s in statuses if s.get("trace")) or [0]


def _timeline(manifest: rundir.Manifest) -> rundir.TimelinePhase:
    """Phase 1's record in the manifest (made when phase 1 starts)."""
    if manifest.phases.timeline is None:
        manifest.phases.timeline = rundir.TimelinePhase()
    return manifest.phases.timeline


def _ncu(manifest: rundir.Manifest) -> rundir.NcuPhase:
    """Phase 2's record in the manifest (made when phase 2 starts)."""
    if manifest.phases.ncu is None:
        manifest.phases.ncu = rundir.NcuPhase()
    return manifest.phases.ncu


def plain_bounds(options: Options, distributed: bool = False) -> tuple[int, int]:
    """The fewest and most plain steps phase 1 times (measurement.yaml's ``plain_min`` and
    ``plain_max`` unless given; never fewer than ``--timing-steps``). Ranks of one job must
    stay in step, so a distributed job times a fixed count."""
    if not options.timing_steps:
        return 0, 0
    from kerneltriage.analysis.steady import settings

    conf = settings()["steady"]
    least = max(options.timing_steps, options.plain_min or int(conf["plain_min"]))
    most = max(least, options.plain_max or int(conf["plain_max"]))
    return (least, least) if distributed else (least, most)


def _plan(options: Options, whole_run: bool = False) -> StepPlan:
    """Phase 1's plan as asked, with its fewest plain steps."""
    return StepPlan(
        options.warmup, options.steps, options.timing_steps, whole_run, plain=plain_bounds(options)[0] or None
    )


def _fitted_timing(options: Options, steps_seen: int) -> tuple[int, int] | None:
    """(timing steps, plain steps) that a script of ``steps_seen`` steps leaves room for, when
    it ran at least the warm-up and recorded steps but too few for the asked plan: fewer plain
    steps first (down to ``--timing-steps``), then fewer timing steps (None: the asked plan
    fits, or the script is too short for any)."""
    asked = _plan(options)
    if not options.timing_steps or steps_seen >= asked.stop_after:
        return None
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


def _finish_traces(
    out: Path, statuses: list[dict[str, Any]], manifest: rundir.Manifest, warnings: list[str]
) -> None:
    """Module ranges relabelled, shapes from the shapes step copied in (``trace_fixup``)."""
    from kerneltriage.profile.trace_fixup import finish_trace

    done: dict[str, Any] = {}
    for status in statuses:
        if not status.get("trace") or not (out / status["trace"]).is_file():
            continue
        shapes = out / rundir.LOGS / status["shapes_trace"] if status.get("shapes_trace") else None
        try:
            stats = finish_trace(out / status["trace"], shapes if shapes and shapes.is_file() else None)
        except Exception as exc:  # the trace as recorded is still worth a report
            warnings.append(f"could not finish {status['trace']} (module ranges, shapes): {exc}")
            continue
        done[status["trace"]] = stats
        if stats.get("ops") and stats["ops_with_shapes"] < 0.99 * stats["ops"]:
            lacking = ", ".join(f"{name} ×{n}" for name, n in (stats.get("missing") or {}).items())
            message = (
                f"{status['trace']}: input shapes found for {stats['ops_with_shapes']} of {stats['ops']} ops; "
                f"the recorded steps ran ops the shapes step did not ({lacking or 'unnamed'}): "
                "those are estimated without their shapes"
            )
            warnings.append(message)
            manifest.warnings.append(message)
    _timeline(manifest).trace_fixup = done


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


def _clean_summary(out: Path, status: dict[str, Any], plan: StepPlan, warnings: list[str]) -> dict[str, Any]:
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


def _step_time(
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
    phase = _timeline(manifest)
    if plan.whole_run:
        return
    step = _step_record(times, clean or {}, rank)
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


def _other_ranks_step_time(
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
        clean = _clean_summary(out, status, plan, warnings)
        step = _step_record(status.get("step_times") or {}, clean, rank)
        by_rank[str(rank)] = rundir.StepTime.model_validate(step).to_json()
    if by_rank:
        # An extra key of the open manifest model (older readers keep it as it is).
        setattr(phase, "step_time_ranks", dict(sorted(by_rank.items(), key=lambda kv: int(kv[0]))))  # noqa: B010


def _step_record(times: dict[str, Any], clean: dict[str, Any], rank: int) -> dict[str, Any]:
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


def find_nsys() -> str | None:
    found = shutil.which("nsys")
    if found:
        return found
    for candidate in sorted(Path("/opt/nvidia").glob("nsight-*/*/host*/*/nsys")):
        if candidate.is_file():
            return str(candidate)
    return None


def _phase_timeline_nsys(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
) -> bool:
    """Phase 1 under Nsight Systems. False when it cannot give a timeline (the caller then
    falls back to the PyTorch profiler): nsys missing, or recording without a report."""
    nsys = find_nsys()
    if nsys is None:
        say.warn("Nsight Systems (nsys) is not on PATH: using the PyTorch profiler for the timeline")
        warnings.append("--timeline nsys: nsys not found; the PyTorch profiler made the timeline")
        return False
    config = _write_config(out, "nsys", options, command, whole_run=False)
    report = out / "timeline"
    cmd = [
        nsys,
        "profile",
        "-t",
        "cuda,nvtx",
        "--pytorch=autograd-nvtx",
        "--capture-range=nvtx",
        f"--nvtx-capture={CAPTURE_RANGE}",
        "--capture-range-end=stop",
        "--force-overwrite=true",
        "-o",
        str(report),
        *command.with_runner(),
    ]
    (out / rundir.LOGS / "nsys_command.txt").write_text(" ".join(cmd) + "\n")
    say.phase("timeline", "Nsight Systems")
    seconds, code, _ = _run(
        cmd, config, out / rundir.LOGS / "phase1-nsys", say, manifest, timeout=options.ncu_timeout
    )
    manifest.phases.timeline = rundir.TimelinePhase(seconds=round(seconds, 2), exit_code=code, tool="nsys")
    rep = report.with_suffix(".nsys-rep")
    if not rep.is_file():
        left = sorted(p.name for p in out.glob("timeline*"))
        say.warn(
            "nsys recorded but produced no report"
            + (f" (left: {', '.join(left)})" if left else "")
            + "; falling back to the PyTorch profiler"
        )
        warnings.append(
            "--timeline nsys: nsys produced no report (no importer on this machine?); "
            "the PyTorch profiler made the timeline"
        )
        return False
    export = subprocess.run(
        [
            nsys,
            "export",
            "--type",
            "sqlite",
            "--force-overwrite=true",
            "-o",
            str(out / rundir.TRACE_NSYS),
            str(rep),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if export.returncode != 0 or not (out / rundir.TRACE_NSYS).is_file():
        say.warn("nsys could not export its report to SQLite; falling back to the PyTorch profiler")
        warnings.append(
            f"--timeline nsys: export failed ({export.stderr.strip()[-200:]}); "
            "the PyTorch profiler made the timeline"
        )
        return False
    _record_environment(manifest, _statuses(out, "nsys"))
    manifest.ranks = [0]
    say.phase_done("timeline", seconds, "Nsight Systems export: timeline.sqlite")
    return True


# --- phase 2 ------------------------------------------------------------------------------


def _phase_ncu(
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
) -> None:
    ncu = ncu_tools.find_ncu()
    if ncu is None:
        say.warn("Nsight Compute (ncu) is not on PATH: timeline only, no counters")
        warnings.append("ncu not found: no counters; the report uses shape estimates")
        return
    manifest.versions["ncu"] = ncu_tools.ncu_version(ncu) or "unknown"
    hot = _hot_kernels(command, options, out)
    if not hot.names:
        warnings.append("phase 1 recorded no GPU kernels in the steps: nothing for ncu to profile")
        return
    metrics = ncu_tools.metric_list(ncu_tools.available_metrics(ncu))
    whole_run = bool(manifest.schedule.whole_run)
    config = _write_config(out, "ncu", options, command, whole_run=whole_run)
    manifest.phases.ncu = rundir.NcuPhase(
        kernels=hot.names,
        expected_configs=hot.configs,
        coverage_of_gpu_time=round(hot.coverage, 4),
        metrics=metrics,
        excluded_communication=hot.left_out,
        variable_size_kernels=hot.variable,
        variable_launches_per_step=hot.variable_launches,
        variable_over_budget=hot.over_budget,
    )
    say.phase(
        "ncu",
        f"Nsight Compute on {len(hot.names)} hot kernels ({hot.coverage:.0%} of GPU time), "
        f"~{hot.configs} launch configurations",
    )
    passes = _ncu_passes(hot, whole_run)
    total_seconds, launches, not_run = _run_ncu_passes(
        ncu, passes, metrics, config, command, options, out, manifest, say, warnings
    )
    _ncu(manifest).seconds, _ncu(manifest).profiled_launches = round(total_seconds, 2), launches
    _hot_without_counters(out, hot, not_run, options.max_variable_launches, manifest, warnings)
    if (out / rundir.NCU_CSV).is_file() or (out / rundir.NCU_LAUNCHES_CSV).is_file():
        say.phase_done("ncu", total_seconds, f"{launches} launches profiled")


def _hot_kernels(command: Command, options: Options, out: Path) -> HotKernels:
    """The hot kernels of the ncu rank's phase-1 trace."""
    rank_trace = out / (rundir.TRACE if not command.distributed else f"trace.rank{options.ncu_rank}.json.gz")
    if not rank_trace.is_file() and (out / rundir.TRACE_NSYS).is_file():
        rank_trace = out / rundir.TRACE_NSYS
    if not rank_trace.is_file():
        raise ToolError(
            f"no phase-1 trace for rank {options.ncu_rank} ({rank_trace.name}) to pick hot kernels from"
        )
    from kerneltriage.analysis.hot_kernels import select_hot_kernels
    from kerneltriage.ingest.source import read_timeline

    return select_hot_kernels(
        read_timeline(rank_trace),
        load_rules(options.rules_file),
        coverage=options.coverage,
        max_kernels=options.max_kernels,
        max_variable_launches=options.max_variable_launches,
    )


#: One ncu pass: its file stem, CSV, kernels, launches to take of each (None: one per
#: configuration) and the launches expected.
_NcuPass = tuple[str, str, list[str], int | None, int]


def _ncu_passes(hot: HotKernels, whole_run: bool) -> list[_NcuPass]:
    if not hot.variable or whole_run:
        return [("ncu", rundir.NCU_CSV, hot.names, None, hot.configs)]
    # Kernels that run several problem sizes under one configuration: every launch, in a first
    # pass; the per-configuration pass then leaves them out (it runs only if the first went well).
    rest = [n for n in hot.names if n not in hot.variable]
    passes: list[_NcuPass] = [
        ("ncu.launches", rundir.NCU_LAUNCHES_CSV, hot.variable, hot.variable_launches, hot.variable_launches)
    ]
    if rest:
        passes.append(("ncu", rundir.NCU_CSV, rest, None, hot.configs - hot.variable_configs))
    return passes


def _run_ncu_passes(
    ncu: str,
    passes: list[_NcuPass],
    metrics: list[str],
    config: Path,
    command: Command,
    options: Options,
    out: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
) -> tuple[float, int, dict[str, str]]:
    """Run the passes in order, up to the first that fails: (seconds, launches profiled, kernel
    -> why it has no counters, for the kernels of the failed pass and of those after it)."""
    whole_run = bool(manifest.schedule.whole_run)
    total_seconds = 0.0
    launches = 0
    not_run: dict[str, str] = {}
    for index, (stem, csv_name, kernels, every, expected) in enumerate(passes):
        cmd = ncu_tools.ncu_command(
            ncu,
            out / stem,
            kernels,
            metrics,
            command.with_runner(),
            nvtx=not whole_run,
            full_set=options.ncu_set == "full",
            every_launch=every,
        )
        (out / rundir.LOGS / f"{stem}_command.txt").write_text(" ".join(cmd) + "\n")
        ok, seconds, done = _ncu_pass(
            ncu, cmd, out, stem, csv_name, expected, config, manifest, say, warnings, options.ncu_timeout
        )
        total_seconds += seconds
        launches += done
        _ncu(manifest).record_pass(stem, seconds=round(seconds, 2))
        if not ok:
            for later_stem, _, later, _, _ in passes[index:]:
                why = "failed" if later_stem == stem else f"did not run (the {stem} pass failed)"
                not_run.update(dict.fromkeys(later, f"its ncu pass ({later_stem}) {why}"))
            break
    return total_seconds, launches, not_run


def _hot_without_counters(
    out: Path, hot, not_run: dict[str, str], budget: int, manifest: rundir.Manifest, warnings: list[str]
) -> None:
    """Name every hot kernel that phase 2 left without counters, or with counters for some of
    its launches only, and why."""
    from kerneltriage.analysis.hot_kernels import without_counter_rows
    from kerneltriage.ingest.ncu_csv import read_counters

    exports = []
    for csv_name in (rundir.NCU_LAUNCHES_CSV, rundir.NCU_CSV):
        if (out / csv_name).is_file():
            try:
                exports.append(read_counters(out / csv_name).rows)
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
    for name, count in hot.over_budget.items():
        missing.setdefault(
            name,
            f"runs several problem sizes under one launch configuration, {count} launches a step, over "
            f"the every-launch budget ({budget} a step, {hot.variable_launches} taken by hotter kernels): "
            "one launch per configuration was profiled, launches of its other sizes get no counters",
        )
    _ncu(manifest).hot_without_counters = missing
    if missing:
        warnings.append(
            "hot kernels without counters from phase 2: "
            + "; ".join(f"{name} ({why})" for name, why in missing.items())
        )
    # The report's join names kernels without counter rows itself; what only this side knows
    # (the launch budget, a failed pass) goes to the report through the manifest.
    known_here = {n: why for n, why in missing.items() if n in not_run or n in hot.over_budget}
    if known_here:
        manifest.warnings.append(
            "hot kernels left without (some) counters by phase 2: "
            + "; ".join(f"{name} ({why})" for name, why in known_here.items())
        )


def _ncu_pass(
    ncu: str,
    cmd: list[str],
    out: Path,
    stem: str,
    csv_name: str,
    expected: int,
    config: Path,
    manifest: rundir.Manifest,
    say: Reporter,
    warnings: list[str],
    timeout: float,
) -> tuple[bool, float, int]:
    """One ncu run and its CSV export. Returns (went well, seconds, launches profiled)."""
    progress = {"done": 0}

    def on_line(line: str) -> bool:
        p = ncu_tools.parse_progress(line, progress["done"])
        if p is not None:
            progress["done"] = p.index
            say.ncu_progress(p.index, max(expected, p.index), p.kernel)
            return True
        return False

    logs = out / rundir.LOGS / stem.replace("ncu", "phase2")
    seconds, code, tail = _run(cmd, config, logs, say, manifest, on_line=on_line, timeout=timeout)
    log = Path(f"{logs}.stdout").read_text(errors="replace") + Path(f"{logs}.stderr").read_text(
        errors="replace"
    )
    rep = out / f"{stem}.ncu-rep"
    if code == TIMED_OUT:
        _ncu(manifest).record_pass(stem, exit_code="timeout")
        if "==PROF== Report:" in log and rep.is_file():
            # ncu finished and wrote its report; only the application failed to exit.
            warnings.append(
                f"ncu ({stem}) wrote its report, but the application did not exit; it was stopped "
                f"after {timeout:.0f} s and the counters are kept"
            )
        else:
            say.warn(f"Nsight Compute did not finish within {timeout:.0f} s: stopped; the timeline is kept")
            warnings.append(
                f"ncu ({stem}) was stopped after {timeout:.0f} s ({progress['done']} launches profiled); "
                "no counters from it (raise --ncu-timeout, or lower --max-kernels)"
            )
            return False, seconds, progress["done"]
    else:
        _ncu(manifest).record_pass(stem, exit_code=code)
    if "ERR_NVGPUCTRPERM" in log:
        say.warn(ncu_tools.PERMISSION_HELP)
        warnings.append("ncu could not read the performance counters (ERR_NVGPUCTRPERM): timeline only")
        return False, seconds, 0
    if not rep.is_file():
        warnings.append(f"ncu wrote no report (exit code {code}); last output: " + " | ".join(tail[-3:]))
        return False, seconds, progress["done"]
    if code not in (0, TIMED_OUT):
        warnings.append(f"ncu exited with code {code} after writing its report")
    export = subprocess.run(ncu_tools.export_command(ncu, rep), capture_output=True, text=True, check=False)
    if export.returncode != 0 or not export.stdout.strip():
        warnings.append(f"ncu could not export its report to CSV: {export.stderr.strip()[-300:]}")
        return False, seconds, progress["done"]
    with gzip.open(out / csv_name, "wt") as f:
        f.write(export.stdout)
    return True, seconds, progress["done"]


# --- helpers ------------------------------------------------------------------------------


def _write_config(out: Path, mode: str, options: Options, command: Command, *, whole_run: bool) -> Path:
    config = {
        "mode": mode,
        "out": str(out.resolve()),
        "warmup": options.warmup,
        "steps": options.steps,
        "run_to_end": options.run_to_end,
        "cpu": options.cpu,
        "whole_run": whole_run,
        "distributed": command.distributed,
        "ncu_rank": options.ncu_rank,
        # Only phase 1 and the timing processes time plain steps; the others stop at the step
        # they need.
        "timing_steps": options.timing_steps if mode in ("timeline", "timing") else 0,
    }
    if mode in ("timeline", "timing"):
        config["plain_min"], config["plain_max"] = plain_bounds(options, bool(command.distributed))
    if options.applied_fixes:  # profile --apply: installed by runner.py before the script runs
        config["apply"] = [{"id": f["id"], "apply": f["apply"]} for f in options.applied_fixes]
    path = out / rundir.LOGS / f"config.{mode}.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    for stale in (out / rundir.LOGS).glob(f"status.{mode}.rank*.json"):
        stale.unlink()
    return path


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


def _statuses(out: Path, mode: str) -> list[dict[str, Any]]:
    found = []
    for f in sorted((out / rundir.LOGS).glob(f"status.{mode}.rank*.json")):
        try:
            found.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return found


def _record_environment(manifest: rundir.Manifest, statuses: list[dict[str, Any]]) -> None:
    env: dict[str, Any] = next((s["environment"] for s in statuses if s.get("environment")), {})
    for key in ("python", "torch", "cuda", "triton"):
        if env.get(key):
            manifest.versions[key] = str(env[key])
    if env.get("gpu"):
        manifest.gpu.update(env["gpu"])
    driver = _driver_version()
    if driver:
        manifest.gpu["driver"] = driver


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0] if out else None


def _cached_calibration(gpu_name: str) -> dict[str, Any] | None:
    from kerneltriage.profile.calibrate import cached

    return cached(gpu_name)


def _phase_calibrate(
    command: Command, out: Path, manifest: rundir.Manifest, say: Reporter, warnings: list[str]
) -> None:
    """Measure the GPU's ceilings with the script's own Python (it has torch and triton)."""
    python = command.prefix[0] if command.launcher == "python" else sys.executable
    target = out / rundir.LOGS / "calibration.json"
    say.phase("calibrate", "measuring copy bandwidth and matmul / FMA peaks")
    config = _write_config(out, "calibrate", Options(), command, whole_run=False)
    seconds, code, tail = _run(
        [python, "-m", "kerneltriage.profile.calibrate", "--json", str(target)],
        config,
        out / rundir.LOGS / "calibrate",
        say,
        manifest,
    )
    if code == 0 and target.is_file():
        manifest.calibration = json.loads(target.read_text())
        manifest.phases.calibrate = rundir.CalibratePhase(seconds=round(seconds, 2))
        say.phase_done("calibrate", seconds)
    else:
        warnings.append("calibration failed; the report uses datasheet ceilings: " + " | ".join(tail[-3:]))


def _child_env(config: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[CONFIG_ENV] = str(config.resolve())
    # The script's Python must find kerneltriage even when it is not installed there.
    package_root = str(Path(kerneltriage.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run(
    cmd: list[str],
    config: Path,
    log_prefix: Path,
    say: Reporter,
    manifest: rundir.Manifest,
    on_line: Callable[[str], bool] | None = None,
    timeout: float | None = None,
) -> tuple[float, int, list[str]]:
    """Run ``cmd``, echo and log its output, return (seconds, exit code, last stderr lines).

    Past ``timeout`` seconds the whole process group is stopped and the exit code is
    ``TIMED_OUT``: a hung tool must not take the phases already written down with it.
    """
    start = time.perf_counter()
    tail: deque[str] = deque(maxlen=20)
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(config),
            text=True,
            errors="replace",
            bufsize=1,
            # Its own process group, so that a timeout can stop ncu, torchrun and every worker.
            start_new_session=timeout is not None,
        )
    except FileNotFoundError:
        raise ToolError(f"cannot start {cmd[0]!r}: not found") from None

    def pump(stream, name: str) -> None:
        with open(f"{log_prefix}.{name}", "w") as log:
            for line in stream:
                line = line.rstrip("\n")
                log.write(line + "\n")
                log.flush()
                if name == "stderr":
                    tail.append(line)
                if on_line is not None and on_line(line):
                    continue
                say.output(line, name)

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(
            proc,
            [
                (lambda: os.killpg(proc.pid, signal.SIGTERM), 20),
                (lambda: os.killpg(proc.pid, signal.SIGKILL), 20),
            ],
        )
        for t in threads:
            t.join(timeout=5)
        return time.perf_counter() - start, TIMED_OUT, list(tail)
    except KeyboardInterrupt:
        if timeout is not None:  # a separate session does not get the terminal's Ctrl-C
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGINT)
        # A terminal's Ctrl-C reaches the child too: let it write what it has and exit. A
        # second SIGINT would interrupt its clean-up, so send one only if it is still running.
        _stop(proc, [(None, 10), (lambda: proc.send_signal(signal.SIGINT), 20), (proc.kill, 20)])
        for t in threads:
            t.join(timeout=5)
        raise
    for t in threads:
        t.join()
    return time.perf_counter() - start, code, list(tail)


def _stop(proc: subprocess.Popen, steps: list[tuple[Callable[[], None] | None, float]]) -> None:
    """Escalate until ``proc`` exits: each step acts (None: just wait) and waits its seconds."""
    for act, seconds in steps:
        try:
            if act is not None:
                act()
            proc.wait(timeout=seconds)
            return
        except subprocess.TimeoutExpired:
            continue
        except OSError:
            return
