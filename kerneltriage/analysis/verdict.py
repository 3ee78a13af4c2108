"""Conditions and verdicts: the three conditions of every candidate against the rules'
thresholds, and the verdict and recommendation the rules give.

Expected saving = share × (1 − 1/headroom) (Amdahl). For plain attention the recommendation
is the faster of SDPA and the built-in on this GPU, from the shipped benchmark table.
"""

from __future__ import annotations

import math
import re
from typing import Any

from kerneltriage.analysis.gpus import GPUSpec, attention_perf
from kerneltriage.analysis.model import Candidate, Condition
from kerneltriage.analysis.rules import Rules


def decide(candidates: list[Candidate], rules: Rules, gpu: GPUSpec) -> None:
    """Ids (by time), the three conditions, expected saving and verdict of every candidate."""
    t = rules.thresholds
    by_time = sorted(candidates, key=lambda c: -c.time_share)
    top_n = max(1, math.ceil(t.top_fraction * len(candidates)))
    top = {id(c) for c in by_time[:top_n]}
    for i, c in enumerate(by_time, 1):
        c.id = f"C{i}"
    max_shapes = t.max_shapes
    for c in candidates:
        shares = [s["share"] for s in c.shapes.signatures]
        c.shapes.dominant_coverage = float(sum(shares[:max_shapes])) if shares else 0.0
        h = c.headroom
        c.conditions["headroom"] = Condition(
            value=h,
            threshold=t.min_headroom,
            passed=None if h is None else h >= t.min_headroom,
            detail=_headroom_detail(c),
        )
        hot = c.time_share >= t.min_share or (id(c) in top and c.time_share >= t.min_share_floor)
        c.conditions["hotness"] = Condition(
            value=c.time_share,
            threshold=t.min_share,
            passed=hot,
            detail=f"{c.time_share:.1%} of step time ({c.gpu_share:.1%} of GPU-busy time)"
            + (f"; among the hottest {t.top_fraction:.0%}" if id(c) in top else ""),
        )
        stable = (
            c.shapes.distinct <= max_shapes
            or c.shapes.dominant_coverage >= t.min_dominant_coverage
            or c.shapes.row_wise_stable
        )
        detail = (
            f"{c.shapes.distinct} shape signature(s); top {max_shapes} cover {c.shapes.dominant_coverage:.0%}"
        )
        if c.shapes.varying_dims:
            detail += f"; varying: {', '.join(c.shapes.varying_dims[:6])}"
            if c.shapes.row_wise_stable:
                detail += " (row-wise op, last dim fixed: stable)"
        c.conditions["stability"] = Condition(
            value=float(c.shapes.distinct), threshold=float(max_shapes), passed=stable, detail=detail
        )
        c.expected_saving_share = c.time_share * (1.0 - 1.0 / h) if h and h > 1.0 else 0.0
        _verdict(c, rules, gpu)


def _headroom_detail(c: Candidate) -> str:
    r = c.roofline
    if c.headroom is None:
        return "no counters and no shape model for this op: headroom unknown"
    what = (
        "fused ceiling (external inputs/outputs only)"
        if r.source == "fused estimate"
        else f"{r.bound}-bound ceiling"
    )
    return f"{c.time_ms_per_step:.3g} ms measured vs {r.ceiling_ms:.3g} ms {what} [{r.source}]"


def _verdict(c: Candidate, rules: Rules, gpu: GPUSpec) -> None:
    rec = rules.recommendation(c.kind, c.variant)
    c.note = str(rec.get("note", ""))
    cond = c.conditions
    if rec["verdict"] == "skip":
        c.verdict, c.reason = "skip", str(rec["reason"])
        return
    if not cond["hotness"].passed:
        c.verdict, c.reason = "skip", "cold"
        return
    if cond["headroom"].passed is None:
        c.verdict, c.reason = "skip", "no-ceiling"
        c.note = "run with Nsight Compute counters (kerneltriage profile) to place it on the roofline"
        return
    if not cond["headroom"].passed:
        library = c.attrs.get("library_op") or _already_uses(c, rec)
        c.verdict, c.reason = "skip", "library-at-roof" if library else "at-roof"
        return
    if not cond["stability"].passed:
        c.verdict, c.reason = "skip", "unstable-shapes"
        return
    c.verdict = str(rec["verdict"])
    c.builtin = rec.get("builtin")
    if c.kind == "attention":
        c.builtin, c.reason = _attention_choice(c, rec, gpu)
    else:
        c.reason = "all three conditions hold"
    used = _already_uses(c, rec)
    if used:
        # It already runs the fused kernel the rules would recommend: nothing to swap in.
        c.verdict, c.builtin = "write", None
        c.reason = f"all three conditions hold, and it already uses {used}: that kernel runs well below its ceiling here"


def _already_uses(c: Candidate, rec: dict[str, Any]) -> str | None:
    """The op of ``c`` that is already the fused kernel ``rec`` would recommend, if any."""
    for pattern in rec.get("already") or []:
        for op in c.ops:
            if re.search(pattern, op):
                return op
    return None


def _attention_choice(c: Candidate, rec: dict[str, Any], gpu: GPUSpec) -> tuple[str | None, str]:
    """SDPA or the built-in flash attention: variants SDPA cannot fuse get the built-in; plain
    attention gets whichever the shipped benchmark table measured faster on this GPU."""
    library, ours = rec.get("builtin"), rec.get("variant_builtin")
    if c.attrs.get("softcap") or c.attrs.get("mask") == "custom-mask":
        return ours, "all three conditions hold; a variant SDPA cannot run fused"
    perf = attention_perf(gpu, c.attrs.get("head_dim"), c.attrs.get("mask") == "causal")
    if perf is None:
        return (
            library,
            f"all three conditions hold; no benchmark of the built-in on {gpu.name}: the library op",
        )
    sdpa, built = perf
    if built > sdpa:
        return (
            ours,
            f"all three conditions hold; built-in measured faster than SDPA here ({built:.0f} vs {sdpa:.0f} TFLOP/s)",
        )
    return (
        library,
        f"all three conditions hold; SDPA measured faster than the built-in here ({sdpa:.0f} vs {built:.0f} TFLOP/s)",
    )
