"""``kerneltriage verify``: measure each fix's saving by re-running the run's recorded command,
baseline and fixed, in fresh processes without a profiler."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

from kerneltriage.cli.console import Progress

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.verify.trials import VerifyReporter


@click.command()
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
@click.option(
    "--start-together",
    is_flag=True,
    help="Start each round's runs at once, each held at its first CUDA use, and give them the GPU in "
    "turn: their start-ups (imports, the model built) overlap, their timed steps never do, so a budget "
    "holds more runs. GPU only; experimental, not yet measured against one-at-a-time runs.",
)
@click.option("--plan", "plan_only", is_flag=True, help="Print what would run and an estimate; run nothing.")
@click.option(
    "--by-hand", "by_hand", metavar="ID", help="Verify candidate ID with your fixed command after --."
)
def verify(
    run: Path,
    command: tuple[str, ...],
    candidates: str | None,
    repeats: int | None,
    max_repeats: int | None,
    budget: float | None,
    run_timeout: float | None,
    steps: int,
    warmup: int,
    loss_rtol: float,
    seed: int,
    start_together: bool,
    plan_only: bool,
    by_hand: str | None,
) -> None:
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
        together=start_together,
    )
    settings.max_repeats = max(settings.max_repeats, settings.repeats)
    ids = [c.strip() for c in candidates.split(",") if c.strip()] if candidates else None
    with Progress(sys.stderr.isatty()) as progress:
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
    # A VerifyReporter by its methods: subclassing it would import the trials at every start.
    data = run_verify(plan, manifest, cast("VerifyReporter", _VerifyReporter()))
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
