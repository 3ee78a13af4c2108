"""Process-wide settings of the built-in kernels, read once per call through ``current()``.

Tests and benchmarks change them with ``override(...)`` (a context manager), never by patching
module globals (``set_defaults`` changes them for the rest of the process)::

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
    fast_launch: the fast host path (``host_path.py``: direct launches, bound norm calls) where
        it can be set up; off: every launch through ``kernel[grid](...)``. Never used by the
        interpreter. Default: $KERNELTRIAGE_FAST_LAUNCH, else on; ``set_fast_launch`` changes it.
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
_default = KernelConfig()  # the settings outside any override (``set_defaults`` changes them)
_current = _default
# The active overrides, oldest first: [token, changes, the config in force inside it].
_overrides: list[list[Any]] = []


def current() -> KernelConfig:
    """The settings in force."""
    return _current


def default() -> KernelConfig:
    """The settings outside any override; ``current() is default()`` when none is active."""
    return _default


def _frozen(name: str, value: Any) -> Any:
    if name in _MAPPINGS and isinstance(value, Mapping):
        return tuple(sorted(value.items()))
    return value


def _checked(changes: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(KernelConfig)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"KernelConfig has no setting {', '.join(unknown)}; settings: {sorted(names)}")
    return {k: _frozen(k, v) for k, v in changes.items()}


def _rebuild(start: int = 0) -> None:
    """The settings in force: the default with the active overrides on top, oldest first; the
    configs of the overrides below ``start`` are kept (the same objects as before)."""
    global _current
    cfg = _default if start == 0 else _overrides[start - 1][2]
    for entry in _overrides[start:]:
        cfg = entry[2] = replace(cfg, **entry[1])
    _current = cfg


def set_defaults(**changes: Any) -> KernelConfig:
    """Change settings for the rest of the process (``kernels.set_fast_launch`` uses it);
    overrides active now keep their own settings on top. Returns the new default."""
    global _default
    _default = replace(_default, **_checked(changes))
    _rebuild()
    return _default


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[KernelConfig]:
    """Replace some settings for the duration of a ``with`` block (mappings may be given as
    dicts). Yields the config in force inside the block."""
    token = object()
    _overrides.append([token, _checked(changes), None])
    _rebuild(len(_overrides) - 1)
    try:
        yield _current
    finally:
        i = next(i for i, entry in enumerate(_overrides) if entry[0] is token)
        del _overrides[i]
        _rebuild(i)
