"""A child process of ``profile``: the user's script behind the runner, ncu, nsys or the
calibration, started with the runner's config, its output echoed and logged, stopped on a
timeout or Ctrl-C.

Each child's stdout and stderr go line by line to ``logs/<name>.stdout`` and ``.stderr`` and
to the user (or to a progress parser first). A child with a timeout gets its own process
group, so that stopping it stops ncu, torchrun and every worker with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import kerneltriage
from kerneltriage.errors import Terminated, ToolError
from kerneltriage.profile.runner import CONFIG_ENV

#: The exit code ``run_child`` gives a child it stopped after its timeout.
TIMED_OUT = -999


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` (a KeyboardInterrupt) in the main thread:
    a run stopped by ``timeout`` or a scheduler stops its children and writes its manifest and
    what it measured, as for Ctrl-C, instead of dying with them in memory."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated

    before = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def child_env(config: Path) -> dict[str, str]:
    """The parent's environment, with the runner's config file and kerneltriage importable."""
    env = dict(os.environ)
    env[CONFIG_ENV] = str(config.resolve())
    # The script's Python must find kerneltriage even when it is not installed there.
    package_root = str(Path(kerneltriage.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_child(
    cmd: list[str],
    config: Path,
    log_prefix: Path,
    echo: Callable[[str, str], None],
    on_line: Callable[[str], bool] | None = None,
    timeout: float | None = None,
) -> tuple[float, int, list[str]]:
    """Run ``cmd``, log its output and ``echo`` each line (with its stream's name) unless
    ``on_line`` took it; return (seconds, exit code, last stderr lines).

    Past ``timeout`` seconds the whole process group is stopped and the exit code is
    ``TIMED_OUT``: a hung tool must not take the phases already written down with it.
    """
    return Child(cmd, config, log_prefix, echo, on_line, timeout).start().wait()


class Child:
    """One child process: started (its output pumped to the logs and ``echo`` from then on),
    then waited for, with ``run_child``'s timeout and Ctrl-C handling. Started early by
    ``Turns``, a child whose config names a gate waits at its first CUDA use (``gate.py``)."""

    def __init__(
        self,
        cmd: list[str],
        config: Path,
        log_prefix: Path,
        echo: Callable[[str, str], None],
        on_line: Callable[[str], bool] | None = None,
        timeout: float | None = None,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.cmd, self.config, self.log_prefix = cmd, config, log_prefix
        self.echo, self.on_line, self.timeout = echo, on_line, timeout
        # Another tool's process (verify's harness): its own environment and directory.
        self.env, self.cwd = env, cwd
        self.tail: deque[str] = deque(maxlen=20)
        self.started = 0.0
        self.proc: subprocess.Popen | None = None
        self.threads: list[threading.Thread] = []

    def start(self) -> Child:
        self.started = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env if self.env is not None else child_env(self.config),
                cwd=self.cwd,
                text=True,
                errors="replace",
                bufsize=1,
                # Its own process group, so that a timeout can stop ncu, torchrun and every worker.
                start_new_session=self.timeout is not None,
            )
        except FileNotFoundError:
            raise ToolError(f"cannot start {self.cmd[0]!r}: not found") from None
        self.threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, "stderr"), daemon=True),
        ]
        for t in self.threads:
            t.start()
        return self

    def _pump(self, stream, name: str) -> None:
        with open(f"{self.log_prefix}.{name}", "w") as log:
            for line in stream:
                line = line.rstrip("\n")
                log.write(line + "\n")
                log.flush()
                if name == "stderr":
                    self.tail.append(line)
                if self.on_line is not None and self.on_line(line):
                    continue
                self.echo(line, name)

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def wait(self) -> tuple[float, int, list[str]]:
        """(seconds since it started, exit code, last stderr lines); the timeout counts from
        now (a child held at its gate has not begun its work)."""
        proc = self.proc
        assert proc is not None, "start() first"
        try:
            code = proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return time.perf_counter() - self.started, TIMED_OUT, list(self.tail)
        except KeyboardInterrupt:
            if self.timeout is not None:  # a separate session does not get the terminal's Ctrl-C
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGINT)
            # A terminal's Ctrl-C reaches the child too: let it write what it has and exit. A
            # second SIGINT would interrupt its clean-up, so send one only if it is still running.
            _stop(proc, [(None, 10), (lambda: proc.send_signal(signal.SIGINT), 20), (proc.kill, 20)])
            for t in self.threads:
                t.join(timeout=5)
            raise
        for t in self.threads:
            t.join()
        return time.perf_counter() - self.started, code, list(self.tail)

    def stop(self) -> None:
        """Stop it (its process group, where it has one) and its output pumps."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        steps: list[tuple[Callable[[], None] | None, float]]
        if self.timeout is not None:
            steps = [
                (lambda: os.killpg(proc.pid, signal.SIGTERM), 20),
                (lambda: os.killpg(proc.pid, signal.SIGKILL), 20),
            ]
        else:
            steps = [(proc.terminate, 20), (proc.kill, 20)]
        _stop(proc, steps)
        for t in self.threads:
            t.join(timeout=5)


def _stop(proc: subprocess.Popen, steps: list[tuple[Callable[[], None] | None, float]]) -> None:
    """Escalate until ``proc`` exits: each step acts (None: just wait) and waits its seconds."""
    for act, seconds in steps:
        try:
            if act is not None:
                act()
            proc.wait(timeout=seconds)
            return
        except subprocess.TimeoutExpired:
            continue
        except OSError:
            return
