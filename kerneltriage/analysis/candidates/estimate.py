"""Analytic FLOPs and bytes from recorded shapes and dtypes (when there are no counters, and
for the ideal ceilings of fused regions).

Bytes are the fewest a kernel must move through HBM: each input read once, each output
written once. FLOPs count a multiply-add as 2. Backward work is derived from forward work by
the op's math (stated at each factor). Every figure here is marked ``estimate`` in the report.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from kerneltriage.resources import load_yaml

DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
# Which peak a tensor-core op runs at, by input dtype.
TENSOR_PRECISION = {
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16_tensor",
    "float": "fp32",
    "double": "fp64",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}
# Backward ÷ forward work. GEMM: dX and dW are each one GEMM of the forward's size.
# Convolution: dgrad and wgrad are each one convolution of the forward's FLOPs.
# Attention: dV, dP, dS·K, dSᵀ·Q plus the recomputed QKᵀ: 2.5× the forward FLOPs (the
# FlashAttention count); it reads q, k, v, o, dO and writes dq, dk, dv: about 2× the bytes.
# Row-wise and elementwise ops read the saved input and dY and write dX: 1.5× the bytes.
BWD_FLOPS = {"gemm": 2.0, "attention": 2.5, "convolution": 2.0}
BWD_BYTES = {"gemm": 2.0, "attention": 2.0, "convolution": 2.0}
BWD_DEFAULT = 1.5


@dataclass
class Work:
    """FLOPs and bytes of one op instance (one direction) and the precision its FLOPs run at."""

    flops: float
    bytes: float
    precision: str  # a key of the GPU table's peak_tflops
    # Output tiles of a GEMM (``GEMM_TILE`` square, batch included): fewer than the GPU's SMs
    # cannot fill it (``fill``). None: not a GEMM, or too large to matter.
    tiles: int | None = None

    def scaled(self, flops: float, bytes_: float) -> Work:
        return Work(self.flops * flops, self.bytes * bytes_, self.precision, self.tiles)


# The output tile a tuned GEMM gives one SM (CTA) at the least: 64×64 (cuBLAS, CUTLASS and
# hipBLASLt all run 64×64 or larger tiles on tensor cores at these sizes).
GEMM_TILE = 64


def gemm_tiles(batch: int, m: int, n: int) -> int:
    return int(batch) * math.ceil(int(m) / GEMM_TILE) * math.ceil(int(n) / GEMM_TILE)


def fill(tiles: int | None, sms: int) -> float:
    """The share of the GPU's compute a GEMM of ``tiles`` output tiles can use: tiles run in
    waves of ``sms``; the last wave's idle SMs are lost (wave quantization). 1 without tiles."""
    if not tiles or sms <= 0:
        return 1.0
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def numel(dims) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def is_tensor(dims, type_name) -> bool:
    return isinstance(dims, list) and type_name not in ("Scalar", "ScalarList", "", None, "TensorList")


def dtype_bytes(type_name: str | None, default: int = 4) -> int:
    return DTYPE_BYTES.get(type_name or "", default)


def tensor_inputs(dims, types) -> list[tuple[list[int], str]]:
    """(dims, dtype) of each tensor argument (scalars and empty lists dropped)."""
    dims = dims or []
    if types is None:
        # Shapes without types (Nsight Systems emit_nvtx names): every non-empty list of ints
        # is a tensor of unknown dtype (estimates then assume 4-byte elements).
        return [
            (list(d), "") for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)
        ]
    out: list[tuple[list[int], str]] = []
    for d, t in zip(dims, types):
        if t == "TensorList" and isinstance(d, list):
            out.extend((x, "") for x in d if isinstance(x, list) and x)
        elif is_tensor(d, t) and (d or t not in ("Scalar",)) and t:
            out.append((list(d), t))
    return out


def bwd_factor(kind: str) -> tuple[float, float]:
    """(FLOPs, bytes) of the backward pass as multiples of the forward's."""
    return BWD_FLOPS.get(kind, 1.0), BWD_BYTES.get(kind, BWD_DEFAULT)


