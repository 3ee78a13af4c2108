"""The verdict of every candidate: ids by time, the three conditions (``conditions.py``), the
decision ladder the rules' recommendation goes through, the library advice and the fix.

Expected saving = share × (1 − 1/headroom) (Amdahl). The ladder's steps (``verdict_steps.py``)
each decide or pass on: a ceiling the measurement disagrees with, a cold candidate, no ceiling,
a failed shape estimate, a launch-bound candidate (told to launch less, never to write a faster
kernel), short of the rules' headroom, unstable shapes; what is left gets the rules' verdict.
Library attention is judged against measured backends (``attention_verdict.py``); a kernel
Inductor generated is never told to `compile` (it is compiled): at its roof `skip
(compiled-at-roof)`, launch-bound mode="reduce-overhead", hot and below its roof `write` with a
fix that tries Inductor's own search first (the rules' ``recommendations.compiled``).
"""

from __future__ import annotations

import math
from typing import Any

from kerneltriage.analysis.attention_choice import choose_attention
from kerneltriage.analysis.attention_verdict import library_attention
from kerneltriage.analysis.conditions import headroom_basis, set_conditions, shown_headroom
from kerneltriage.analysis.fix_environment import Environment, environment
from kerneltriage.analysis.fixes import assign_fixes
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.library_advice import library_advice
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.rules_schema import Recommendation
from kerneltriage.analysis.verdict_steps import (
    already_uses,
    disagrees,
    failed_estimate,
    launch_bound,
    low_headroom,
    rules_reason,
    skip_below_headroom,
    skip_cold,
    skip_failed_estimate,
    skip_failed_shape_model,
    skip_unstable,
    skip_without_ceiling,
)
from kerneltriage.analysis.vocabulary import Reason, Verdict


def decide(
    candidates: list[Candidate], rules: Rules, gpu: GPUSpec | None, env: Environment | None = None
) -> None:
    """Ids (by time), the three conditions, expected saving, verdict and fix (a recipe of
    ``fixes.yaml``, checked against the trace's ``env``) of every candidate."""
    t = rules.thresholds
    by_time = sorted(candidates, key=lambda c: -c.time_share)
    top_n = max(1, math.ceil(t.top_fraction * len(candidates)))
    top = {id(c) for c in by_time[:top_n]}
    for i, c in enumerate(by_time, 1):
        c.id = f"C{i}"
    for c in candidates:
        set_conditions(c, rules, id(c) in top)
        h = c.headroom
        c.expected_saving_share = c.time_share * (1.0 - 1.0 / h) if h and h > 1.0 else 0.0
        _verdict(c, rules, gpu)
        library_advice(c, rules, gpu)
        if c.verdict == Verdict.SKIP:
            # A skip saves nothing: what a fix could take, if any, is in its note.
            c.expected_saving_share = 0.0
        c.attrs["headroom_basis"] = headroom_basis(c, gpu)
    assign_fixes(candidates, rules, env or environment(gpu, None, None))


