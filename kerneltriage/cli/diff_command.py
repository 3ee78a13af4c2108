"""``kerneltriage diff``: did the kernel pay? A run before and after a change, compared."""

from __future__ import annotations

from pathlib import Path

import click

from kerneltriage.cli.console import emit
from kerneltriage.cli.options import format_option, gpu_option, output_option, rules_option


@click.command()
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option(
    "--ncu-before", type=click.Path(path_type=Path), help="Counters for BEFORE when it is a bare trace."
)
@click.option(
    "--ncu-after", type=click.Path(path_type=Path), help="Counters for AFTER when it is a bare trace."
)
@format_option("kerneltriage.diff/1", "the matched candidates")
@output_option
@click.option("--top", type=click.IntRange(min=1), help="Show only the first N matched candidates.")
@rules_option
@gpu_option("for both sides")
@click.option(
    "--rank",
    type=int,
    default=None,
    help="For multi-rank runs: compare this rank (default: the one Nsight Compute profiled).",
)
def diff(
    before: Path,
    after: Path,
    ncu_before: Path | None,
    ncu_after: Path | None,
    fmt: str,
    output: Path | None,
    top: int | None,
    rules_file: Path | None,
    gpu: str | None,
    rank: int | None,
) -> None:
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
    emit(text, output)
