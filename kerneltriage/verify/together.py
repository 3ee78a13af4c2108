"""``verify --start-together``: the runs of a round started at once, the GPU given in turns.

A run of a Hugging Face model spends most of its life on the host before its first CUDA use
(imports, the model built: 10-17 s), and its timed steps take a few seconds, so a round of the
baseline and three fixes run one after the other is mostly start-ups. Here every run of a round
starts together, each held by the harness at its first CUDA use (``profile/gate.py``), and they
take the GPU one at a time in the round's order (``profile/turns.py``): a run's gate opens only
once every later run of the round is waiting at its own, so no start-up shares the host with
timed steps, as ``profile`` times its processes. A run's time limit counts from its gate.

Only on a GPU (on a CPU nothing would hold the runs apart), not for a torchrun job (its ranks
start their own processes), and only where the round's processes, each as large as phase 1's
peak host memory, fit in the host's available memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from kerneltriage import rundir
from kerneltriage.profile import context, ncu_gpus
from kerneltriage.profile.command import Command
from kerneltriage.profile.processes import TIMED_OUT, Child
from kerneltriage.profile.turns import Turn, Turns
from kerneltriage.verify import torchrun

#: The share of the host's available memory a round's held processes may take together.
HOST_MEMORY_SHARE = 0.8


def why_apart(run: Path, manifest: rundir.Manifest, command: Command, processes: int) -> str | None:
    """Why a round of ``processes`` runs cannot start together (None: they can)."""
    if torchrun.world_size(command):
        return "a torchrun job starts its ranks itself"
    if not (manifest.gpu or {}).get("name"):
        return "the run was not profiled on a GPU"
    if not ncu_gpus.visible_gpus(environ={}):
        return "no GPU is visible here (nvidia-smi -L lists none)"
    peaks = []
    for status in sorted((run / rundir.LOGS).glob("status.timeline.rank*.json")):
        try:
            peaks.append(float(json.loads(status.read_text()).get("max_rss_mb") or 0.0))
        except (OSError, ValueError):
            continue
    peak, available = max(peaks, default=0.0), context.available_mb()
    if peak and available is not None and processes * peak > HOST_MEMORY_SHARE * available:
        return (
            f"{processes} runs of {peak / 1024:.1f} GiB each (phase 1's peak) would not fit in "
            f"{HOST_MEMORY_SHARE:.0%} of the host's {available / 1024:.1f} GiB available"
        )
    return None


class Launch(NamedTuple):
    """One run of a round: its command line, environment, working directory, config file (which
    names its gate) and log prefix."""

    cmd: list[str]
    env: dict[str, str]
    cwd: Path
    config: Path
    prefix: Path


class Round:
    """A round's runs, started together and held at their gates; ``next`` runs the next one."""

    def __init__(self, launches: list[Launch], budget_s: float):
        turns = [
            Turn(
                Child(r.cmd, r.config, r.prefix, _quiet, timeout=budget_s, env=r.env, cwd=r.cwd),
                gate_of(r.prefix),
            )
            for r in launches
        ]
        self.turns = Turns(turns, quiet=True)

    def next(self, timeout: float) -> tuple[int, list[str]]:
        """Run the next run within ``timeout`` seconds from its gate: (exit code, last stderr
        lines); ``TIMED_OUT`` when it ran past the limit and was stopped."""
        self.turns.turns[self.turns.index].child.timeout = timeout
        _, code, tail = self.turns.next()
        return code, tail

    def skip(self) -> None:
        self.turns.skip()

    def close(self) -> None:
        self.turns.close()


def gate_of(prefix: Path) -> Path:
    return Path(f"{prefix}.gate")


def timed_out(code: int) -> bool:
    return code == TIMED_OUT


def _quiet(line: str, stream: str) -> None:
    """A run's output goes to its log files only, as a run one at a time does."""
