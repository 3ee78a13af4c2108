"""The Python API: what the CLI does, for notebooks and scripts (README "Python API").

import kerneltriage
rep = kerneltriage.report("runs/exp1")            # a Report (one rank)
rep.to_frame()                                     # its candidates as a DataFrame
prof = kerneltriage.load("runs/exp1")              # the tables: prof.kernels, prof.ops
d = kerneltriage.diff("runs/before", "runs/after") # d.to_frame()

Nothing here needs torch or a GPU. Errors are ``kerneltriage.errors`` exceptions
(``InputError`` for bad input), never a ``SystemExit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis import frames
from kerneltriage.analysis.diff import Diff as _Diff
from kerneltriage.analysis.gpus import (
    GPUSpec,
    implausible_calibration,
    known_gpus,
    resolve_gpu,
    unresolved_reason,
)
from kerneltriage.analysis.model import Report
from kerneltriage.analysis.rules import Rules, load_rules
from kerneltriage.analysis.triage import require_gpu_activity, triage
from kerneltriage.errors import InputError, ToolError
from kerneltriage.ingest.source import Profile as _Loaded
from kerneltriage.ingest.source import load_profile

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "EXPORT_FORMATS",
    "Diff",
    "Profile",
    "Report",
    "build_report",
    "build_reports",
    "diff",
    "export_tables",
    "load",
    "load_rules",
    "report",
    "reports",
]

EXPORT_FORMATS = ("csv", "parquet")


# --- loading ---------------------------------------------------------------------------------


class Profile:
    """A profile read from disk (run directory, folder of per-rank traces, or a trace), before
    any analysis. ``kernels`` and ``ops`` are its tables; ``report()``/``reports()`` analyse it.

    The tables are built on first access (attribution of every kernel to its step, op and
    module); the reports reuse what was read, so one ``load`` serves both.
    """

    def __init__(
        self,
        loaded: _Loaded,
        *,
        rules_file: str | Path | None = None,
        step_marker: str | None = None,
    ):
        self.loaded = loaded
        self.rules_file = rules_file
        self.step_marker = step_marker
        self._attribution: dict[int, Any] = {}  # rank -> Attribution, shared by the tables

    def __repr__(self) -> str:
        return f"<kerneltriage.Profile {self.path} ranks={self.ranks}>"

    @property
    def path(self) -> str:
        return str(self.loaded.source_info()["path"])

    @property
    def ranks(self) -> list[int]:
        """The process ranks held (``[0]`` for a single process)."""
        return sorted(self.loaded.timelines)

    @property
    def default_rank(self) -> int:
        """The rank ``report()`` picks when none is given: the only one, else the rank Nsight
        Compute profiled (the one with counters; the first rank when no run says)."""
        ranks = self.ranks
        if len(ranks) == 1:
            return ranks[0]
        counted = self.loaded.counters_rank
        return counted if counted in ranks else ranks[0]

    @property
    def warnings(self) -> list[str]:
        return list(self.loaded.warnings)

    @cached_property
    def _rules(self) -> Rules:
        return load_rules(self.rules_file)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """One row per GPU activity of every rank (columns: ``frames.KERNEL_COLUMNS``)."""
        return self._table("kernels")

    @cached_property
    def ops(self) -> pd.DataFrame:
        """One row per top-level CPU op of every rank (columns: ``frames.OP_COLUMNS``)."""
        return self._table("ops")

    def _table(self, which: str) -> pd.DataFrame:
        import pandas as pd

        from kerneltriage.analysis.attribution import attribute

        parts = []
        for rank in self.ranks:
            tl = self.loaded.timelines[rank]
            attr = self._attribution.get(rank)
            if attr is None:
                attr = self._attribution[rank] = attribute(tl, self.step_marker)
            if which == "kernels":
                parts.append(frames.kernels_frame(tl, attr, self._rules, rank))
            else:
                parts.append(frames.ops_frame(tl, attr, rank))
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]

    def report(
        self,
        rank: int | None = None,
        *,
        rules_file: str | Path | None = None,
        gpu: str | GPUSpec | None = None,
        min_headroom: float | None = None,
        min_share: float | None = None,
        max_shapes: int | None = None,
        step_marker: str | None = None,
        rules: Rules | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Report:
        """One rank's report (``rank`` None: ``default_rank``). ``rules``: ready rules (then
        ``rules_file`` and the thresholds are not read)."""
        rank = self.default_rank if rank is None else rank
        if rank not in self.loaded.timelines:
            raise InputError(
                f"rank {rank} is not in the profile (it has {', '.join(map(str, self.ranks))})",
                path=self.path,
            )
        if rules is None:
            rules = self._report_rules(rules_file, min_headroom, min_share, max_shapes)
        marker = step_marker if step_marker is not None else self.step_marker
        return report_for(self.loaded, rank, rules=rules, gpu=gpu, step_marker=marker, progress=progress)

    def reports(
        self,
        *,
        rules_file: str | Path | None = None,
        gpu: str | GPUSpec | None = None,
        min_headroom: float | None = None,
        min_share: float | None = None,
        max_shapes: int | None = None,
        step_marker: str | None = None,
        rules: Rules | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> dict[int, Report]:
        """Every rank's report, by rank."""
        if rules is None:
            rules = self._report_rules(rules_file, min_headroom, min_share, max_shapes)
        marker = step_marker if step_marker is not None else self.step_marker
        return {
            rank: report_for(self.loaded, rank, rules=rules, gpu=gpu, step_marker=marker, progress=progress)
            for rank in self.ranks
        }

    def _report_rules(self, rules_file, min_headroom, min_share, max_shapes) -> Rules:
        overrides = {"min_headroom": min_headroom, "min_share": min_share, "max_shapes": max_shapes}
        return load_rules(rules_file if rules_file is not None else self.rules_file, overrides)


