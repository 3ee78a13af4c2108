"""Optional annotations for a training script profiled by ``kerneltriage profile``.

``with kerneltriage.step(): ...`` marks one training step; ``with kerneltriage.region("attn"):``
names a region the report should treat as one fusion candidate. Each is an NVTX range (seen
by Nsight Compute's NVTX filters and Nsight Systems) and a ``record_function`` range (seen by
the PyTorch profiler). Both are no-ops when torch is missing, so a script that uses them
still runs anywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: Range names the ingest layer looks for; ``profile`` and ``report`` share them.
STEP_RANGE = "kerneltriage.step"
REGION_PREFIX = "kerneltriage.region:"
MODULE_PREFIX = "kerneltriage.module:"


@contextlib.contextmanager
def _range(name: str) -> Iterator[None]:
    try:
        import torch
    except ImportError:  # annotations must never break the user's script
        yield
        return
    pushed = False
    if torch.cuda.is_available():
        torch.cuda.nvtx.range_push(name)
        pushed = True
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if pushed:
            torch.cuda.nvtx.range_pop()


#: Callables ``f(event)`` with event "begin" or "end", run around every ``step()``; the
#: profile bootstrap registers one to drive its schedule. Empty outside ``kerneltriage profile``.
step_listeners: list = []


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one training step (forward, backward, optimizer)."""
    for listener in step_listeners:
        listener("begin")
    try:
        with _range(STEP_RANGE):
            yield
    finally:
        for listener in step_listeners:
            listener("end")


def region(name: str) -> contextlib.AbstractContextManager[None]:
    """Name a region of the forward pass; the report treats it as one fused candidate."""
    if not name or ":" in name:
        raise ValueError(f"region name must be non-empty and contain no ':' (got {name!r})")
    return _range(REGION_PREFIX + name)
