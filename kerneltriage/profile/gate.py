"""Turns on the GPU: processes of the script started together, each held at its first CUDA use.

A process of the script spends its first seconds on the host: Python and torch imported, the
model built (ConvNeXt-T on an H200: 3.5 s to import torch, 9 more to its first step's end).
``profile`` starts the processes it runs one after the other (timing processes, ncu passes)
at once instead, each with a *gate*: the runner wraps ``torch.cuda._lazy_init`` so that the
script's first CUDA use waits until the parent opens its gate (``open_gate``). The host work of
all of them overlaps; their GPU work stays one process at a time, and none holds GPU memory
while it waits.

A process at its gate says so (``<gate>.ready``); the parent opens the gate of a timed process
only once every process still to come is at its gate or has exited, so no other process's
start-up runs on the host while steps are timed. A process whose parent has gone stops.

Imported inside the user's process by ``runner.py`` (stdlib only) and by the parent.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READY = ".ready"
OPEN = ".open"
#: How often a held process looks at its gate, in seconds.
POLL_S = 0.02


def hold_at_first_cuda_use(
    torch: Any, gate: Path, parent_pid: int, on_wait: Callable[[str], None] | None = None
) -> None:
    """Make the first CUDA initialization of this process wait for ``gate`` to open.

    ``torch.cuda._lazy_init`` is what every first CUDA use calls (tensors, modules moved to the
    GPU, streams, events: torch's C++ side looks it up on ``torch.cuda`` each time);
    ``torch.cuda.random`` holds its own reference, so it is replaced there too. ``on_wait`` is
    called with "at_gate" and "gate_open" (the runner's milestones).
    """
    cuda = torch.cuda
    original = cuda._lazy_init
    lock = threading.Lock()
    held = {"done": False}

    def gated_lazy_init() -> None:
        with lock:
            if not held["done"]:
                held["done"] = True
                if not cuda.is_initialized():
                    if on_wait is not None:
                        on_wait("at_gate")
                    wait_for_gate(gate, parent_pid)
                    if on_wait is not None:
                        on_wait("gate_open")
                cuda._lazy_init = original
                random = getattr(cuda, "random", None)
                if random is not None and getattr(random, "_lazy_init", None) is gated_lazy_init:
                    random._lazy_init = original
        original()

    cuda._lazy_init = gated_lazy_init
    random = getattr(cuda, "random", None)
    if random is not None and hasattr(random, "_lazy_init"):
        random._lazy_init = gated_lazy_init


def wait_for_gate(gate: Path, parent_pid: int) -> None:
    """Say this process is ready, then wait until the parent opens ``gate``; exit if the parent
    is gone (nobody would ever open it)."""
    Path(str(gate) + READY).touch()
    opened = Path(str(gate) + OPEN)
    checks = 0
    while not opened.exists():
        time.sleep(POLL_S)
        checks += 1
        if checks % 50 == 0 and not _alive(parent_pid):
            raise SystemExit(3)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the parent's side ------------------------------------------------------------------


def at_gate(gate: Path) -> bool:
    return Path(str(gate) + READY).exists()


def is_open(gate: Path) -> bool:
    return Path(str(gate) + OPEN).exists()


def open_gate(gate: Path) -> None:
    Path(str(gate) + OPEN).touch()


def clear(gate: Path) -> None:
    for suffix in (READY, OPEN):
        Path(str(gate) + suffix).unlink(missing_ok=True)
