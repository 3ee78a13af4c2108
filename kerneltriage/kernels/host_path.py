"""How the built-in kernels are launched from the host: the fast path, or plain Triton launches.

The one place that decides (``select``); the rest of ``kernels/`` launches through the object it
returns and never imports the fast path's modules itself. Attention launches through
``launch`` here; the norms' launch plans, which the fast path's bound calls build on, through
``_common.launch``, which this module routes through ``select`` when it is imported (the norms'
API imports it; an import from the plans would be a cycle).

- **plain**: every launch is ``kernel[grid](*args, **kwargs)``, the tile configuration chosen by
  ``triton.autotune`` on a GPU's first call. Public Triton API only, all of it there since
  Triton 3.2 (``triton>=3.2`` in pyproject.toml): ``triton.jit`` kernels launched with
  ``kernel[grid](...)`` (constexprs and ``num_warps`` / ``num_stages`` as keywords),
  ``triton.autotune(configs, key, prune_configs_by, post_hook)`` and its ``best_config``,
  ``triton.Config`` and ``Config.all_kwargs()``, ``triton.next_power_of_2``; the autotuner's
  disk cache (``cache_results``, Triton 3.4) only where ``triton.autotune`` takes it. Always
  correct, on every Triton the project supports, under the interpreter too.
- **fast**: the same kernels with less host time per call, through Triton 3.6 internals:
  ``fast_launch.py`` (calls a compiled kernel's launcher directly once Triton has resolved it
  for an argument class), ``norms/fast.py`` (a repeated norm call bound to its input signature)
  and ``native.py`` + ``csrc/`` (those bound calls in C++, built on first use). Outputs are the
  plain path's bit for bit (``tests/kernels/test_fast_launch.py`` and ``test_native.py`` on a
  GPU).

Switch: ``KERNELTRIAGE_FAST_LAUNCH=0`` in the environment (read when ``kerneltriage.kernels``
is first used) or ``kerneltriage.kernels.set_fast_launch(False)`` turns the fast path off;
``set_fast_launch(True)`` turns it back on. ``KERNELTRIAGE_NATIVE=0`` turns off only its C++
layer.

Fallback: the fast path is set up once per process, on first use, and any failure leaves the
plain path with the reason recorded, never an exception: a Triton other than 3.6 (the
internals it relies on differ), Triton's driver or launch-hook internals not found (no GPU
driver, another backend), or Triton's interpreter (``TRITON_INTERPRET=1``: no compiled
launcher to call). Without a C++ compiler or ninja the fast path keeps its Python bound calls.
At run time a kernel whose launch the fast path cannot reproduce (another launcher class, a
scratch buffer, an argument type it does not classify) goes through Triton's own path, and so
does every launch while a launch hook (a profiler's, e.g. Proton) is set.

``launch_path()`` says which path is in use and why (``LaunchPath``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kerneltriage.kernels import _common, config

# Triton (major, minor) versions whose internals the fast path was written against.
SUPPORTED_TRITON = ((3, 6),)


@dataclass(frozen=True)
class LaunchPath:
    """Which host path launches the built-in kernels, and why.

    path: "fast" or "plain".
    reason: why this path (the switch, the interpreter, why the fast path could not be set up,
        or what the fast path found).
    native: the fast path's C++ layer (``native.status()``: "loaded", "building", "not built",
        "unavailable: <why>"), or "not used" on the plain path.
    triton: the installed Triton's version, None when Triton cannot be imported.
    fallbacks: on the fast path, why each kernel configuration that it hands to Triton's own
        launch does so (distinct reasons).
    """

    path: str
    reason: str
    native: str
    triton: str | None
    fallbacks: tuple[str, ...] = ()


class Host:
    """The plain path: every launch through ``kernel[grid](...)``, no bound norm calls.

    The ``norm_*`` methods are the norms' bound calls (``norms/fast.py``); on this path there
    are none, so lookups find nothing and binds do nothing."""

    name = "plain"
    bound = False  # the norms' bound calls are in use

    def launch(self, kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict) -> None:
        kernel[grid](*args, **kwargs)

    def norm_call(self, kind: str, x, residual, weight, bias, eps, w_offset, cast_x) -> Any:
        """The call's output from its C++ bound call, or None."""
        return None

    def norm_lookup(
        self, kind: str, x, residual, weight, bias, eps, w_offset, cast_x
    ) -> tuple[tuple | None, Any]:
        """(signature, its bound forward or None); (None, None): no binding for this call."""
        return None, None

    def norm_bind(self, key: tuple, x, residual, weight, bias, eps, is_rms: bool, w_offset, cast_x) -> None:
        """After a generic forward of a call whose ``norm_lookup`` gave ``key``: bind it."""

    def norm_lookup_bwd(
        self, key: tuple, dy, dresidual, need_dw: bool, need_db: bool
    ) -> tuple[tuple | None, Any]:
        """(gradient signature, its bound backward or None) of a bound forward's backward."""
        return None, None

    def norm_bind_bwd(
        self,
        bkey: tuple,
        dy,
        xs,
        weight,
        mean,
        rstd,
        dresidual,
        need_dw: bool,
        need_db: bool,
        w_offset,
        cast_x,
    ) -> None:
        """After a generic backward whose ``norm_lookup_bwd`` gave ``bkey``: bind it."""


