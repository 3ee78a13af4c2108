"""Phase 1 under Nsight Systems (``--timeline nsys``): the script recorded by ``nsys profile``
over the recorded steps (``--capture-range=nvtx``), exported to SQLite. False where nsys cannot
give a timeline (missing, or recording without a report): the PyTorch profiler then makes it
(``phase_timeline.py``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kerneltriage import rundir
from kerneltriage.profile.context import ProfileSession
from kerneltriage.profile.step_plan import CAPTURE_RANGE


def find_nsys() -> str | None:
    found = shutil.which("nsys")
    if found:
        return found
    for candidate in sorted(Path("/opt/nvidia").glob("nsight-*/*/host*/*/nsys")):
        if candidate.is_file():
            return str(candidate)
    return None


def run_timeline_nsys(session: ProfileSession) -> bool:
    """Phase 1 under Nsight Systems. False when it cannot give a timeline (the caller then
    falls back to the PyTorch profiler): nsys missing, or recording without a report."""
    out, manifest, reporter, warnings = session.out, session.manifest, session.reporter, session.warnings
    nsys = find_nsys()
    if nsys is None:
        reporter.warn("Nsight Systems (nsys) is not on PATH: using the PyTorch profiler for the timeline")
        warnings.append("--timeline nsys: nsys not found; the PyTorch profiler made the timeline")
        return False
    config = session.write_config("nsys", whole_run=False)
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
        *session.command.with_runner(),
    ]
    (session.logs / "nsys_command.txt").write_text(" ".join(cmd) + "\n")
    reporter.phase("timeline", "Nsight Systems")
    seconds, code, _ = session.run(cmd, config, "phase1-nsys", timeout=session.options.ncu_timeout)
    manifest.phases.timeline = rundir.TimelinePhase(seconds=round(seconds, 2), exit_code=code, tool="nsys")
    rep = report.with_suffix(".nsys-rep")
    if not rep.is_file():
        left = sorted(p.name for p in out.glob("timeline*"))
        reporter.warn(
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
        reporter.warn("nsys could not export its report to SQLite; falling back to the PyTorch profiler")
        warnings.append(
            f"--timeline nsys: export failed ({export.stderr.strip()[-200:]}); "
            "the PyTorch profiler made the timeline"
        )
        return False
    session.record_environment(session.statuses("nsys"))
    manifest.ranks = [0]
    reporter.phase_done("timeline", seconds, "Nsight Systems export: timeline.sqlite")
    return True
