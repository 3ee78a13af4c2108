"""``kerneltriage profile``: run the user's command under the profilers and write one run
directory.

Phase 1 runs the command under the PyTorch profiler, through ``runner.py``
(``phase_timeline.py``); phase 2 runs it again under Nsight Compute on the hot kernels of
phase 1 (``phase_ncu.py``); ``--calibrate`` first measures the GPU's ceilings. The phases share
one ``ProfileSession`` (``context.py``). The manifest is written at the start and after the
run (atomically), so an interrupted or failed run leaves a directory that says what it holds;
``--force`` swaps a new run in for an old one only once the new one is complete.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kerneltriage
from kerneltriage import rundir
from kerneltriage.analysis.rules import load_rules
from kerneltriage.errors import InputError, Terminated, ToolError
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.command import Command, parse_command
from kerneltriage.profile.context import Options, ProfileSession, Reporter, too_many_for_host_memory
from kerneltriage.profile.phase_ncu import NcuPlan, plan_ncu, run_ncu
from kerneltriage.profile.phase_timeline import import_statistics_in_background, run_timeline, spare_processes
from kerneltriage.profile.phase_timeline_nsys import run_timeline_nsys
from kerneltriage.profile.processes import terminate_as_interrupt
from kerneltriage.profile.turns import Turn

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
class Result:
    run_dir: Path
    manifest: rundir.Manifest
    warnings: list[str] = field(default_factory=list)


def default_out(command: Command) -> Path:
    stem = Path(command.script).stem.replace(".", "_") or "run"
    return Path("runs") / f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_profile(argv: list[str], options: Options, reporter: Reporter | None = None) -> Result:
    """Profile ``argv`` (the user's command) and return the run directory."""
    command = parse_command(argv)
    if options.steps < 1 or options.warmup < 0:
        raise InputError("--steps must be at least 1 and --warmup at least 0")
    load_rules(options.rules_file)  # a bad rules file fails now, not after phase 1
    target = Path(options.out) if options.out else default_out(command)
    out = _prepare_out(target, options.force)
    session = ProfileSession(command, options, out, _first_manifest(argv, options), reporter or Reporter())
    manifest = session.manifest
    rundir.write_manifest(out, manifest)
    with terminate_as_interrupt():
        _run_phases(session, target)
    return Result(target, manifest, session.warnings)


def _run_phases(session: ProfileSession, target: Path) -> None:
    """The phases, the manifest written whatever happens (Ctrl-C and SIGTERM included)."""
    options, out, manifest = session.options, session.out, session.manifest
    early = _EarlyNcu(session)
    try:
        if options.calibrate and not options.cpu:
            _calibrate(session)
        if early.ncu is not None:
            ncu_tools.prefetch(early.ncu)  # while phase 1 runs (after the calibration's timings)
        if not options.cpu:
            import_statistics_in_background()
        if options.timeline == "nsys" and not options.cpu:
            if not run_timeline_nsys(session):
                run_timeline(session, start_next=early)
        else:
            run_timeline(session, start_next=early)
        if not manifest.calibration and manifest.gpu.get("name"):
            manifest.calibration = _cached_calibration(manifest.gpu["name"]) or {}
        if options.ncu and not options.cpu:
            _counters(session, early)
        elif options.cpu:
            manifest.notes.append("--cpu dry run: CPU ops only, no GPU kernels and no counters")
        manifest.status = "ok"
    except KeyboardInterrupt as exc:
        manifest.status = "interrupted"
        how = "stopped by SIGTERM" if isinstance(exc, Terminated) else "interrupted by the user (Ctrl-C)"
        manifest.notes.append(f"{how}; files written so far are kept")
        raise
    except BaseException as exc:
        if manifest.status == "running":
            manifest.status = "failed"
            manifest.notes.append(str(exc))
        raise
    finally:
        early.close()
        manifest.notes.extend(w for w in session.warnings if w not in manifest.notes)
        rundir.write_manifest(out, manifest)
        _replace_run(out, target, manifest.status == "ok")


def _first_manifest(argv: list[str], options: Options) -> rundir.Manifest:
    """The manifest as the run starts: the command, where and how it runs, the schedule asked."""
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
    return manifest


class _EarlyNcu:
    """Phase 2 planned from phase 1's trace and its processes started while the timing
    processes start (``run_timeline``'s ``start_next``), each held at its first CUDA use: their
    start-ups overlap, their GPU work comes after the timed steps."""

    def __init__(self, session: ProfileSession) -> None:
        self.session = session
        options = session.options
        self.ncu = ncu_tools.find_ncu() if options.ncu and not options.cpu else None
        self.planned = False
        self.plan: NcuPlan | None = None

    def __call__(self) -> list[Turn]:
        if self.ncu is None:
            return []
        session = self.session
        try:
            self.plan = plan_ncu(session, self.ncu, early=True)
        except ToolError:
            return []  # phase 2 plans again after the timing processes, and says why it cannot
        self.planned = True
        if self.plan is None:
            return []
        crowded = too_many_for_host_memory(
            session,
            session.options.timing_processes - 1 + spare_processes(session) + self.plan.processes(),
        )
        if crowded:
            session.manifest.notes.append(
                f"phase 2's processes started after the timing processes: {crowded}"
            )
            if self.plan.shares:  # planned for processes started early: plan again
                self.plan = plan_ncu(session, self.ncu)
            return []
        return self.plan.start()

    def close(self) -> None:
        if self.plan is not None:
            self.plan.close()


def _counters(session: ProfileSession, early: _EarlyNcu) -> None:
    """Phase 2 where Nsight Compute is found; without it the run is timeline only, and says so."""
    ncu = early.ncu or ncu_tools.find_ncu()
    if ncu is None:
        session.reporter.warn("Nsight Compute (ncu) is not on PATH: timeline only, no counters")
        session.warnings.append("ncu not found: no counters; the report uses shape estimates")
        return
    if early.planned:
        if early.plan is not None:
            run_ncu(session, ncu, early.plan)
        return
    run_ncu(session, ncu)


def _calibrate(session: ProfileSession) -> None:
    """Measure the GPU's ceilings with the script's own Python (it has torch and triton)."""
    command, manifest = session.command, session.manifest
    python = command.prefix[0] if command.launcher == "python" else sys.executable
    target = session.logs / "calibration.json"
    session.reporter.phase("calibrate", "measuring copy bandwidth and matmul / FMA peaks")
    config = session.write_config("calibrate", whole_run=False, options=Options())
    seconds, code, tail = session.run(
        [python, "-m", "kerneltriage.profile.calibrate", "--json", str(target)], config, "calibrate"
    )
    if code == 0 and target.is_file():
        manifest.calibration = json.loads(target.read_text())
        manifest.phases.calibrate = rundir.CalibratePhase(seconds=round(seconds, 2))
        session.reporter.phase_done("calibrate", seconds)
    else:
        session.warnings.append(
            "calibration failed; the report uses datasheet ceilings: " + " | ".join(tail[-3:])
        )


def _cached_calibration(gpu_name: str) -> dict[str, Any] | None:
    from kerneltriage.profile.calibrate import cached

    return cached(gpu_name)


# --- the run directory ---------------------------------------------------------------------


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