class _Fast(Host):
    """Launches through ``fast_launch``; no bound norm calls (a ``config.override`` is active:
    poisoned buffers, forced configurations and stub launchers take the generic host code)."""

    name = "fast"

    def __init__(self) -> None:
        from kerneltriage.kernels import fast_launch

        self._launch = fast_launch.fast_launch

    def launch(self, kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict) -> None:
        self._launch(kernel, grid, args, kwargs)


class _FastBound(_Fast):
    """The fast path with the norms' bound calls (the default configuration)."""

    bound = True

    def __init__(self) -> None:
        super().__init__()
        from kerneltriage.kernels.fast_launch import direct_ok
        from kerneltriage.kernels.norms import fast

        self._fast = fast
        self._direct_ok = direct_ok  # per call: a profiler may set a launch hook at any time

    def norm_call(self, kind: str, x, residual, weight, bias, eps, w_offset, cast_x) -> Any:
        table = self._fast.TABLE
        if table is None or not self._direct_ok():
            return None
        try:
            return table.call(self._fast.KINDS[kind], x, residual, weight, bias, eps, w_offset, cast_x)
        except TypeError:  # not tensors or floats: the generic path checks and rejects them
            return None

    def norm_lookup(
        self, kind: str, x, residual, weight, bias, eps, w_offset, cast_x
    ) -> tuple[tuple | None, Any]:
        if not self._direct_ok():
            return None, None
        fast = self._fast
        try:
            key = fast.fwd_key(kind, x, residual, weight, bias, eps, w_offset, cast_x)
            return key, fast.fwd(key)
        except Exception:  # not tensors, an unhashable eps: the generic path checks them
            return None, None

    def norm_bind(self, key: tuple, x, residual, weight, bias, eps, is_rms: bool, w_offset, cast_x) -> None:
        self._fast.bind_fwd(key, x, residual, weight, bias, eps, is_rms, w_offset, cast_x)

    def norm_lookup_bwd(
        self, key: tuple, dy, dresidual, need_dw: bool, need_db: bool
    ) -> tuple[tuple | None, Any]:
        if not self._direct_ok():
            return None, None
        try:
            bkey = self._fast.bwd_key(key, dy, dresidual, need_dw, need_db)
        except Exception:
            return None, None
        return bkey, self._fast.bwd(bkey)

    def norm_bind_bwd(
        self,
        bkey: tuple,
        dy,
        xs,
        weight,
        mean,
        rstd,
        dresidual,
        need_dw: bool,
        need_db: bool,
        w_offset,
        cast_x,
    ) -> None:
        self._fast.bind_bwd(bkey, dy, xs, weight, mean, rstd, dresidual, need_dw, need_db, w_offset, cast_x)


PLAIN = Host()


class _State:
    tried = False  # the fast path's set-up has run
    why: str | None = None  # why it could not be set up
    fast: _Fast | None = None
    fast_bound: _FastBound | None = None
    switched_by_call: bool = False  # set_fast_launch was called (the reason names it)
    chosen: tuple[Any, Host, str] = (None, PLAIN, "")  # (config, its host, why), the latest


def _triton_version() -> str | None:
    try:
        import triton
    except Exception:
        return None
    return str(getattr(triton, "__version__", "")) or None


