"""Bound norm calls in C++: ``csrc/norm_node.cpp``, built on first use.

Why: after the Python fast path (``fast_launch.py``, ``norms/fast.py``) a norm call that needs
a gradient still spent 12-24 µs in ``torch.autograd.Function`` (``apply``, ``ctx``, the engine
calling back into Python) and its backward 13-29 µs more than ``F.rms_norm``'s on an H100
(BENCHMARKS.md, issue 20). The extension does what a bound Python call does (allocate the
outputs, launch the compiled Triton kernels with arguments fixed at bind time) in C++, with a
C++ autograd node (``kerneltriage::NormBackward``) whose backward runs without Python once its
gradient signature is bound.

What it relies on, all checked at bind time, anything else keeps the Python path:

- Triton 3.6's kernel parameter layout: the non-constexpr parameters in order (pointers,
  ``i32``/``i64`` ints, ``fp32`` floats), then the global and profile scratch pointers; a kernel
  needing scratch, a cluster, cooperative or PDL launch is not bound. The signature and
  metadata come from the ``CompiledKernel`` Triton itself launched for the call just made.
- ``cuLaunchKernel`` from ``libcuda.so.1`` (as Triton's launcher) and the current stream from
  c10's device guard: no CUDA headers, so the same source builds against a CPU torch.

Building needs a C++ compiler and ninja (``pip install ninja``) and takes 15-40 s, once per
machine and torch version (torch's extension cache, ``$TORCH_EXTENSIONS_DIR``). By default the
first eligible call starts the build in a background thread and calls keep the Python path
until it is loaded; ``build()`` waits for it. ``KERNELTRIAGE_NATIVE=0`` turns it off. The
compile itself runs in a child process of its own session, so that a process ending during
the build does not leave torch's build lock behind (which made every later build wait).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

NAME = "kerneltriage_norm_node"
BUILD_TIMEOUT_S = 600
STALE_LOCK_S = 900  # a lock older than this was left by a killed build
SOURCE = Path(__file__).with_name("csrc") / "norm_node.cpp"

_log = logging.getLogger("kerneltriage.kernels")

# Slot kinds of a launch's parameters (``Kind`` in norm_node.cpp).
PTR, I32, I64, F32 = 0, 1, 2, 3
_INT_KINDS = {"i32": I32, "i64": I64}
_FLOAT_TYPES = ("fp32", "f32")


class Ref(int):
    """A tensor parameter: the index of its tensor in the program's table."""


class _State:
    module: Any = None
    why: str | None = None  # why there is no module (build failed, turned off)
    thread: threading.Thread | None = None
    lock = threading.RLock()
    # called with the module once it is loaded, before any caller sees it (the norms set the
    # backward fallback and forget their Python-only bindings)
    on_load: ClassVar[list] = []


def enabled() -> bool:
    return os.environ.get("KERNELTRIAGE_NATIVE", "1") not in ("", "0")


def module() -> Any:
    """The loaded extension, or None. The first call on a CUDA machine starts the build in the
    background (``KERNELTRIAGE_NATIVE=0``: never)."""
    m = _State.module
    if m is not None or _State.why is not None or _State.thread is not None:
        return m
    if not enabled():
        _State.why = "turned off (KERNELTRIAGE_NATIVE=0)"
        return None
    with _State.lock:
        if _State.thread is None and _State.module is None and _State.why is None:
            _State.thread = threading.Thread(target=_build, name="kerneltriage-native-build", daemon=True)
            _State.thread.start()
    return _State.module


def build(timeout: float | None = None) -> Any:
    """Build (or load from torch's extension cache) and return the extension; None if it cannot
    be built (``status()`` says why)."""
    if _State.module is None and _State.why is None:
        module()
        t = _State.thread
        if t is not None:
            t.join(timeout)
    return _State.module


def status() -> str:
    if _State.module is not None:
        return "loaded"
    if _State.why is not None:
        return f"unavailable: {_State.why}"
    return "building" if _State.thread is not None else "not built"