def load(
    path: str | Path,
    *,
    ncu: str | Path | None = None,
    ranks: list[int] | None = None,
    rules_file: str | Path | None = None,
    step_marker: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """Read a run directory, a folder of per-rank traces or a trace (``ncu``: counters for a
    bare trace). ``ranks`` reads only those ranks; ``rules_file`` and ``step_marker`` serve
    the tables (kernel classes, steps) and are the reports' defaults."""
    loaded = load_profile(path, ncu=ncu, ranks=ranks, progress=progress)
    return Profile(loaded, rules_file=rules_file, step_marker=step_marker)


# --- reports ---------------------------------------------------------------------------------


def report(
    path: str | Path,
    *,
    rank: int | None = None,
    ncu: str | Path | None = None,
    rules_file: str | Path | None = None,
    gpu: str | GPUSpec | None = None,
    min_headroom: float | None = None,
    min_share: float | None = None,
    max_shapes: int | None = None,
    step_marker: str | None = None,
) -> Report:
    """``kerneltriage report PATH`` as a ``Report``, for one rank: ``rank``, else the only one,
    else (several ranks) the one Nsight Compute profiled; ``Report.rank`` says which.
    ``reports()`` gives every rank."""
    check_options(
        gpu=gpu,
        step_marker=step_marker,
        min_headroom=min_headroom,
        min_share=min_share,
        max_shapes=max_shapes,
    )
    profile = load(path, ncu=ncu, ranks=None if rank is None else [rank], rules_file=rules_file)
    return profile.report(
        rank,
        gpu=gpu,
        min_headroom=min_headroom,
        min_share=min_share,
        max_shapes=max_shapes,
        step_marker=step_marker,
    )


def reports(
    path: str | Path,
    *,
    ranks: list[int] | None = None,
    ncu: str | Path | None = None,
    rules_file: str | Path | None = None,
    gpu: str | GPUSpec | None = None,
    min_headroom: float | None = None,
    min_share: float | None = None,
    max_shapes: int | None = None,
    step_marker: str | None = None,
) -> dict[int, Report]:
    """Every rank's report (or those of ``ranks``): ``{rank: Report}``, ``{0: …}`` for one
    process."""
    check_options(
        gpu=gpu,
        step_marker=step_marker,
        min_headroom=min_headroom,
        min_share=min_share,
        max_shapes=max_shapes,
    )
    profile = load(path, ncu=ncu, ranks=ranks, rules_file=rules_file)
    return profile.reports(
        gpu=gpu,
        min_headroom=min_headroom,
        min_share=min_share,
        max_shapes=max_shapes,
        step_marker=step_marker,
    )


def build_reports(
    path: str | Path,
    *,
    ncu: str | Path | None = None,
    rules_file: str | Path | None = None,
    gpu: str | None = None,
    overrides: dict[str, float | None] | None = None,
    step_marker: str | None = None,
    ranks: list[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[int, Report]:
    """One report per rank (a single-process run has rank 0); the CLI's entry point."""
    say = progress or (lambda _m: None)
    rules = load_rules(rules_file, overrides)
    loaded = load_profile(path, ncu=ncu, ranks=ranks, progress=say)
    return {
        rank: report_for(loaded, rank, rules=rules, gpu=gpu, step_marker=step_marker, progress=say)
        for rank in loaded.timelines
    }


def build_report(path: str | Path, **kwargs) -> Report:
    """The report of the first rank (the only one for a single-process run)."""
    return next(iter(build_reports(path, **kwargs).values()))


def report_for(
    profile: _Loaded,
    rank: int,
    *,
    rules: Rules,
    gpu: str | GPUSpec | None = None,
    step_marker: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """One rank's report. ``gpu``: a ``--gpu`` key or device name, or a ready ``GPUSpec``;
    left out, the GPU comes from the run's calibration, the trace's name or deviceProperties,
    and without any of them the report has no ceilings (``report.gpu`` is None)."""
    check_options(gpu=gpu, step_marker=step_marker)
    timeline = profile.timelines[rank]
    require_gpu_activity(timeline)
    properties = timeline.gpu_properties
    doubt = None  # why the run's calibration is not applied
    if isinstance(gpu, GPUSpec):
        spec: GPUSpec | None = gpu
    else:
        calibration = profile.manifest.calibration if profile.manifest else None
        doubt = implausible_calibration(calibration, timeline.gpu_name)
        if doubt:
            calibration = None
        spec = resolve_gpu(timeline.gpu_name, gpu, calibration, properties)
    if progress:
        progress(f"analysing {Path(timeline.source).name}")
    # Counters are measured on one rank (the one ncu profiled); join them there only.
    counters = profile.counters if rank == profile.counters_rank else None
    result = triage(
        timeline,
        spec,
        rules,
        counters,
        step_marker=step_marker,
        source=profile.source_info(),
        hot_kernels=profile.hot_kernels,
        timing=profile.step_timing(rank),
    )
    result.warnings = profile.warnings + result.warnings
    if doubt:
        result.warnings.append(doubt)
    _verified(result, profile.source_info().get("path"))
    if spec is None:
        # No ceilings: the report still gives shares, idle time, kinds, shapes and a ranking.
        reason = unresolved_reason(timeline.gpu_name, properties)
        result.source["gpu_unresolved"] = reason
        result.notes.insert(0, no_gpu_note(reason))
    return result


def _verified(report: Report, path: Any) -> None:
    """Put RUN/verify.json (``kerneltriage verify``) on the report, when the run has one."""
    if not path or "://" in str(path) or not Path(path).is_dir():
        return
    from kerneltriage.analysis.verification import attach
    from kerneltriage.errors import RunDirError
    from kerneltriage.verify.record import read

    try:
        data = read(path)
    except RunDirError as exc:  # the report stands without it
        report.warnings.append(f"{exc}; the report shows no verification")
        return
    if data is not None:
        attach(report, data.to_json())


def check_options(
    *,
    gpu: Any = None,
    step_marker: Any = None,
    min_headroom: Any = None,
    min_share: Any = None,
    max_shapes: Any = None,
) -> None:
    """The checks the command line's flags get, for keyword arguments: an ``InputError`` before
    any work. Thresholds are checked by the rules (``load_rules``), as a rules file's are."""
    if gpu is not None and not isinstance(gpu, GPUSpec) and not (isinstance(gpu, str) and gpu.strip()):
        raise InputError(f"gpu must be a GPU table key such as 'H100-SXM' or a GPUSpec, got {gpu!r}")
    if step_marker is not None:
        from kerneltriage.analysis.attribution import step_marker_pattern

        step_marker_pattern(step_marker)
    overrides = {"min_headroom": min_headroom, "min_share": min_share, "max_shapes": max_shapes}
    if any(v is not None for v in overrides.values()):
        load_rules(None, overrides)


def no_gpu_note(reason: str) -> str:
    """The report's note when no GPU row fits the trace."""
    return (
        f"GPU unknown ({reason}): no ceilings, so no headroom and no write or compile verdict; "
        f"pass --gpu KEY, one of: {', '.join(known_gpus())}"
    )


# --- diff ------------------------------------------------------------------------------------


@dataclass
class Diff(_Diff):
    """``kerneltriage diff`` as an object (schema ``kerneltriage.diff/1``), with ``to_frame``."""

    def to_frame(self) -> pd.DataFrame:
        """One row per matched candidate (columns: ``frames.DIFF_COLUMNS``)."""
        return frames.diff_frame(self)


def diff(
    before: str | Path,
    after: str | Path,
    *,
    rank: int | None = None,
    ncu_before: str | Path | None = None,
    ncu_after: str | Path | None = None,
    rules_file: str | Path | None = None,
    gpu: str | GPUSpec | None = None,
) -> Diff:
    """``kerneltriage diff BEFORE AFTER``: the saving each predicted candidate realized.
    For multi-rank runs, ``rank`` as in ``report()`` (default: the profiled rank)."""
    from dataclasses import fields

    from kerneltriage.analysis.diff import compare

    sides = [
        report(path, rank=rank, ncu=ncu, rules_file=rules_file, gpu=gpu)
        for path, ncu in ((before, ncu_before), (after, ncu_after))
    ]
    result = compare(sides[0], sides[1], (str(before), str(after)))
    return Diff(**{f.name: getattr(result, f.name) for f in fields(_Diff)})


# --- exports ---------------------------------------------------------------------------------


def check_export_format(fmt: str) -> None:
    """Fail before any work when ``fmt`` cannot be written (Parquet needs pyarrow)."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format {fmt!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if fmt == "parquet":
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            raise ToolError(
                "--export-format parquet needs the pyarrow package, which is not installed "
                "(pip install pyarrow), or use --export-format csv"
            )


def export_tables(
    profile: Profile, reports_by_rank: dict[int, Report], out_dir: str | Path, fmt: str = "csv"
) -> list[Path]:
    """Write every table to ``out_dir`` as CSV or Parquet: candidates, kinds, gaps, ranks
    (and rank_candidates with several ranks), kernels, ops. Returns the files written."""
    import pandas as pd

    from kerneltriage.analysis.ranks import summarize
    from kerneltriage.outputs import atomic_path

    check_export_format(fmt)
    if not reports_by_rank:
        raise InputError("no report to export (the report set is empty)", path=str(out_dir))
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("--export needs a directory, and this is a file", path=str(out))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot create the export directory ({exc.strerror or exc})", path=str(out)
        ) from None
    several = len(reports_by_rank) > 1
    tables: dict[str, pd.DataFrame] = {
        "candidates": frames.candidates_table(reports_by_rank),
        "kinds": pd.DataFrame(
            [
                {"rank": r, "kind": k, "ms_per_step": v}
                for r, rep in reports_by_rank.items()
                for k, v in rep.kind_breakdown.items()
            ],
            columns=["rank", "kind", "ms_per_step"],
        ),
        "gaps": pd.concat(
            [rep.gaps_frame().assign(rank=r) for r, rep in reports_by_rank.items()], ignore_index=True
        )[["rank", *frames.GAP_COLUMNS]],
    }
    summary = summarize(reports_by_rank)
    tables["ranks"] = frames.ranks_frame(summary)
    if several:
        tables["rank_candidates"] = frames.rank_candidates_frame(summary)
    tables["kernels"] = profile.kernels
    tables["ops"] = profile.ops
    written = []
    for name, table in tables.items():
        path = out / f"{name}.{fmt}"
        with atomic_path(path) as tmp:  # whole or not at all; a write error names the table
            if fmt == "csv":
                table.to_csv(tmp, index=False, lineterminator="\n")
            else:
                table.to_parquet(tmp, index=False)
        written.append(path)
    return written
