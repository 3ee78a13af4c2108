"""What one ``kerneltriage profile`` run carries from phase to phase (``ProfileSession``): the
user's command, the options, the run directory being written, its manifest, the reporter and
the warnings so far; and what every phase does with them: write the runner's config, run a
child process, read the processes' status files.

The phases (``phase_timeline.py``, ``phase_ncu.py``) take the session; ``session.py`` makes
it and runs them in order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltriage import rundir
from kerneltriage.profile.command import Command
from kerneltriage.profile.processes import Child, run_child
from kerneltriage.profile.step_plan import StepPlan
from kerneltriage.profile.turns import Turn


@dataclass
class Options:
    out: Path | None = None
    force: bool = False
    warmup: int = 3
    steps: int = 3
    ncu: bool = True
    max_kernels: int = 64
    coverage: float = 0.97
    ncu_set: str = "roofline"  # or "full"
    run_to_end: bool = False
    step_marker: str | None = None
    cpu: bool = False
    ncu_rank: int = 0
    timeline: str = "torch"
    calibrate: bool = False
    ncu_timeout: float = 900.0  # seconds for each ncu pass
    # GPUs phase 2 splits a single-process script's hot kernels over, one ncu process each, at
    # once (None: every visible GPU; 1: one process at a time, on the script's own GPU).
    ncu_gpus: int | None = None
    rules_file: Path | None = None  # --rules: merged over the shipped rules (hot-kernel selection)
    # Plain steps (nothing installed) and as many clean steps (CUDA-only profiler) before the
    # recorded ones (``step_plan.StepPlan``): the plain steps give the step time the report
    # uses, the clean steps the GPU's busy time.
    timing_steps: int = 5
    # Plain steps: at least ``plain_min``, more until the step times settle, at most
    # ``plain_max`` (None: measurement.yaml's). A script too short for them gets a fixed count.
    plain_min: int | None = None
    plain_max: int | None = None
    # Processes whose plain steps give the step time: phase 1 and this many less one more
    # processes that run only the warm-up and plain steps (processes of one script differ by
    # up to 9% on an H100, more than one process's steps do). 1: phase 1 alone.
    timing_processes: int = 3
    # More processes, up to this many in all (None: measurement.yaml's ``timing.max_processes``),
    # while the interval a further run falls in is wider than ``timing.target_half_width``.
    max_timing_processes: int | None = None
    # Launches per step the every-launch ncu pass may profile (about 0.32 s each on an H200
    # with the roofline metric set: 256 launches ≈ 80 s).
    max_variable_launches: int = 256
    # Every launch configuration of the hot elementwise kernels (else one per instantiation
    # and L2 regime, the rest scaled by threads: ``analysis/timeline/one_size.py``).
    ncu_every_size: bool = False
    # The instruction counters (FLOPs) on every kernel (else kernels memory-bound by what they
    # compute go in a pass of their own without them: ``ncu_passes.light_split``).
    ncu_every_counter: bool = False
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
class ProfileSession:
    """One ``profile`` run as its phases see it. ``options`` are the user's, until phase 1
    fits its timing steps to a script too short for them; ``warnings`` become the manifest's
    notes when the run ends."""

    command: Command
    options: Options
    out: Path  # the run directory being written
    manifest: rundir.Manifest
    reporter: Reporter = field(default_factory=Reporter)
    warnings: list[str] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        return self.out / rundir.LOGS

    @property
    def timeline_record(self) -> rundir.TimelinePhase:
        """Phase 1's record in the manifest (made when phase 1 starts)."""
        return timeline_record(self.manifest)

    @property
    def ncu_record(self) -> rundir.NcuPhase:
        """Phase 2's record in the manifest (made when phase 2 starts)."""
        if self.manifest.phases.ncu is None:
            self.manifest.phases.ncu = rundir.NcuPhase()
        return self.manifest.phases.ncu

    def write_config(
        self,
        mode: str,
        *,
        whole_run: bool,
        options: Options | None = None,
        name: str | None = None,
        ncu_take: str | None = None,
        gated: bool = True,
        ncu_skip: list[tuple[str, tuple]] | None = None,
        measure_gate: bool = False,
    ) -> Path:
        """The runner's settings for a ``mode`` process (``logs/config.<mode>.json``), from the
        session's options unless given; that mode's old status files go. ``name``: one of
        several processes of the mode started at once (``turn``), with a config, status file
        and gate of its own (``gated=False``: no gate, for a process that runs alone under its
        own name). ``ncu_take="first-of-size"``: an ncu process marks the first call of each op
        signature of its step (``first_of_size.py``); ``ncu_skip``: the op keys whose calls it
        runs inside the range ncu excludes. ``measure_gate``: a gated process also waits at a
        second gate before its profiled step (``turns.py``)."""
        if options is None:
            options = self.options
        config: dict[str, Any] = {
            "mode": mode,
            "out": str(self.out.resolve()),
            "warmup": options.warmup,
            "steps": options.steps,
            "run_to_end": options.run_to_end,
            "cpu": options.cpu,
            "whole_run": whole_run,
            "distributed": self.command.distributed,
            "ncu_rank": options.ncu_rank,
            # Only phase 1 and the timing processes time plain steps; the others stop at the
            # step they need.
            "timing_steps": options.timing_steps if mode in ("timeline", "timing") else 0,
        }
        if mode in ("timeline", "timing"):
            config["plain_min"], config["plain_max"] = plain_bounds(
                options, bool(self.command.distributed), phase1=mode == "timeline"
            )
        if options.applied_fixes:  # profile --apply: installed by runner.py before the script runs
            config["apply"] = [{"id": f["id"], "apply": f["apply"]} for f in options.applied_fixes]
        if ncu_take:
            config["ncu_take"] = ncu_take
        if ncu_skip:  # op calls whose launches ncu excludes (first_of_size.py)
            config["ncu_skip"] = [[name, [list(s) for s in shapes]] for name, shapes in ncu_skip]
        if mode == "ncu" and not self.command.distributed:
            # Kernel replay saves and restores the process's GPU memory, cached blocks included:
            # the profiled step hands its free blocks back before each op (first_of_size.py).
            config["ncu_trim"] = True
        stem = name or mode
        if name is not None:
            config["status_name"] = name
        if name is not None and gated:
            config["gate"] = str((self.logs / f"gate.{name}").resolve())
            config["parent_pid"] = os.getpid()
            if measure_gate:
                config["measure_gate"] = str((self.logs / f"measure.{name}").resolve())
        path = self.logs / f"config.{stem}.json"
        path.write_text(json.dumps(config, indent=2) + "\n")
        for stale in self.logs.glob(f"status.{stem}.rank*.json"):
            stale.unlink()
        return path

    def turn(
        self,
        cmd: list[str],
        config: Path,
        log: str,
        *,
        on_line: Callable[[str], bool] | None = None,
        timeout: float | None = None,
        echo: Callable[[str, str], None] | None = None,
    ) -> Turn:
        """A child for ``Turns``: ``cmd`` with ``config`` (written with a ``name``), logged as
        ``run`` logs, not started yet."""
        settings = json.loads(config.read_text())
        measure = Path(settings["measure_gate"]) if settings.get("measure_gate") else None
        child = Child(cmd, config, self.logs / log, echo or self.reporter.output, on_line, timeout)
        return Turn(child, Path(settings["gate"]), measure)

    def run(
        self,
        cmd: list[str],
        config: Path,
        log: str,
        *,
        on_line: Callable[[str], bool] | None = None,
        timeout: float | None = None,
    ) -> tuple[float, int, list[str]]:
        """Run ``cmd`` with ``config``, logged to ``logs/<log>.stdout`` and ``.stderr`` and
        echoed to the reporter (``processes.run_child``): (seconds, exit code, last stderr
        lines)."""
        return run_child(cmd, config, self.logs / log, self.reporter.output, on_line=on_line, timeout=timeout)

    def statuses(self, mode: str) -> list[dict[str, Any]]:
        """The status files the ``mode`` processes wrote, one per rank (unreadable ones left out)."""
        found = []
        for f in sorted(self.logs.glob(f"status.{mode}.rank*.json")):
            try:
                found.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        return found

    def record_environment(self, statuses: list[dict[str, Any]]) -> None:
        """Versions and the GPU as the script's process saw them, and the driver."""
        env: dict[str, Any] = next((s["environment"] for s in statuses if s.get("environment")), {})
        for key in ("python", "torch", "cuda", "triton"):
            if env.get(key):
                self.manifest.versions[key] = str(env[key])
        if env.get("gpu"):
            self.manifest.gpu.update(env["gpu"])
        driver = _driver_version()
        if driver:
            self.manifest.gpu["driver"] = driver


