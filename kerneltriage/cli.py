"""The command line: parse, call the core, render. Nothing else lives here.

Core errors (``KernelTriageError``) become a one-line message and their exit code:
2 for bad input, 3 for a failing external tool, 1 otherwise; Ctrl-C exits 130.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

import click

from kerneltriage import __version__
from kerneltriage.errors import KernelTriageError


class _Failure(click.ClickException):
    """A core error on its way to click: one line on stderr, the error's exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click's default is class-wide; each error has its own

    def show(self, file=None) -> None:
        click.echo(f"kerneltriage: error: {self.format_message()}", err=True)


class _Main(click.Group):
    """The command group; every command's core errors reach click here, and only here."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            # Ctrl-C: the message is out; skip the interpreter's teardown of a large analysis
            # (a second or more) so the shell gets its prompt back at once. Only as the real
            # program: under click's test runner stderr is not the process's own.
            if exc.code == 130 and sys.stderr is sys.__stderr__:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(130)
            raise

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KernelTriageError as exc:
            raise _Failure(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise _Failure("interrupted", 130) from None
        except BrokenPipeError:  # `kerneltriage report … | head`
            raise click.exceptions.Exit(0) from None
        except (OSError, RecursionError, MemoryError) as exc:
            # The last net under the core's own checks: still one line, naming the file.
            raise _Failure(_environment_message(exc), 2) from None
        except ModuleNotFoundError as exc:  # an optional package a command needs: exit 3
            package = (exc.name or "").partition(".")[0]
            if package not in _OPTIONAL_PACKAGES:
                raise
            raise _Failure(
                f"this command needs the {package} package, which is not installed "
                f"(pip install {_OPTIONAL_PACKAGES[package]})",
                3,
            ) from None


def _environment_message(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        from kerneltriage.inputs import os_reason

        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{os_reason(exc)}"
    if isinstance(exc, RecursionError):
        return "an input is nested too deeply to be read (a JSON or YAML file of thousands of levels?)"
    return "out of memory: an input asks for more memory than this machine has (a corrupt size?)"


# Packages some commands need and the base install lacks -> what to install.
_OPTIONAL_PACKAGES = {
    "torch": "torch",
    "triton": "triton",
    "pyarrow": "pyarrow",
    "dask": "'kerneltriage[dask]'",
    "distributed": "'kerneltriage[dask]'",
    "fsspec": "'kerneltriage[dask]'",
}


class _Progress:
    """Status line on stderr while reading and analysing (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.status = None
        if enabled:
            from rich.console import Console

            self.status = Console(stderr=True).status("starting")

    def __enter__(self):
        if self.status:
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status:
            self.status.__exit__(*exc)

    def __call__(self, message: str) -> None:
        if self.status:
            self.status.update(message)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kerneltriage")
def main() -> None:
    """Decide whether a custom GPU kernel is worth writing.

    A kernel pays only when three conditions hold for an op: HEADROOM (the profiler shows it
    far below its roofline ceiling), HOTNESS (it is a large share of step time) and SHAPE
    STABILITY (it runs on one or a few shapes). kerneltriage measures all three.

    \b
    Typical session:
      kerneltriage profile -- python train.py --lr 3e-4     # writes runs/<name>/
      kerneltriage report runs/<name>                       # ranked write-or-skip verdicts
      kerneltriage scaffold runs/<name> C1 --out kernels/c1 # a Triton kernel package to start from
    """


# --- options shared by several commands --------------------------------------------------


def _format_option(schema: str, csv: str = "the candidates table"):
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["terminal", "markdown", "json", "csv", "html"]),
        default="terminal",
        show_default=True,
        help=f"Output format; json follows the schema {schema}, csv is {csv} (README).",
    )


