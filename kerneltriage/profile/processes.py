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
    start = time.perf_counter()
    tail: deque[str] = deque(maxlen=20)
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(config),
            text=True,
            errors="replace",
            bufsize=1,
            # Its own process group, so that a timeout can stop ncu, torchrun and every worker.
            start_new_session=timeout is not None,
        )
    except FileNotFoundError:
        raise ToolError(f"cannot start {cmd[0]!r}: not found") from None

    def pump(stream, name: str) -> None:
        with open(f"{log_prefix}.{name}", "w") as log:
            for line in stream:
                line = line.rstrip("\n")
                log.write(line + "\n")
                log.flush()
                if name == "stderr":
                    tail.append(line)
                if on_line is not None and on_line(line):
                    continue
                echo(line, name)

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(
            proc,
            [
                (lambda: os.killpg(proc.pid, signal.SIGTERM), 20),
                (lambda: os.killpg(proc.pid, signal.SIGKILL), 20),
            ],
        )
        for t in threads:
            t.join(timeout=5)
        return time.perf_counter() - start, TIMED_OUT, list(tail)
    except KeyboardInterrupt:
        if timeout is not None:  # a separate session does not get the terminal's Ctrl-C
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGINT)
        # A terminal's Ctrl-C reaches the child too: let it write what it has and exit. A
        # second SIGINT would interrupt its clean-up, so send one only if it is still running.
        _stop(proc, [(None, 10), (lambda: proc.send_signal(signal.SIGINT), 20), (proc.kill, 20)])
        for t in threads:
            t.join(timeout=5)
        raise
    for t in threads:
        t.join()
    return time.perf_counter() - start, code, list(tail)


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
