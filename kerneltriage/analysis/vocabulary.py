"""The words of a verdict: what the report tells a candidate (``Verdict``) and why (``Reason``).

Both are ``str`` enums whose values are the words on the wire: a member compares, hashes,
formats and serializes (JSON, DataFrames, HTML, Markdown) as its value, so code passes members
where it passed strings and the output does not change.

A reason is a code (``cold``, ``at-roof``, …) or a sentence. Sentences are members too, as
``str.format`` templates (``Reason.FASTER_BACKEND.text(backend=…, …)``); ``Reason.of`` reads
back which member a reason on the wire came from. Skip reasons a rules file gives
(``recommendations.<kind>.reason``) are data: ``communication`` and ``not-a-kernel`` ship in
``data/rules/default.yaml``, a user's file may name others.
"""

from __future__ import annotations

import functools
import re
from enum import Enum, unique
from typing import Any


class _Word(str, Enum):
    """A ``str`` enum that reads as its value everywhere (``str()``, f-strings, ``format``),
    on every Python from 3.10 (``StrEnum`` is 3.11+, and 3.12 changed mixed-in ``format``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@unique
class Verdict(_Word):
    """What the report recommends for a candidate."""

    WRITE = "write"
    USE_BUILTIN = "use-builtin"
    COMPILE = "compile"
    SKIP = "skip"


@unique
class Reason(_Word):
    """Why a candidate got its verdict: a code, or a sentence template (``text``)."""

    # Codes.
    COLD = "cold"
    AT_ROOF = "at-roof"
    LIBRARY_AT_ROOF = "library-at-roof"
    COMPILED_AT_ROOF = "compiled-at-roof"
    LOW_HEADROOM = "low-headroom"
    CEILING_DISAGREES = "ceiling-disagrees"
    ESTIMATE_FAILED = "estimate-failed"
    NO_CEILING = "no-ceiling"
    LIBRARY_KERNEL = "library-kernel"
    UNSTABLE_SHAPES = "unstable-shapes"
    LAUNCH_BOUND = "launch-bound"
    FP32_OFF_TENSOR_CORES = "fp32-off-tensor-cores"
    # A fused library op alone, below its roof, that no fix was measured to speed up
    # (recommendations.<kind>.already_alone).
    ALREADY_FUSED = "already-fused"
    # Skips the shipped rules give (recommendations.communication / memcpy): no kernel at all.
    COMMUNICATION = "communication"
    NOT_A_KERNEL = "not-a-kernel"
    # Sentences. The first is also the prefix of the rules' own write reasons (compiled).
    ALL_CONDITIONS = "all three conditions hold"
    ALREADY_USES = "all three conditions hold; it already uses {op}, which runs well below its ceiling here"
    VARIANT_NEEDS_BUILTIN = "all three conditions hold; a variant SDPA cannot run fused"
    SDPA_BEST_BACKEND = (
        "all three conditions hold; on {gpu} SDPA's fastest measured backend here is {backend} "
        "({rate:.0f} TFLOP/s at D={head_dim}, S≈{seq_len}): {how}"
    )
    NO_BUILTIN_BENCHMARK = "all three conditions hold; no benchmark of the built-in on {gpu}: the library op"
    BUILTIN_FASTER = "all three conditions hold; built-in measured faster than SDPA here ({built:.0f} vs {sdpa:.0f} TFLOP/s)"
    SDPA_FASTER = "all three conditions hold; SDPA measured faster than the built-in here ({sdpa:.0f} vs {built:.0f} TFLOP/s)"
    FASTER_BACKEND = (
        "{backend} measured faster here ({best:.0f} vs {this:.0f} TFLOP/s for {current} at {basis})"
    )
    BELOW_BEST_RATE = (
        "runs at {achieved:.0f} TFLOP/s, below half of the best measured library rate ({best:.0f})"
    )
    BELOW_FIRST_PRINCIPLES = "runs at {achieved:.0f} TFLOP/s, below half of the {ceiling:.0f} a fused kernel reaches from first principles"
    MATH_PATH = "SDPA ran its unfused math path ({unit} GEMMs and softmax, {share:.0%} of its time): {cause}"

    def text(self, **fields: Any) -> str:
        """The reason as the report words it: the template with ``fields`` filled in."""
        return str(self.value).format(**fields)

    @classmethod
    def of(cls, reason: str) -> Reason | None:
        """The member a reason on the wire came from: the code itself, the template it fills,
        or (for a rules file's sentence such as Inductor's write reason) the one whose text it
        begins with followed by ``;``. None for a reason a user's rules file made up."""
        for member, pattern in _templates():
            if pattern.fullmatch(reason):
                return member
        return next((m for m in cls if reason.startswith(f"{m.value};")), None)


@functools.cache
def _templates() -> tuple[tuple[Reason, re.Pattern[str]], ...]:
    """Each reason as a pattern (a template's fields match any text), longest first so that a
    sentence is not taken for a shorter one it extends."""
    out = []
    for member in sorted(Reason, key=lambda m: -len(m.value)):
        parts = re.split(r"\{[^{}]*\}", member.value)
        out.append((member, re.compile(".+?".join(re.escape(p) for p in parts), re.DOTALL)))
    return tuple(out)