def gemm_work(name: str, dims, types, compute_type: str | None) -> Work | None:
    """GEMM-like ops: linear, mm, bmm, matmul, addmm, baddbmm, _grouped_mm."""
    tensors = tensor_inputs(dims, types)
    op = name.split("::")[-1]
    es = dtype_bytes(compute_type or (tensors[0][1] if tensors else None))
    precision = TENSOR_PRECISION.get(compute_type or (tensors[0][1] if tensors else ""), "fp32")
    try:
        if op == "linear" or (_LINEAR_LIKE.search(name) and _is_x_wt(tensors)):
            (x, _), (w, _) = tensors[0], tensors[1]
            m, k, n = numel(x[:-1]), x[-1], w[0]
            extra = w[0] if len(tensors) > 2 and op == "linear" else 0
            return Work(2.0 * m * n * k, es * (m * k + n * k + m * n + extra), precision, gemm_tiles(1, m, n))
        if op in ("mm", "addmm", "_addmm_activation"):
            a, b = (tensors[1][0], tensors[2][0]) if op != "mm" else (tensors[0][0], tensors[1][0])
            m, k, n = a[0], a[1], b[1]
            return Work(2.0 * m * n * k, es * (m * k + k * n + m * n), precision, gemm_tiles(1, m, n))
        if op in ("bmm", "baddbmm"):
            a, b = (tensors[0][0], tensors[1][0]) if op == "bmm" else (tensors[1][0], tensors[2][0])
            bt, m, k, n = a[0], a[1], a[2], b[2]
            return Work(
                2.0 * bt * m * n * k, es * bt * (m * k + k * n + m * n), precision, gemm_tiles(bt, m, n)
            )
        if op in ("_grouped_mm", "grouped_mm"):
            # MoE experts: a [T, K] tokens (sorted by expert) times b [E, K, N], one group per
            # expert; or a [E, M, K] times b [E, K, N]. The tokens' FLOPs, every expert's weight.
            a, b = tensors[0][0], tensors[1][0]
            if len(b) != 3:
                return None
            e, k, n = b
            rows = numel(a[:-1])
            return Work(
                2.0 * rows * n * k, es * (rows * k + e * k * n + rows * n), precision, gemm_tiles(1, rows, n)
            )
        if op == "matmul":
            a, b = tensors[0][0], tensors[1][0]
            if len(b) == 1:
                b = [*b, 1]
            if len(a) == 1:
                a = [1, *a]
            batch = max(numel(a[:-2]), numel(b[:-2]))
            m, k, n = a[-2], a[-1], b[-1]
            b_batch = numel(b[:-2])
            return Work(
                2.0 * batch * m * n * k,
                es * (batch * m * k + b_batch * k * n + batch * m * n),
                precision,
                gemm_tiles(batch, m, n),
            )
    except (IndexError, TypeError, ValueError):
        return None
    return None


# Library GEMM ops of extension namespaces that take (x [..., K], w [N, K]) as linear does:
# aiter::gemm_a16w16, vLLM's and SGLang's unquantized GEMMs.
_LINEAR_LIKE = re.compile(r"::(\w*_)?gemm(_a16w16|_a8w8\w*)?$|::\w*linear\w*$|::\w*(mm|matmul)_a16w16$")


def _is_x_wt(tensors) -> bool:
    """Two leading tensors shaped as linear's input and weight: x [..., K], w [N, K]."""
    if len(tensors) < 2:
        return False
    x, w = tensors[0][0], tensors[1][0]
    return len(x) >= 2 and len(w) == 2 and x[-1] == w[1]


# Attention entry points whose shapes say the case: the index of their causal flag and their
# layout. SDPA's are (batch, heads, sequence, head dim); FlashAttention's and the memory-
# efficient kernel's own ops take (batch, sequence, heads, head dim).
ATTENTION_OPS = {
    "aten::scaled_dot_product_attention": (5, "bhsd"),
    "aten::_scaled_dot_product_flash_attention": (4, "bhsd"),
    "aten::_scaled_dot_product_cudnn_attention": (6, "bhsd"),
    "aten::_scaled_dot_product_efficient_attention": (6, "bhsd"),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (4, "bhsd"),
    "aten::_flash_attention_forward": (8, "bshd"),
    "aten::_efficient_attention_forward": (9, "bshd"),
}


