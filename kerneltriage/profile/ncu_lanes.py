"""Where phase 2's passes run and how they report (``phase_ncu.py``): a ``GpuLane`` is the session
itself (one ncu process at a time) or one GPU of several, whose lanes share a ``LaneBoard``: one
progress bar over all their launches, output lines marked with their GPU, each warning once;
``interrupt`` passes a Ctrl-C on to a lane's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from kerneltriage import rundir
from kerneltriage.profile import ncu_gpus
from kerneltriage.profile.context import ProfileSession
from kerneltriage.profile.ncu_pass import NcuPass
from kerneltriage.profile.processes import run_child
from kerneltriage.profile.turns import Turn


class GpuLane:
    """Where one chain of passes runs and what it tells the user: the session as it is (one
    ncu process at a time), or one GPU of several, through a ``LaneBoard``."""

    def __init__(
        self,
        session: ProfileSession,
        gpu: ncu_gpus.Gpu | None = None,
        board: LaneBoard | None = None,
        env: list[str] | None = None,
    ) -> None:
        self.session, self.gpu, self.board = session, gpu, board
        self.env = env or []  # more VAR=value for its processes (ncu_gpus.apart_env)
        self.finished = 0  # launches profiled by its passes that ended
        self.done = 0  # ... and by the one running
        self.total = 0  # launches expected of all its passes
        self.records: list[rundir.NcuPassRecord] = []

    def command(self, cmd: list[str]) -> list[str]:
        if self.gpu is None:
            return cmd
        # The script's cuda:0 is this GPU: env(1) sets it for ncu and the script alike.
        return ["env", f"CUDA_VISIBLE_DEVICES={self.gpu.device}", *self.env, *cmd]

    def run(
        self, cmd: list[str], config: Path, log: str, on_line: Callable[[str], bool], timeout: float
    ) -> tuple[float, int, list[str]]:
        if self.board is None:
            return self.session.run(cmd, config, log, on_line=on_line, timeout=timeout)
        echo = self.board.echo(self)
        return run_child(cmd, config, self.session.logs / log, echo, on_line=on_line, timeout=timeout)

    def turn(
        self, cmd: list[str], config: Path, log: str, on_line: Callable[[str], bool], timeout: float
    ) -> Turn:
        echo = self.board.echo(self) if self.board is not None else None
        return self.session.turn(cmd, config, log, on_line=on_line, timeout=timeout, echo=echo)

    def progress(self, one: NcuPass, done: int, kernel: str) -> None:
        if self.board is None:
            self.session.reporter.ncu_progress(done, max(one.expected, done), kernel)
        else:
            self.board.progress(self, self.finished + done, kernel)

    def warn(self, message: str) -> None:
        if self.board is None:
            self.session.reporter.warn(message)
        else:
            self.board.warn(message)


class LaneBoard:
    """The reporter of lanes that run at once: one progress bar over all their launches that
    says each GPU's own count, output lines marked with their GPU, each warning once."""

    def __init__(self, session: ProfileSession) -> None:
        self.reporter = session.reporter
        self.lanes: list[GpuLane] = []
        self.lock = threading.Lock()
        self.warned: set[str] = set()

    def echo(self, lane: GpuLane) -> Callable[[str, str], None]:
        gpu = lane.gpu.device if lane.gpu else ""

        def echo(line: str, stream: str) -> None:
            with self.lock:
                self.reporter.output(f"[GPU {gpu}] {line}", stream)

        return echo

    def progress(self, lane: GpuLane, done: int, kernel: str) -> None:
        with self.lock:
            lane.done = done
            lane.total = max(lane.total, done)
            each = " ".join(f"{x.gpu.device if x.gpu else ''}:{x.done}/{x.total}" for x in self.lanes)
            done_all, total_all = sum(x.done for x in self.lanes), sum(x.total for x in self.lanes)
            self.reporter.ncu_progress(done_all, total_all, f"GPU {each} {kernel}")

    def warn(self, message: str) -> None:
        with self.lock:
            if message not in self.warned:
                self.warned.add(message)
                self.reporter.warn(message)


def interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in ``thread`` (Ctrl-C reaches the main thread only): its wait
    on ncu is a Python loop, so run_child's own clean-up then stops ncu and the script."""
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)
        )
