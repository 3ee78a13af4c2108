"""The runner's end: a stopped phase-1 or timing process runs its exit handlers, then skips
its interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import atexit, subprocess, sys, threading, time
from kerneltriage.profile.runner import _exit_now

class Model:  # freed in the interpreter's teardown
    def __del__(self):
        print("teardown ran", flush=True)

model = Model()
atexit.register(lambda: print("atexit ran", flush=True))
if {child}:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
if {thread}:
    threading.Thread(target=time.sleep, args=(0.5,)).start()  # a checkpoint being written
_exit_now({config!r})
print("returned", flush=True)
if {child}:
    child.kill()
    child.wait()
"""


def _end(config: dict, *, child: bool = False, thread: bool = False) -> list[str]:
    code = textwrap.dedent(SCRIPT.format(config=config, child=child, thread=thread))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


NORMAL = ["returned", "atexit ran", "teardown ran"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children are read from /proc")
@pytest.mark.parametrize("mode", ["timing", "timeline"])
def test_a_stopped_timing_or_phase_1_process_skips_its_teardown_not_its_exit_handlers(mode):
    # The next process's turn waits for this one's exit: T5-base's took 1.4 s on an H100. A
    # script's own exit handlers still run (the examples write their stats file in one).
    assert _end({"mode": mode}) == ["atexit ran"]


@pytest.mark.parametrize(
    "config",
    [
        {"mode": "ncu"},  # ncu's injected library writes its report in an exit handler
        {"mode": "timing", "distributed": True},  # the process group is torn down first
    ],
)
def test_an_ncu_or_distributed_process_ends_normally(config):
    assert _end(config) == NORMAL


def test_a_process_with_children_or_working_threads_ends_normally():
    # An orphaned worker would hold the output pipes the parent reads to their end; a normal
    # exit waits for a thread that is still writing.
    assert _end({"mode": "timing"}, child=True) == NORMAL
    assert _end({"mode": "timing"}, thread=True) == NORMAL
