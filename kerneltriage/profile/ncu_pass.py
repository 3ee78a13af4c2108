"""One ncu pass of phase 2 (``phase_ncu.py``): what it profiles, its progress as ncu prints it,
and, once it exited, its report checked and exported to CSV in the trace's kernel spelling."""

from __future__ import annotations

import gzip
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.ncu_names import mangled_in_trace, with_trace_spelling
from kerneltriage.profile.processes import TIMED_OUT

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.profile.context import ProfileSession


class NcuPass(NamedTuple):
    """One ncu run: its file stem, its CSV export, the kernels it profiles, the launches it
    takes of each (None: one per launch configuration; else at most that many a step), the
    launches expected, whether it takes the first launch of each problem size only, the
    kernels of which it takes some instantiations only (``HotKernels.instances``), and the op
    keys whose calls it leaves out (``analysis/timeline/one_size.py``); ``light``: its kernels
    are of memory-bound kinds, measured without the instruction counters
    (``nsight_compute.light_metrics``)."""

    stem: str
    csv_name: str
    kernels: list[str]
    every_launch: int | None
    expected: int
    first_of_size: bool = False
    instances: dict[str, list[str]] | None = None
    skip: list[tuple[str, tuple]] | None = None
    light: bool = False


class PassRun(NamedTuple):
    """How one pass went: its counters exported, its seconds, launches profiled, exit code, and
    the seconds from its first profiled launch to its last (None: fewer than two)."""

    ok: bool
    seconds: float
    launches: int
    exit_code: int | str | None
    profiling: float | None = None


class Lane(Protocol):
    """Where a pass runs (``phase_ncu._Lane``): its GPU (None: the parent's), its progress bar
    and warnings."""

    gpu: Any

    def progress(self, one: NcuPass, done: int, kernel: str) -> None: ...

    def warn(self, message: str) -> None: ...


class PassWatch:
    """One ncu pass: its progress as ncu prints it, then, once it exited, its report checked
    (``check``) and exported (``export``, which may run while the next pass profiles)."""

    def __init__(self, session: ProfileSession, ncu: str, cmd: list[str], one: NcuPass, lane: Lane) -> None:
        self.session, self.ncu, self.cmd, self.one, self.lane = session, ncu, cmd, one, lane
        self.done = 0
        self.log_name = one.stem.replace("ncu", "phase2")
        # When ncu printed its first and last profiled launch (a line as each one ends): their
        # distance over the launches between is the cost of a launch, start-up and warm-up apart.
        self.first_at: float | None = None
        self.last_at: float | None = None

    def on_line(self, line: str) -> bool:
        p = ncu_tools.parse_progress(line, self.done)
        if p is not None:
            self.last_at = time.perf_counter()
            if self.first_at is None:
                self.first_at = self.last_at
            self.done = p.index
            self.lane.progress(self.one, p.index, p.kernel)
            return True
        return False

    def check(self, seconds: float, code: int, tail: list[str]) -> PassRun:
        """How the process ended (its report not exported yet): ``ok`` when it left one."""
        session, one, lane = self.session, self.one, self.lane
        out, warnings, stem = session.out, session.warnings, one.stem
        timeout = session.options.ncu_timeout
        who = f"ncu ({stem})" if lane.gpu else "ncu"  # one GPU's pass among several
        logs = session.logs / self.log_name
        log = Path(f"{logs}.stdout").read_text(errors="replace") + Path(f"{logs}.stderr").read_text(
            errors="replace"
        )
        rep = out / f"{stem}.ncu-rep"
        exit_code: int | str = code
        if code == TIMED_OUT:
            exit_code = "timeout"
            if "==PROF== Report:" in log and rep.is_file():
                # ncu finished and wrote its report; only the application failed to exit.
                warnings.append(
                    f"ncu ({stem}) wrote its report, but the application did not exit; it was stopped "
                    f"after {timeout:.0f} s and the counters are kept"
                )
            else:
                lane.warn(
                    f"Nsight Compute did not finish within {timeout:.0f} s: stopped; the timeline is kept"
                )
                warnings.append(
                    f"ncu ({stem}) was stopped after {timeout:.0f} s ({self.done} launches profiled); "
                    "no counters from it (raise --ncu-timeout, or lower --max-kernels)"
                )
                return PassRun(False, seconds, self.done, exit_code, self._profiling())
        if "ERR_NVGPUCTRPERM" in log:
            lane.warn(ncu_tools.PERMISSION_HELP)
            perm = "ncu could not read the performance counters (ERR_NVGPUCTRPERM): timeline only"
            if perm not in warnings:
                warnings.append(perm)
            return PassRun(False, seconds, 0, exit_code)
        if not rep.is_file():
            warnings.append(
                f"{who} wrote no report (exit code {code}); last output: " + " | ".join(tail[-3:])
            )
            return PassRun(False, seconds, self.done, exit_code, self._profiling())
        if code not in (0, TIMED_OUT):
            warnings.append(f"{who} exited with code {code} after writing its report")
        return PassRun(True, seconds, self.done, exit_code, self._profiling())

    def _profiling(self) -> float | None:
        if self.first_at is None or self.last_at is None or self.done < 2:
            return None
        return self.last_at - self.first_at

    def export(self, run: PassRun) -> PassRun:
        """The checked report (``check``) exported to CSV in the trace's kernel spelling: ``run``,
        or the same not ``ok`` when the export failed. ncu reads the report on the CPU only, so
        this may run while the next pass profiles."""
        ncu, one = self.ncu, self.one
        who = f"ncu ({one.stem})" if self.lane.gpu else "ncu"
        rep = self.session.out / f"{one.stem}.ncu-rep"
        export = subprocess.run(
            ncu_tools.export_command(ncu, rep), capture_output=True, text=True, check=False
        )
        if export.returncode != 0 or not export.stdout.strip():
            message = f"{who} could not export its report to CSV: {export.stderr.strip()[-300:]}"
            self.session.warnings.append(message)
            return run._replace(ok=False)
        # Written whole, then renamed: an interrupted run keeps a complete export or none.
        csv = self.session.out / one.csv_name
        partial = csv.with_name(csv.name + ".partial")
        with gzip.open(partial, "wt") as f:
            f.write(_trace_spelling(ncu, rep, export.stdout, one.kernels))
        os.replace(partial, csv)
        return run


def _trace_spelling(ncu: str, rep: Path, text: str, kernels: list[str]) -> str:
    """The export with the trace's mangled spelling on the kernels the trace left mangled."""
    symbols = mangled_in_trace(kernels)
    if not symbols:
        return text
    mangled = subprocess.run(
        ncu_tools.export_command(ncu, rep, names="mangled"), capture_output=True, text=True, check=False
    )
    return with_trace_spelling(text, mangled.stdout, symbols) if mangled.returncode == 0 else text
