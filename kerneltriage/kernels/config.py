"""Process-wide settings of the built-in kernels, read once per call through ``current()``.

Tests and benchmarks change them with ``override(...)`` (a context manager), never by patching
module globals::

    from kerneltriage.kernels import config

    with config.override(poison=True, norm_configs={"fwd": cfg}):
        ...

The object is frozen and hashable: launch plans are cached per (shape, dtypes, device,
``KernelConfig``), so an override gets plans of its own and leaves the default ones intact.
An override applies to the whole process (autograd's backward threads included), not to one
thread, so it is for tests and benchmarks rather than for serving code.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


def _env_interpreter() -> bool:
    # Triton reads TRITON_INTERPRET when it is first imported; so do we, once.
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _env_fast_launch() -> bool:
    return os.environ.get("KERNELTRIAGE_FAST_LAUNCH", "1") not in ("", "0")


def _env_tma() -> str:
    return os.environ.get("KERNELTRIAGE_ATTN_TMA", "auto")


@dataclass(frozen=True)
class KernelConfig:
    """What the kernels' host code reads per call.

    norm_configs: kernel kind of the norms ("fwd", "bwd", "bwd_dots", "bwd_split") -> a forced
        ``triton.Config``, on a GPU and in the interpreter alike (e.g. the looped variant on a
        short row). Stored as sorted (kind, config) pairs so that the object stays hashable.
    norm_split_bwd_above: row length above which the norms' backward takes the two-kernel path.
    attention_configs: "fwd" | "dkdv" | "dq" -> (BLOCK_M, BLOCK_N, num_warps, num_stages),
        replacing autotuning.
    attention_tma: "auto" (tensor descriptors where the tables say so), "on" (every kernel where
        alignment allows; the interpreter runs the descriptor path this way) or "off".
        Default: $KERNELTRIAGE_ATTN_TMA, else "auto".
    poison: fill every buffer the host code allocates (outputs, statistics, partial sums) with
        NaN, so that an element a kernel fails to write shows in a comparison.
    launcher: called as ``launcher(kernel, grid, args, kwargs)`` instead of launching a Triton
        kernel; a no-op launcher measures the host code alone.
    interpreter: kernels run through Triton's CPU interpreter (CPU tensors allowed). Default:
        $TRITON_INTERPRET.
    fast_launch: launch compiled kernels directly once Triton has resolved them for an argument
        class (``fast_launch.py``); off: every launch through ``kernel[grid](...)``. Never used
        by the interpreter. Default: $KERNELTRIAGE_FAST_LAUNCH, else on.
    """

    norm_configs: tuple[tuple[str, Any], ...] = ()
    norm_split_bwd_above: int = 16384
    attention_configs: tuple[tuple[str, tuple[int, int, int, int]], ...] = ()
    attention_tma: str = field(default_factory=_env_tma)
    poison: bool = False
    launcher: Callable[..., None] | None = None
    interpreter: bool = field(default_factory=_env_interpreter)
    fast_launch: bool = field(default_factory=_env_fast_launch)

    def norm_config(self, kind: str) -> Any | None:
        for k, cfg in self.norm_configs:
            if k == kind:
                return cfg
        return None

    def attention_config(self, kind: str) -> tuple[int, int, int, int] | None:
        for k, cfg in self.attention_configs:
            if k == kind:
                return cfg
        return None


_MAPPINGS = {"norm_configs", "attention_configs"}
_current = KernelConfig()


def current() -> KernelConfig:
    """The settings in force."""
    return _current


def _frozen(name: str, value: Any) -> Any:
    if name in _MAPPINGS and isinstance(value, Mapping):
        return tuple(sorted(value.items()))
    return value


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[KernelConfig]:
    """Replace some settings for the duration of a ``with`` block (mappings may be given as
    dicts). Yields the config in force inside the block."""
    global _current
    names = {f.name for f in fields(KernelConfig)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"KernelConfig has no setting {', '.join(unknown)}; settings: {sorted(names)}")
    previous = _current
    _current = replace(previous, **{k: _frozen(k, v) for k, v in changes.items()})
    try:
        yield _current
    finally:
        _current = previous
