"""What library attention reaches on a GPU: the measured backend rates of
``kerneltriage/data/attention_perf.yaml`` (section ``rates``), per GPU table key, head dim,
causality and sequence length: interpolated between measured lengths, never extrapolated.

A library attention kernel is judged against the best backend measured on its GPU for the
nearest row, never against the GEMM peak: FlashAttention-2 on an H100 runs at about 300
TFLOP/s forward where cuDNN's fused SDPA runs at 450–600, and both are far from 989. The
backends (section ``backends``: the kernel library each one is, how to ask PyTorch for it) and
the first-principles fraction are the same file's; it is validated as it is read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from kerneltriage.validation import load_shipped


class _Backend(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    library: StrictStr | None  # the kernel library (kernel_classes.yaml) whose kernels it is
    how: StrictStr  # how to ask PyTorch for it


class _Row(BaseModel):
    """One measured case: [forward, backward] TFLOP/s of each backend measured there."""

    model_config = ConfigDict(extra="allow", frozen=True)
    head_dim: StrictInt
    causal: StrictBool
    seq_len: StrictInt = Field(gt=0)


class _Rates(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: StrictStr
    rows: tuple[_Row, ...]


class _FirstPrinciples(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    fused_fraction: float = Field(gt=0.0, le=1.0)
    source: StrictStr


class _AttentionPerf(BaseModel):
    # ``measured`` and ``gpus`` (SDPA against the built-in) are read by ``gpus.attention_perf``.
    model_config = ConfigDict(extra="allow", frozen=True)
    schema_: Literal["kerneltriage.attention_perf/1"] = Field(alias="schema")
    backends: dict[StrictStr, _Backend]
    rates: dict[StrictStr, _Rates]
    first_principles: _FirstPrinciples

    @model_validator(mode="after")
    def _rows_name_backends(self) -> _AttentionPerf:
        for key, entry in self.rates.items():
            for i, row in enumerate(entry.rows):
                for name, pair in (row.model_extra or {}).items():
                    if name not in self.backends:
                        raise ValueError(f"rates.{key}.rows[{i}]: {name!r} is not one of the backends")
                    if not (isinstance(pair, list) and len(pair) == 2 and all(x > 0 for x in pair)):
                        raise ValueError(f"rates.{key}.rows[{i}].{name}: [forward, backward] TFLOP/s")
        return self


@functools.cache
def _perf() -> _AttentionPerf:
    return load_shipped(_AttentionPerf, "attention_perf.yaml")


def backend_of(library: str | None) -> str | None:
    """The backend of the rates table a kernel library's attention kernels are (None: none)."""
    return next((name for name, b in _perf().backends.items() if library and b.library == library), None)


def how(backend: str) -> str:
    """How to ask PyTorch for ``backend`` (``torch.nn.attention.sdpa_kernel``), or the built-in."""
    return _perf().backends[backend].how


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
    entry = _perf().rates.get(gpu_key)
    if entry is None:
        return [], ""
    rows = [r.model_dump() for r in entry.rows if r.head_dim == head_dim and r.causal == causal]
    return sorted(rows, key=lambda r: int(r["seq_len"])), entry.source


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
    for backend in _perf().backends:
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
    entry = _perf().first_principles
    return FirstPrinciples(entry.fused_fraction, entry.source)
