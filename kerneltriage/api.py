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
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis import frames
from kerneltriage.analysis.compare.diff import Diff
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Report
from kerneltriage.analysis.rules import Rules, load_rules
from kerneltriage.errors import InputError, ToolError
from kerneltriage.ingest.source import LoadedProfile, load_profile
from kerneltriage.parallel import report_ranks
from kerneltriage.pipeline import rank_report, with_waits

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
        loaded: LoadedProfile,
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
        return self.loaded.default_rank

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

        from kerneltriage.analysis.timeline.attribution import attribute

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
        check_options(gpu=gpu, step_marker=step_marker, rank=rank)
        rank = self.default_rank if rank is None else rank
        if rank not in self.loaded.timelines:
            raise InputError(
                f"rank {rank} is not in the profile (it has {', '.join(map(str, self.ranks))})",
                path=self.path,
            )
        if rules is None:
            rules = self._report_rules(rules_file, min_headroom, min_share, max_shapes)
        marker = step_marker if step_marker is not None else self.step_marker
        return rank_report(self.loaded, rank, rules=rules, gpu=gpu, step_marker=marker, progress=progress)

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
        check_options(gpu=gpu, step_marker=step_marker)
        if rules is None:
            rules = self._report_rules(rules_file, min_headroom, min_share, max_shapes)
        marker = step_marker if step_marker is not None else self.step_marker
        reports = {
            rank: rank_report(self.loaded, rank, rules=rules, gpu=gpu, step_marker=marker, progress=progress)
            for rank in self.ranks
        }
        return with_waits(reports, self.loaded.timelines, rules)

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
    check_options(ranks=ranks)
    loaded = load_profile(path, ncu=ncu, ranks=ranks, progress=progress)
    return Profile(loaded, rules_file=rules_file, step_marker=step_marker)


# --- reports ---------------------------------------------------------------------------------
# ``reports`` and ``report`` are what ``kerneltriage report`` and ``kerneltriage diff`` call:
# one way to read the ranks, one rule for the rank of a single report.


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
    workers: int | None = None,
    scheduler: str | None = None,
    rules: Rules | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[int, Report]:
    """``kerneltriage report PATH``: every rank's report (or those of ``ranks``), ``{rank:
    Report}`` in rank order, ``{0: …}`` for one process. Each rank is read and reduced by a
    worker process (``workers``: how many; default one per core, at most one per rank; 1: in
    this process) or on Dask (``scheduler``: an address, or ``local``); see
    ``kerneltriage.parallel``. ``rules``: ready rules (then ``rules_file`` and the thresholds
    are not read)."""
    check_options(ranks=ranks, workers=workers)
    rules = _checked_rules(rules, rules_file, gpu, step_marker, min_headroom, min_share, max_shapes)
    return report_ranks(
        path,
        rules=rules,
        ncu=ncu,
        ranks=ranks,
        gpu=gpu,
        step_marker=step_marker,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
    )


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
    rules: Rules | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """One rank's report, as ``reports()`` makes it: ``rank``, else the only one, else (several
    ranks) the one Nsight Compute profiled; ``Report.rank`` says which. Only that rank's trace
    is read."""
    check_options(rank=rank)
    rules = _checked_rules(rules, rules_file, gpu, step_marker, min_headroom, min_share, max_shapes)
    made = report_ranks(
        path,
        rules=rules,
        ncu=ncu,
        ranks=None if rank is None else [rank],
        one=True,
        gpu=gpu,
        step_marker=step_marker,
        workers=1,
        progress=progress,
    )
    (only,) = made.values()
    return only


def build_reports(
    path: str | Path, *, overrides: dict[str, float | None] | None = None, **options: Any
) -> dict[int, Report]:
    """``reports()``, the thresholds given as one ``overrides`` dict (the older name)."""
    # Passed on as keywords, each checked by reports()'s own parameters.
    thresholds: dict[str, Any] = dict(overrides or {})
    return reports(path, **thresholds, **options)


def build_report(path: str | Path, *, ranks: list[int] | None = None, **options: Any) -> Report:
    """``report()``, the rank given as ``ranks=[rank]`` (the older name)."""
    return report(path, rank=min(ranks) if ranks else None, **options)


def _checked_rules(
    rules: Rules | None,
    rules_file: str | Path | None,
    gpu: Any,
    step_marker: Any,
    min_headroom: float | None,
    min_share: float | None,
    max_shapes: int | None,
) -> Rules:
    """The options checked before any work, and the rules to report with."""
    check_options(gpu=gpu, step_marker=step_marker)
    if rules is not None:
        return rules
    return load_rules(
        rules_file, {"min_headroom": min_headroom, "min_share": min_share, "max_shapes": max_shapes}
    )


def check_options(
    *,
    gpu: Any = None,
    step_marker: Any = None,
    min_headroom: Any = None,
    min_share: Any = None,
    max_shapes: Any = None,
    rank: Any = None,
    ranks: Any = None,
    workers: Any = None,
) -> None:
    """The checks the command line's flags get, for keyword arguments: an ``InputError`` before
    any work. Thresholds are checked by the rules (``load_rules``), as a rules file's are."""
    if gpu is not None and not isinstance(gpu, GPUSpec) and not (isinstance(gpu, str) and gpu.strip()):
        raise InputError(f"gpu must be a GPU table key such as 'H100-SXM' or a GPUSpec, got {gpu!r}")
    if step_marker is not None:
        from kerneltriage.analysis.timeline.attribution import step_marker_pattern

        step_marker_pattern(step_marker)
    overrides = {"min_headroom": min_headroom, "min_share": min_share, "max_shapes": max_shapes}
    if any(v is not None for v in overrides.values()):
        load_rules(None, overrides)
    if rank is not None and not _is_rank(rank):
        raise InputError(f"rank must be a whole number ≥ 0 such as 0, got {rank!r} ({type(rank).__name__})")
    if ranks is not None:
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise InputError(f"ranks must be a list of whole numbers ≥ 0, got {ranks!r}")
        listed = list(ranks)
        if not listed:
            raise InputError("ranks is an empty list; give at least one rank, or None for every rank")
        bad = [r for r in listed if not _is_rank(r)]
        if bad:
            raise InputError(f"ranks must be whole numbers ≥ 0, got {bad[0]!r} ({type(bad[0]).__name__})")
    if workers is not None and not (_is_rank(workers) and workers >= 1):
        raise InputError(f"workers must be a whole number ≥ 1, got {workers!r} ({type(workers).__name__})")


def _is_rank(value: Any) -> bool:
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


# --- diff ------------------------------------------------------------------------------------


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
    """``kerneltriage diff BEFORE AFTER``: the saving each predicted candidate realized
    (``Diff.to_frame()``: as a table). For multi-rank runs, each side's rank as in
    ``report()``: ``rank``, else the one Nsight Compute profiled."""
    from kerneltriage.analysis.compare.diff import compare

    rules = load_rules(rules_file)  # read once; what it warns about is said once, as report says it
    sides = [
        report(path, rank=rank, ncu=ncu, rules=rules, gpu=gpu)
        for path, ncu in ((before, ncu_before), (after, ncu_after))
    ]
    result = compare(sides[0], sides[1], (str(before), str(after)))
    result.warnings = [*rules.warnings, *(w for w in result.warnings if w not in rules.warnings)]
    return result


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

    from kerneltriage.analysis.compare.ranks import summarize
    from kerneltriage.outputs import atomic_path, refuse_read_only

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
    for name in tables:  # a read-only table refuses the export before any table is replaced
        refuse_read_only(out / f"{name}.{fmt}", "--export")
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
