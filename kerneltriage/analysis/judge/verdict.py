"""The verdict of every candidate: ids by time, the three conditions (``conditions.py``), the
decision ladder the rules' recommendation goes through, the library advice and the fix.

Expected saving = share × (1 − 1/headroom) (Amdahl). The ladder exists once: its steps
(``verdict_steps.py``) each decide or pass on (a ceiling the measurement disagrees with, a cold
candidate, no ceiling, a failed shape estimate, a launch-bound candidate, told to launch less and
never to write a faster kernel, short of the rules' headroom, unstable shapes), and what is left
gets the rules' verdict. Which steps run, in which order and with which words is data
(``data/verdicts.yaml``): one ladder for kernels the framework or a library ran, one for kernels
Inductor generated (never told to `compile`: at its roof `skip (compiled-at-roof)`, launch-bound
mode="reduce-overhead", hot and below its roof `write` with a fix that tries Inductor's own search
first, the rules' ``recommendations.compiled``). Library attention is judged against measured
backends (``attention_verdict.py``); the advice on library GEMMs and convolutions
(``library_advice.py``) runs after the ladder.
"""

from __future__ import annotations

import math

from kerneltriage.analysis.fixes.attach import assign_fixes
from kerneltriage.analysis.fixes.fix_environment import Environment, environment
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.attention_verdict import library_attention
from kerneltriage.analysis.judge.conditions import headroom_basis, set_conditions
from kerneltriage.analysis.judge.library_advice import library_advice
from kerneltriage.analysis.judge.verdict_data import verdicts
from kerneltriage.analysis.judge.verdict_steps import STEPS, rules_reason
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Verdict


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
        _fusion_saving(c)
        library_advice(c, rules, gpu)
        if c.verdict == Verdict.SKIP:
            # A skip saves nothing: what a fix could take, if any, is in its note.
            c.expected_saving_share = 0.0
        c.attrs["headroom_basis"] = headroom_basis(c, gpu)
    assign_fixes(candidates, rules, env or environment(gpu, None, None))


def _fusion_saving(c: Candidate) -> None:
    """A compile of a region around a batch norm in training takes what fusing removes, not
    the norm's own headroom (``roofline.fusion_headroom``)."""
    fusion = c.compile_headroom
    if c.verdict != Verdict.COMPILE or fusion >= (c.headroom or 1.0):
        return
    c.expected_saving_share = c.time_share * (1.0 - 1.0 / fusion)
    c.attrs["saving_basis"] = (
        f"share × (1 − 1/{fusion:.3g}): its ops alone move {fusion:.3g}× the bytes of one fused kernel, "
        "and the batch norm's own passes stay"
    )


def _verdict(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """The verdict of the rules' recommendation for ``c``, or the first step of its ladder
    that decides otherwise."""
    rec = rules.recommendation(c.kind, c.variant)
    c.note = str(rec.get("note", ""))
    if rec["verdict"] == Verdict.SKIP:
        c.verdict, c.reason = Verdict.SKIP, rules_reason(rec)
        return
    if c.kind == "attention" and c.attrs.get("written") != "naive":
        library_attention(c, rules, gpu)
        return
    ladder = verdicts().ladders["compiled" if c.inductor else "eager"]
    if ladder.recommendation:
        rec = rules.recommendation(ladder.recommendation)
        c.builtin, c.note = None, ""
    why = c.attrs.get("estimate")
    if ladder.estimate_unavailable and c.conditions["headroom"].passed is None and why and gpu is not None:
        c.conditions["headroom"].detail = ladder.estimate_unavailable.format(why=why)
    for step in ladder.steps:
        if STEPS[step.step](c, rules, gpu, rec, step):
            break
    if (
        c.verdict == Verdict.COMPILE
        and c.compiled
        and not c.inductor
        and "max-autotune" not in (c.builtin or "")
    ):
        # The graph is compiled already and Inductor left this op alone: the cheap option is spent
        # (max-autotune is another search: its Triton templates may replace a library kernel).
        c.verdict, c.builtin, c.note = Verdict.WRITE, None, verdicts().words.compiled_fallback


def rank_in_order(candidates: list[Candidate]) -> None:
    """The report's order, in place: actionable verdicts first, then by expected saving and
    share; ``rank`` numbered from 1 (ids stay as ``decide`` gave them)."""
    candidates.sort(
        key=lambda c: (c.verdict != Verdict.SKIP, c.expected_saving_share, c.time_share), reverse=True
    )
    for i, c in enumerate(candidates, 1):
        c.rank = i