def _verdict(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """The verdict of the rules' recommendation for ``c``, or the first step that decides
    otherwise (each returns whether it decided)."""
    rec = rules.recommendation(c.kind, c.variant)
    c.note = str(rec.get("note", ""))
    if rec["verdict"] == Verdict.SKIP:
        c.verdict, c.reason = Verdict.SKIP, rules_reason(rec)
        return
    if c.kind == "attention" and c.attrs.get("written") != "naive":
        library_attention(c, rules, gpu)
        return
    if c.inductor:
        _inductor_verdict(c, rules, gpu)
        return
    decided = (
        disagrees(c, rules)
        or skip_cold(c)
        or skip_without_ceiling(c, rules, gpu)
        or skip_failed_shape_model(c, rules)
        or launch_bound(c, rules)
        or skip_below_headroom(c, rules, rec)
        or skip_unstable(c)
    )
    if not decided:
        _recommend(c, rec, gpu)


def _recommend(c: Candidate, rec: Recommendation, gpu: GPUSpec | None) -> None:
    """All three conditions hold: the rules' verdict and built-in (for naive attention the
    faster of SDPA and the built-in), unless it already runs the fused kernel they name."""
    c.verdict = Verdict(rec["verdict"])
    c.builtin = rec.get("builtin")
    if c.kind == "attention" and gpu is not None:  # a ceiling passed: there is a GPU
        c.builtin, c.reason = choose_attention(c, rec, gpu)
    else:
        c.reason = Reason.ALL_CONDITIONS
    used = already_uses(c, rec)
    if used:
        # It already runs the fused kernel the rules would recommend: nothing to swap in, and
        # torch.compile still covers it (one generated kernel for the op and its neighbours),
        # so this is not yet a kernel to write by hand.
        c.verdict, c.builtin = Verdict.COMPILE, "torch.compile"
        c.reason = Reason.ALREADY_USES.text(op=used)
        c.note = "torch.compile generates one kernel for it and its neighbouring ops; write one only if that stays below the roof"


def _inductor_verdict(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """A kernel Inductor generated: torch.compile already runs it, so `compile` is no advice.
    At its roof: `skip (compiled-at-roof)`; launch-bound: CUDA graphs; hot and below its roof:
    `write`, after what Inductor could try first (the fix)."""
    rec = rules.recommendation("compiled")
    c.builtin, c.note = None, ""
    why = c.attrs.get("estimate")
    if c.conditions["headroom"].passed is None and why and gpu is not None:
        c.conditions["headroom"].detail = f"estimate unavailable: {why}"
    decided = (
        disagrees(c, rules)
        or skip_cold(c)
        or _inductor_without_ceiling(c, rec, gpu, why)
        or _inductor_failed_estimate(c, rules)
        or _inductor_launch_bound(c)
        or _inductor_below_headroom(c, rules, rec)
        or skip_unstable(
            c,
            "Inductor recompiles or runs dynamic-shape kernels for these shapes: mark_dynamic, or pad to a few sizes",
        )
    )
    if decided:
        return
    bound = c.roofline.bound or "memory"
    c.verdict = Verdict.WRITE
    achieved = f"{1.0 / c.headroom:.0%}" if c.headroom else "?"
    c.reason = str(rec.get("reason", Reason.ALL_CONDITIONS)).format(achieved=achieved, bound=bound)
    rung = (rec.get("rungs") or {}).get(bound, "")
    c.note = str(rec.get("note", "{rung}")).format(rung=rung)


def _inductor_without_ceiling(c: Candidate, rec: Recommendation, gpu: GPUSpec | None, why: Any) -> bool:
    if c.conditions["headroom"].passed is not None:
        return False
    c.verdict, c.reason = Verdict.SKIP, Reason.NO_CEILING
    if gpu is None:
        c.note = "no GPU spec: pass --gpu to place it on the roofline"
    elif why:
        c.note = str(rec.get("estimate_unavailable", "{why}")).format(why=why)
    else:
        c.note = "run with Nsight Compute counters (kerneltriage profile) to place it on the roofline"
    return True


def _inductor_failed_estimate(c: Candidate, rules: Rules) -> bool:
    if not failed_estimate(c, rules):
        return False
    skip_failed_estimate(
        c,
        f"the estimate from its arguments puts the ceiling at 1/{c.headroom:.0f} of the measured time: "
        "a buffer it reads or writes more than once, or a gather",
    )
    return True


def _inductor_launch_bound(c: Candidate) -> bool:
    if not c.roofline.launch_bound:
        return False
    if c.conditions["headroom"].passed:
        c.verdict, c.reason = Verdict.COMPILE, Reason.LAUNCH_BOUND
        c.builtin = 'torch.compile(mode="reduce-overhead")'
        c.note = (
            f"{c.roofline.launches_per_step:.3g} launches per step doing almost no work each: "
            "CUDA graphs launch the compiled graph at once"
        )
    else:
        c.verdict, c.reason = Verdict.SKIP, Reason.LAUNCH_BOUND
        c.note = "each launch already runs near the GPU's per-launch floor"
    return True


def _inductor_below_headroom(c: Candidate, rules: Rules, rec: Recommendation) -> bool:
    if c.conditions["headroom"].passed:
        return False
    c.verdict = Verdict.SKIP
    headroom = shown_headroom(c.headroom or 1.0)
    if headroom < rules.thresholds.at_roof:
        c.reason = Reason.COMPILED_AT_ROOF
        c.note = str(rec.get("at_roof_note", "")).format(headroom=f"{headroom:g}×")
    else:
        low_headroom(c, rules, "Inductor ")
    return True
