"""``python -m kerneltriage.profile.runner SCRIPT ARGS…`` (or ``-m MODULE ARGS…``).

Runs the user's script or module exactly as ``python SCRIPT ARGS`` would (``runpy``, the same
``sys.argv``, ``__name__ == "__main__"``), with kerneltriage's hooks installed first. The
parent (``context.py``) passes its settings in the file named by ``KERNELTRIAGE_PROFILE``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path

from kerneltriage.profile import fix_install, gate
from kerneltriage.profile.hooks import ProfiledProcess, StepsDone
from kerneltriage.recipes.install import ApplyFailed

CONFIG_ENV = "KERNELTRIAGE_PROFILE"


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    config_path = os.environ.get(CONFIG_ENV)
    if not config_path:
        print(
            "kerneltriage.profile.runner is started by `kerneltriage profile`, not by hand", file=sys.stderr
        )
        return 2
    with open(config_path) as f:
        config = json.load(f)
    if not argv:
        print("kerneltriage runner: no script given", file=sys.stderr)
        return 2
    missing = _missing_target(argv)
    if missing:
        print(f"kerneltriage runner: {missing}", file=sys.stderr)  # one line: nothing ran
        return 2
    config["_started"] = started
    process = ProfiledProcess(config)
    process.install()
    if config.get("gate") and process.torch is not None:
        # Started with others: the script's first CUDA use waits for its turn on the GPU.
        gate.hold_at_first_cuda_use(
            process.torch, Path(config["gate"]), int(config["parent_pid"]), on_wait=process.milestone
        )
    code = 0
    stopped = False
    fixes: list[fix_install.Installed] = []
    try:
        # profile --apply: the fixes go in before the script runs, as verify's harness does.
        fixes = fix_install.install_all(config.get("apply") or [])
        process.milestone("script")
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = [script, *argv[1:]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
        process.finish("ok")
    except StepsDone:
        code = 0  # stopped after the recorded steps: everything is written
        stopped = True
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        process.finish(
            "ok" if code == 0 else "failed", error=None if code == 0 else f"the script exited with {code}"
        )
    except KeyboardInterrupt:
        process.finish("interrupted")
        code = 130
    except ApplyFailed as exc:
        process.finish("failed", error=fix_install.failure(fixes, exc))
        code = fix_install.EXIT_NOT_APPLIED
    except BaseException as exc:
        process.finish("failed", error="".join(traceback.format_exception_only(type(exc), exc)).strip())
        raise
    if code == 0 and fix_install.problems(fixes):
        process.write_status("failed", error=fix_install.problems(fixes)[0])
        code = fix_install.EXIT_NOT_APPLIED
    _shutdown_distributed(code)
    if stopped and code == 0:
        _exit_now(config)
    return code


#: Modes whose process, once stopped with everything written, needs nothing of its interpreter's
#: teardown. Not ``ncu``: ncu's injected library writes its report in an exit handler.
_EXIT_NOW_MODES = ("timeline", "timing")


def _exit_now(config: dict) -> None:
    """End a stopped phase-1 or timing process at once, after its exit handlers (``atexit``: a
    script's own, such as a stats file written at exit), skipping the interpreter's teardown:
    freeing a model's tensors one by one and the CUDA context took 1.4 s a process on T5-base
    (H100), and the next process's turn waits for this one to exit. Not where the process has
    children (DataLoader or compile workers: a normal exit shuts them down, and an orphan would
    hold the output pipes the parent reads to their end), nor threads that a normal exit would
    wait for (a checkpoint being written)."""
    if config.get("mode") not in _EXIT_NOW_MODES or config.get("distributed"):
        return
    if _has_children() or any(
        t is not threading.main_thread() and not t.daemon for t in threading.enumerate()
    ):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _has_children() -> bool:
    """Whether this process has a live child (Linux's ``/proc``; elsewhere, assumed so)."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    try:
        return any((task / "children").read_text().strip() for task in tasks.iterdir())
    except OSError:
        return True


def _missing_target(argv: list[str]) -> str | None:
    """Why ``runpy`` would refuse the script or module before running any of it (a module not
    found, a folder or package without ``__main__``), in words; None when it can run."""
    if argv[0] == "-m":
        if len(argv) < 2:
            return "python -m needs a module name"
        name = argv[1]
        try:
            spec = importlib.util.find_spec(name)
            package = spec is not None and spec.submodule_search_locations is not None
            if package and importlib.util.find_spec(f"{name}.__main__") is None:
                return f"{name!r} is a package without a __main__ module; it cannot be run with -m"
        except (ImportError, ValueError) as exc:
            return f"cannot find module {name!r} ({exc})"
        return None if spec is not None else f"no module named {name!r} for {sys.executable}"
    script = argv[0]
    if os.path.isdir(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
        return f"{script!r} is a directory without a __main__.py; name the training script in it"
    return None


def _shutdown_distributed(code: int, timeout: float = 60.0) -> None:
    """A script stopped early never destroyed its process group; do it so NCCL exits cleanly.

    The process must then end normally: ``os._exit`` skips the exit handlers of ncu's
    injected library (on 2× H200, ranks that left that way made ncu crash without writing its
    report). Only a teardown that hangs is cut short.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    guard = threading.Timer(timeout, os._exit, args=(code,))
    guard.daemon = True
    guard.start()
    with contextlib.suppress(Exception):  # best effort: the results are already on disk
        dist.destroy_process_group()
    guard.cancel()


if __name__ == "__main__":
    sys.exit(main())
