"""Host side of flash attention: input checks, tile configurations, cached launch plans, and the
host functions ``flash_fwd`` / ``flash_bwd`` that allocate the outputs and launch.

A launch plan per (kernel, dtype, head dim, length buckets, mask parameters, TMA, device) holds
the constexpr arguments and, once chosen, the tile configuration: fixed under the interpreter
or an explicit configuration, chosen by the autotuner on a GPU's first launch and launched
directly afterwards.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels import config
from kerneltriage.kernels._common import cdiv, check_device, check_dtype, empty
from kerneltriage.kernels.attention import triton_kernels as K
from kerneltriage.kernels.host_path import launch

NAME = "flash_attention"
UNBOUNDED = 1 << 30  # window side without a limit; keeps the bound arithmetic in int32
_MAX_SEQ = 1 << 23  # keeps in-head row offsets (seq·head_dim) inside int32
_HEAD_DIMS = "a multiple of 16 between 16 and 256 (tuned for 64 and 128)"
# With a softcap, logits lie in [-c, c]; 2^(c·log2 e) stays far inside the fp32/bf16
# exponent range for c <= 50, so the forward pass can skip the running max (bf16 only:
# fp16 p would overflow).
_STATIC_MAX_SOFTCAP = 50.0


def tile_config(bm: int, bn: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


# Autotuning candidates, (BLOCK_M, BLOCK_N, num_warps, num_stages), kept from the sweeps of
# benchmarks/bench_attention.py on an H200 (2026-11-21, Triton 3.6). For the dK/dV kernel
# BLOCK_N is the KV block it holds and BLOCK_M the q block it streams; the others hold q and
# stream KV. Tried there and left out: tensor-descriptor (TMA) loads (within ±5% of plain
# pointer loads, no consistent winner), warp specialization of the forward's KV loop (fails
# to compile with 4 warps, 5-13% slower with 8), and rescaling the accumulator only when the
# row max grows by 2^8 (the branch in the loop costs the wgmma pipelining: 10-40% slower).
# The H100 sweep of 2026-11-22 (BENCHMARKS.md) found nothing faster than these forward tiles
# (the tutorial's Hopper settings, more stages, TMA and warp specialization included); it put
# 4 stages first for dK/dV and dQ by 1-3% and (32, 128, 4, 3) at a third of the others' speed.
GPU_CONFIGS = {
    "fwd": [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
    "dkdv": [(32, 64, 4, 3), (32, 64, 4, 4), (64, 128, 8, 3)],
    "dq": [(128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)],
}
# head_dim > 128: smaller tiles and two stages, so that K/V tiles fit in shared memory and
# the fp32 accumulators in registers
GPU_CONFIGS_BIG_D = {
    "fwd": [(64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2)],
    "dkdv": [(32, 32, 4, 2), (64, 64, 8, 2)],
    "dq": [(64, 32, 4, 2), (64, 64, 8, 2)],
}
# The interpreter runs one numpy op per tile op: small tiles and one config keep CI quick.
INTERP_CONFIGS = {"fwd": (64, 32, 4, 1), "dkdv": (32, 64, 4, 1), "dq": (64, 32, 4, 1)}
# Kernels that load through tensor descriptors in "auto" mode (KernelConfig.attention_tma):
# none by default, as measured; the descriptor path stays tested and selectable.
TMA_KINDS = {"fwd": False, "dkdv": False, "dq": False}
KERNELS = {"fwd": K._attn_fwd_kernel, "dkdv": K._attn_bwd_dkdv_kernel, "dq": K._attn_bwd_dq_kernel}


def _pruner(kind: str):
    def prune(configs, named_args, **kwargs):
        """Big head dims get their own candidates (the autotuner benchmarks what we return)."""
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))  # constexprs: kwargs
        if head_dim <= 128:
            return configs
        return [tile_config(*c) for c in GPU_CONFIGS_BIG_D[kind]]

    return {"early_config_prune": prune}


_KEY = ["SQ_KEY", "SK_KEY", "HEAD_DIM", "SOFTCAP", "USE_TMA", "win_left", "win_right"]
_KEYS = {"fwd": [*_KEY, "REVERSE"], "dkdv": _KEY, "dq": [*_KEY, "REVERSE"]}
TUNERS = {
    kind: triton.autotune(
        [tile_config(*c) for c in GPU_CONFIGS[kind]], key=_KEYS[kind], prune_configs_by=_pruner(kind)
    )(kernel)
    for kind, kernel in KERNELS.items()
}


# ----------------------------------------------------------------------------- input checks


@dataclass(frozen=True)
class Params:
    causal: bool
    sm_scale: float
    win_left: int  # UNBOUNDED when the window has no left limit
    win_right: int
    softcap: float | None
    group: int


def _parse_window(window, causal: bool) -> tuple[int, int]:
    if window is None:
        left, right = -1, -1
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise KernelInputError(
                f"{NAME}: window must be a (left, right) pair of ints (-1 or None: unbounded); got {window!r}"
            )
        left, right = (-1 if w is None else w for w in window)
        for side, w in (("left", left), ("right", right)):
            if isinstance(w, bool) or not isinstance(w, int) or w < -1:
                raise KernelInputError(
                    f"{NAME}: window {side} must be an int >= 0, or -1/None for unbounded; got {w!r}"
                )
    left = UNBOUNDED if left == -1 else left
    right = UNBOUNDED if right == -1 else right
    if causal:
        right = min(right, 0)  # causal caps the right side at the diagonal
    return left, right


def check_options(causal, sm_scale, window, softcap) -> tuple[float | None, int, int, float | None]:
    """Validated (sm_scale or None for 1/sqrt(D), win_left, win_right, softcap)."""
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise KernelInputError(f"{NAME}: softcap must be a positive number; got {softcap!r}")
        if not (softcap > 0 and math.isfinite(softcap)):
            raise KernelInputError(f"{NAME}: softcap must be a positive number; got {softcap!r}")
        softcap = float(softcap)
    if sm_scale is not None:
        if (
            isinstance(sm_scale, bool)
            or not isinstance(sm_scale, (int, float))
            or not (math.isfinite(sm_scale) and sm_scale > 0)
        ):
            raise KernelInputError(f"{NAME}: sm_scale must be a positive number; got {sm_scale!r}")
        sm_scale = float(sm_scale)
    left, right = _parse_window(window, causal)
    return sm_scale, left, right, softcap


def check_tensors(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise KernelInputError(f"{NAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise KernelInputError(
                f"{NAME}: {name} must be 4-D (batch, heads, seq, head_dim) as for "
                f"F.scaled_dot_product_attention; got shape {tuple(t.shape)}"
            )
    check_device(q, k, v, name=NAME)
    check_dtype(q, (torch.float16, torch.bfloat16), what="q", name=NAME)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelInputError(
            f"{NAME}: q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    B, H, Sq, D = q.shape
    Bk, Hk, Sk, Dk = k.shape
    if v.shape != k.shape:
        raise KernelInputError(
            f"{NAME}: v must have k's shape {tuple(k.shape)} (same head dim for q, k and v); "
            f"got {tuple(v.shape)}"
        )
    if Bk != B:
        raise KernelInputError(f"{NAME}: batch sizes differ: q has {B}, k and v have {Bk}")
    if Dk != D:
        raise KernelInputError(f"{NAME}: head dims differ: q has {D}, k and v have {Dk}")
    if D % 16 or not 16 <= D <= 256:
        raise KernelInputError(f"{NAME}: head_dim {D} is not supported; it must be {_HEAD_DIMS}")
    if Hk == 0 or H % Hk:
        raise KernelInputError(
            f"{NAME}: q has {H} heads and k/v have {Hk}: for GQA/MQA the k/v head count must "
            "divide the q head count"
        )
    if min(B, H, Sq, Sk) == 0:
        raise KernelInputError(f"{NAME}: empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if max(Sq, Sk) >= _MAX_SEQ:
        raise KernelInputError(f"{NAME}: sequence length {max(Sq, Sk)} is over {_MAX_SEQ}")


def make_params(q, k, causal, sm_scale, win_left, win_right, softcap) -> Params:
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    return Params(bool(causal), float(scale), win_left, win_right, softcap, q.shape[1] // k.shape[1])


def check_inputs(q, k, v, causal, sm_scale, window, softcap) -> Params:
    """Everything ``flash_attention`` checks, as the Params of the launch."""
    check_tensors(q, k, v)
    sm_scale, left, right, softcap = check_options(causal, sm_scale, window, softcap)
    return make_params(q, k, causal, sm_scale, left, right, softcap)


def lastdim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # the kernels take every stride from the tensor except the last, which must be 1
    t = t if t.stride(-1) == 1 else t.contiguous()
    # in-head row offsets are int32 inside the kernels
    if (t.shape[2] - 1) * t.stride(2) + t.shape[3] >= 1 << 31:
        t = t.contiguous()
    return t


# ----------------------------------------------------------------------------- tensor descriptors


@functools.cache
def _capability(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def use_tma(*tensors: torch.Tensor, mode: str | None = None) -> bool:
    """Whether the tensors can go through tensor descriptors in ``mode`` (default: the config's)."""
    mode = config.current().attention_tma if mode is None else mode
    D = tensors[0].shape[-1]
    if mode == "off" or D & (D - 1):  # descriptors take the power-of-two head dim only
        return False
    t0 = tensors[0]
    if mode != "on" and (
        config.current().interpreter or t0.device.type != "cuda" or _capability(t0.device) < 9
    ):
        return False
    size = t0.element_size()
    # descriptors need 16-byte aligned bases (per batch/head) and row strides
    return all(t.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in t.stride()[:3]) for t in tensors)


