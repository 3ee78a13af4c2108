"""Host side of the norm kernels: input checks, tile configurations, cached launch plans, and the
two host functions ``norm_fwd`` / ``norm_bwd`` that allocate buffers and launch.

Per call the host does the checks, allocates the outputs and workspaces, looks up one cached
``NormLaunchPlan`` per kernel (keyed by kind, row length, dtypes, flags, device and any forced
configuration) and launches. A plan is resolved once: under the interpreter or a forced
configuration at once, on a GPU by the autotuner on its first launch, after which the chosen
configuration is launched directly. No host reads of device memory, no syncs.
"""

from __future__ import annotations

import functools
import inspect

import torch
import triton

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels import config
from kerneltriage.kernels._common import cdiv, check_device, check_dtype, dtype_name, empty, launch
from kerneltriage.kernels.norms import triton_kernels as K

DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Longest row kept in registers in one block in forward; beyond it only the looped variant.
_MAX_SINGLE_BLOCK = 32768


# --------------------------------------------------------------------------------------------
# Tile configurations
# --------------------------------------------------------------------------------------------


def kernel_config(num_warps: int, **kwargs: int) -> triton.Config:
    return triton.Config(kwargs, num_warps=num_warps, num_stages=1)


def row_config(num_warps: int, block_m: int, block_n: int, looped: bool, pps: int) -> triton.Config:
    """A config of the row-wise kernels; pps (programs per SM) 0 = one program per row block."""
    return kernel_config(num_warps, BLOCK_M=block_m, BLOCK_N=block_n, LOOPED=looped, PROGS_PER_SM=pps)


_row = row_config


