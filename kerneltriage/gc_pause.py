"""Python's cyclic garbage collector paused around work that makes millions of small containers
and no reference cycles: reading a trace's events, and analysing them.

The collector runs every few hundred new containers and each of its older passes walks every
object still alive, so a run that keeps hundreds of thousands of them (ops, segments, their
keys) pays for itself over and over: a fifth of a 1 GB trace's analysis. Reference counting
still frees everything as usual; cycles made meanwhile are collected once the pause ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (as it was, after; nested pauses are fine)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