def timeline_record(manifest: rundir.Manifest) -> rundir.TimelinePhase:
    """Phase 1's record in ``manifest``, made if it has none yet."""
    if manifest.phases.timeline is None:
        manifest.phases.timeline = rundir.TimelinePhase()
    return manifest.phases.timeline


def plain_bounds(options: Options, distributed: bool = False, *, phase1: bool = True) -> tuple[int, int]:
    """The fewest and most plain steps phase 1 (``phase1``) or a timing process times
    (measurement.yaml's ``plain_min`` and ``plain_max`` unless given; never fewer than
    ``--timing-steps``). Ranks of one job must stay in step, so a distributed job times a fixed
    count (``plain_distributed``, within those bounds): a transient of up to half of it can be
    cut. Phase 1 goes on until settled only where it is the one process timed: otherwise its
    profiler steps, which follow the plain ones, must still fit in the script, and the timing
    processes, which stop after their plain steps, settle instead (T5-base's 40-step example
    settled past its 26th plain step on an H100 and was profiled twice, 35 s more)."""
    if not options.timing_steps:
        return 0, 0
    from kerneltriage.analysis.timeline.steady import settings

    conf = settings()["steady"]
    least = max(options.timing_steps, options.plain_min or int(conf["plain_min"]))
    most = max(least, options.plain_max or int(conf["plain_max"]))
    if distributed:
        fixed = min(most, max(least, int(conf["plain_distributed"])))
        return fixed, fixed
    if phase1 and options.timing_processes > 1 and not options.cpu and options.plain_max is None:
        return least, least
    return least, most


