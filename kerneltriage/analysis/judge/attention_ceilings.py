"""What library attention is placed against: the best backend the shipped tables measured on
its GPU at its case (head dim, causality, sequence length, interpolated, never extrapolated),
else a first-principles ceiling (its FLOPs at the share of the tensor-core rate fused attention
reaches, its ideal bytes at the bandwidth), else no ceiling and a note that says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from kerneltriage.analysis.candidates.estimate import (
    BWD_BYTES,
    BWD_FLOPS,
    TENSOR_PRECISION,
    attention_case,
    attention_work,
    kernel_precision,
)
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.attention_rates import AttentionRates, attention_rates, measured_range
from kerneltriage.analysis.judge.conditions import shown_headroom
from kerneltriage.analysis.model import Candidate, Condition
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Reason, Verdict


@dataclass(frozen=True)
class LibraryRate:
    """A library attention candidate's backend and the rate it achieved."""

    name: str  # the library that wrote its kernel ("library" when none is known)
    backend: str | None  # that library's row in the attention tables
    achieved: float  # TFLOP/s, 0 without recorded shapes


def library_attention_case(c: Candidate) -> tuple[int, int, bool, float] | None:
    """(head dim, query length, causal, FLOPs per step) of a library attention candidate, from
    the recorded shapes of its attention op (SDPA's or FlashAttention's own layout)."""
    for op in c.example:
        case = attention_case(op["name"], op["dims"], op["types"], op.get("concrete"))
        if case is None:
            continue
        fwd = attention_work(case.q, case.k, case.v, case.dtype, case.causal).flops
        per_instance = fwd * (3.5 if c.bwd_ms_per_step > 0 else 1.0)
        return case.head_dim, case.seq_len, case.causal, per_instance * c.instances_per_step
    return None


def attention_ideal(c: Candidate) -> tuple[float, float, str] | None:
    """(FLOPs, ideal bytes, dtype) per step of a library attention's recorded case: the fused
    forward's (q, k, v, o, log-sum-exp), and 2.5× the FLOPs and 2× the bytes more for a
    backward."""
    for op in c.example:
        case = attention_case(op["name"], op["dims"], op["types"], op.get("concrete"))
        if case is None:
            continue
        w = attention_work(case.q, case.k, case.v, case.dtype, case.causal)
        bwd = c.bwd_ms_per_step > 0
        flops = w.flops * (1.0 + BWD_FLOPS["attention"] if bwd else 1.0)
        bytes_ = w.bytes * (1.0 + BWD_BYTES["attention"] if bwd else 1.0)
        n = c.instances_per_step
        return flops * n, bytes_ * n, case.dtype
    r = c.roofline
    if r.flops and r.bytes and r.source in ("estimate", "fused estimate", "ncu", "ncu+estimate"):
        # An attention op outside ATTENTION_OPS (the built-in _FlashAttention): the shape
        # model's work of its recorded tensors, per step.
        dtype = next((t for t, p in TENSOR_PRECISION.items() if p == r.precision), "c10::BFloat16")
        return float(r.flops), float(r.bytes), dtype
    return None


def kernel_unit_of(c: Candidate) -> str | None:
    """The precision most of a candidate's kernel time runs at, where its kernels' names say."""
    by: dict[str, float] = {}
    for k in c.kernels:
        unit = kernel_precision(k.full_name)
        if unit is not None:
            by[unit] = by.get(unit, 0.0) + k.time_ms_per_step
    if not by:
        return None
    best = max(by, key=lambda u: by[u])
    return best if by[best] >= 0.5 * sum(k.time_ms_per_step for k in c.kernels) else None


def first_principles_ceiling(
    c: Candidate, gpu: GPUSpec, unit: str, fraction: float
) -> tuple[float, float, str] | None:
    """(ceiling ms per step, compute rate in FLOP/s, what it rests on) of an attention case:
    its FLOPs at ``fraction`` of the achievable rate of ``unit``, its ideal bytes at the
    achievable bandwidth."""
    ideal = attention_ideal(c)
    if ideal is None:
        return None
    flops, bytes_, _ = ideal
    rate = gpu.peak(unit) * fraction
    ceiling_ms = max(flops / rate, bytes_ / gpu.bandwidth) * 1e3
    c.roofline.flops, c.roofline.bytes = flops, bytes_
    c.roofline.intensity = flops / bytes_ if bytes_ else None
    c.roofline.bound = "compute" if flops / rate >= bytes_ / gpu.bandwidth else "memory"
    c.roofline.precision = gpu.unit(unit)
    c.roofline.achieved_gbs = bytes_ / (c.time_ms_per_step * 1e-3) / 1e9 if c.time_ms_per_step else None
    what = (
        f"{flops / 1e12:.3g} TFLOP per step at {rate / 1e12:.0f} TFLOP/s ({fraction:.0%} of {gpu.name}'s achievable "
        f"{gpu.unit(unit)} rate), {bytes_ / 1e9:.3g} GB at {gpu.ceiling_bandwidth_gbs:.0f} GB/s"
        if fraction < 1.0
        else f"{flops / 1e12:.3g} TFLOP per step at {gpu.name}'s achievable {gpu.unit(unit)} rate "
        f"({rate / 1e12:.0f} TFLOP/s), {bytes_ / 1e9:.3g} GB at {gpu.ceiling_bandwidth_gbs:.0f} GB/s"
    )
    return ceiling_ms, rate, what


