"""An NVTX range around the first call of each distinct op signature of the ncu process's
profiled step, so that Nsight Compute (``--nvtx-include`` on that range) profiles each problem
size of a kernel once instead of at every launch.

A persistent cuBLAS GEMM launches one grid whatever its problem, so one launch per launch
configuration cannot stand for the others; profiling every launch costs about 0.5 s each
(T5-base: 316 such launches a step, 15 problem sizes). Two calls of an op with the same
arguments (shapes, dtypes, strides, scalar values) launch the same kernels on the same
sizes, so the first one's counters serve both: the join (``analysis/timeline/sizes.py``)
maps each counter row onto the first launch of its size in the trace and from there onto
every launch of that size.

A ``TorchDispatchMode`` sees every op below autograd, on the autograd thread too (the mode is
part of the thread-local state the engine carries over). Dynamo runs a compiled function
eagerly while such a mode is on, which would change the kernels, so a process that has
compiled graphs takes the whole step instead (``mode == "step"``). Runs inside the user's
process: torch is passed in, never imported here.

The same mode trims the step's GPU memory for every ncu pass (``trim``): before the first call
of each op signature, the caching allocator's free blocks go back to the driver. Kernel replay
saves and restores all of the process's GPU memory around each profiled launch, cached blocks
included: an 8 MiB kernel took 0.13 s a launch with nothing else held, 0.28 s beside 40 GiB held
or merely cached, and 0.13 s once that cache was emptied (H200,
``benchmarks/probes/ncu_footprint.py``). A training step's cache holds its peak activations from
the warm-up steps on. A later call of a signature launches the kernels, configurations and sizes
its first call did, which ncu has profiled by then: it needs no trim, and an emptied cache makes
every allocation after it a driver call that waits for the GPU (T5-base's step: 7,635 op calls,
349 signatures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerneltriage.profile.process_facts import dynamo_graphs
from kerneltriage.profile.step_plan import SKIP_RANGE, TAKE_RANGE

#: Non-tensor arguments that are part of a signature by value; any other object by its type.
_VALUE_TYPES = (int, float, bool, str, type(None))


class FirstOfSize:
    """``start()`` at the profiled step's beginning, ``stop()`` at its end. ``take``: the range
    around the first call of each op signature; ``trim``: the cache emptied before the first
    call of each op signature; ``skip``: op keys (name, tensor shapes:
    ``analysis/timeline/one_size.py``) whose calls run inside a range ncu excludes."""

    def __init__(
        self,
        torch: Any,
        range_start: Callable[[str], Any] | None = None,
        range_end: Callable[[Any], None] | None = None,
        *,
        take: bool = True,
        trim: bool = False,
        skip: set[tuple] | None = None,
    ) -> None:
        self.torch = torch
        self.take, self.trim = take, trim
        self.skip = skip or set()
        self.skipped = 0  # calls run inside the excluded range
        self._start = range_start or torch.cuda.nvtx.range_start
        self._end = range_end or torch.cuda.nvtx.range_end
        self.seen: set[tuple] = set()  # signatures taken
        self.trimmed: set[tuple] = set()  # signatures whose first call was trimmed before
        self.trims = 0
        self.calls = 0  # ops called while the mode was on
        self.taken = 0  # ops run inside the range
        # "first-of-size"; "step" (the whole step taken: compiled graphs); "trim" (no range)
        self.mode: str | None = None
        self._dispatch: Any = None
        self._step_range: Any = None

    def start(self) -> None:
        if self.mode is not None:
            return
        if dynamo_graphs():
            self.mode = "step"
            if self.take:
                self._step_range = self._start(TAKE_RANGE)
            if self.trim:  # once: the warm-up steps' cache (graphs keep pools of their own)
                self.torch.cuda.empty_cache()
            return
        self.mode = "first-of-size" if self.take else "trim"
        self._dispatch = _mode_type(self.torch)(self)
        self._dispatch.__enter__()

    def stop(self) -> None:
        if self._dispatch is not None:
            dispatch, self._dispatch = self._dispatch, None
            dispatch.__exit__(None, None, None)
        if self._step_range is not None:
            self._end(self._step_range)
            self._step_range = None

    def status(self) -> dict[str, Any] | None:
        if self.mode is None:
            return None
        data = {"mode": self.mode, "ops": self.calls, "taken": self.taken, "trim": self.trim}
        if self.trim and self.mode != "step":
            data["trims"] = self.trims
        if self.skip:
            data["skipped"] = self.skipped
        return data

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one op, inside the range when its signature is new."""
        self.calls += 1
        key = self._signature_of(func, args, kwargs) if self.take or self.trim else None
        if self.trim and (key is None or key not in self.trimmed):
            cuda = self.torch.cuda
            # (a CUDA graph being captured may not free memory)
            if cuda.is_initialized() and not cuda.is_current_stream_capturing():
                cuda.empty_cache()
                self.trims += 1
            if key is not None:
                self.trimmed.add(key)
        if self.skip and _op_key(func, args, kwargs) in self.skip:
            self.skipped += 1
            return self._in_range(SKIP_RANGE, func, args, kwargs)
        if not self.take:
            return func(*args, **kwargs)
        if key is not None and key in self.seen:
            return func(*args, **kwargs)
        if key is not None:
            self.seen.add(key)
        self.taken += 1
        return self._in_range(TAKE_RANGE, func, args, kwargs)

    def _signature_of(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The op call's signature (None: an argument we cannot describe, which is then taken
        and trimmed rather than guessed)."""
        try:
            return (
                str(func),
                _signature(args, self.torch),
                _signature(tuple(sorted(kwargs.items())), self.torch),
            )
        except Exception:
            return None

    def _in_range(self, name: str, func: Any, args: tuple, kwargs: dict) -> Any:
        handle = self._start(name)
        try:
            return func(*args, **kwargs)
        finally:
            self._end(handle)


def _op_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The op call's name and the shapes of its tensor arguments in schema order, as the
    trace's ``Input Dims`` give them (``one_size.op_key``); None where the op has no schema."""
    try:
        schema = func._schema
        values = [args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema.arguments)]
        return schema.name, tuple(_shapes(values))
    except Exception:  # an op we cannot describe is profiled
        return None


def _shapes(values: Any) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out += _shapes(v)
        elif hasattr(v, "shape") and hasattr(v, "dim") and v.dim() > 0:
            out.append(tuple(int(d) for d in v.shape))
    return out


def _signature(value: Any, torch: Any) -> Any:
    """A hashable description of an op argument: a tensor's shape, dtype, strides and device;
    sequences element by element; plain values as they are."""
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), str(value.dtype), tuple(value.stride()), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v, torch) for v in value)
    if isinstance(value, _VALUE_TYPES):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    return type(value).__name__


def _mode_type(torch: Any) -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _FirstOfSizeMode(TorchDispatchMode):
        def __init__(self, owner: FirstOfSize) -> None:
            super().__init__()
            self.owner = owner

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self.owner.call(func, args, kwargs or {})

    return _FirstOfSizeMode
