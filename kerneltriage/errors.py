"""Exceptions raised by kerneltriage's core.

The core never prints or exits: it raises one of these. the command line (``cli/group.py``) turns them into a one-line
message and an exit code, so a user mistake never ends in a traceback.
"""

from __future__ import annotations


class KernelTriageError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        self.message = message
        self.path = path
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} ({self.hint})" if self.hint else text


class InputError(KernelTriageError):
    """Bad input from the user: a file that is not what it claims, a bad option value."""

    exit_code = 2


class TraceFormatError(InputError):
    """A trace file that cannot be read as a Kineto (PyTorch profiler) trace or nsys export."""


class CountersFormatError(InputError):
    """An Nsight Compute CSV that is not a ``--page raw`` export or lacks needed metrics."""


class RunDirError(InputError):
    """A run directory that is missing, incomplete or of an unknown schema version."""


class RulesError(InputError):
    """A rules or GPU-table YAML file that does not follow its schema."""


class UnknownGPUError(InputError):
    """The GPU named by the trace or ``--gpu`` is not in the GPU table."""


class OutputError(InputError):
    """An output the user named that cannot be written: a missing folder, a directory, a
    full disk, or a file the same command reads."""


class ToolError(KernelTriageError):
    """An external tool (ncu, nsys, the user's script) failed or is missing, or an optional
    package a command needs (triton, pyarrow) is not installed."""

    exit_code = 3


class KernelInputError(KernelTriageError, ValueError):
    """Unsupported input to a built-in kernel (device, dtype, shape)."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, a batch scheduler, ``kill``) while ``profile`` or ``verify`` runs,
    handled as Ctrl-C is: the children are stopped and what was measured is written."""
