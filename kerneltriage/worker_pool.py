"""Worker processes that a Ctrl-C stops cleanly: the trace reader's and the ranks' fan-out.

- Fork where the platform has it: the workers start at once with what is imported here, and
  never run a script's ``__main__`` again (else spawn).
- Workers ignore SIGINT: the parent handles Ctrl-C and terminates them, so a Ctrl-C sent to the
  whole process group (what a terminal does) prints no worker tracebacks. SIGINT stays blocked
  while they start, so none can take one before it ignores it; the parent receives a Ctrl-C
  held back meanwhile once they run.
- On any exception in the ``with`` block (a Ctrl-C, a task that failed) the workers are
  terminated at once: queued work is dropped, not waited for.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """``workers`` processes (see the module's docstring); shut down on leaving."""
    pool = _start(workers)
    try:
        yield pool
    except BaseException:
        stop(pool)
        raise
    pool.shutdown()


def stop(pool: ProcessPoolExecutor) -> None:
    """Terminate the workers now and drop the work still queued."""
    processes = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        process.terminate()
    # Neither pipe to the dead workers may hold the exit (a Ctrl-C hung 1 exit in 2 without
    # this). Work still buffered for them: the call queue's feeder thread would wait forever to
    # write it. A result a worker was killed while writing: the pool's manager thread would wait
    # forever for its last bytes, unless the parent's own copy of the pipe's writing end closes,
    # so that the dead workers' ends were the last and the read ends.
    call_queue = getattr(pool, "_call_queue", None)
    if call_queue is not None:
        call_queue.cancel_join_thread()
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
        writer.close()
    pool.shutdown(wait=False, cancel_futures=True)


def completed(
    pool: ProcessPoolExecutor, fn: Callable[[T], R], items: Iterable[T], window: int
) -> Iterator[R]:
    """``fn`` of each item, run in ``pool``, as each finishes; at most ``window`` submitted and
    unfinished at a time, so that a failing item stops the rest early."""
    todo = list(items)[::-1]
    running: set[Future[R]] = set()
    while todo or running:
        while todo and len(running) < window:
            running.add(pool.submit(fn, todo.pop()))
        done, running = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            yield future.result()


def _start(workers: int) -> ProcessPoolExecutor:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no fork, no signal masks
        return ProcessPoolExecutor(workers, mp_context=context, initializer=_ignore_sigint)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pool: Any = None
    try:
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_ignore_sigint)
        pool.submit(int).result()  # the first task starts the workers (with fork: all of them)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if pool is not None:
            stop(pool)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a Ctrl-C held back arrives here
    except BaseException:
        stop(pool)
        raise
    return pool


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
