"""``kerneltriage report``: rank every op and fused region of a profile by whether a custom
kernel would pay, in one of five formats, with the roofline chart and the tables on request."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kerneltriage.cli.console import Progress, emit
from kerneltriage.cli.options import (
    check_step_marker,
    format_option,
    gpu_option,
    ncu_option,
    output_option,
    rules_option,
)


class _ThresholdOption(click.Option):
    """A threshold flag (overrides the rules' value); its help ends with the default read from
    the shipped rules file when help is shown, so the file stays the one source of the value."""

    def get_help_record(self, ctx: click.Context):
        from kerneltriage.analysis.rules import default_rules_path, default_thresholds
        from kerneltriage.resources import DATA_DIR

        value = getattr(default_thresholds(), self.name)
        where = default_rules_path().relative_to(DATA_DIR.parents[1])
        text = self.help
        self.help = f"{text} Default: {value} (from {where})."
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = text


def _threshold_option(flag: str, kind, text: str):
    return click.option(flag, cls=_ThresholdOption, type=kind, help=text)


@click.command()
@click.argument("run", type=click.Path())  # a str: a URL's "//" must survive
@ncu_option
@format_option("kerneltriage.report/1")
@output_option
@click.option("--top", type=click.IntRange(min=1), help="Show only the first N candidates.")
@rules_option
@gpu_option()
@_threshold_option("--min-headroom", float, "Headroom threshold (measured ÷ ceiling time), at least 1.")
@_threshold_option("--min-share", click.FloatRange(0.0, 1.0), "Hotness threshold as a share of step time.")
@_threshold_option(
    "--max-shapes", click.IntRange(min=1), "Shape-stability threshold: distinct shape signatures."
)
@click.option(
    "--step-marker",
    callback=check_step_marker,
    help="Regex on annotation names that mark steps, if not ProfilerStep/optimizer/kerneltriage.step.",
)
@click.option(
    "--rank",
    "ranks",
    type=int,
    multiple=True,
    help="Report only this rank (repeatable) of a run directory, a folder of per-rank traces or a "
    "trace; a rank the input does not hold is an error that lists the ranks it has.",
)
@click.option("--plot", type=click.Path(path_type=Path), help="Also write the roofline chart as PNG or SVG.")
@click.option(
    "--export",
    "export_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Also write every table to this folder: candidates, kinds, gaps, ranks (rank_candidates "
    "with several ranks), kernels and ops, one file each.",
)
@click.option(
    "--export-format",
    type=click.Choice(["csv", "parquet"]),
    default="csv",
    show_default=True,
    help="File format for --export; parquet needs the pyarrow package.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Ranks read at once, each in its own process (default: one per core, at most one per "
    "rank); 1 reads them one after another in this process. With --scheduler local: the cluster's workers.",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="Run the per-rank work on Dask distributed: a scheduler's address (tcp://host:8786) or "
    "'local' for a LocalCluster here. Traces are read where they lie (a shared path or an fsspec "
    "URL such as s3://bucket/run/). Needs the dask extra.",
)
@click.option("--color/--no-color", default=None, help="Force or disable colour in terminal output.")
def report(
    run: str,
    ncu: Path | None,
    fmt: str,
    output: Path | None,
    top: int | None,
    rules_file: Path | None,
    gpu: str | None,
    min_headroom: float | None,
    min_share: float | None,
    max_shapes: int | None,
    step_marker: str | None,
    ranks: tuple[int, ...],
    plot: Path | None,
    export_dir: Path | None,
    export_format: str,
    workers: int | None,
    scheduler: str | None,
    color: bool | None,
) -> None:
    """Rank every op and fused region of a profile by whether a custom kernel would pay.

    RUN is a run directory written by `kerneltriage profile`, or a PyTorch profiler trace
    (.json / .json.gz) — add --ncu for Nsight Compute counters — or an Nsight Systems export
    (.sqlite / .nsys-rep).

    \b
    Examples:
      kerneltriage report runs/exp1
      kerneltriage report trace.json.gz --ncu counters.csv.gz
      kerneltriage report runs/exp1 --format json --top 20 --gpu H100-SXM
      kerneltriage report runs/exp1 --format html -o report.html
      kerneltriage report runs/exp1 --format csv -o candidates.csv
      kerneltriage report runs/exp1 --export tables/      # every table as CSV
      kerneltriage report traces/ --workers 8              # a folder of rank traces, 8 at once
      kerneltriage report s3://bucket/traces/ --scheduler tcp://head:8786
    """
    from kerneltriage import api

    _check_report_outputs(run, ncu, output, rules_file, plot, export_dir, export_format)
    # A bad rules file or threshold flag fails before the trace is read.
    rules = api.load_rules(
        rules_file, {"min_headroom": min_headroom, "min_share": min_share, "max_shapes": max_shapes}
    )
    interactive = sys.stderr.isatty() and output is None and fmt == "terminal"
    read: dict[str, Any] = {"ncu": ncu, "ranks": list(ranks) or None, "step_marker": step_marker}
    with Progress(interactive) as progress:
        if export_dir:
            # --export writes every rank's tables, so they are read here.
            reports, written = _reports_and_tables(
                run, read, rules, rules_file, gpu, export_dir, export_format, scheduler, progress
            )
        else:
            # Ranks read and reduced to their reports in parallel, or on Dask.
            reports = api.reports(
                run, rules=rules, gpu=gpu, workers=workers, scheduler=scheduler, progress=progress, **read
            )
    color = color if output is None else False
    emit(_render_reports(reports, fmt, top, str(run), color, bool(ranks)), output)
    if plot:
        _write_plot(plot, reports)
    if export_dir:
        click.echo(f"wrote {export_dir}/: {', '.join(path.name for path in written)}", err=True)


def _check_report_outputs(run, ncu, output, rules_file, plot, export_dir, export_format) -> None:
    """Every output is checked before any work, and none may be an input."""
    from kerneltriage import api
    from kerneltriage.outputs import check_outputs

    check_outputs({"-o": output, "--plot": plot}, [run, ncu, rules_file], {"--export": export_dir})
    if plot:
        from kerneltriage.render.roofline_chart import check_plot_path

        check_plot_path(plot)  # fail before any work, not after the report
    if export_dir:
        api.check_export_format(export_format)  # parquet without pyarrow: before any work


def _reports_and_tables(run, read, rules, rules_file, gpu, export_dir, export_format, scheduler, progress):
    """Every rank read in this process, reported, and its tables written to ``export_dir``:
    (reports, the files written)."""
    from kerneltriage import api
    from kerneltriage.errors import InputError

    if scheduler:
        raise InputError("--export reads the traces in this process; leave out --scheduler")
    profile = api.load(run, rules_file=rules_file, progress=progress, **read)
    reports = profile.reports(rules=rules, gpu=gpu, progress=progress)
    progress("writing the tables")
    return reports, api.export_tables(profile, reports, export_dir, export_format)


def _render_reports(reports: dict, fmt: str, top, run_ref: str, color, picked_ranks: bool) -> str:
    """One report as ``fmt``, or several ranks' with their summary."""
    from kerneltriage.render import render

    if len(reports) == 1:
        # A rank picked with --rank is named in the scaffold commands (ids are numbered per rank).
        (rank, one), *_ = reports.items()
        return render(one, fmt, top=top, run_ref=run_ref, color=color, rank=rank if picked_ranks else None)
    from kerneltriage.analysis.compare.ranks import summarize
    from kerneltriage.render.ranks_render import render_rank_reports

    return render_rank_reports(summarize(reports), reports, fmt, top=top, run_ref=run_ref, color=color)


def _write_plot(plot: Path, reports: dict) -> None:
    """The roofline chart of the first report, written whole or not at all."""
    from kerneltriage.outputs import atomic_path
    from kerneltriage.render.roofline_chart import save_roofline

    with atomic_path(plot) as tmp:
        save_roofline(next(iter(reports.values())), tmp)
    click.echo(f"wrote {plot}", err=True)
