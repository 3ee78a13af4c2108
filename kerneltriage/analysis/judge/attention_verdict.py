"""The verdict of library attention (FlashAttention, cuDNN, CK, aiter, …): against the best
backend measured on its GPU for its case, never the GEMM peak. A faster backend measured here is
a `use-builtin`; below half the best known rate, hot and stable, a `write`; near it, a skip.
Where no measured row applies, the first-principles ceiling stands in.
"""

from __future__ import annotations

import dataclasses

from kerneltriage.analysis.candidates.estimate import TENSOR_PRECISION
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.attention_ceilings import (
    LibraryRate,
    attention_ideal,
    below_the_table,
    first_principles_ceiling,
    kernel_unit_of,
    library_attention_case,
    no_attention_ceiling,
    no_attention_rates,
    place_on_attention_table,
    set_first_principles,
)
from kerneltriage.analysis.judge.attention_rates import (
    AttentionRates,
    attention_rates,
    backend_of,
    first_principles,
    how,
    measured_range,
)
from kerneltriage.analysis.judge.conditions import shown_headroom
from kerneltriage.analysis.judge.sdpa_math_path import math_path, unfused_attention
from kerneltriage.analysis.judge.verdict_data import verdicts
from kerneltriage.analysis.judge.verdict_steps import low_headroom, skip_cold, skip_unstable
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Reason, Verdict