@dataclass(frozen=True)
class AttentionCase:
    """q, k, v in (batch, heads, sequence, head dim), their dtype and the causal flag."""

    q: list[int]
    k: list[int]
    v: list[int]
    dtype: str
    causal: bool

    @property
    def head_dim(self) -> int:
        return int(self.q[-1])

    @property
    def seq_len(self) -> int:
        return int(self.q[-2])


def attention_case(name: str, dims, types, concrete) -> AttentionCase | None:
    """The attention case of a recorded attention op, or None for an op not in
    ``ATTENTION_OPS`` or without 4-D q, k, v."""
    known = ATTENTION_OPS.get(name)
    if known is None:
        return None
    index, layout = known
    tensors = tensor_inputs(dims, types)
    if len(tensors) < 3 or any(len(t[0]) != 4 for t in tensors[:3]):
        return None
    (q, qt), (k, _), (v, _) = tensors[:3]
    if layout == "bshd":
        q, k, v = ([d[0], d[2], d[1], d[3]] for d in (q, k, v))
    causal = _flag(concrete, index)
    if name == "aten::_efficient_attention_forward":
        # custom_mask_type: 0 none, 1 causal from the top left, 2 from the bottom right.
        causal = _int(concrete, index) in (1, 2)
    return AttentionCase(list(q), list(k), list(v), qt, causal)


def sdpa_work(dims, types, concrete, name: str = "aten::scaled_dot_product_attention") -> Work | None:
    """An attention op of ``ATTENTION_OPS``: the ideal fused forward of its case."""
    case = attention_case(name, dims, types, concrete)
    if case is None:
        return None
    return attention_work(case.q, case.k, case.v, case.dtype, case.causal)


def _int(concrete, index: int) -> int | None:
    try:
        return int(str(concrete[index]).strip())
    except (IndexError, TypeError, ValueError):
        return None


def attention_work(q, k, v, type_name: str, causal: bool, window: int | None = None) -> Work:
    """Ideal fused attention forward: read q, k, v, write o (+ the fp32 log-sum-exp)."""
    *batch, sq, d = q
    sk, dv = k[-2], v[-1]
    b_h = numel(batch)
    es = dtype_bytes(type_name, 2)
    pairs = sq * sk
    if causal:
        pairs = _causal_pairs(int(sq), int(sk))
    if window is not None:
        pairs = min(pairs, sq * min(sk, window))
    flops = 2.0 * b_h * pairs * (d + dv)
    bytes_ = es * (numel(q) + numel(k) + numel(v) + b_h * sq * dv) + 4 * b_h * sq
    return Work(flops, bytes_, TENSOR_PRECISION.get(type_name, "bf16"))


@functools.lru_cache(maxsize=256)
def _causal_pairs(sq: int, sk: int) -> int:
    """Visible (query, key) pairs under a bottom-right aligned causal mask: query i sees keys
    up to i + (sk − sq)."""
    return int(np.clip(np.arange(1, sq + 1, dtype=np.int64) + (sk - sq), 0, sk).sum())


def _flag(concrete, index: int) -> bool:
    try:
        return str(concrete[index]).strip().lower() in ("true", "1")
    except (IndexError, TypeError):
        return False


_ROWWISE_FLOPS = {"norm": 5.0, "softmax": 5.0, "cross-entropy": 6.0, "reduction": 1.0, "elementwise": 1.0}


# Gated activations read x [..., 2N] and write out [..., N] (SGLang's and vLLM's silu_and_mul
# and kin take the output buffer first: it is written, not read).
_GATED = re.compile(
    r"(silu|gelu|gelu_tanh|gelu_new|gelu_fast|gelu_quick|fatrelu|swigluoai|relu2?)_and_mul|swiglu|geglu|reglu"
)
# Index tensors (positions, slot mappings) select rows of a table: a cache or pool is read or
# written at those rows, not whole.
_INDEX_TYPES = ("long int", "long", "int")


