"""``python -m kerneltriage.profile.runner SCRIPT ARGS…`` (or ``-m MODULE ARGS…``).

Runs the user's script or module exactly as ``python SCRIPT ARGS`` would (``runpy``, the same
``sys.argv``, ``__name__ == "__main__"``), with kerneltriage's hooks installed first. The
parent (``session.py``) passes its settings in the file named by ``KERNELTRIAGE_PROFILE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import threading
import traceback

from kerneltriage.profile.hooks import Done, Session

CONFIG_ENV = "KERNELTRIAGE_PROFILE"


def main(argv: list[str] | None = None) -> int:
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
    session = Session(config)
    session.install()
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = [script, *argv[1:]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
        session.finish("ok")
    except Done:
        code = 0  # stopped after the recorded steps: everything is written
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        session.finish(
            "ok" if code == 0 else "failed", error=None if code == 0 else f"the script exited with {code}"
        )
    except KeyboardInterrupt:
        session.finish("interrupted")
        code = 130
    except BaseException as exc:
        session.finish("failed", error="".join(traceback.format_exception_only(type(exc), exc)).strip())
        raise
    _shutdown_distributed(code)
    return code


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
