"""A launch path for Triton kernels that skips ``JITFunction.run``'s per-call work.

``kernel[grid](*args, **kwargs)`` costs 22-29 µs of host time per launch on an H100 host with
Triton 3.6 (this path: 11-16 µs, ``benchmarks/probes/launch_overhead.py``): it binds the arguments, builds the specialization and its cache key (``str`` of
the options), checks the globals, builds launch metadata and calls the (empty) launch hooks.
For one kernel with fixed constexprs and options (the ``kwargs`` of a launch plan), what
decides which compiled binary runs is only each argument's specialization class: a tensor's
dtype and 16-byte alignment, an int's ``== 1``, ``% 16 == 0`` and 32-bit range. So the first
launch per class goes through Triton (which compiles or finds the binary, and launches); its
``CompiledKernel`` is kept under that class, and later launches call its launcher directly.

Anything unexpected (another Triton version's internals, launch hooks set by a profiler such as
Proton, async compilation, an argument type not classified here) takes Triton's own path, so
the fast path can only skip work, not change what runs. Part of the fast host path: only
``host_path.py`` imports it for launching, and picks it or plain launches (its docstring: the
switch ``KERNELTRIAGE_FAST_LAUNCH=0``, the Triton versions it is set up for, the fallback).
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

import torch

_Tensor = torch.Tensor
_SIMPLE = (_Tensor, int, float)  # bool is an int
_MAX_CLASSES = 256  # per kernel and kwargs: argument classes are few; a bound against surprises


def _arg_class(args: tuple) -> tuple:
    """What Triton 3.6 specializes on, per argument (``native_specialize_impl``): a tensor's
    dtype and 16-byte alignment; an int's ``== 1``, ``% 16 == 0`` and 32-bit range; floats,
    None and bools by type (bools are ints to Python, hence ``__class__ is int``)."""
    return tuple(
        [
            (a.data_ptr() & 15 == 0, a.dtype)
            if isinstance(a, _Tensor)
            else (
                (a == 1)
                | ((a & 15 == 0) << 1)
                | ((-0x80000000 <= a <= 0x7FFFFFFF) << 2)
                | ((a > 0x7FFFFFFFFFFFFFFF) << 3)
                if a.__class__ is int
                else (a if a is None or a.__class__ is bool else a.__class__)
            )
            for a in args
        ]
    )


class _Driver:
    """Triton's current-device and raw-stream getters and its runtime knobs (the launch hook
    chains), looked up once; a failed lookup (another Triton) is final."""

    ok = False
    failed = False
    why: str | None = None  # why the lookup failed
    device: Any = None
    stream: Any = None
    runtime: Any = None

    @classmethod
    def load(cls) -> bool:
        if cls.ok or cls.failed:
            return cls.ok
        try:
            from triton import knobs
            from triton.runtime import driver

            active = driver.active
            cls.device = active.get_current_device
            cls.stream = active.get_current_stream
            cls.runtime = knobs.runtime
            cls.hooks_set()  # HookChain objects with .calls in 3.6; else fall back
        except Exception as e:
            cls.failed, cls.why = True, f"{type(e).__name__}: {e}"
            return False
        cls.ok = True
        return True

    @classmethod
    def hooks_set(cls) -> bool:
        """A launch hook (a profiler's, e.g. Proton): launches go through Triton, which calls it."""
        rt = cls.runtime
        return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls)