def _gpu_option(note: str = ""):
    return click.option(
        "--gpu",
        callback=_not_empty,
        help="GPU table entry to use instead of the trace's device name, e.g. H100-SXM, H200, A100-80GB"
        + (f" ({note})." if note else "."),
    )


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """click's ranges let NaN through (every comparison with NaN is false)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", ctx, param)
    return value


def _step_marker(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--step-marker`` that is not a linear-time regular expression fails before any work."""
    if value is not None:
        from kerneltriage.analysis.attribution import step_marker_pattern

        step_marker_pattern(value)
    return value


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An empty value (``--gpu ""``, an unset shell variable) is refused, not ignored."""
    if value is not None and not value.strip():
        from kerneltriage.errors import InputError

        raise InputError(f"{param.opts[0]} is empty; give a GPU table key, e.g. H100-SXM")
    return value


_output_option = click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Write to this file instead of standard output. An existing file is overwritten (replaced "
    "whole once the output is complete); a file the command reads is refused.",
)
_rules_option = click.option(
    "--rules",
    "rules_file",
    type=click.Path(path_type=Path),
    help="A rules YAML merged over the shipped kerneltriage/data/rules/default.yaml (thresholds, op classes, recommendations).",
)
_ncu_option = click.option(
    "--ncu",
    type=click.Path(path_type=Path),
    help="Nsight Compute counters for a bare trace: 'ncu --csv --page raw' export (.csv, .csv.gz) "
    "or a .ncu-rep (needs ncu on PATH). Overrides a run directory's own ncu.csv.gz.",
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


# --- report ---------------------------------------------------------------------------------


@main.command()
@click.argument("run", type=click.Path())  # a str: a URL's "//" must survive
@_ncu_option
@_format_option("kerneltriage.report/1")
@_output_option
@click.option("--top", type=click.IntRange(min=1), help="Show only the first N candidates.")
@_rules_option
@_gpu_option()
@_threshold_option("--min-headroom", float, "Headroom threshold (measured ÷ ceiling time), at least 1.")
@_threshold_option("--min-share", click.FloatRange(0.0, 1.0), "Hotness threshold as a share of step time.")
@_threshold_option(
    "--max-shapes", click.IntRange(min=1), "Shape-stability threshold: distinct shape signatures."
)
@click.option(
    "--step-marker",
    callback=_step_marker,
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
    run,
    ncu,
    fmt,
    output,
    top,
    rules_file,
    gpu,
    min_headroom,
    min_share,
    max_shapes,
    step_marker,
    ranks,
    plot,
    export_dir,
    export_format,
    workers,
    scheduler,
    color,
):
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
    read = {"ncu": ncu, "ranks": list(ranks) or None, "step_marker": step_marker}
    with _Progress(interactive) as progress:
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
    _emit(_render_reports(reports, fmt, top, str(run), color, bool(ranks)), output)
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
    from kerneltriage.analysis.ranks import summarize
    from kerneltriage.render.ranks_render import render_rank_reports

    return render_rank_reports(summarize(reports), reports, fmt, top=top, run_ref=run_ref, color=color)


def _write_plot(plot: Path, reports: dict) -> None:
    """The roofline chart of the first report, written whole or not at all."""
    from kerneltriage.outputs import atomic_path
    from kerneltriage.render.roofline_chart import save_roofline

    with atomic_path(plot) as tmp:
        save_roofline(next(iter(reports.values())), tmp)
    click.echo(f"wrote {plot}", err=True)


# --- diff -----------------------------------------------------------------------------------


@main.command()
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option(
    "--ncu-before", type=click.Path(path_type=Path), help="Counters for BEFORE when it is a bare trace."
)
@click.option(
    "--ncu-after", type=click.Path(path_type=Path), help="Counters for AFTER when it is a bare trace."
)
@_format_option("kerneltriage.diff/1", "the matched candidates")
@_output_option
@click.option("--top", type=click.IntRange(min=1), help="Show only the first N matched candidates.")
@_rules_option
@_gpu_option("for both sides")
@click.option(
    "--rank",
    type=int,
    default=None,
    help="For multi-rank runs: compare this rank (default: the one Nsight Compute profiled).",
)
def diff(before, after, ncu_before, ncu_after, fmt, output, top, rules_file, gpu, rank):
    """Did the kernel pay? Compare a run before and after a change.

    BEFORE and AFTER are run directories or traces, as `report` accepts. For every candidate
    the BEFORE report predicted a saving for, the diff shows the saving realized in AFTER,
    matched by what the op computes (a naive attention region before matches SDPA or flash
    attention after), plus new hot spots, regressions and warnings when the runs differ.

    \b
    Examples:
      kerneltriage diff runs/before runs/after
      kerneltriage diff runs/before runs/after --format markdown > pr-comment.md
      kerneltriage diff runs/before runs/after --format html -o diff.html
    """
    from kerneltriage import api
    from kerneltriage.outputs import check_outputs
    from kerneltriage.render.diff_render import render_diff

    check_outputs({"-o": output}, [before, after, ncu_before, ncu_after, rules_file])
    result = api.diff(
        before, after, rank=rank, ncu_before=ncu_before, ncu_after=ncu_after, rules_file=rules_file, gpu=gpu
    )
    text = render_diff(result, fmt, top)
    _emit(text, output)


def _emit(text: str, output: Path | None) -> None:
    """Write a rendered report to ``output``, or to stdout when none was given."""
    if output:
        from kerneltriage.outputs import write_atomic

        write_atomic(output, text)
        click.echo(f"wrote {output}", err=True)
        return
    try:
        click.echo(text, nl=False)
    except BrokenPipeError:
        raise
    except OSError as exc:  # a full disk behind `> file`, /dev/full
        from kerneltriage.errors import OutputError
        from kerneltriage.inputs import os_reason

        # What is still buffered would fail again at exit, with a traceback of its own.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise OutputError(f"cannot write to standard output ({os_reason(exc)})") from None


# --- profile / calibrate --------------------------------------------------------------------


class _ProfileReporter:
    """Renders a profiling session: phase lines, the script's output, an ncu progress bar."""

    def __init__(self, quiet: bool):
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.progress: Any = None  # a rich Progress bar while ncu runs
        self.task: Any = None

    def phase(self, name: str, detail: str = "") -> None:
        self.console.print(f"[bold]kerneltriage[/] {name}: {detail}")

    def phase_done(self, name: str, seconds: float, detail: str = "") -> None:
        self._close_bar()
        self.console.print(
            f"[bold]kerneltriage[/] {name} done in {seconds:.1f} s" + (f" — {detail}" if detail else "")
        )

    def output(self, line: str, stream: str) -> None:
        if not self.quiet:
            click.echo(line, err=stream == "stderr")

    def ncu_progress(self, done: int, total: int, kernel: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self.progress is None:
            self.progress = Progress(
                TextColumn("ncu"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task("", total=total)
        self.progress.update(self.task, completed=done, total=max(total, done), description=kernel[:40])

    def _close_bar(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def warn(self, message: str) -> None:
        self._close_bar()
        self.console.print(f"[yellow]warning:[/] {message}", markup=True)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Run directory to write (default runs/<script>-<time>).",
)
@click.option("--force", is_flag=True, help="Replace an existing run directory.")
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Steps to skip first (compilation, autotuning, cudnn benchmarking).",
)
@click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True, help="Steps to record.")
@click.option(
    "--timing-steps",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Right after the warm-up: at least this many steps with nothing installed (the step time the "
    "report uses; on a GPU 20 at least, more until their times settle), then this many under a GPU-only "
    "profiler (busy time), before the recorded steps; 0: time the recorded steps.",
)
@click.option(
    "--timing-processes",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Processes whose plain steps give the step time and its interval: phase 1 and N-1 more that run "
    "only the warm-up and plain steps (processes of one script differ by more than the steps of one do). "
    "1: phase 1 alone. Not for --cpu or torchrun jobs.",
)
@click.option(
    "--max-variable-launches",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Launches per step Nsight Compute profiles one by one, for kernels that run several sizes "
    "under one launch configuration (about 0.3 s each).",
)
@click.option("--no-ncu", "no_ncu", is_flag=True, help="Timeline only: skip the Nsight Compute phase.")
@click.option(
    "--max-kernels",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="At most this many distinct hot kernels go to Nsight Compute.",
)
@click.option(
    "--coverage",
    type=click.FloatRange(0.1, 1.0),
    callback=_finite,
    default=0.95,
    show_default=True,
    help="Profile the kernels covering this share of GPU time.",
)
@click.option(
    "--ncu-set",
    type=click.Choice(["roofline", "full"]),
    default="roofline",
    show_default=True,
    help="'full' adds every Nsight Compute section (slower; for the ncu GUI: RUN/ncu.ncu-rep).",
)
@click.option(
    "--ncu-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="With torchrun: the rank whose kernels Nsight Compute profiles.",
)
@click.option(
    "--run-to-end", is_flag=True, help="Let the script finish instead of stopping after the recorded steps."
)
@click.option(
    "--ncu-timeout",
    type=click.FloatRange(min=10),
    callback=_finite,
    default=900,
    show_default=True,
    help="Seconds each Nsight Compute pass may take; past it ncu is stopped and the timeline kept.",
)
@click.option(
    "--timeline",
    type=click.Choice(["torch", "nsys"]),
    default="torch",
    show_default=True,
    help="Phase 1 under the PyTorch profiler, or Nsight Systems (falls back to torch when nsys cannot report).",
)
@click.option(
    "--step-marker",
    callback=_step_marker,
    help="Regex on record_function names that mark steps; records the whole run.",
)
@click.option(
    "--cpu", is_flag=True, help="Dry run without a GPU: CPU ops only (checks steps and module hooks)."
)
@click.option(
    "--calibrate",
    "calibrate_first",
    is_flag=True,
    help="Measure this GPU's ceilings first (copy, matmul, FMA) and record them in the run.",
)
@click.option(
    "--apply",
    "apply_spec",
    metavar="RUN[:C1,C3]",
    help="Profile RUN's recorded command again with fixes applied by verify's runner: every fix "
    "`kerneltriage verify` verified, or the candidates named. Takes no COMMAND; --out defaults to RUN-applied.",
)
@_rules_option
@click.option("-q", "--quiet", is_flag=True, help="Do not echo the script's output.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def profile(
    out,
    force,
    warmup,
    steps,
    timing_steps,
    timing_processes,
    max_variable_launches,
    no_ncu,
    max_kernels,
    coverage,
    ncu_set,
    ncu_rank,
    run_to_end,
    ncu_timeout,
    timeline,
    step_marker,
    cpu,
    calibrate_first,
    rules_file,
    quiet,
    command,
    apply_spec,
):
    """Profile a training script and write a run directory for `kerneltriage report`.

    Runs COMMAND twice: under the PyTorch profiler (time shares, ops, shapes, modules) and
    then under Nsight Compute on the hot kernels only (bytes, FLOPs, duration). The script
    runs unchanged; steps are found from optimizer steps or `kerneltriage.step()`.

    \b
    Examples:
      kerneltriage profile -- python train.py --lr 3e-4
      kerneltriage profile --warmup 3 --steps 3 --out runs/exp1 -- python -m mypkg.train
      kerneltriage profile --no-ncu -- python train.py          # timeline only
      kerneltriage profile -- torchrun --nproc-per-node 2 train.py --ddp
      kerneltriage report runs/exp1
      kerneltriage profile --apply runs/exp1             # again, with the verified fixes
    """
    from kerneltriage.profile.session import Options, run_profile

    if apply_spec and command:
        raise click.UsageError("--apply profiles RUN's recorded command: give no COMMAND with it")
    if not apply_spec and not command:
        raise click.UsageError("Missing argument 'COMMAND...'.")

    options = Options(
        out=out,
        force=force,
        warmup=warmup,
        steps=steps,
        timing_steps=timing_steps,
        timing_processes=timing_processes,
        max_variable_launches=max_variable_launches,
        ncu=not no_ncu,
        max_kernels=max_kernels,
        coverage=coverage,
        ncu_set=ncu_set,
        run_to_end=run_to_end,
        step_marker=step_marker,
        cpu=cpu,
        ncu_rank=ncu_rank,
        calibrate=calibrate_first,
        ncu_timeout=ncu_timeout,
        timeline=timeline,
        rules_file=rules_file,
    )
    if apply_spec:
        from kerneltriage.ladder import profile_applied

        result = profile_applied(apply_spec, options, _ProfileReporter(quiet))
    else:
        result = run_profile(list(command), options, _ProfileReporter(quiet))
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    phases = ", ".join(f"{name} {s:.1f} s" for name, s in result.manifest.phases.seconds().items())
    click.echo(f"wrote {result.run_dir} ({phases})")
    if cpu:  # no GPU kernels: nothing for `report` to place on a roofline
        click.echo("next: a --cpu dry run records no GPU kernels: profile on a GPU for a report")
    else:
        click.echo(f"next: kerneltriage report {result.run_dir}")
    if result.manifest.parent_run:
        click.echo(f"compare: kerneltriage diff {result.manifest.parent_run} {result.run_dir}")


@main.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--candidates", help="Comma-separated candidate ids (default: every actionable one), e.g. C1,C3."
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    help="Runs of each side before a status is judged, after one uncounted warm-up run [default: 3].",
)
@click.option(
    "--max-repeats",
    type=click.IntRange(min=1),
    help="Runs of each side at most: a fix whose status is still inconclusive gets more runs [default: 10].",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0.0, min_open=True),
    help="Minutes for all the runs: no round starts that would end past it [default: 20].",
)
@click.option(
    "--run-timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    help="Minutes one run may take (default: 4× its estimate, compilation included, 3 min at least); "
    "a fix past it is reported as not measured within the budget, the others still run.",
)
@click.option(
    "--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Timed steps per run."
)
@click.option(
    "--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed steps first."
)
@click.option(
    "--loss-rtol",
    type=click.FloatRange(min=0.0, min_open=True),
    default=0.005,
    show_default=True,
    help="Relative tolerance on the first steps' losses; beyond it a fix changes the model's results.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed set before the script runs.")
