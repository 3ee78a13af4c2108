"""The host path of a repeated norm call: one bound launch per input signature.

A training or inference loop calls a norm with the same shapes, strides, dtypes and devices
every step. The first call of a signature takes the generic host code (input checks, row views,
launch plan, Triton's launch); once the plan is tuned and the kernel compiled, the signature
gets a closure that allocates the outputs and calls the compiled kernel's launcher with
arguments fixed in advance (row strides, grid, constexprs). A later call with that signature
costs a key (shape, strides, dtypes, device, 16-byte alignment of each input) and the closure.

The key covers everything the generic path checks and everything Triton specializes on, so a
hit is a call the generic path has already accepted and launched. Part of the fast host path:
only ``host_path.py`` imports this module, and calls it only on that path with the default
kernel configuration (no ``config.override`` active: tests' poisoned buffers and launcher stubs
take the generic path), never under the interpreter, and never while a launch hook (a
profiler) is set. Row views that would copy (a strided last dim) and the two-kernel backward of
long rows are not bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kerneltriage.kernels import config, native
from kerneltriage.kernels.fast_launch import Bound, current_device, direct_ok
from kerneltriage.kernels.norms import launch as L

_FWD: dict[tuple, Callable[..., Any]] = {}
_BWD: dict[tuple, Callable[..., Any]] = {}
# The C++ signature table (``native.py``) once the extension is loaded: call -> bound Norm.
TABLE: Any = None
KINDS = {"rms": 0, "ln": 1, "add": 2}
_MAX = 1024  # signatures per direction; cleared beyond (a bound against unbounded shapes)
_empty = torch.empty
_f32 = torch.float32


def usable() -> bool:
    """The bound calls may run: the default configuration, fast launches on, no interpreter
    (``host_path`` chose them when it bound the call), and no launch hook set."""
    cfg = config.current()
    return cfg is config.default() and cfg.fast_launch and not cfg.interpreter and direct_ok()


def _sig(t: torch.Tensor | None) -> tuple | None:
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)


def fwd_key(kind: str, x, residual, weight, bias, eps, w_offset, cast_x) -> tuple:
    """The call's signature; ``key[-2]``: whether it needs a gradient. Raises for inputs that
    are not tensors (the generic path checks and rejects them)."""
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, residual, weight, bias)
    )
    sigs = (_sig(x), _sig(residual), _sig(weight), _sig(bias))
    return (kind, *sigs, eps, w_offset, cast_x, grad, current_device())


def _same_memory(view: torch.Tensor, t: torch.Tensor) -> bool:
    return view.data_ptr() == t.data_ptr()


def _store(cache: dict[tuple, Callable[..., Any]], key: tuple, fn: Callable[..., Any]) -> None:
    if len(cache) >= _MAX:
        cache.clear()
    cache[key] = fn


def bind_fwd(key: tuple, x, residual, weight, bias, eps, is_rms: bool, w_offset, cast_x) -> None:
    """After a generic forward of these inputs (signature ``key``): the closure for their
    signature, if it can be bound (plan tuned, kernel launched through the fast path, row views
    without copies)."""
    grad = bool(key[-2])
    try:
        N = x.shape[-1]
        x2 = L.as_rows(x)
        M = x2.shape[0]
        r2 = None if residual is None else L.as_rows(residual)
        if M == 0 or not _same_memory(x2, x) or (r2 is not None and not _same_memory(r2, residual)):
            return
        sr = 0 if r2 is None else r2.stride(0)
        if any(t is not None and t.stride(-1) != 1 for t in (weight, bias)):
            return  # the generic path passes unit-stride copies of these
        ydtype = L.out_dtype(x, weight, cast_x)
        dtypes = (
            x.dtype,
            ydtype,
            None if weight is None else weight.dtype,
            None if bias is None else bias.dtype,
        )
        flags = (
            ("IS_RMS", is_rms), ("HAS_RES", residual is not None), ("HAS_W", weight is not None),
            ("HAS_B", bias is not None), ("CAST_X", cast_x), ("INTERP", False),
        )  # fmt: skip
        plan = L._plan_for("fwd", N, dtypes, flags, x.device, config.current())
        if plan.kwargs is None:
            return
        b = Bound.latest(L.KERNELS["fwd"], plan.kwargs)
        if b is None:
            return
        g = plan.grid(M, N, plan.kwargs)
        g0, g1, g2 = g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1
        launch, function, packed, coop, pdl, stream, tail = (
            b.launch, b.function, b.packed, b.coop, b.pdl, b.stream, b.tail,
        )  # fmt: skip
        dev, dev_index = x.device, x.get_device()
        shape, xdtype = x.shape, x.dtype
        has_res = residual is not None
        sx = x2.stride(0)
        eps_, w_off = float(eps), float(w_offset)
        # Without a gradient the statistics are not returned: the kernel writes them to a
        # buffer kept with the closure (same values each time; never read).
        scratch_rstd = None if grad else _empty((M,), dtype=_f32, device=dev)
        scratch_mean = None if grad or is_rms else _empty((M,), dtype=_f32, device=dev)

        def run(x, residual, weight, bias):
            y = _empty(shape, dtype=ydtype, device=dev)
            h = _empty(shape, dtype=xdtype, device=dev) if has_res else None
            if grad:
                rstd = _empty((M,), dtype=_f32, device=dev)
                mean = None if is_rms else _empty((M,), dtype=_f32, device=dev)
            else:
                rstd, mean = scratch_rstd, scratch_mean
            launch(
                g0, g1, g2, stream(dev_index), function, coop, pdl, None, None, packed, None, None, None,
                x, residual, weight, bias, y, h, mean, rstd, M, N, sx, sr, N, N if has_res else 0,
                eps_, w_off, *tail,
            )  # fmt: skip
            return y, h, mean, rstd

        if key[-1] != dev_index:  # launched on another device than x's: not its stream
            return
        _store(_FWD, key, run)
        m = native.module()
        if m is None:
            return
        R = [native.Ref(i) for i in range(8)]  # x, residual, weight, bias, y, h, mean, rstd
        args = (
            R[0], R[1] if has_res else None, None if weight is None else R[2],
            None if bias is None else R[3], R[4], R[5] if has_res else None,
            None if is_rms else R[6], R[7], M, N, sx, sr, N, N if has_res else 0, eps_, w_off,
        )  # fmt: skip
        spec = native.launch_spec(b, (g0, g1, g2), args)
        if spec is None:
            return
        p = m.Program(4, 8, dev_index)
        p.add_alloc(4, list(shape), _like(ydtype))
        if has_res:
            p.add_alloc(5, list(shape), _like(xdtype))
        if grad:
            p.add_alloc(7, [M], _like(_f32))
            if not is_rms:
                p.add_alloc(6, [M], _like(_f32))
        else:
            p.add_kept(7, scratch_rstd)
            if scratch_mean is not None:
                p.add_kept(6, scratch_mean)
        p.add_launch(*spec)
        p.set_outputs([4, 5, 6, 7])
        norm = m.Norm(_NAMES[key[0]], p, has_res, bias is not None, w_off, bool(cast_x))
        table = TABLE if TABLE is not None else _new_table(m)
        table.add(KINDS[key[0]], x, residual, weight, bias, eps_, w_off, bool(cast_x), grad, norm)
    except Exception:  # binding is an optimization: the generic path stays correct
        return


_NAMES = {
    "rms": "kerneltriage::rms_norm",
    "ln": "kerneltriage::layer_norm",
    "add": "kerneltriage::fused_add_rms_norm",
}
_LIKE: dict[torch.dtype, torch.Tensor] = {}


def _like(dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of ``dtype``: how a dtype crosses into the extension."""
    t = _LIKE.get(dtype)
    if t is None:
        t = _LIKE[dtype] = torch.empty(0, dtype=dtype)
    return t