def asked_plan(options: Options, whole_run: bool = False, distributed: bool = False) -> StepPlan:
    """Phase 1's plan as asked, with its fewest plain steps (a torchrun job's fixed count)."""
    plain = plain_bounds(options, distributed)[0] or None
    return StepPlan(options.warmup, options.steps, options.timing_steps, whole_run, plain=plain)


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


#: The share of the host's available memory the processes of the script may take at once.
HOST_MEMORY_SHARE = 0.8


def too_many_for_host_memory(session: ProfileSession, processes: int) -> str | None:
    """Why ``processes`` of the script, each as large as phase 1's peak, would not fit in the
    host's available memory (a model built on the host before it moves to the GPU is held
    there while its process waits at its gate); None where they fit or nothing says."""
    peaks = [s.get("max_rss_mb") for s in session.statuses("timeline")]
    peak = max((float(p) for p in peaks if p), default=0.0)
    available = available_mb()
    if not peak or available is None or processes * peak <= HOST_MEMORY_SHARE * available:
        return None
    return (
        f"{processes} processes of {peak / 1024:.1f} GiB each (phase 1's peak) would not fit in "
        f"{HOST_MEMORY_SHARE:.0%} of the host's {available / 1024:.1f} GiB available"
    )


def available_mb() -> float | None:
    """The host's available memory (``MemAvailable``), in MiB; None where /proc says nothing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
