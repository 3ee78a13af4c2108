"""Options several commands share (output format and file, GPU, rules, counters, step marker)
and the checks click runs on their values before any work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

Decorator = Callable[[Any], Any]  # what click.option returns: it adds the option to a command


def format_option(schema: str, csv: str = "the candidates table") -> Decorator:
    """``--format``, naming the JSON schema and what the CSV holds."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["terminal", "markdown", "json", "csv", "html"]),
        default="terminal",
        show_default=True,
        help=f"Output format; json follows the schema {schema}, csv is {csv} (README).",
    )


def gpu_option(note: str = "") -> Decorator:
    """``--gpu``, with the command's own ``note`` on its help."""
    return click.option(
        "--gpu",
        callback=_not_empty,
        help="GPU table entry to use instead of the trace's device name, e.g. H100-SXM, H200, A100-80GB"
        + (f" ({note})." if note else "."),
    )


def check_step_marker(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--step-marker`` that is not a linear-time regular expression fails before any work."""
    if value is not None:
        from kerneltriage.analysis.timeline.attribution import step_marker_pattern

        step_marker_pattern(value)
    return value


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An empty value (``--gpu ""``, an unset shell variable) is refused, not ignored."""
    if value is not None and not value.strip():
        from kerneltriage.errors import InputError

        raise InputError(f"{param.opts[0]} is empty; give a GPU table key, e.g. H100-SXM")
    return value


output_option = click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Write to this file instead of standard output. An existing file is overwritten (replaced "
    "whole once the output is complete); a file the command reads is refused.",
)
rules_option = click.option(
    "--rules",
    "rules_file",
    type=click.Path(path_type=Path),
    help="A rules YAML merged over the shipped kerneltriage/data/rules/default.yaml (thresholds, op classes, recommendations).",
)
ncu_option = click.option(
    "--ncu",
    type=click.Path(path_type=Path),
    help="Nsight Compute counters for a bare trace: 'ncu --csv --page raw' export (.csv, .csv.gz) "
    "or a .ncu-rep (needs ncu on PATH). Overrides a run directory's own ncu.csv.gz.",
)