def _check_version() -> str | None:
    """Why this Triton's internals are not the fast path's, or None."""
    version = _triton_version()
    if version is None:
        return "Triton cannot be imported"
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or (int(m[1]), int(m[2])) not in SUPPORTED_TRITON:
        known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_TRITON)
        return f"Triton {version}: the fast path relies on the internals of Triton {known} only"
    return None


def _check_driver() -> str | None:
    """Why Triton's driver and launch-hook internals are not usable, or None."""
    from kerneltriage.kernels.fast_launch import _Driver

    if _Driver.load():
        return None
    return f"Triton's launch internals not found ({_Driver.why})"


def _set_up() -> str | None:
    """Set the fast path up (once per process): None when it is usable, else why not."""
    if _State.tried:
        return _State.why
    try:
        why = _check_version() or _check_driver()
        if why is None:
            _State.fast, _State.fast_bound = _Fast(), _FastBound()
    except Exception as e:  # anything unexpected leaves the plain path
        why = f"setting the fast path up failed: {type(e).__name__}: {e}"
    _State.why, _State.tried = why, True
    return why


def _off_reason(cfg: config.KernelConfig) -> str:
    if cfg is not config.default():
        return "turned off by config.override(fast_launch=False)"
    if _State.switched_by_call:
        return "turned off by set_fast_launch(False)"
    return "turned off (KERNELTRIAGE_FAST_LAUNCH=0)"


def _choose(cfg: config.KernelConfig) -> tuple[Host, str]:
    if not cfg.fast_launch:
        return PLAIN, _off_reason(cfg)
    if cfg.interpreter:
        return PLAIN, "Triton's interpreter (TRITON_INTERPRET=1): no compiled launcher to call"
    why = _set_up()
    if why is not None or _State.fast is None or _State.fast_bound is None:
        return PLAIN, why or "the fast path is not set up"
    if cfg is config.default():
        return _State.fast_bound, f"Triton {_triton_version()}: direct launches and bound norm calls"
    return _State.fast, (
        f"Triton {_triton_version()}: direct launches; the norms' bound calls are off while "
        "config.override(...) is active"
    )


def select(cfg: config.KernelConfig | None = None) -> Host:
    """The host path for ``cfg`` (default: the settings in force): fast or plain. Cheap per
    call: the choice is kept for the latest configuration object."""
    if cfg is None:
        cfg = config.current()
    chosen = _State.chosen
    if chosen[0] is cfg:
        return chosen[1]
    host, why = _choose(cfg)
    _State.chosen = (cfg, host, why)
    return host


def launch(kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict, cfg: config.KernelConfig) -> None:
    """``kernel[grid](*args, **kwargs)`` on the path ``select(cfg)`` picks, or ``cfg.launcher``
    (a stub) with the same arguments: what ``_common.launch`` does once this module is imported."""
    if cfg.launcher is not None:
        cfg.launcher(kernel, grid, args, kwargs)
    else:
        select(cfg).launch(kernel, grid, args, kwargs)


def set_fast_launch(enabled: bool) -> None:
    """Turn the fast host path on or off for the rest of the process (outside any
    ``config.override``); the environment's ``KERNELTRIAGE_FAST_LAUNCH`` is only the default."""
    _State.switched_by_call = not enabled
    config.set_defaults(fast_launch=bool(enabled))


def launch_path() -> LaunchPath:
    """Which host path launches the kernels under the settings in force, and why. Sets the
    fast path up if that has not been tried yet."""
    cfg = config.current()
    select(cfg)
    _, host, why = _State.chosen
    native = "not used"
    fallbacks: tuple[str, ...] = ()
    if host is not PLAIN:
        from kerneltriage.kernels import fast_launch
        from kerneltriage.kernels import native as native_ext

        native = native_ext.status()
        fallbacks = tuple(sorted({fl.why for fl in fast_launch._LAUNCHERS.values() if fl.why}))
    return LaunchPath(
        path=host.name, reason=why, native=native, triton=_triton_version(), fallbacks=fallbacks
    )


def _reset() -> None:
    """Forget the set-up and the latest choice (tests: after changing what the set-up checks)."""
    _State.tried, _State.why = False, None
    _State.fast = _State.fast_bound = None
    _State.chosen = (None, PLAIN, "")


_common.route_launches(select)  # every kernel launch from now on takes the path picked here
