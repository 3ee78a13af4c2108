"""``kerneltriage profile``: run a training script under the PyTorch profiler, then Nsight
Compute on its hot kernels, and write a run directory for ``kerneltriage report``.

The command's many settings are ``profile.context.Options`` fields: click hands them over by
the fields' own names, so the command builds the options in one line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from kerneltriage.cli.options import check_step_marker, rules_option

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.profile.context import Reporter


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


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """click's ranges let NaN through (every comparison with NaN is false)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", ctx, param)
    return value


# Options that set ``profile.context.Options`` fields (by name; ``--no-ncu`` sets ``ncu``), in
# the order ``--help`` lists them.
_SESSION_OPTIONS = (
    click.option(
        "--out",
        "-o",
        type=click.Path(path_type=Path),
        help="Run directory to write (default runs/<script>-<time>).",
    ),
    click.option("--force", is_flag=True, help="Replace an existing run directory."),
    click.option(
        "--warmup",
        type=click.IntRange(min=0),
        default=3,
        show_default=True,
        help="Steps to skip first (compilation, autotuning, cudnn benchmarking).",
    ),
    click.option(
        "--steps", type=click.IntRange(min=1), default=3, show_default=True, help="Steps to record."
    ),
    click.option(
        "--timing-steps",
        type=click.IntRange(min=0),
        default=5,
        show_default=True,
        help="Right after the warm-up: at least this many steps with nothing installed (the step time the "
        "report uses; on a GPU 20 at least, more until their times settle), then this many under a GPU-only "
        "profiler (busy time), before the recorded steps; 0: time the recorded steps.",
    ),
    click.option(
        "--timing-processes",
        type=click.IntRange(min=1),
        default=3,
        show_default=True,
        help="Processes whose plain steps give the step time and its interval: phase 1 and N-1 more that run "
        "only the warm-up and plain steps (processes of one script differ by more than the steps of one do); "
        "more, up to --max-timing-processes, while the interval a run of the script falls in is wider than "
        "±3% of the step and their spread could still bring it near that. 1: phase 1 alone. Not for --cpu "
        "or torchrun jobs.",
    ),
    click.option(
        "--max-timing-processes",
        type=click.IntRange(min=1),
        default=None,
        help="The most timing processes when those so far disagree [default: 6, measurement.yaml's "
        "timing.max_processes]; equal to --timing-processes: exactly that many.",
    ),
    click.option(
        "--max-variable-launches",
        type=click.IntRange(min=1),
        default=256,
        show_default=True,
        help="Launches per step Nsight Compute profiles one by one, for kernels that run several sizes "
        "under one launch configuration (about 0.3 s each).",
    ),
    click.option(
        "--ncu-every-size",
        is_flag=True,
        help="Profile every launch configuration of the hot elementwise kernels. By default each "
        "instantiation gets one below L2 and one above it, and the other sizes get those counters "
        "scaled by threads (about 0.5 s saved a configuration).",
    ),
    click.option(
        "--ncu-every-counter",
        is_flag=True,
        help="Count the FLOPs of every hot kernel. By default the kernels memory-bound by what they "
        "compute (PyTorch's elementwise, copy, index, reduction, norm, softmax… kernels: "
        "kernel_classes.yaml, memory_bound) get their time and bytes in a pass of their own, without "
        "the instruction counters: one replay a launch instead of three (about 0.04 s instead of "
        "0.2-0.5 s).",
    ),
    click.option("--no-ncu", "no_ncu", is_flag=True, help="Timeline only: skip the Nsight Compute phase."),
    click.option(
        "--max-kernels",
        type=click.IntRange(min=1),
        default=64,
        show_default=True,
        help="At most this many distinct hot kernels go to Nsight Compute.",
    ),
    click.option(
        "--coverage",
        type=click.FloatRange(0.1, 1.0),
        callback=_finite,
        default=0.97,
        show_default=True,
        help="Profile the kernels covering this share of GPU time, counted by instantiation "
        "(each costs ncu about 0.2-0.4 s a launch configuration).",
    ),
    click.option(
        "--ncu-set",
        type=click.Choice(["roofline", "full"]),
        default="roofline",
        show_default=True,
        help="'full' adds every Nsight Compute section (slower; for the ncu GUI: RUN/ncu.ncu-rep).",
    ),
    click.option(
        "--ncu-rank",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="With torchrun: the rank whose kernels Nsight Compute profiles.",
    ),
    click.option(
        "--run-to-end",
        is_flag=True,
        help="Let the script finish instead of stopping after the recorded steps.",
    ),
    click.option(
        "--ncu-timeout",
        type=click.FloatRange(min=10),
        callback=_finite,
        default=900,
        show_default=True,
        help="Seconds each Nsight Compute pass may take; past it ncu is stopped and the timeline kept.",
    ),
    click.option(
        "--ncu-gpus",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="Nsight Compute on N GPUs at once [default: every visible GPU]: the hot kernels are shared among "
        "N processes of the script, one per GPU (CUDA_VISIBLE_DEVICES set to it, so the script's cuda:0 lands "
        "there), and their counters merged into the same files. For a single-process script that fits on one "
        "GPU; torchrun jobs and scripts that use several GPUs stay on one. 1: one process at a time, as on one GPU.",
    ),
    click.option(
        "--timeline",
        type=click.Choice(["torch", "nsys"]),
        default="torch",
        show_default=True,
        help="Phase 1 under the PyTorch profiler, or Nsight Systems (falls back to torch when nsys cannot report).",
    ),
    click.option(
        "--step-marker",
        callback=check_step_marker,
        help="Regex on record_function names that mark steps; records the whole run.",
    ),
    click.option(
        "--cpu", is_flag=True, help="Dry run without a GPU: CPU ops only (checks steps and module hooks)."
    ),
    click.option(
        "--calibrate",
        is_flag=True,
        help="Measure this GPU's ceilings first (copy, matmul, FMA) and record them in the run.",
    ),
)