def set_first_principles(
    c: Candidate, rules: Rules, ceiling_ms: float, detail: str, basis: dict
) -> bool | None:
    """The headroom against a first-principles ceiling and its condition; returns whether it
    passed (None: below 1, a disagreement)."""
    c.roofline.source = "first principles"
    c.roofline.ceiling_ms = c.roofline.work_ceiling_ms = ceiling_ms
    c.roofline.launch_bound = False
    c.headroom = c.time_ms_per_step / ceiling_ms if ceiling_ms else None
    c.attrs["first_principles"] = basis
    min_headroom = rules.thresholds.min_headroom
    passed = (
        None
        if c.headroom is None or c.headroom < 1.0
        else shown_headroom(c.headroom) >= max(min_headroom, rules.thresholds.at_roof)
    )
    c.conditions["headroom"] = Condition(c.headroom, min_headroom, passed, detail)
    return passed


def table_rate(c: Candidate, gpu: GPUSpec, backend: str | None) -> tuple[int, str, float] | None:
    """(length, backend, TFLOP/s) the GPU's table gives ``backend`` (None: the best) for the
    candidate's case: at its length, or at the shortest measured where it is shorter; None
    where the table has no row for it, or the sequence is longer than any row."""
    case = library_attention_case(c)
    if case is None:
        return None
    head_dim, seq_len, causal, _ = case
    measured = measured_range(gpu.key, head_dim, causal)
    if measured is None or seq_len > measured[1]:
        return None
    at = max(seq_len, measured[0])
    rates = attention_rates(gpu.key, head_dim, causal, at, backward=c.bwd_ms_per_step > 0)
    if rates is None:
        return None
    if backend is None:
        name, rate = rates.best
        return at, name, rate
    chosen = rates.rates.get(backend)
    return (at, backend, chosen) if chosen else None


def below_the_table(c: Candidate, gpu: GPUSpec) -> tuple[int, str, float] | None:
    """(shortest length measured, its best backend, its TFLOP/s) where the candidate's sequence
    is shorter than any row of its GPU, head dim and causality; None otherwise."""
    case = library_attention_case(c)
    if case is None:
        return None
    head_dim, seq_len, causal, _ = case
    measured = measured_range(gpu.key, head_dim, causal)
    if measured is None or seq_len >= measured[0]:
        return None
    rates = attention_rates(gpu.key, head_dim, causal, measured[0], backward=c.bwd_ms_per_step > 0)
    if rates is None:
        return None
    name, rate = rates.best
    return measured[0], name, rate


def place_on_attention_table(
    c: Candidate,
    rules: Rules,
    gpu: GPUSpec,
    lib: LibraryRate,
    rates: AttentionRates,
    case: tuple[int, int, bool, float],
) -> bool | None:
    """Its headroom over the best backend measured at its case, the headroom condition and
    the table row behind it; returns whether the condition passed (None: it disagrees)."""
    head_dim, seq_len, causal, _ = case
    best_name, best = rates.best
    c.headroom = best / lib.achieved if lib.achieved else None
    c.roofline.source = "attention table"
    if c.headroom:
        c.roofline.ceiling_ms = c.roofline.work_ceiling_ms = c.time_ms_per_step / c.headroom
        c.roofline.launch_bound = False
    direction = "fwd+bwd" if c.bwd_ms_per_step > 0 else "fwd"
    detail = (
        f"{lib.achieved:.0f} TFLOP/s achieved ({lib.name}) vs {best:.0f} for {best_name}, the best measured on "
        f"{gpu.name} at D={head_dim}, {'causal' if causal else 'non-causal'}, {rates.basis}, {direction} [attention table]"
    )
    c.attrs["attention_rates"] = detail
    c.attrs["attention_table"] = {
        "gpu": gpu.key,
        "head_dim": head_dim,
        "causal": causal,
        "seq_len": seq_len,
        "rows": list(rates.measured),
        "backend": best_name,
        "tflops": round(best, 1),
        "achieved_tflops": round(lib.achieved, 1),
    }
    min_headroom = rules.thresholds.min_headroom
    passed = (
        None
        if c.headroom and c.headroom < 1.0
        else bool(c.headroom and shown_headroom(c.headroom) >= min_headroom)
    )
    c.conditions["headroom"] = Condition(c.headroom, min_headroom, passed, detail)
    return passed


def no_attention_ceiling(case: tuple[int, int, bool, float] | None, gpu: GPUSpec | None) -> str:
    """Why the attention table gives a library attention candidate no ceiling."""
    if case is None:
        return "no attention shapes recorded for its op (nor for the op its kernel's External id names)"
    if gpu is None:
        return "no GPU spec"
    head_dim, seq_len, causal, _ = case
    measured = measured_range(gpu.key, head_dim, causal)
    what = f"D={head_dim}, {'causal' if causal else 'non-causal'}"
    if measured is None:
        return f"no attention rates measured on {gpu.name} for {what}"
    return (
        f"S={seq_len} lies outside the S={measured[0]}–{measured[1]} measured on {gpu.name} for {what} "
        "(rates at other lengths do not carry over; measure this GPU at these shapes)"
    )


def no_attention_rates(c: Candidate, rules: Rules, lib: LibraryRate, why: str) -> None:
    """No measured rate for its case: no ceiling, and a library kernel gets no other."""
    c.headroom, c.expected_saving_share = None, 0.0
    c.roofline.source = "none"
    c.roofline.ceiling_ms = c.roofline.work_ceiling_ms = None
    rate = (
        f"{lib.name} attention at {lib.achieved:.0f} TFLOP/s; " if lib.achieved else f"{lib.name} attention; "
    )
    c.conditions["headroom"] = Condition(
        None,
        rules.thresholds.min_headroom,
        None,
        f"no ceiling: {why}; a library kernel is judged only against measured backends",
    )
    c.verdict, c.reason = Verdict.SKIP, Reason.NO_CEILING
    c.note = f"{rate}no ceiling: {why}"
