"""What padding an unaligned GEMM buys, as measured (``kerneltriage/data/gemm_alignment.yaml``):
the prediction behind a padding fix where neither counters nor a recorded shape give the GEMM a
headroom, and what Inductor's ``force_shape_pad`` did at the same shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from kerneltriage.validation import load_shipped

#: The cases that stand for a unit without cases of its own (fp16 and bf16 kernels take the same
#: 16-bit alignment, 16 bytes of operands).
_UNIT_CASES = {"tf32": "tf32", "fp32": "tf32", "bf16": "bf16", "fp16_tensor": "bf16", "fp16": "bf16"}


class AlignmentCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: StrictStr
    precision: Literal["tf32", "bf16"]
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    dim: Literal["K", "N"]
    eager_ms: float = Field(gt=0)
    padded_ms: float = Field(gt=0)
    inductor_ms: float = Field(gt=0)
    inductor_padded_ms: float = Field(gt=0)


class AlignmentFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    measured_on: StrictStr
    cases: tuple[AlignmentCase, ...] = Field(min_length=1)


@dataclass(frozen=True)
class Gain:
    """How much faster the padded GEMM ran than the unaligned one, and where."""

    gain: float
    case: str
    precision: str
    measured_on: str


def alignment_data() -> AlignmentFile:
    return load_shipped(AlignmentFile, "gemm_alignment.yaml")


def _cases(unit: str | None) -> list[AlignmentCase]:
    precision = _UNIT_CASES.get(unit or "")
    return [c for c in alignment_data().cases if c.precision == precision]


def padding_gain(unit: str | None) -> Gain | None:
    """The smallest gain padding measured at ``unit``'s precision (eager cuBLAS, the recorded
    GEMM against the padded one); None for a unit with no cases."""
    cases = _cases(unit)
    if not cases:
        return None
    worst = min(cases, key=lambda c: c.eager_ms / c.padded_ms)
    return Gain(worst.eager_ms / worst.padded_ms, worst.name, worst.precision, alignment_data().measured_on)


def shape_pad_gains(unit: str | None) -> tuple[float, float] | None:
    """The range of what Inductor's ``force_shape_pad`` gained over Inductor's default at
    ``unit``'s precision (below 1: slower); None for a unit with no cases."""
    gains = [c.inductor_ms / c.inductor_padded_ms for c in _cases(unit)]
    return (min(gains), max(gains)) if gains else None