def _new_table(m: Any) -> Any:
    global TABLE
    TABLE = m.Table()
    return TABLE


def _forget() -> None:
    """Bind every signature again (the extension just loaded: with its C++ call this time)."""
    _FWD.clear()
    _BWD.clear()
    if TABLE is not None:
        TABLE.clear()


def _on_native_load(m: Any) -> None:
    m.set_fallback(_fallback_backward)
    _forget()


def _fallback_backward(norm, dy, xs, weight, mean, rstd, dres, need_dw: bool, need_db: bool):
    """A backward whose gradient signature is not bound yet (called by the C++ node, GIL held):
    the generic host code, then bind the signature into ``norm`` for the next time."""
    dx, dw, db = L.norm_bwd(
        L.as_rows(dy),
        L.as_rows(xs),
        weight,
        mean,
        rstd,
        dresidual=None if dres is None else L.as_rows(dres),
        need_dw=need_dw,
        need_db=need_db,
        w_offset=norm.w_offset,
        cast_x=norm.cast_x,
    )
    if usable():
        bind_native_bwd(norm, dy, xs, weight, mean, rstd, dres, need_dw, need_db)
    return L.like(dx, dy.shape), dw, db


def fwd(key: tuple) -> Callable[..., Any] | None:
    """The bound forward of this signature (on the current device), or None."""
    return _FWD.get(key)