def _plain(cfg: triton.Config) -> triton.Config:
    """A forward config whose loads of x take the default cache policy."""
    return triton.Config({**cfg.kwargs, "EVICT_X": ""}, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


# Candidates per row length, each checked with ptxas for sm_90 (registers, spills), and tried by
# the autotuner on the first call per (N, op, dtype). Persistent grids are sized so that their
# programs are resident at once.


@functools.cache
def _fwd_candidates(N: int) -> list[triton.Config]:
    """Rows in one block up to 16384 (32768 with 32 warps); the looped variant runs a persistent
    grid, so that only a few long rows per SM are in flight and their second read hits L2."""
    n = triton.next_power_of_2(N)
    if n <= 1024:
        bm = 1024 // n
        return [_row(4, 2 * bm, n, False, 0), _row(4, 4 * bm, n, False, 0), _row(8, 8 * bm, n, False, 0)]
    # One row with 16/32 warps and plain loads of x (no evict_first): what Liger and Inductor run
    # at 4096-8192, which reached 91-100% of copy on an H200 where these tiles reached 87-93%.
    if n <= 4096:
        return [
            _row(4, 1, n, False, 0), _row(8, 1, n, False, 0), _row(8, 8192 // n, n, False, 0),
            _row(16, 1, n, False, 0), _plain(_row(8, 1, n, False, 0)),
        ]  # fmt: skip
    if n <= 8192:
        return [
            _row(4, 1, n, False, 0), _row(8, 1, n, False, 0), _row(16, 2, n, False, 0),
            _row(16, 1, n, False, 0), _row(32, 1, n, False, 0), _plain(_row(16, 1, n, False, 0)),
            _plain(_row(4, 1, n, False, 0)),
        ]  # fmt: skip
    looped = [
        _row(16, 1, 8192, True, 2),
        _row(8, 1, 4096, True, 4),
        _row(16, 1, 16384, True, 1),
        _row(8, 1, 8192, True, 3),
    ]
    if n <= 16384:
        return [_row(8, 1, n, False, 0), _row(16, 1, n, False, 0), *looped[:2]]
    if n <= _MAX_SINGLE_BLOCK:
        return [_row(32, 1, n, False, 0), *looped[:2]]
    return looped


@functools.cache
def _bwd_candidates(N: int) -> list[triton.Config]:
    """Fewer elements per thread than forward: dy, x, w and the dw/db accumulators are live
    together. The tuning also times the partial-sum kernel, so that more programs pay for their
    extra partial rows."""
    n = triton.next_power_of_2(N)
    if n <= 1024:
        bm = 1024 // n
        return [
            _row(4, 2 * bm, n, False, 4),
            _row(4, 2 * bm, n, False, 2),
            _row(8, 4 * bm, n, False, 2),
            _row(8, 8 * bm, n, False, 1),
        ]
    if n <= 4096:
        return [
            _row(8, 1, n, False, 3),
            _row(16, 1, n, False, 2),
            _row(4, 1, n, False, 2),
            _row(8, 8192 // n, n, False, 1),
        ]
    if n <= 8192:
        return [_row(16, 1, n, False, 1), _row(8, 1, 4096, True, 2), _row(4, 1, 2048, True, 4)]
    # 16384: one block spills a little (dy, x and dw of 32 elements per thread), looped re-reads.
    return [
        _row(16, 1, n, False, 1),
        _row(32, 1, n, False, 1),
        _row(16, 1, 8192, True, 1),
        _row(8, 1, 4096, True, 2),
    ]


@functools.cache
def _dots_candidates(N: int) -> list[triton.Config]:
    return [kernel_config(8, BLOCK_N=4096), kernel_config(16, BLOCK_N=8192), kernel_config(4, BLOCK_N=2048)]


@functools.cache
def _split_candidates(N: int) -> list[triton.Config]:
    """16 elements per thread per tile; grid dim 1 (row groups) makes ~PROGS_PER_SM programs
    per SM in all, enough loads in flight to stream (more groups only add partial rows)."""
    return [
        kernel_config(4, BLOCK_M=2, BLOCK_N=1024, PROGS_PER_SM=8),
        kernel_config(4, BLOCK_M=4, BLOCK_N=512, PROGS_PER_SM=8),
        kernel_config(8, BLOCK_M=4, BLOCK_N=1024, PROGS_PER_SM=4),
        kernel_config(8, BLOCK_M=2, BLOCK_N=2048, PROGS_PER_SM=8),
    ]


CANDIDATES = {
    "fwd": _fwd_candidates,
    "bwd": _bwd_candidates,
    "bwd_dots": _dots_candidates,
    "bwd_split": _split_candidates,
}
KERNELS = {
    "fwd": K._norm_fwd_kernel,
    "bwd": K._norm_bwd_kernel,
    "bwd_dots": K._bwd_row_dots_kernel,
    "bwd_split": K._bwd_split_kernel,
}


def _interpreter_config(kind: str, N: int) -> triton.Config:
    """One configuration for Triton's interpreter: few, large programs (it runs them one by one);
    backward on a small persistent grid, so that programs loop over several row blocks."""
    n = triton.next_power_of_2(N)
    if kind == "bwd_dots":
        return kernel_config(4, BLOCK_N=min(n, 16384))
    if kind == "bwd_split":
        return kernel_config(4, BLOCK_M=4, BLOCK_N=min(n, 4096), PROGS_PER_SM=4)
    pps = 1 if kind == "bwd" else 0
    if n > 16384:
        return _row(4, 1, 16384, True, pps)
    return _row(4, 65536 // n, n, False, pps)


# --------------------------------------------------------------------------------------------
# Autotuning (GPU, first call per key)
# --------------------------------------------------------------------------------------------


def _bwd_tuning_post_hook(nargs: dict, exception) -> None:
    """Runs inside the autotuner's timed call: include the partial-sum kernel, so that a config
    with more programs (more partial rows to sum) pays for them."""
    if exception is None and (nargs["HAS_DW"] or nargs["HAS_DB"]):
        n = nargs["N"]
        scratch = torch.empty(2 * n, dtype=torch.float32, device=nargs["DX"].device)
        dw = scratch[:n] if nargs["HAS_DW"] else None
        db = scratch[n:] if nargs["HAS_DB"] else None
        _sum_partials(nargs["DW_PART"], nargs["DB_PART"], nargs["NPROG"], dw, db, n, config.current())


# The autotuner's disk cache came with Triton 3.4; older ones take no such argument.
_CACHE_RESULTS = (
    {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
)


def _autotuned(kernel, kind: str, key: list[str], post_hook=None):
    """The autotuner needs more than one config to tune at all; the real candidates per N come
    from the prune hook. Results are also cached on disk (Triton's cache dir, Triton >= 3.4)."""
    candidates = CANDIDATES[kind]
    placeholder = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=8)]
    return triton.autotune(
        configs=placeholder,
        key=key,
        prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: candidates(nargs["N"])},
        post_hook=post_hook,
        **_CACHE_RESULTS,
    )(kernel)


_BWD_KEY = ["N", "IS_RMS", "HAS_W", "HAS_DRES", "HAS_DW", "HAS_DB", "CAST_X"]
TUNERS = {
    "fwd": _autotuned(K._norm_fwd_kernel, "fwd", ["N", "IS_RMS", "HAS_RES", "HAS_W", "HAS_B", "CAST_X"]),
    "bwd": _autotuned(K._norm_bwd_kernel, "bwd", _BWD_KEY, _bwd_tuning_post_hook),
    "bwd_dots": _autotuned(K._bwd_row_dots_kernel, "bwd_dots", ["N", "IS_RMS", "HAS_W"]),
    "bwd_split": _autotuned(K._bwd_split_kernel, "bwd_split", _BWD_KEY, _bwd_tuning_post_hook),
}


# --------------------------------------------------------------------------------------------
# Launch plans
# --------------------------------------------------------------------------------------------


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few programs, each looping over several row blocks
    return torch.cuda.get_device_properties(device).multi_processor_count


class NormLaunchPlan:
    """How one kernel kind launches for one key: its constexpr flags and tile configuration
    (``kwargs``; None on a GPU until the autotuner has chosen, on the first launch), the SM
    count of the device, and the bound on the dw/db partial rows a launch may write."""

    __slots__ = ("flags", "key", "kind", "kwargs", "max_pps", "min_bm", "num_sms")

    def __init__(
        self, kind: str, flags: dict, fixed: triton.Config | None, N: int, sms: int, key: tuple = ()
    ):
        self.kind = kind
        self.key = key
        self.flags = flags
        self.num_sms = sms
        self.kwargs = None if fixed is None else {**flags, **fixed.all_kwargs()}
        configs = [fixed] if fixed is not None else CANDIDATES[kind](N)
        if kind in ("bwd", "bwd_split"):
            self.min_bm = min(c.kwargs["BLOCK_M"] for c in configs)
            self.max_pps = max(c.kwargs["PROGS_PER_SM"] for c in configs)

    def grid(self, M: int, N: int, meta: dict) -> tuple[int, ...]:
        if self.kind == "bwd_dots":
            return (M,)
        if self.kind == "bwd_split":
            col_blocks = cdiv(N, meta["BLOCK_N"])
            groups = max(1, min(cdiv(M, meta["BLOCK_M"]), self.num_sms * meta["PROGS_PER_SM"] // col_blocks))
            return (col_blocks, groups)
        blocks = cdiv(M, meta["BLOCK_M"])
        pps = meta["PROGS_PER_SM"]
        return (blocks if pps == 0 else min(blocks, self.num_sms * pps),)

    def partial_rows(self, M: int) -> int:
        """At most one partial row per program (persistent) or per row group (split)."""
        return min(cdiv(M, self.min_bm), self.num_sms * max(self.max_pps, 1))

    def launch(self, args: tuple, M: int, N: int, cfg: config.KernelConfig) -> None:
        kwargs = self.kwargs
        if kwargs is None:  # first launch on a GPU: the autotuner times the candidates and runs
            tuner = TUNERS[self.kind]
            tuner[lambda meta: self.grid(M, N, meta)](*args, **self.flags)
            self.kwargs = {**self.flags, **tuner.best_config.all_kwargs()}
            TUNED[self.key] = self.kwargs
            return
        launch(KERNELS[self.kind], self.grid(M, N, kwargs), args, kwargs, cfg)


# (kind, N, dtypes, flags, device) -> the launch arguments the autotuner chose: a record for the
# benchmark's report, written once per key (never read by the launch path).
TUNED: dict[tuple, dict] = {}


@functools.lru_cache(maxsize=4096)
def plan(
    kind: str, N: int, dtypes: tuple, flags: tuple, device: torch.device, forced, interpreter: bool
) -> NormLaunchPlan:
    """The cached plan for (kind, row length, dtypes, flags, device, forced config)."""
    fixed = forced if forced is not None else (_interpreter_config(kind, N) if interpreter else None)
    return NormLaunchPlan(kind, dict(flags), fixed, N, num_sms(device), (kind, N, dtypes, flags, device))


def _plan_for(
    kind: str, N: int, dtypes: tuple, flags: tuple, device, cfg: config.KernelConfig
) -> NormLaunchPlan:
    return plan(kind, N, dtypes, flags, device, cfg.norm_config(kind), cfg.interpreter)


@functools.lru_cache(maxsize=1024)
def _sum_partials_meta(N: int, has_dw: bool, has_db: bool, interpreter: bool) -> tuple[tuple[int], dict]:
    # GPU: a few thousand partial elements per step (at most 16 per thread), narrow column
    # blocks so that even N = 1024 spreads over 32-64 programs; the partial rows were just
    # written and mostly sit in L2. Interpreter: few, large programs.
    if interpreter:
        block_p, block_n = 32, min(4096, triton.next_power_of_2(N))
    else:
        block_p, block_n = (128, 16 if N <= 1024 else 32) if N <= 4096 else (64, 64)
    flags = {"HAS_DW": has_dw, "HAS_DB": has_db, "INTERP": interpreter}
    return (cdiv(N, block_n),), {**flags, "BLOCK_P": block_p, "BLOCK_N": block_n, "num_warps": 8}


def _sum_partials(dw_part, db_part, nprog, dw, db, N: int, cfg: config.KernelConfig) -> None:
    """dw = Σ rows of dw_part (db likewise), over the rows the backward kernel wrote."""
    grid, kwargs = _sum_partials_meta(N, dw is not None, db is not None, cfg.interpreter)
    launch(K._sum_partials_kernel, grid, (dw_part, db_part, nprog, dw, db, N), kwargs, cfg)


# --------------------------------------------------------------------------------------------
# Host functions
# --------------------------------------------------------------------------------------------


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with a unit last-dim stride; the kernels take any row stride.

    Only a strided last dim is copied here; ``reshape`` copies besides only when the leading dims
    cannot be flattened into one row stride (e.g. a transposed batch dim)."""
    if t.stride(-1) != 1 and t.shape[-1] != 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def like(t: torch.Tensor, shape) -> torch.Tensor:
    return t if t.shape == shape else t.view(shape)


def out_dtype(x: torch.Tensor, weight: torch.Tensor | None, cast_x: bool) -> torch.dtype:
    """The output dtype: x's, or with ``cast_x`` (Hugging Face's ``weight * hidden.to(dtype)``)
    the promotion of x's and the weight's, as that product has."""
    if cast_x and weight is not None and weight.dtype != x.dtype:
        return torch.promote_types(x.dtype, weight.dtype)
    return x.dtype


def check_inputs(
    name: str,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{name}: x must be a torch.Tensor, got {type(x).__name__}")
    check_device(x, weight, bias, residual, name=name)
    check_dtype(x, DTYPES, what="x", name=name)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise KernelInputError(
            f"{name}: x has shape {tuple(x.shape)}; expected at least one dim and a non-empty last dim"
        )
    n = x.shape[-1]
    for t, what in ((weight, "weight"), (bias, "bias")):
        if t is None:
            continue
        check_dtype(t, DTYPES, what=what, name=name)
        if t.dim() != 1 or t.shape[0] != n:
            raise KernelInputError(
                f"{name}: {what} has shape {tuple(t.shape)}; expected ({n},), the last dim of x"
            )
    if residual is not None:
        if residual.shape != x.shape:
            raise KernelInputError(
                f"{name}: residual has shape {tuple(residual.shape)}; expected {tuple(x.shape)} like x"
            )
        if residual.dtype != x.dtype:
            raise KernelInputError(
                f"{name}: residual has dtype {dtype_name(residual.dtype)}; expected {dtype_name(x.dtype)} like x"
            )


def _unit_stride(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    is_rms: bool,
    *,
    w_offset: float = 0.0,
    cast_x: bool = False,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """x, residual: [M, N] with unit last-dim stride. Returns (y, new_residual, mean, rstd).

    ``w_offset`` / ``cast_x``: the Hugging Face variants (see triton_kernels). ``out`` /
    ``residual_out`` ([M, N], unit last-dim stride) receive y / new_residual: the tests pass
    buffers filled with NaN to prove that every element is written."""
    cfg = config.current()
    M, N = x.shape
    dev = x.device
    y = out if out is not None else empty((M, N), out_dtype(x, weight, cast_x), dev, cfg)
    h = None
    if residual is not None:
        h = residual_out if residual_out is not None else empty((M, N), x.dtype, dev, cfg)
    rstd = empty((M,), torch.float32, dev, cfg)
    mean = None if is_rms else empty((M,), torch.float32, dev, cfg)
    if M == 0:
        return y, h, mean, rstd
    weight, bias = _unit_stride(weight), _unit_stride(bias)
    has_res = residual is not None
    p = _plan_for(
        "fwd",
        N,
        (x.dtype, y.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype),
        (
            ("IS_RMS", is_rms),
            ("HAS_RES", has_res),
            ("HAS_W", weight is not None),
            ("HAS_B", bias is not None),
            ("CAST_X", cast_x),
            ("INTERP", cfg.interpreter),
        ),
        dev,
        cfg,
    )
    args = (
        x, residual, weight, bias, y, h, mean, rstd, M, N,
        x.stride(0), 0 if residual is None else residual.stride(0), y.stride(0), 0 if h is None else h.stride(0),
        float(eps), float(w_offset),
    )  # fmt: skip
    p.launch(args, M, N, cfg)
    return y, h, mean, rstd


def norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    *,
    dresidual: torch.Tensor | None = None,
    need_dw: bool = True,
    need_db: bool = False,
    w_offset: float = 0.0,
    cast_x: bool = False,
    dx_out: torch.Tensor | None = None,
    dw_out: torch.Tensor | None = None,
    db_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dy, x, dresidual: [M, N] with unit last-dim stride; RMSNorm when ``mean`` is None.

    Returns (dx, dw, db): dw only when there is a weight and ``need_dw``, db when ``need_db``;
    dw/db in the weight's dtype. ``*_out`` buffers as in ``norm_fwd``."""
    cfg = config.current()
    M, N = x.shape
    dev = x.device
    has_dw = weight is not None and need_dw
    wdtype = weight.dtype if weight is not None else x.dtype
    dx = dx_out if dx_out is not None else empty((M, N), x.dtype, dev, cfg)
    dw = db = None
    if has_dw:
        dw = dw_out if dw_out is not None else empty((N,), wdtype, dev, cfg)
    if need_db:
        db = db_out if db_out is not None else empty((N,), wdtype, dev, cfg)
    if M == 0:
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return dx, dw, db

    weight = _unit_stride(weight)
    is_rms = mean is None
    has_w = weight is not None
    has_dres = dresidual is not None
    split = cfg.norm_split_bwd_above < N
    dtypes = (x.dtype, dy.dtype, wdtype, None if dresidual is None else dresidual.dtype)
    flags = (
        ("IS_RMS", is_rms),
        ("HAS_W", has_w),
        ("HAS_DRES", has_dres),
        ("HAS_DW", has_dw),
        ("HAS_DB", need_db),
        ("CAST_X", cast_x),
        ("INTERP", cfg.interpreter),
    )
    p = _plan_for("bwd_split" if split else "bwd", N, dtypes, flags, dev, cfg)
    rows = p.partial_rows(M)
    dw_part = empty((rows, N), torch.float32, dev, cfg) if has_dw else None
    db_part = empty((rows, N), torch.float32, dev, cfg) if need_db else None
    nprog = torch.empty(1, dtype=torch.int32, device=dev)
    stride_dres = 0 if dresidual is None else dresidual.stride(0)
    w_offset = float(w_offset)
    args: tuple
    if not split:
        args = (
            dy, x, weight, mean, rstd, dresidual, dx, dw_part, db_part, nprog, M, N,
            dy.stride(0), x.stride(0), stride_dres, dx.stride(0), w_offset,
        )  # fmt: skip
        p.launch(args, M, N, cfg)
    else:
        c = empty((2, M), torch.float32, dev, cfg)
        dots = _plan_for("bwd_dots", N, dtypes, (("IS_RMS", is_rms), ("HAS_W", has_w)), dev, cfg)
        dots.launch((dy, x, weight, mean, rstd, c, M, N, dy.stride(0), x.stride(0), w_offset), M, N, cfg)
        args = (
            dy, x, weight, mean, rstd, c, dresidual, dx, dw_part, db_part, nprog, M, N,
            dy.stride(0), x.stride(0), stride_dres, dx.stride(0), w_offset,
        )  # fmt: skip
        p.launch(args, M, N, cfg)
    if has_dw or need_db:
        _sum_partials(dw_part, db_part, nprog, dw, db, N, cfg)
    return dx, dw, db
