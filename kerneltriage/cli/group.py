"""The command group's class: every command's core errors reach click here, and only here.

A core error (``KernelTriageError``) becomes a one-line message and its exit code: 2 for bad
input, 3 for a failing external tool, 1 otherwise; Ctrl-C exits 130. An optional package a
command needs and the install lacks is named with the pip command that adds it (exit 3).
"""

from __future__ import annotations

import os
import sys

import click

from kerneltriage.errors import KernelTriageError


class _Failure(click.ClickException):
    """A core error on its way to click: one line on stderr, the error's exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click's default is class-wide; each error has its own

    def show(self, file=None) -> None:
        click.echo(f"kerneltriage: error: {self.format_message()}", err=True)


class CommandGroup(click.Group):
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
