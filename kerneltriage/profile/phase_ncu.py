"""Phase 2: the script again under Nsight Compute, on the hot kernels of phase 1 only.

The hot kernels come from the ncu rank's phase-1 trace (``analysis/timeline/hot_kernels.py``). Kernels
that run several problem sizes under one launch configuration get a first pass that profiles
their every launch of one step; the others one launch per configuration. Each pass's report
is exported to CSV; a pass that fails or hangs stops the ones after it, and every hot kernel
left without counters is named, with why.
"""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kerneltriage import rundir
from kerneltriage.analysis.rules import load_rules
from kerneltriage.errors import ToolError
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.context import ProfileSession
from kerneltriage.profile.ncu_names import mangled_in_trace, with_trace_spelling
from kerneltriage.profile.processes import TIMED_OUT

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.timeline.hot_kernels import HotKernels


class NcuPass(NamedTuple):
    """One ncu run: its file stem, its CSV export, the kernels it profiles, the launches it
    takes of each (None: one per launch configuration) and the launches expected."""

    stem: str
    csv_name: str
    kernels: list[str]
    every_launch: int | None
    expected: int


def run_ncu(session: ProfileSession, ncu: str) -> None:
    """Phase 2 with the ncu at ``ncu``: the manifest's ``phases.ncu`` and the counters' CSVs."""
    manifest, out = session.manifest, session.out
    manifest.versions["ncu"] = ncu_tools.ncu_version(ncu) or "unknown"
    hot = _hot_kernels(session)
    if not hot.names:
        session.warnings.append("phase 1 recorded no GPU kernels in the steps: nothing for ncu to profile")
        return
    metrics = ncu_tools.metric_list(ncu_tools.available_metrics(ncu))
    whole_run = bool(manifest.schedule.whole_run)
    config = session.write_config("ncu", whole_run=whole_run)
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
    session.reporter.phase(
        "ncu",
        f"Nsight Compute on {len(hot.names)} hot kernels ({hot.coverage:.0%} of GPU time), "
        f"~{hot.configs} launch configurations",
    )
    passes = _ncu_passes(hot, whole_run)
    total_seconds, launches, not_run = _run_passes(session, ncu, passes, metrics, config)
    session.ncu_record.seconds, session.ncu_record.profiled_launches = round(total_seconds, 2), launches
    _hot_without_counters(session, hot, not_run)
    if (out / rundir.NCU_CSV).is_file() or (out / rundir.NCU_LAUNCHES_CSV).is_file():
        session.reporter.phase_done("ncu", total_seconds, f"{launches} launches profiled")


def _hot_kernels(session: ProfileSession) -> HotKernels:
    """The hot kernels of the ncu rank's phase-1 trace."""
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

    return select_hot_kernels(
        read_timeline(rank_trace),
        load_rules(options.rules_file),
        coverage=options.coverage,
        max_kernels=options.max_kernels,
        max_variable_launches=options.max_variable_launches,
    )


def _ncu_passes(hot: HotKernels, whole_run: bool) -> list[NcuPass]:
    if not hot.variable or whole_run:
        return [NcuPass("ncu", rundir.NCU_CSV, hot.names, None, hot.configs)]
    # Kernels that run several problem sizes under one configuration: every launch, in a first
    # pass; the per-configuration pass then leaves them out (it runs only if the first went well).
    rest = [n for n in hot.names if n not in hot.variable]
    passes = [
        NcuPass(
            "ncu.launches",
            rundir.NCU_LAUNCHES_CSV,
            hot.variable,
            hot.variable_launches,
            hot.variable_launches,
        )
    ]
    if rest:
        passes.append(NcuPass("ncu", rundir.NCU_CSV, rest, None, hot.configs - hot.variable_configs))
    return passes