@click.option("--plan", "plan_only", is_flag=True, help="Print what would run and an estimate; run nothing.")
@click.option(
    "--by-hand", "by_hand", metavar="ID", help="Verify candidate ID with your fixed command after --."
)
def verify(
    run,
    command,
    candidates,
    repeats,
    max_repeats,
    budget,
    run_timeout,
    steps,
    warmup,
    loss_rtol,
    seed,
    plan_only,
    by_hand,
):
    """Measure each fix's saving: re-run the run's recorded command, baseline and fixed.

    Fresh processes, no profiler: one warm-up run (not counted), then the baseline and each
    candidate's fix (applied by the runner to the unchanged script), interleaved, REPEATS times
    each. Each run's steps are cut to their steady state; the realized saving gets a 95%
    interval over runs and steps: verified when it lies at or above half the prediction,
    refuted below it, inconclusive when it straddles; an inconclusive fix gets more runs, up to
    MAX-REPEATS, within the BUDGET. The first steps' losses are compared. Results go to
    RUN/verify.json; `kerneltriage report RUN` then shows predicted beside realized savings.

    \b
    Examples:
      kerneltriage verify runs/exp1 --plan
      kerneltriage verify runs/exp1 --candidates C1,C3 --repeats 3 --steps 20
      kerneltriage verify runs/exp1 --by-hand C2 -- python train_fixed.py --lr 3e-4
    """
    from kerneltriage.errors import InputError
    from kerneltriage.render.verify_text import result_lines
    from kerneltriage.verify.plan import Settings, describe
    from kerneltriage.verify.trials import load_plan, run_verify

    if by_hand and not command:
        raise InputError("--by-hand needs your fixed command after --, e.g. -- python train_fixed.py")
    if command and not by_hand:
        raise InputError(f"unexpected arguments {' '.join(command)!r}: a command goes with --by-hand ID")
    if by_hand and candidates:
        raise InputError("--by-hand verifies one candidate; leave out --candidates")
    # Defaults not given come from the shipped measurement.yaml.
    settings = Settings.defaults(
        repeats=repeats,
        warmup=max(warmup, 1),
        steps=steps,
        loss_steps=min(3, max(warmup, 1)),
        loss_rtol=loss_rtol,
        seed=seed,
        max_repeats=max(max_repeats, repeats or 1) if max_repeats else None,
        budget_s=budget * 60.0 if budget else None,
        run_timeout_s=run_timeout * 60.0 if run_timeout else None,
    )
    settings.max_repeats = max(settings.max_repeats, settings.repeats)
    ids = [c.strip() for c in candidates.split(",") if c.strip()] if candidates else None
    with _Progress(sys.stderr.isatty()) as progress:
        progress("reading the run's report")
        plan, manifest = load_plan(
            str(run),
            settings,
            ids=ids,
            by_hand=(by_hand, list(command)) if by_hand else None,
            progress=progress,
        )
    text = "\n".join(describe(plan))
    if plan_only:
        click.echo(text)
        return
    click.echo(text, err=True)
    data = run_verify(plan, manifest, _VerifyReporter())
    click.echo("\n".join(result_lines(data)))
    click.echo(f"wrote {Path(run) / 'verify.json'}", err=True)