def tma_for(kind: str, tensors: tuple, mode: str) -> bool:
    """Descriptors for ``kind``: in "auto" mode only the kinds TMA_KINDS names."""
    if mode == "off" or (mode == "auto" and not TMA_KINDS[kind]):
        return False
    return use_tma(*tensors, mode=mode)


def _tma_alloc(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Descriptors built inside kernels need scratch memory from a Triton allocator; install
    one unless the application already did. Per call (on the tensor-descriptor path only): the
    allocator is a context variable, and autograd runs backward in a thread of its own."""
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        if not isinstance(current, _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_tma_alloc)


# ----------------------------------------------------------------------------- launch plans


def _bucket(n: int) -> int:
    """Autotune key for a length: its power-of-two ceiling."""
    return 1 << max(n - 1, 0).bit_length()


class AttentionLaunchPlan:
    """The constexpr arguments of one kernel for one key, and its tile configuration: fixed
    (interpreter, explicit config) or, on a GPU, chosen by the autotuner on the first launch."""

    __slots__ = ("kind", "kwargs", "meta")

    def __init__(self, kind: str, meta: dict, fixed: tuple | None):
        self.kind = kind
        self.meta = meta
        self.kwargs = None
        if fixed is not None:
            c = tile_config(*fixed)
            self.kwargs = {**meta, **c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}

    def launch(self, grid, args: tuple, cfg: config.KernelConfig) -> None:
        kwargs = self.kwargs
        if kwargs is None:
            tuner = TUNERS[self.kind]
            tuner[grid](*args, **self.meta)
            self.kwargs = {**self.meta, **tuner.best_config.all_kwargs()}
            return
        launch(KERNELS[self.kind], grid(kwargs), args, kwargs, cfg)


@functools.lru_cache(maxsize=4096)
def plan(
    kind: str,
    dtype: torch.dtype,
    D: int,
    sq_key: int,
    sk_key: int,
    p: Params,
    tma: bool,
    ws: bool,
    device: torch.device,
    interpreter: bool,
    fixed: tuple | None,
) -> AttentionLaunchPlan:
    """The cached plan of ``kind`` for this key (``fixed``: an explicit (BLOCK_M, BLOCK_N,
    warps, stages))."""
    meta = {
        "win_left": p.win_left,
        "win_right": p.win_right,
        "sm_scale": p.sm_scale,
        "softcap": p.softcap or 1.0,
        "SQ_KEY": sq_key,
        "SK_KEY": sk_key,
        "HEAD_DIM": D,
        "BLOCK_D": triton.next_power_of_2(D),
        "SOFTCAP": p.softcap is not None,
        "FAST_TANH": device.type == "cuda" and not interpreter,
        "USE_TMA": tma,
        "INTERP_BF16": interpreter and dtype == torch.bfloat16,
    }
    if kind == "fwd":
        meta["STATIC_MAX"] = (
            p.softcap is not None and p.softcap <= _STATIC_MAX_SOFTCAP and dtype == torch.bfloat16
        )
        meta["WS"] = ws
    if kind == "dkdv":
        meta["HAS_RIGHT"] = p.win_right < UNBOUNDED
    else:
        meta["REVERSE"] = p.causal
        meta["HAS_LEFT"] = p.win_left < UNBOUNDED
    if fixed is None and interpreter:
        fixed = INTERP_CONFIGS[kind]
    return AttentionLaunchPlan(kind, meta, fixed)


def _plan_for(kind, q, k, p, tma, cfg, fixed=None, ws=False) -> AttentionLaunchPlan:
    fixed = fixed or cfg.attention_config(kind)
    return plan(
        kind, q.dtype, q.shape[-1], _bucket(q.shape[2]), _bucket(k.shape[2]), p, tma, ws, q.device,
        cfg.interpreter, fixed,
    )  # fmt: skip


# ----------------------------------------------------------------------------- host functions


def flash_fwd(q, k, v, p: Params, cfg=None, use_tma: bool | None = None, ws: bool = False):
    """Returns (out, lse); ``cfg`` = (BLOCK_M, BLOCK_N, num_warps, num_stages) skips
    autotuning; ``use_tma`` None: decided by the config's mode and TMA_KINDS."""
    kc = config.current()
    B, H, Sq, D = q.shape
    o = empty((B, H, Sq, D), q.dtype, q.device, kc)
    lse = empty((B, H, Sq), torch.float32, q.device, kc)
    tma = tma_for("fwd", (q, k, v, o), kc.attention_tma) if use_tma is None else use_tma
    if tma and q.device.type == "cuda":
        _ensure_allocator()
    args = (
        q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        H, p.group, Sq, k.shape[2],
    )  # fmt: skip
    _plan_for("fwd", q, k, p, tma, kc, cfg, ws).launch(lambda m: (cdiv(Sq, m["BLOCK_M"]), B * H), args, kc)
    return o, lse


@functools.lru_cache(maxsize=64)
def _preprocess_meta(D: int, interpreter: bool) -> dict:
    """The delta kernel's constexprs: one dict per head dim (the fast launch path keys on it)."""
    return {"HEAD_DIM": D, "BLOCK_D": triton.next_power_of_2(D), "BLOCK_M": 32 if interpreter else 128}


def flash_bwd(do, q, k, v, o, lse, p: Params, cfgs=None, use_tma: bool | None = None, parts=("dkdv", "dq")):
    """Returns (dq, dk, dv); ``cfgs`` = {"dkdv": cfg, "dq": cfg} skips autotuning; ``parts``
    lets the benchmark time one of the two kernels."""
    kc = config.current()
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    delta = empty((B, H, Sq), torch.float32, q.device, kc)
    pre = _preprocess_meta(D, kc.interpreter)
    launch(
        K._attn_bwd_preprocess_kernel,
        (cdiv(Sq, pre["BLOCK_M"]), B * H),
        (o, do, delta, *o.stride()[:3], *do.stride()[:3], H, Sq),
        pre,
        kc,
    )
    dq = empty(q.shape, q.dtype, q.device, kc)
    dk = empty(k.shape, k.dtype, k.device, kc)
    dv = empty(v.shape, v.dtype, v.device, kc)
    tensors = (q, k, v, do, dq, dk, dv)
    tma = {
        kind: tma_for(kind, tensors, kc.attention_tma) if use_tma is None else use_tma
        for kind in ("dkdv", "dq")
    }
    if (tma["dkdv"] or tma["dq"]) and q.device.type == "cuda":
        _ensure_allocator()
    cfgs = cfgs or {}
    if "dkdv" in parts:
        args = (
            q, k, v, do, lse, delta, dk, dv,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
            *dk.stride()[:3], *dv.stride()[:3], H, Hk, p.group, Sq, Sk,
        )  # fmt: skip
        pl = _plan_for("dkdv", q, k, p, tma["dkdv"], kc, cfgs.get("dkdv"))
        pl.launch(lambda m: (cdiv(Sk, m["BLOCK_N"]), B * Hk), args, kc)
    if "dq" in parts:
        args = (
            q, k, v, do, lse, delta, dq,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3],
            H, p.group, Sq, Sk,
        )  # fmt: skip
        pl = _plan_for("dq", q, k, p, tma["dq"], kc, cfgs.get("dq"))
        pl.launch(lambda m: (cdiv(Sq, m["BLOCK_M"]), B * H), args, kc)
    return dq, dk, dv
