"""The user's command, and the same command with kerneltriage's runner in front of the script.

``python train.py --lr 3e-4``         → ``python -m kerneltriage.profile.runner train.py --lr 3e-4``
``python -m pkg.train --lr 3e-4``     → ``python -m kerneltriage.profile.runner -m pkg.train --lr 3e-4``
``torchrun --nproc-per-node 2 t.py``  → ``torchrun --nproc-per-node 2 -m kerneltriage.profile.runner t.py``

The runner executes the script exactly as Python would (``runpy``, ``__main__``, same argv),
with the profiler's hooks installed first; child processes the script starts (compile workers,
data loaders) are untouched.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from kerneltriage.errors import InputError

RUNNER = "kerneltriage.profile.runner"
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?(\.exe)?$")
_TORCHRUN = re.compile(r"^torchrun(\.exe)?$")
# Interpreter options that take a value (python -X opt, -W arg, --check-hash-based-pycs mode).
_PY_VALUE_OPTS = {"-X", "-W", "--check-hash-based-pycs"}
# torchrun flags that take no value; every other option takes one (unless written --opt=value).
_TORCHRUN_FLAGS = {
    "--standalone",
    "--no-python",
    "--no_python",
    "--run-path",
    "--run_path",
    "--module",
    "-m",
    "--redirects-none",
    "--no-local-addr",
    "--use-env",
    "--use_env",
}


@dataclass
class Command:
    """A parsed training command: how it starts (python or torchrun) and what it runs."""

    argv: list[str]
    launcher: str  # "python" or "torchrun"
    prefix: list[str]  # interpreter/launcher and its options
    target: list[str]  # ["script.py", args...] or ["-m", "module", args...]

    @property
    def distributed(self) -> bool:
        return self.launcher == "torchrun"

    @property
    def script(self) -> str:
        return self.target[1] if self.target[0] == "-m" else self.target[0]

    @property
    def world_size(self) -> int | None:
        """Processes a single-node torchrun starts (``--nproc-per-node N``), when it says."""
        if not self.distributed:
            return None
        nodes, procs = 1, None
        for i, arg in enumerate(self.prefix):
            name, _, value = arg.partition("=")
            if not value and i + 1 < len(self.prefix):
                value = self.prefix[i + 1]
            if name in ("--nproc-per-node", "--nproc_per_node") and value.isdigit():
                procs = int(value)
            elif name == "--nnodes" and value.isdigit():
                nodes = int(value)
        return procs * nodes if procs else None

    def with_runner(self) -> list[str]:
        """The command with kerneltriage's runner in front of the script or module."""
        return [*self.prefix, "-m", RUNNER, *self.target]


def parse_command(argv: list[str]) -> Command:
    """Recognise ``python …``, ``python -m …``, ``torchrun …`` and ``python -m torch.distributed.run …``."""
    if not argv:
        raise InputError(
            "no command given: put the training command after '--', e.g. "
            "kerneltriage profile -- python train.py"
        )
    exe = os.path.basename(argv[0])
    if _TORCHRUN.match(exe):
        prefix, target = _split_torchrun(argv, 1)
        return Command(argv, "torchrun", prefix, target)
    if not _PYTHON.match(exe):
        hint = "write it as: python " + " ".join(argv) if argv[0].endswith(".py") else None
        raise InputError(
            f"kerneltriage profile runs Python training scripts; {argv[0]!r} is not a Python interpreter or torchrun",
            hint=hint,
        )
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        if argv[i] in ("-c", "-"):
            raise InputError("python -c and stdin scripts cannot be profiled: save the code to a file")
        i += 2 if argv[i] in _PY_VALUE_OPTS else 1
    if i >= len(argv):
        raise InputError("the python command names no script or module")
    if argv[i] == "-m":
        if i + 1 >= len(argv):
            raise InputError("python -m needs a module name")
        if argv[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            prefix, target = _split_torchrun(argv, i + 2)
            return Command(argv, "torchrun", prefix, target)
        return Command(argv, "python", argv[:i], argv[i:])
    if not os.path.exists(argv[i]):
        raise InputError(f"script {argv[i]!r} does not exist (relative to {os.getcwd()})")
    if os.path.isdir(argv[i]) and not os.path.isfile(os.path.join(argv[i], "__main__.py")):
        raise InputError(
            f"script {argv[i]!r} is a directory without a __main__.py; name the training script in it"
        )
    return Command(argv, "python", argv[:i], argv[i:])


def _split_torchrun(argv: list[str], start: int) -> tuple[list[str], list[str]]:
    i = start
    module = False
    while i < len(argv) and argv[i].startswith("-"):
        opt = argv[i]
        if opt in ("-m", "--module"):
            module = True
            i += 1
            continue
        if opt in ("--no-python", "--no_python"):
            raise InputError(
                "torchrun --no-python runs a non-Python binary, which kerneltriage cannot profile"
            )
        if "=" in opt or opt in _TORCHRUN_FLAGS:
            i += 1
        else:
            i += 2
    if i >= len(argv):
        raise InputError("the torchrun command names no training script")
    # Drop torchrun's own --module flag (it moves in front of the target); keep the launcher's
    # part as is (``python -m torch.distributed.run``).
    prefix = argv[:start] + [a for a in argv[start:i] if a not in ("-m", "--module")]
    target = ["-m", *argv[i:]] if module else argv[i:]
    return prefix, target