class _VerifyReporter:
    """One line per run on stderr, with the time left."""

    def run_started(self, label: str, index: int, total: int, remaining: float | None = None) -> None:
        left = f" (about {remaining / 60:.1f} min left)" if remaining is not None else ""
        click.echo(f"[{index}/{total}]{left} {label} …", err=True, nl=False)

    def run_done(self, label: str, result: dict, seconds: float) -> None:
        import statistics

        times = result.get("step_ms") or []
        if result.get("status") == "ok" and times:
            said = f"median {statistics.median(times):.2f} ms over {len(times)} steps"
        else:
            said = f"{result.get('status')}: {result.get('error')}"
        click.echo(f" {seconds:.1f} s, {said}", err=True)


@main.command()
@click.option("--quick", is_flag=True, help="Smaller problems and fewer repetitions (a few seconds).")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device index.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurement as JSON.")
@click.option(
    "--run",
    "run_path",
    type=click.Path(exists=True, path_type=Path),
    help="Also measure this run's own GEMM shapes (the 8 with the most FLOPs) and record the "
    "result in the run's manifest when the run was made on this GPU.",
)
def calibrate(quick, device, as_json, run_path):
    """Measure this GPU's ceilings: copy bandwidth, bf16/fp16/tf32 matmul and fp32 FMA peaks.

    A matmul peak is the best of several shapes (square 4096 and 8192, a long K, and with
    --run the run's own GEMMs): one long run of one shape throttles the clock below what a
    training step's GEMMs reach. The result is stored per GPU
    (~/.cache/kerneltriage/calibration/); `profile` records it in each run's manifest and
    `report` then prefers it to the datasheet figures. Needs torch with CUDA and a GPU.

    \b
    Examples:
      kerneltriage calibrate                       # this machine's GPU 0, then every later profile uses it
      kerneltriage calibrate --quick               # smaller problems, fewer repetitions
      kerneltriage calibrate --device 1 --json     # another GPU, the measurement as JSON
      kerneltriage profile --calibrate -- python train.py   # measure first, record it in the run
      kerneltriage calibrate --run runs/exp1       # add that run's GEMM shapes, record in the run
    """
    import json

    from kerneltriage.profile import calibrate as cal

    shapes = cal.run_gemm_shapes(run_path) if run_path else None
    result = cal.measure(device, quick, shapes)
    if run_path:
        result["run"] = str(run_path)
    path = cal.save(result)
    recorded = cal.record_in_run(run_path, result) if run_path else None
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        peaks = ", ".join(f"{k} {v:g}" for k, v in result["peak_tflops"].items())
        click.echo(f"{result['gpu']}: copy {result['hbm_gbs']:g} GB/s; peak TFLOP/s: {peaks}")
        for precision, best in cal.best_shapes(result).items():
            click.echo(
                f"  {precision}: best {best['tflops']:g} TFLOP/s at {best['shape']} ({best['from']} shape)"
            )
        click.echo(f"saved {path}")
    if recorded:
        click.echo(recorded, err=as_json)