def bwd_key(fkey: tuple, dy, dres, need_dw: bool, need_db: bool) -> tuple:
    return (fkey, _sig(dy), _sig(dres), need_dw, need_db, current_device())


class _BwdPlan:
    """What a bound backward of one gradient signature launches (rows up to 16384 only): the
    backward kernel ``b`` on grid ``g``, and the partial-sum kernel ``sums`` on ``sum_grid``
    when dw or db is summed."""

    __slots__ = (
        "M", "N", "b", "dev_index", "g", "has_dw", "need_db", "nprog", "rows", "sdres", "sdy",
        "shape", "sum_grid", "sums", "sx", "w_off", "wdtype", "xdtype",
    )  # fmt: skip
    M: int
    N: int
    b: Bound
    dev_index: int
    g: tuple[int, int, int]
    has_dw: bool
    need_db: bool
    nprog: torch.Tensor
    rows: int
    sdres: int
    sdy: int
    shape: torch.Size
    sum_grid: tuple[int, ...]
    sums: Bound | None
    sx: int
    w_off: float
    wdtype: torch.dtype
    xdtype: torch.dtype


def _bwd_plan(
    dy, xs, weight, mean, rstd, dres, need_dw: bool, need_db: bool, w_offset, cast_x
) -> _BwdPlan | None:
    x2 = L.as_rows(xs)
    M, N = x2.shape
    if not _same_memory(x2, xs) or (weight is not None and weight.stride(-1) != 1):
        return None
    cfg = config.current()
    if M == 0 or cfg.norm_split_bwd_above < N:
        return None
    dy2 = L.as_rows(dy)
    dres2 = None if dres is None else L.as_rows(dres)
    if not _same_memory(dy2, dy) or (dres2 is not None and not _same_memory(dres2, dres)):
        return None
    is_rms = mean is None
    has_w = weight is not None
    p = _BwdPlan()
    p.has_dw, p.need_db = has_w and need_dw, need_db
    p.wdtype = weight.dtype if has_w else x2.dtype
    dtypes = (x2.dtype, dy.dtype, p.wdtype, None if dres is None else dres.dtype)
    flags = (
        ("IS_RMS", is_rms), ("HAS_W", has_w), ("HAS_DRES", dres is not None), ("HAS_DW", p.has_dw),
        ("HAS_DB", need_db), ("CAST_X", cast_x), ("INTERP", False),
    )  # fmt: skip
    plan = L._plan_for("bwd", N, dtypes, flags, x2.device, cfg)
    if plan.kwargs is None:
        return None
    b = Bound.latest(L.KERNELS["bwd"], plan.kwargs)
    p.sums, p.sum_grid = None, ()
    if p.has_dw or need_db:
        sum_grid, sum_kwargs = L._sum_partials_meta(N, p.has_dw, need_db, False)
        p.sums, p.sum_grid = Bound.latest(L.K._sum_partials_kernel, sum_kwargs), sum_grid
        if p.sums is None:
            return None
    if b is None:
        return None
    p.b = b
    g = plan.grid(M, N, plan.kwargs)
    p.g = (g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1)
    p.rows = plan.partial_rows(M)
    p.dev_index = x2.get_device()
    p.M, p.N, p.shape, p.xdtype = M, N, dy.shape, x2.dtype
    p.sdy, p.sx, p.sdres = dy2.stride(0), x2.stride(0), (dres2.stride(0) if dres2 is not None else 0)
    p.w_off = float(w_offset)
    # Every launch of this signature writes the same program count here: one buffer serves all.
    p.nprog = _empty((1,), dtype=torch.int32, device=x2.device)
    return p