def when_loaded(fn) -> None:
    """Call ``fn(module)`` once the extension is loaded (now, if it is), before any other caller
    sees the module."""
    with _State.lock:
        if _State.module is not None:
            fn(_State.module)
        else:
            _State.on_load.append(fn)


def _build() -> None:
    try:
        t = time.perf_counter()
        m = _load()
        with _State.lock:
            for fn in _State.on_load:
                fn(m)
            _State.module = m
        _log.info("C++ bound norm calls loaded in %.1f s", time.perf_counter() - t)
    except Exception as e:  # any failure keeps the Python path, for good
        _State.why = f"{type(e).__name__}: {e}".strip()[:500]
        _log.warning("C++ bound norm calls unavailable, the Python path stays: %s", _State.why)


def _load() -> Any:
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        # pip's ninja puts its binary beside the package, which is not on PATH unless the
        # environment is activated
        with contextlib.suppress(ImportError):
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        if not cpp_extension.is_ninja_available():
            raise RuntimeError("ninja not found (pip install ninja)")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx}) on PATH")
    _clear_stale_lock(Path(cpp_extension._get_build_directory(NAME, verbose=False)))
    # Compile in a child process of its own session. torch's extension build holds a lock file
    # while it runs; a build killed halfway (this process exiting while the build thread
    # compiles) leaves the lock, and every later build or load waits on it forever. The child
    # finishes and releases it even if this process is gone; then the load here finds the build
    # up to date.
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this kerneltriage
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else root
    try:
        r = subprocess.run(
            [sys.executable, "-m", "kerneltriage.kernels.native", "--compile"],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"the build took over {BUILD_TIMEOUT_S} s") from e
    if r.returncode != 0:
        raise RuntimeError(f"the build failed: {(r.stderr or r.stdout).strip()[-400:]}")
    return _compile()


def _compile() -> Any:
    from torch.utils import cpp_extension

    return cpp_extension.load(name=NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False)


def _clear_stale_lock(build_dir: Path) -> None:
    """A lock file older than any build takes is one a killed build left: remove it."""
    lock = build_dir / "lock"
    with contextlib.suppress(OSError):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()


# --------------------------------------------------------------------------------------------
# Launch descriptions from a bound Triton kernel
# --------------------------------------------------------------------------------------------


def launch_spec(bound, grid: tuple[int, int, int], args: tuple) -> tuple | None:
    """``Program.add_launch`` arguments for the kernel ``bound`` (``fast_launch.Bound``) called
    with ``args`` (tensors as ``Ref``; the positional arguments, constexprs after them), or
    None when the compiled kernel is not one this launcher lays out exactly."""
    compiled = getattr(bound, "compiled", None)
    if compiled is None:
        return None
    md = compiled.metadata
    if (
        getattr(md, "num_ctas", 1) != 1
        or getattr(md, "launch_cooperative_grid", False)
        or getattr(md, "launch_pdl", False)
        or getattr(md, "global_scratch_size", 0)
        or getattr(md, "profile_scratch_size", 0)
        or getattr(md, "tensordesc_meta", None)
    ):
        return None
    types = list(compiled.src.signature.values())
    if len(types) < len(args) or any(t != "constexpr" for t in types[len(args) :]):
        return None
    kinds: list[int] = []
    ints: list[int] = []
    floats: list[float] = []
    for a, ty in zip(args, types):
        if ty == "constexpr":  # None, or an int Triton specialized to a constant (== 1)
            continue
        if isinstance(ty, str) and ty.startswith("*"):
            if type(a) is not Ref:
                return None
            kinds.append(PTR)
            ints.append(int(a))
            floats.append(0.0)
        elif ty in _INT_KINDS and type(a) is int:
            kinds.append(_INT_KINDS[ty])
            ints.append(a)
            floats.append(0.0)
        elif ty in _FLOAT_TYPES and type(a) is float:
            kinds.append(F32)
            ints.append(0)
            floats.append(a)
        else:
            return None
    g0, g1, g2 = grid
    return (int(compiled.function), [g0, g1, g2], 32 * md.num_warps, md.shared, kinds, ints, floats)


if __name__ == "__main__":  # the build child (see _load)
    if sys.argv[1:] == ["--compile"]:
        _compile()