class FastLauncher:
    """One kernel launched with one ``kwargs`` (constexprs and options): its compiled kernels
    per (device, argument class), each as (launch function, function handle, packed metadata,
    cooperative, pdl, scratch). ``why`` says why the launcher takes Triton's path, if it does."""

    __slots__ = ("compiled", "kernel", "kwargs", "last", "last_thread", "tail", "why")

    def __init__(self, kernel, kwargs: dict):
        self.kernel = kernel
        self.kwargs = kwargs
        self.tail: tuple | None = None  # the parameters after the positional arguments
        self.compiled: dict[tuple, tuple] = {}
        self.why: str | None = None
        self.last: tuple | None = None  # the entry of the latest launch (for ``Bound``)
        self.last_thread = 0  # and the thread that launched it

    @property
    def disabled(self) -> bool:
        return self.why is not None

    def __call__(self, grid: tuple, args: tuple) -> None:
        tail = self.tail
        if self.why is None and tail is not None and not _Driver.hooks_set():
            device = _Driver.device()
            hit = self.compiled.get((device, _arg_class(args)))
            if hit is not None:
                self.last, self.last_thread = hit, get_ident()
                launch, function, packed, coop, pdl, scratch, _ = hit
                n = len(grid)
                g1 = grid[1] if n > 1 else 1
                g2 = grid[2] if n > 2 else 1
                try:
                    if scratch:  # CudaLauncher.__call__ allocates the scratch buffers
                        launch(grid[0], g1, g2, _Driver.stream(device), function, packed, None, None, None,
                               *args, *tail)  # fmt: skip
                    else:  # its C launcher, with the arguments CudaLauncher.__call__ passes
                        launch(grid[0], g1, g2, _Driver.stream(device), function, coop, pdl, None, None,
                               packed, None, None, None, *args, *tail)  # fmt: skip
                    return
                except TypeError as e:  # the launcher parses its arguments before launching
                    self.why = f"launcher rejected the arguments: {e}"
        compiled = self.kernel.run(*args, grid=grid, warmup=False, **self.kwargs)
        if self.why is None:
            self._remember(compiled, args)

    def _remember(self, compiled, args: tuple) -> None:
        """Keep the kernel Triton just launched for this argument class, if it can be launched
        directly; otherwise this launcher always takes Triton's path."""
        try:
            if not all(a is None or isinstance(a, _SIMPLE) for a in args):
                self.why = "an argument of a type not classified here"  # e.g. host descriptors
                return
            if self.tail is None:
                self.tail = self._tail(len(args))
            runner = compiled.run  # loads the binary (already loaded: it just ran)
            if type(runner).__name__ != "CudaLauncher":
                self.why = f"launcher {type(runner).__name__}, not Triton 3.6's CudaLauncher"
                return
            scratch = bool(runner.global_scratch_size or runner.profile_scratch_size)
            if len(self.compiled) >= _MAX_CLASSES:
                self.compiled.clear()
            key = (_Driver.device(), _arg_class(args))
            self.last_thread = get_ident()
            self.compiled[key] = self.last = (
                runner if scratch else runner.launch,
                compiled.function,
                compiled.packed_metadata,
                runner.launch_cooperative_grid,
                runner.launch_pdl,
                scratch,
                compiled,
            )
        except Exception as e:
            self.why = f"{type(e).__name__}: {e}"

    def _tail(self, n_args: int) -> tuple:
        """The values of the kernel's parameters after the first ``n_args``, from ``kwargs`` or
        their defaults (constexprs included: Triton's launcher takes every parameter, in order)."""
        return tuple(
            self.kwargs[p.name] if p.name in self.kwargs or not p.has_default else p.default
            for p in self.kernel.params[n_args:]
        )


_LAUNCHERS: dict[tuple[int, int], FastLauncher] = {}


def fast_launch(kernel, grid: tuple, args: tuple, kwargs: dict) -> None:
    """``kernel[grid](*args, **kwargs)`` through the cached launcher of (kernel, kwargs).

    Launch plans keep one ``kwargs`` dict per configuration, so the lookup is by identity; a
    dict that has the id of a freed one is told apart by its content."""
    if not _Driver.load():
        kernel[grid](*args, **kwargs)
        return
    key = (id(kernel), id(kwargs))
    fl = _LAUNCHERS.get(key)
    if fl is None or (fl.kwargs is not kwargs and (fl.kernel is not kernel or fl.kwargs != kwargs)):
        if len(_LAUNCHERS) >= 16384:
            _LAUNCHERS.clear()
        fl = _LAUNCHERS[key] = FastLauncher(kernel, kwargs)
    fl(grid, args)


def launcher_for(kernel, kwargs: dict) -> FastLauncher | None:
    """The cached launcher of (kernel, kwargs), if any."""
    fl = _LAUNCHERS.get((id(kernel), id(kwargs)))
    return fl if fl is not None and fl.kwargs is kwargs else None


class Bound:
    """The compiled kernel of the latest launch of (kernel, kwargs) by this thread, for a caller
    that has just made that launch and knows its arguments keep that class (same shapes,
    strides, dtypes, alignment), and launches it itself: ``b.launch(g0, g1, g2, b.stream(device), b.function, b.coop, b.pdl, None, None,
    b.packed, None, None, None, *args, *b.tail)``. None when there is none to bind."""

    __slots__ = ("compiled", "coop", "function", "launch", "packed", "pdl", "stream", "tail")
    launch: Callable[..., Any]  # the compiled kernel's C launcher
    function: int  # the CUfunction handle
    packed: Any  # packed kernel metadata, passed through
    coop: int
    pdl: int
    compiled: Any  # Triton's CompiledKernel: signature and metadata
    stream: Callable[[int], int]  # device index -> raw current stream
    tail: tuple  # the constexpr parameters after the positional arguments

    @classmethod
    def latest(cls, kernel, kwargs: dict) -> Bound | None:
        fl = launcher_for(kernel, kwargs)
        if fl is None or fl.why is not None or fl.last is None or fl.tail is None:
            return None
        if fl.last_thread != get_ident():  # another thread launched since: maybe another class
            return None
        launch, function, packed, coop, pdl, scratch, compiled = fl.last
        if scratch:
            return None
        b = cls()
        b.launch, b.function, b.packed, b.coop, b.pdl = launch, function, packed, coop, pdl
        b.compiled = compiled  # its signature and metadata: what a native launch needs
        b.stream, b.tail = _Driver.stream, fl.tail
        return b


def direct_ok() -> bool:
    """Whether a caller may launch bound kernels itself: Triton's driver found, and no launch
    hook (a profiler's) that only Triton's own path would call."""
    return _Driver.load() and not _Driver.hooks_set()


def current_device() -> int:
    return _Driver.device()