def bind_bwd(
    key: tuple, dy, xs, weight, mean, rstd, dres, need_dw: bool, need_db: bool, w_offset, cast_x
) -> None:
    """After a generic backward: the closure for its signature (rows up to 16384 only). ``xs``:
    the tensor the forward saved (x, or new_residual), in any shape whose rows are views."""
    try:
        p = _bwd_plan(dy, xs, weight, mean, rstd, dres, need_dw, need_db, w_offset, cast_x)
        if p is None or key[-1] != p.dev_index:  # launched on another device than the tensors'
            return
        b, sums, sum_grid, (g0, g1, g2) = p.b, p.sums, p.sum_grid, p.g
        M, N, rows, shape, xdtype, wdtype = p.M, p.N, p.rows, p.shape, p.xdtype, p.wdtype
        has_dw, dev_index, dev = p.has_dw, p.dev_index, dy.device
        sdy, sx, sdres, w_off, nprog = p.sdy, p.sx, p.sdres, p.w_off, p.nprog

        def run(dy, xs, weight, mean, rstd, dres):
            dx = _empty(shape, dtype=xdtype, device=dev)
            dw = _empty((N,), dtype=wdtype, device=dev) if has_dw else None
            db = _empty((N,), dtype=wdtype, device=dev) if need_db else None
            dw_part = _empty((rows, N), dtype=_f32, device=dev) if has_dw else None
            db_part = _empty((rows, N), dtype=_f32, device=dev) if need_db else None
            s = b.stream(dev_index)
            b.launch(
                g0, g1, g2, s, b.function, b.coop, b.pdl, None, None, b.packed, None, None, None,
                dy, xs, weight, mean, rstd, dres, dx, dw_part, db_part, nprog, M, N,
                sdy, sx, sdres, N, w_off, *b.tail,
            )  # fmt: skip
            if sums is not None:
                sums.launch(
                    sum_grid[0], 1, 1, s, sums.function, sums.coop, sums.pdl, None, None, sums.packed,
                    None, None, None, dw_part, db_part, nprog, dw, db, N, *sums.tail,
                )  # fmt: skip
            return dx, dw, db

        _store(_BWD, key, run)
    except Exception:
        return


def bind_native_bwd(norm, dy, xs, weight, mean, rstd, dres, need_dw: bool, need_db: bool) -> None:
    """After a generic backward called by the C++ node of ``norm``: a C++ program for this
    gradient signature (same launches as ``bind_bwd``'s closure), added to ``norm``."""
    try:
        m = native.module()
        p = _bwd_plan(dy, xs, weight, mean, rstd, dres, need_dw, need_db, norm.w_offset, norm.cast_x)
        if m is None or p is None or current_device() != p.dev_index:
            return
        has_dw, need_db, M, N = p.has_dw, p.need_db, p.M, p.N
        R = [native.Ref(i) for i in range(12)]  # inputs, then dx, dw, db, dw_part, db_part, nprog
        args = (
            R[0], R[1], None if weight is None else R[2], None if mean is None else R[3], R[4],
            None if dres is None else R[5], R[6], R[9] if has_dw else None,
            R[10] if need_db else None, R[11], M, N, p.sdy, p.sx, p.sdres, N, p.w_off,
        )  # fmt: skip
        spec = native.launch_spec(p.b, p.g, args)
        if spec is None:
            return
        prog = m.Program(6, 12, p.dev_index)
        prog.add_alloc(6, list(p.shape), _like(p.xdtype))
        if has_dw:
            prog.add_alloc(7, [N], _like(p.wdtype))
            prog.add_alloc(9, [p.rows, N], _like(_f32))
        if need_db:
            prog.add_alloc(8, [N], _like(p.wdtype))
            prog.add_alloc(10, [p.rows, N], _like(_f32))
        prog.add_kept(11, p.nprog)
        prog.add_launch(*spec)
        if p.sums is not None:
            sum_args = (
                R[9] if has_dw else None, R[10] if need_db else None, R[11],
                R[7] if has_dw else None, R[8] if need_db else None, N,
            )  # fmt: skip
            sum_spec = native.launch_spec(p.sums, (p.sum_grid[0], 1, 1), sum_args)
            if sum_spec is None:
                return
            prog.add_launch(*sum_spec)
        prog.set_outputs([6, 7, 8])
        norm.add_backward(prog, need_dw, need_db, dy, dres)
    except Exception:
        return


def bwd(key: tuple) -> Callable[..., Any] | None:
    return _BWD.get(key)


# Last: the hook may run at once (the extension already loaded), and needs the names above.
native.when_loaded(_on_native_load)