def simple_work(kind: str, dims, types, name: str = "") -> Work | None:
    """Elementwise, reduction and row-wise ops: read each tensor input, write one output the
    size of the largest input (a reduction writes a small output: counted as the largest
    input divided by its last dim).

    Touched bytes only: a gated activation reads its input and writes half of it; a table
    (RoPE's cos/sin cache, a KV cache or pool) indexed by a 1-D index tensor of T entries is
    counted at the T slices it touches, not whole."""
    tensors = tensor_inputs(dims, types)
    if not tensors:
        return None
    tensors = _table_slices(tensors)
    if _GATED.search(name):
        x, xt = max(tensors, key=lambda t: numel(t[0]))
        n = numel(x)
        es = dtype_bytes(xt)
        return Work(4.0 * n / 2, es * (n + n // 2), "fp32" if xt in ("float", "double") else "fp16")
    read = sum(numel(d) * dtype_bytes(t) for d, t in tensors)
    big, big_t = max(tensors, key=lambda x: numel(x[0]))
    n = numel(big)
    out = n * dtype_bytes(big_t)
    if kind == "reduction":
        out = out // max(1, big[-1] if big else 1)
    elif kind == "cross-entropy":
        out = 4 * (n // max(1, big[-1] if big else 1))
    flops = _ROWWISE_FLOPS.get(kind, 1.0) * n
    precision = "fp32" if big_t in ("float", "double") else "fp16"
    return Work(flops, read + out, precision)


def _table_slices(tensors: list[tuple[list[int], str]]) -> list[tuple[list[int], str]]:
    """``tensors`` with each table cut to the rows a 1-D index tensor selects. An index: a 1-D
    integer tensor of T entries, T also the leading dim of a non-integer tensor (the tokens).
    A table: a non-integer tensor whose leading dim is not T and that is larger than T rows of
    its own row size; one row is the trailing dims it shares with a token tensor (a KV cache
    [blocks, block size, heads, dim] against keys [T, heads, dim]), else its dims after the
    first."""
    leading = {d[0] for d, t in tensors if len(d) >= 2 and t not in _INDEX_TYPES}
    index = [d[0] for d, t in tensors if len(d) == 1 and t in _INDEX_TYPES and d[0] in leading]
    if not index:
        return tensors
    tokens = max(index)
    token_tensors = [d for d, t in tensors if len(d) >= 2 and d[0] == tokens and t not in _INDEX_TYPES]
    out = []
    for d, t in tensors:
        if len(d) >= 2 and d[0] != tokens and t not in _INDEX_TYPES:
            row = d[1:]
            for tok in token_tensors:
                trail = tok[1:]
                if len(trail) < len(d) and list(d[len(d) - len(trail) :]) == list(trail):
                    row = trail
                    break
            if tokens * numel(row) < numel(d):
                out.append(([tokens, *row], t))
                continue
        out.append((d, t))
    return out


_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


def op_work(kind: str, name: str, dims, types, concrete, compute_type: str | None) -> Work | None:
    """Forward work of one top-level op, or None when no model applies."""
    if kind == "gemm":
        return gemm_work(name, dims, types, compute_type)
    if kind == "attention":
        return sdpa_work(dims, types, concrete, name)
    if kind == "embedding":
        return embedding_work(dims, types)
    if kind == "convolution":
        return conv_work(name, dims, types, concrete, compute_type)
    if kind == "optimizer":
        return optimizer_work(name, dims, types)
    if kind in ("elementwise", "reduction", "norm", "softmax", "cross-entropy"):
        if _ATTENTION_NAME.search(name):
            return None  # an attention op classed by its kernels: no elementwise model applies
        return simple_work(kind, dims, types, name)
    return None


_CONV_OPS = re.compile(r"^aten::(conv[123]d|convolution|_convolution|cudnn_convolution)$")


def _int_list(value: Any, n: int) -> list[int] | None:
    """``"[2, 2]"`` or ``"2"`` as ``n`` ints (a recorded stride, padding or dilation)."""
    found = re.findall(r"-?\d+", str(value or ""))
    if not found:
        return None
    ints = [int(x) for x in found]
    return ints if len(ints) == n else (ints * n)[:n] if len(ints) == 1 else None


def conv_work(name: str, dims, types, concrete, compute_type: str | None) -> Work | None:
    """Forward work of a convolution from its recorded input and weight (N, C, *spatial) and
    (K, C/groups, *kernel), with its stride, padding, dilation and groups where recorded
    (aten::conv2d(input, weight, bias, stride, padding, dilation, groups); the defaults 1, 0,
    1, 1 otherwise): 2·N·K·(C/groups)·∏kernel·∏output FLOPs; input, weight and output bytes."""
    if not _CONV_OPS.match(name):
        return None
    tensors = tensor_inputs(dims, types)
    if len(tensors) < 2:
        return None
    (x, xt), (w, _) = tensors[:2]
    if len(x) < 3 or len(w) != len(x) or len(x) > 5:
        return None
    spatial = len(x) - 2
    conc = list(concrete or [])
    if name in ("aten::convolution", "aten::_convolution") and len(conc) > 6 and _flag(conc, 6):
        return None  # a transposed convolution: another output size
    stride = _int_list(conc[3] if len(conc) > 3 else None, spatial) or [1] * spatial
    padding = _int_list(conc[4] if len(conc) > 4 else None, spatial) or [0] * spatial
    dilation = _int_list(conc[5] if len(conc) > 5 else None, spatial) or [1] * spatial
    out = []
    for i in range(spatial):
        size = (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // max(1, stride[i]) + 1
        if size <= 0:
            return None
        out.append(size)
    n, k, c_per_group = x[0], w[0], w[1]
    flops = 2.0 * n * k * c_per_group * numel(w[2:]) * numel(out)
    es = dtype_bytes(compute_type or xt, 2)
    bytes_ = es * (numel(x) + numel(w) + n * k * numel(out))
    precision = TENSOR_PRECISION.get(compute_type or xt, "bf16")
    return Work(flops, bytes_, precision)


def embedding_work(dims, types) -> Work | None:
    """embedding(weight [V, D], indices): read the indices and the selected rows, write them."""
    tensors = tensor_inputs(dims, types)
    if len(tensors) < 2 or len(tensors[0][0]) != 2:
        return None
    (weight, wt), (idx, it) = tensors[0], tensors[1]
    rows = numel(idx)
    es = dtype_bytes(wt)
    return Work(0.0, rows * dtype_bytes(it, 8) + 2 * rows * weight[1] * es, "fp32")


def optimizer_work(name: str, dims, types) -> Work | None:
    """Multi-tensor optimizer ops: read every tensor list once; write the parameters (and,
    for Adam, both moment buffers). About 12 FLOPs per parameter for Adam(W)."""
    lists = [d for d, t in zip(dims or [], types or []) if t == "TensorList" and isinstance(d, list)]
    if not lists:
        return None
    sizes = [sum(numel(x) for x in lst if isinstance(x, list) and x) for lst in lists]
    params = sizes[0]
    es = 4
    adam = bool(re.search(r"adam", name))
    written = sizes[0] + (sizes[2] + sizes[3] if adam and len(sizes) >= 4 else 0)
    return Work((12.0 if adam else 1.0) * params, es * (sum(sizes) + written), "fp32")


@functools.lru_cache(maxsize=1)
def _precision_patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    entries = (load_yaml("kernel_classes.yaml") or {}).get("precisions") or []
    out = []
    for e in entries:
        flags = re.IGNORECASE if "ignorecase" in (e.get("flags") or []) else 0
        out.append((re.compile(str(e["pattern"]), flags), str(e["precision"])))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def kernel_precision(name: str) -> str | None:
    """The precision a GEMM, convolution or attention kernel computes in, from its name
    (``kernel_classes.yaml``, section ``precisions``); None when its name does not say."""
    for pattern, precision in _precision_patterns():
        if pattern.search(name):
            return precision
    return None
