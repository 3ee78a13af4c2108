"""What library attention reaches on a GPU: the measured backend rates of
``kerneltriage/data/attention_perf.yaml`` (section ``rates``), per GPU table key, head dim,
causality and sequence length: interpolated between measured lengths, never extrapolated.

A library attention kernel is judged against the best backend measured on its GPU for the
nearest row, never against the GEMM peak: FlashAttention-2 on an H100 runs at about 300
TFLOP/s forward where cuDNN's fused SDPA runs at 450–600, and both are far from 989.
"""

from __future__ import annotations

from dataclasses import dataclass

from kerneltriage.resources import load_yaml

#: Kernel library (kernel_classes.yaml) → backend name in the rates table.
BACKENDS = {
    "FlashAttention": "flash",
    "cuDNN": "cudnn",
    "xFormers": "efficient",
}

#: How to ask PyTorch for a backend (torch.nn.attention.sdpa_kernel).
HOW = {
    "cudnn": "SDPA's cuDNN backend: with torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)",
    "flash": "SDPA's FlashAttention backend: with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)",
    "efficient": "SDPA's memory-efficient backend: with torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)",
    "kerneltriage": "kerneltriage.kernels.flash_attention",
}


@dataclass(frozen=True)
class AttentionRates:
    """Forward+backward (or forward-only) TFLOP/s of each measured backend for one case."""

    gpu_key: str
    head_dim: int
    causal: bool
    seq_len: int  # the candidate's sequence length, inside the measured range
    rates: dict[str, float]  # backend -> TFLOP/s, interpolated between the bracketing rows
    source: str
    measured: tuple[int, int] = (0, 0)  # the sequence lengths of the rows it lies between

    @property
    def best(self) -> tuple[str, float]:
        name = max(self.rates, key=self.rates.__getitem__)
        return name, self.rates[name]

    @property
    def basis(self) -> str:
        lo, hi = self.measured
        rows = f"the S={lo} row" if lo == hi else f"interpolated between the S={lo} and S={hi} rows"
        return f"S={self.seq_len}, {rows}"


def _rows(gpu_key: str, head_dim: int, causal: bool) -> tuple[list[dict], str]:
    table = (load_yaml("attention_perf.yaml") or {}).get("rates") or {}
    entry = table.get(gpu_key) or {}
    rows = [
        r
        for r in entry.get("rows") or []
        if int(r.get("head_dim", -1)) == head_dim and bool(r.get("causal")) == causal
    ]
    return sorted(rows, key=lambda r: int(r["seq_len"])), str(entry.get("source", ""))


def measured_range(gpu_key: str, head_dim: int, causal: bool) -> tuple[int, int] | None:
    """The shortest and longest sequence measured for this case on this GPU (None: never)."""
    rows, _ = _rows(gpu_key, head_dim, causal)
    return (int(rows[0]["seq_len"]), int(rows[-1]["seq_len"])) if rows else None


def _rate(pair, backward: bool) -> float:
    fwd, bwd = float(pair[0]), float(pair[1])
    return 3.5 / (1.0 / fwd + 2.5 / bwd) if backward else fwd


def attention_rates(
    gpu_key: str, head_dim: int, causal: bool, seq_len: int, backward: bool
) -> AttentionRates | None:
    """The measured rates of this GPU at ``seq_len``, interpolated (linearly in the sequence
    length) between the two rows that bracket it; None when the GPU, head dim or causality was
    never measured, or when ``seq_len`` lies outside the measured lengths (rates rise steeply
    at short sequences: a row measured at S=1024 says nothing of S=197). ``backward``: combine
    forward and backward as a training step pays them (FLOPs 1 + 2.5, times added)."""
    rows, source = _rows(gpu_key, head_dim, causal)
    if not rows:
        return None
    lengths = [int(r["seq_len"]) for r in rows]
    if not lengths[0] <= seq_len <= lengths[-1]:
        return None
    hi = next(i for i, n in enumerate(lengths) if n >= seq_len)
    lo = hi if lengths[hi] == seq_len else hi - 1
    t = 0.0 if lo == hi else (seq_len - lengths[lo]) / (lengths[hi] - lengths[lo])
    rates = {}
    for backend in (*BACKENDS.values(), "kerneltriage"):
        a, b = rows[lo].get(backend), rows[hi].get(backend)
        if not a or not b:
            continue
        ra, rb = _rate(a, backward), _rate(b, backward)
        rates[backend] = ra + t * (rb - ra)
    if not rates:
        return None
    return AttentionRates(gpu_key, head_dim, causal, int(seq_len), rates, source, (lengths[lo], lengths[hi]))


@dataclass(frozen=True)
class FirstPrinciples:
    """The share of the GPU's achievable tensor-core rate a fused attention kernel reaches,
    where no measured row applies (``attention_perf.yaml``, section ``first_principles``)."""

    fused_fraction: float
    source: str


def first_principles() -> FirstPrinciples:
    entry = (load_yaml("attention_perf.yaml") or {}).get("first_principles") or {}
    return FirstPrinciples(float(entry.get("fused_fraction", 0.6)), str(entry.get("source", "")))