def library_attention(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """Library attention against the best backend measured on this GPU for its case: the
    table's rate interpolated at its sequence length, never one measured at another length
    (outside the table's range there is no ceiling, and the note says why)."""
    case = library_attention_case(c)
    kernel = next((k.full_name for k in c.kernels if rules.kernel_kind(k.full_name) == "attention"), None)
    library = rules.kernel_class(kernel).library if kernel else None
    lib = LibraryRate(library or "library", backend_of(library), 0.0)
    rates = None
    if case is not None:
        head_dim, seq_len, causal, flops = case
        achieved = flops / (c.time_ms_per_step * 1e-3) / 1e12 if c.time_ms_per_step else 0.0
        lib = dataclasses.replace(lib, achieved=achieved)
        # One achieved rate for the candidate: the roofline line says what the headroom uses.
        c.roofline.flops = flops
        c.roofline.achieved_tflops = achieved or None
        if gpu is not None:
            rates = attention_rates(gpu.key, head_dim, causal, seq_len, backward=c.bwd_ms_per_step > 0)
    c.builtin = None
    math = math_path(c, rules) if case is not None and gpu is not None else None
    if math is not None and gpu is not None and case is not None:
        unfused_attention(c, rules, gpu, lib, math)
        return
    if rates is None or case is None or gpu is None:
        ideal = attention_ideal(c) if gpu is not None else None
        if ideal is not None and gpu is not None:
            if not lib.achieved and c.time_ms_per_step:
                lib = dataclasses.replace(lib, achieved=ideal[0] / (c.time_ms_per_step * 1e-3) / 1e12)
                c.roofline.achieved_tflops = lib.achieved or None
            why = (
                no_attention_ceiling(case, gpu)
                if case is not None
                else f"no measured attention rate covers its op ({c.example[0]['name'] if c.example else c.name})"
            )
            _first_principles_attention(c, rules, gpu, lib, why)
            return
        no_attention_rates(c, rules, lib, no_attention_ceiling(case, gpu))
        return
    passed = place_on_attention_table(c, rules, gpu, lib, rates, case)
    decided = (
        _attention_disagrees(c, gpu, lib, rates)
        or skip_cold(c, keep_note=True)
        or _switch_backend(c, rules, gpu, lib, rates)
        or _write_library_attention(c, passed, lib, rates)
    )
    if not decided:
        _skip_library_attention(c, rules, lib, rates)


def _attention_disagrees(c: Candidate, gpu: GPUSpec, lib: LibraryRate, rates: AttentionRates) -> bool:
    """Faster than the best the table measured: the measurement and the table disagree."""
    if not (c.headroom and c.headroom < 1.0):
        return False
    best_name, best = rates.best
    c.verdict, c.reason, c.expected_saving_share = Verdict.SKIP, Reason.CEILING_DISAGREES, 0.0
    c.note = (
        f"{lib.name} attention runs at {lib.achieved:.0f} TFLOP/s, above the {best:.0f} measured for {best_name} "
        f"at this case on {gpu.name}: the measurement and the table disagree; no verdict rests on it"
    )
    return True


def _switch_backend(
    c: Candidate, rules: Rules, gpu: GPUSpec, lib: LibraryRate, rates: AttentionRates
) -> bool:
    """Another backend measured faster at this case, and this backend runs here about as fast
    as the table measured it: the table's ratio applies to this run."""
    best_name, best = rates.best
    this = rates.rates.get(lib.backend or "")
    cut = rules.cutoffs
    if not (
        this
        and best_name != lib.backend
        and best >= cut.switch_ratio * this
        and lib.achieved >= cut.switch_min_rate * this
    ):
        return False
    c.verdict, c.builtin = Verdict.USE_BUILTIN, how(best_name)
    c.reason = Reason.FASTER_BACKEND.text(
        backend=best_name, best=best, this=this, current=lib.backend, basis=rates.basis
    )
    c.expected_saving_share = c.time_share * (1.0 - this / best)
    c.attrs["saving_basis"] = (
        f"share × (1 − {this:.0f}/{best:.0f}): {lib.backend}'s measured rate over {best_name}'s"
    )
    c.note = verdicts().attention.faster_backend.format(gpu=gpu.name)
    return True


def _switch_below_the_table(
    c: Candidate, rules: Rules, gpu: GPUSpec, lib: LibraryRate, shortest: int
) -> bool:
    """Shorter than any row, and another backend measured faster than this one at every
    length of the table: the same attention through that backend, predicted at the ratio of
    their rates at the shortest length (rates there are an upper bound for both)."""
    case = library_attention_case(c)
    if case is None or not lib.backend:
        return False
    head_dim, _, causal, _ = case
    lo, hi = measured_range(gpu.key, head_dim, causal) or (0, 0)
    backward = c.bwd_ms_per_step > 0
    rows = [attention_rates(gpu.key, head_dim, causal, n, backward) for n in (lo, hi)]
    if any(r is None for r in rows):
        return False
    at_lo = rows[0]
    assert at_lo is not None
    best_name, best = at_lo.best
    this = at_lo.rates.get(lib.backend)
    everywhere = all(
        r is not None and r.best[0] == best_name and r.rates.get(lib.backend or "") for r in rows
    )
    if not (this and everywhere and best_name != lib.backend and best >= rules.cutoffs.switch_ratio * this):
        return False
    c.verdict, c.builtin = Verdict.USE_BUILTIN, how(best_name)
    basis = f"S={shortest}, the shortest row (S={case[1]} is shorter; {best_name} is faster at every length measured)"
    c.reason = Reason.FASTER_BACKEND.text(
        backend=best_name, best=best, this=this, current=lib.backend, basis=basis
    )
    c.expected_saving_share = c.time_share * (1.0 - this / best)
    c.attrs["saving_basis"] = (
        f"share × (1 − {this:.0f}/{best:.0f}): {lib.backend}'s measured rate over {best_name}'s at S={shortest}"
    )
    c.note = verdicts().attention.faster_backend.format(gpu=gpu.name)
    return True


def _write_library_attention(
    c: Candidate, passed: bool | None, lib: LibraryRate, rates: AttentionRates
) -> bool:
    """Below half of the best library rate, hot and stable: a kernel to write."""
    c.expected_saving_share = 0.0
    if not (passed and c.conditions["stability"].passed):
        return False
    best = rates.best[1]
    c.verdict = Verdict.WRITE
    c.reason = Reason.BELOW_BEST_RATE.text(achieved=lib.achieved, best=best)
    c.expected_saving_share = c.time_share * (1.0 - lib.achieved / best)
    c.note = verdicts().attention.check_shapes
    return True


def _skip_library_attention(c: Candidate, rules: Rules, lib: LibraryRate, rates: AttentionRates) -> None:
    """Near the best library rate, or short of the rules' headroom."""
    c.verdict = Verdict.SKIP
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = Reason.LIBRARY_AT_ROOF
        c.note = f"{lib.name} attention at {lib.achieved:.0f} of the {rates.best[1]:.0f} TFLOP/s best measured here"
    else:
        low_headroom(c, rules, f"{lib.name} attention ")


def _first_principles_attention(c: Candidate, rules: Rules, gpu: GPUSpec, lib: LibraryRate, why: str) -> None:
    """A fused library attention kernel no measured row applies to: its FLOPs at the share of
    the achievable tensor-core rate fused attention reaches, its bytes at the bandwidth."""
    ideal = attention_ideal(c)
    assert ideal is not None  # the caller checked
    dtype = ideal[2]
    unit = kernel_unit_of(c) or TENSOR_PRECISION.get(dtype, "bf16")
    fp = first_principles()
    fraction, capped = fp.fused_fraction, None
    shorter = below_the_table(c, gpu)
    if shorter is not None and shorter[2] * 1e12 < gpu.peak(unit) * fraction:
        # Below the shortest length measured: no backend runs faster there than the best did
        # at that length (rates fall as sequences shorten).
        fraction, capped = shorter[2] * 1e12 / gpu.peak(unit), shorter
    placed = first_principles_ceiling(c, gpu, unit, fraction)
    assert placed is not None
    ceiling_ms, rate, what = placed
    if capped is not None:
        what += f"; capped at {capped[1]}'s {capped[2]:.0f} TFLOP/s at S={capped[0]}, the shortest length measured"
    detail = (
        f"{c.time_ms_per_step:.3g} ms measured ({lib.achieved:.0f} TFLOP/s, {lib.name}) vs {ceiling_ms:.3g} ms "
        f"first-principles ceiling: {what} [first principles; {why}]"
    )
    passed = set_first_principles(
        c,
        rules,
        ceiling_ms,
        detail,
        {
            "unit": gpu.unit(unit),
            "fused_fraction": round(fraction, 4),
            "tflops": round(rate / 1e12, 1),
            "why": why,
            **({"capped_by": {"seq_len": capped[0], "backend": capped[1]}} if capped else {}),
        },
    )
    basis = f"{fraction:.0%} of the achievable {gpu.unit(unit)} rate; {why}"
    if c.headroom is not None and c.headroom < 1.0:
        c.verdict, c.reason, c.expected_saving_share = Verdict.SKIP, Reason.CEILING_DISAGREES, 0.0
        c.note = (
            f"{lib.name} attention runs at {lib.achieved:.0f} TFLOP/s, above the first-principles ceiling "
            f"({rate / 1e12:.0f} TFLOP/s): the fraction fused attention reaches is higher on this GPU; no verdict rests on it"
        )
        return
    if skip_cold(c, keep_note=True):
        c.note = f"{lib.name} attention at {lib.achieved:.0f} TFLOP/s; first-principles ceiling ({basis})"
        return
    if capped is not None and _switch_below_the_table(c, rules, gpu, lib, capped[0]):
        return
    if passed and c.conditions["stability"].passed:
        c.verdict = Verdict.WRITE
        c.reason = Reason.BELOW_FIRST_PRINCIPLES.text(achieved=lib.achieved, ceiling=rate / 1e12)
        c.expected_saving_share = c.time_share * (1.0 - 1.0 / (c.headroom or 1.0))
        c.note = verdicts().attention.backends_to_try(gpu.vendor)
        return
    c.verdict = Verdict.SKIP
    if skip_unstable(c):
        return
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = Reason.LIBRARY_AT_ROOF
        c.note = f"{lib.name} attention at {lib.achieved:.0f} of the {rate / 1e12:.0f} TFLOP/s first-principles ceiling"
    else:
        low_headroom(c, rules, f"{lib.name} attention ")
