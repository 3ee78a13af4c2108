"""What library attention reaches on a GPU: the measured backend rates of
``kerneltriage/data/attention_perf.yaml`` (section ``rates``), per GPU table key, head dim,
causality and sequence length.

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
    seq_len: int  # the table row's sequence length (nearest to the candidate's)
    rates: dict[str, float]  # backend -> TFLOP/s
    source: str

    @property
    def best(self) -> tuple[str, float]:
        name = max(self.rates, key=self.rates.get)
        return name, self.rates[name]


def attention_rates(
    gpu_key: str, head_dim: int, causal: bool, seq_len: int, backward: bool
) -> AttentionRates | None:
    """The measured rates for the nearest row of this GPU, or None when the GPU, head dim or
    causality was never measured. ``backward``: combine forward and backward as a training
    step pays them (FLOPs 1 + 2.5, times added)."""
    table = (load_yaml("attention_perf.yaml") or {}).get("rates") or {}
    entry = table.get(gpu_key)
    if not entry:
        return None
    rows = [
        r
        for r in entry.get("rows") or []
        if int(r.get("head_dim", -1)) == head_dim and bool(r.get("causal")) == causal
    ]
    if not rows:
        return None
    row = min(rows, key=lambda r: abs(int(r["seq_len"]) - seq_len))
    rates = {}
    for backend in (*BACKENDS.values(), "kerneltriage"):
        pair = row.get(backend)
        if not pair:
            continue
        fwd, bwd = float(pair[0]), float(pair[1])
        rates[backend] = 3.5 / (1.0 / fwd + 2.5 / bwd) if backward else fwd
    if not rates:
        return None
    return AttentionRates(gpu_key, head_dim, causal, int(row["seq_len"]), rates, str(entry.get("source", "")))