def _session_options(command: Any) -> Any:
    """``_SESSION_OPTIONS`` as if stacked as decorators, the first on top."""
    for option in reversed(_SESSION_OPTIONS):
        command = option(command)
    return command


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_session_options
@click.option(
    "--apply",
    "apply_spec",
    metavar="RUN[:C1,C3]",
    help="Profile RUN's recorded command again with fixes applied by verify's runner: every fix "
    "`kerneltriage verify` verified, or the candidates named. Takes no COMMAND; --out defaults to RUN-applied.",
)
@rules_option
@click.option("-q", "--quiet", is_flag=True, help="Do not echo the script's output.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def profile(command: tuple[str, ...], apply_spec: str | None, quiet: bool, **session: Any) -> None:
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
    from kerneltriage.profile.context import Options
    from kerneltriage.profile.session import run_profile

    if apply_spec and command:
        raise click.UsageError("--apply profiles RUN's recorded command: give no COMMAND with it")
    if not apply_spec and not command:
        raise click.UsageError("Missing argument 'COMMAND...'.")

    most = session.get("max_timing_processes")
    if most is not None and most < session["timing_processes"]:
        raise click.UsageError(
            f"--max-timing-processes {most} is fewer than --timing-processes {session['timing_processes']}: "
            "the most processes cannot be fewer than the least"
        )
    options = Options(ncu=not session.pop("no_ncu"), **session)
    # A Reporter by its methods: subclassing it would import the profiler at every start.
    reporter = cast("Reporter", _ProfileReporter(quiet))
    if apply_spec:
        from kerneltriage.ladder import profile_applied

        result = profile_applied(apply_spec, options, reporter)
    else:
        result = run_profile(list(command), options, reporter)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    phases = ", ".join(f"{name} {s:.1f} s" for name, s in result.manifest.phases.seconds().items())
    click.echo(f"wrote {result.run_dir} ({phases})")
    if options.cpu:  # no GPU kernels: nothing for `report` to place on a roofline
        click.echo("next: a --cpu dry run records no GPU kernels: profile on a GPU for a report")
    else:
        click.echo(f"next: kerneltriage report {result.run_dir}")
    if result.manifest.parent_run:
        click.echo(f"compare: kerneltriage diff {result.manifest.parent_run} {result.run_dir}")