# --- scaffold -------------------------------------------------------------------------------


class _KindOption(click.Option):
    """``--kind``, its help read from the scaffold families' registry when help is shown (the
    registry's import is too slow for every start)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from kerneltriage.scaffold import kinds_text

        self.help = f"Without a run, the op class to scaffold, by template: {kinds_text()}."
        return super().get_help_record(ctx)


@main.command()
@click.argument("run", required=False, type=click.Path(path_type=Path))
@click.argument("candidate", required=False)
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder for the package (created; refused when it exists and is not empty, unless --force).",
)
@click.option(
    "--force", is_flag=True, help="Write into a non-empty --out, replacing the scaffold's own files."
)
@click.option("--kind", cls=_KindOption)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    help="With --kind: one observed shape, e.g. 16384x4096 (attention BxHxSxD, gemm MxNxK); repeatable.",
)
@click.option("--dtype", help="With --kind: bf16 (default), fp16 or fp32.")
@_gpu_option("with --kind: default H100-SXM")
@_ncu_option
@_rules_option
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    help="For a multi-rank run: the rank whose candidate to scaffold (ids are numbered per rank; "
    "the report's commands name it). Default: the only rank, else the one Nsight Compute profiled.",
)
def scaffold(run, candidate, out, force, kind, shapes, dtype, gpu, ncu, rules_file, rank):
    """Write a Triton kernel package for a report candidate: kernel.py, reference.py,
    test_kernel.py, bench.py and README.md, correct and benchmarked from the start.

    RUN and CANDIDATE are a run (or trace) and a candidate id from `kerneltriage report RUN`.
    Without a run, --kind with --shape (and --dtype) scaffolds an op class directly.

    \b
    Examples:
      kerneltriage scaffold runs/exp1 C3 --out kernels/c3
      kerneltriage scaffold runs/ddp C2 --rank 1 --out kernels/c2   # a rank of a torchrun run
      kerneltriage scaffold --kind rmsnorm --shape 16384x4096 --dtype bf16 --out kernels/my_norm
      cd kernels/c3 && TRITON_INTERPRET=1 pytest -q && python bench.py
    """
    from kerneltriage.errors import InputError
    from kerneltriage.outputs import check_outputs
    from kerneltriage.scaffold import scaffold_candidate, scaffold_kind

    check_outputs({}, [run, ncu, rules_file], {"--out": out})

    if kind:
        if run is not None or candidate is not None:
            raise InputError("give either RUN CANDIDATE or --kind with --shape, not both")
        if rank is not None:
            raise InputError("--rank goes with RUN CANDIDATE, not --kind")
        result = scaffold_kind(kind, list(shapes), dtype, out, force=force, gpu=gpu)
    else:
        if run is None or candidate is None:
            raise InputError(
                "expected RUN and CANDIDATE (kerneltriage scaffold runs/exp1 C3 --out kernels/c3), "
                "or --kind with --shape"
            )
        if shapes or dtype:
            raise InputError("--shape and --dtype go with --kind")
        result = scaffold_candidate(
            run, candidate, out, force=force, ncu=ncu, rules_file=rules_file, gpu=gpu, rank=rank
        )
    for message in result.messages:
        click.echo(f"note: {message}", err=True)
    names = ", ".join(path.name for path in result.files)
    click.echo(f"wrote {result.out}/: {names} ({result.template} template, `{result.name}`)")
    click.echo(f"next: cd {result.out} && TRITON_INTERPRET=1 pytest -q && python bench.py")


if __name__ == "__main__":  # pragma: no cover
    main()
