"""What the commands write besides their own lines: the rendered text (to standard output or a
file, whole or not at all) and a status line on stderr while they read and analyse."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click


class Progress:
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


def emit(text: str, output: Path | None) -> None:
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