def _run_passes(
    session: ProfileSession, ncu: str, passes: list[NcuPass], metrics: list[str], config: Path
) -> tuple[float, int, dict[str, str]]:
    """Run the passes in order, up to the first that fails: (seconds, launches profiled, kernel
    -> why it has no counters, for the kernels of the failed pass and of those after it)."""
    whole_run = bool(session.manifest.schedule.whole_run)
    total_seconds = 0.0
    launches = 0
    not_run: dict[str, str] = {}
    for index, one in enumerate(passes):
        cmd = ncu_tools.ncu_command(
            ncu,
            session.out / one.stem,
            one.kernels,
            metrics,
            session.command.with_runner(),
            nvtx=not whole_run,
            full_set=session.options.ncu_set == "full",
            every_launch=one.every_launch,
        )
        (session.logs / f"{one.stem}_command.txt").write_text(" ".join(cmd) + "\n")
        ok, seconds, done = _run_pass(session, ncu, cmd, one, config)
        total_seconds += seconds
        launches += done
        session.ncu_record.record_pass(one.stem, seconds=round(seconds, 2))
        if not ok:
            for later in passes[index:]:
                why = "failed" if later.stem == one.stem else f"did not run (the {one.stem} pass failed)"
                not_run.update(dict.fromkeys(later.kernels, f"its ncu pass ({later.stem}) {why}"))
            break
    return total_seconds, launches, not_run


def _run_pass(
    session: ProfileSession, ncu: str, cmd: list[str], one: NcuPass, config: Path
) -> tuple[bool, float, int]:
    """One ncu run and its CSV export. Returns (went well, seconds, launches profiled)."""
    out, warnings, stem = session.out, session.warnings, one.stem
    timeout = session.options.ncu_timeout
    progress = {"done": 0}

    def on_line(line: str) -> bool:
        p = ncu_tools.parse_progress(line, progress["done"])
        if p is not None:
            progress["done"] = p.index
            session.reporter.ncu_progress(p.index, max(one.expected, p.index), p.kernel)
            return True
        return False

    log_name = stem.replace("ncu", "phase2")
    seconds, code, tail = session.run(cmd, config, log_name, on_line=on_line, timeout=timeout)
    logs = session.logs / log_name
    log = Path(f"{logs}.stdout").read_text(errors="replace") + Path(f"{logs}.stderr").read_text(
        errors="replace"
    )
    rep = out / f"{stem}.ncu-rep"
    if code == TIMED_OUT:
        session.ncu_record.record_pass(stem, exit_code="timeout")
        if "==PROF== Report:" in log and rep.is_file():
            # ncu finished and wrote its report; only the application failed to exit.
            warnings.append(
                f"ncu ({stem}) wrote its report, but the application did not exit; it was stopped "
                f"after {timeout:.0f} s and the counters are kept"
            )
        else:
            session.reporter.warn(
                f"Nsight Compute did not finish within {timeout:.0f} s: stopped; the timeline is kept"
            )
            warnings.append(
                f"ncu ({stem}) was stopped after {timeout:.0f} s ({progress['done']} launches profiled); "
                "no counters from it (raise --ncu-timeout, or lower --max-kernels)"
            )
            return False, seconds, progress["done"]
    else:
        session.ncu_record.record_pass(stem, exit_code=code)
    if "ERR_NVGPUCTRPERM" in log:
        session.reporter.warn(ncu_tools.PERMISSION_HELP)
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
    with gzip.open(out / one.csv_name, "wt") as f:
        f.write(_trace_spelling(ncu, rep, export.stdout, one.kernels))
    return True, seconds, progress["done"]


def _trace_spelling(ncu: str, rep: Path, text: str, kernels: list[str]) -> str:
    """The export with the trace's mangled spelling on the kernels the trace left mangled."""
    symbols = mangled_in_trace(kernels)
    if not symbols:
        return text
    mangled = subprocess.run(
        ncu_tools.export_command(ncu, rep, names="mangled"), capture_output=True, text=True, check=False
    )
    return with_trace_spelling(text, mangled.stdout, symbols) if mangled.returncode == 0 else text


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
    for name, count in hot.over_budget.items():
        missing.setdefault(
            name,
            f"runs several problem sizes under one launch configuration, {count} launches a step, over "
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
