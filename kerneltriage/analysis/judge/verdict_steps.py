"""The steps of the decision ladder: each looks at a candidate whose conditions are set and
either decides its verdict (a skip and why, launching less, the rules' verdict) and says so, or
leaves it to the next step. Which steps a ladder runs, in which order and with which words is
data (``verdicts.yaml``, ``verdict_data.py``); ``verdict.py`` runs them, and library attention
runs the ones it shares (a cold candidate, unstable shapes, a low headroom).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.attention_choice import choose_attention
from kerneltriage.analysis.judge.conditions import shown_headroom
from kerneltriage.analysis.judge.verdict_data import (
    BelowHeadroomStep,
    FailedEstimateStep,
    LaunchBoundStep,
    NoCeilingStep,
    RecommendStep,
    UnstableStep,
    verdicts,
)
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.rules_schema import AloneSkip, Recommendation
from kerneltriage.analysis.vocabulary import Reason, Verdict


def _launches_near_floor(c: Candidate, rules: Rules) -> bool:
    """A launch-bound candidate is told to launch less only when its launches run within the
    rules' ``near_floor`` launch floors; launches many times the floor are slow kernels."""
    r = c.roofline
    if not r.launches_per_step or not r.launch_floor_ms:
        return True
    return c.time_ms_per_step <= rules.cutoffs.near_floor * r.launch_floor_ms


def _implausible_estimate(c: Candidate, rules: Rules) -> bool:
    """A shape estimate that puts the op above its own roof: the op's tensors are not what its
    kernels moved (a fill, a gather, a custom op whose work runs in kernels it did not launch)."""
    return (
        c.headroom is not None
        and c.roofline.source in ("estimate", "fused estimate")
        and c.headroom < rules.thresholds.min_estimated_headroom
    )


def _times(headroom: float) -> str:
    """1/headroom as "12.5×"; a headroom of 0 (kernels of zero duration) as "many times"."""
    return f"{1 / headroom:.1f}×" if headroom > 0 else "many times"


def low_headroom(c: Candidate, rules: Rules, what: str) -> None:
    """Below the rules' headroom but not at the roof: not worth a kernel by the rules, with
    what a fix could take (not counted as a saving: the row is a skip)."""
    h = c.headroom or 1.0
    c.reason = Reason.LOW_HEADROOM
    c.note = verdicts().words.low_headroom.format(
        what=what,
        achieved=1 / h,
        headroom=shown_headroom(h),
        min_headroom=rules.thresholds.min_headroom,
        saving=c.time_share * (1 - 1 / h),
    )


def rules_reason(rec: Recommendation | AloneSkip) -> str:
    """A skip reason the rules give: the vocabulary's word when it is one, else the file's."""
    reason = str(rec.reason)
    try:
        return Reason(reason)
    except ValueError:
        return reason


def skip_cold(c: Candidate, keep_note: bool = False) -> bool:
    if c.conditions["hotness"].passed:
        return False
    c.verdict, c.reason = Verdict.SKIP, Reason.COLD
    if not keep_note:
        c.note = ""
    return True


def skip_unstable(c: Candidate, note: str | None = None) -> bool:
    if c.conditions["stability"].passed:
        return False
    c.verdict, c.reason = Verdict.SKIP, Reason.UNSTABLE_SHAPES
    if note is not None:
        c.note = note
    return True


def already_uses(c: Candidate, rec: Recommendation) -> str | None:
    """The op of ``c`` that is already the fused kernel ``rec`` would recommend, if any."""
    for pattern in rec.get("already") or []:
        for op in c.ops:
            if pattern.search(op):
                return op
    return None


# --- the steps, by the name a ladder gives them ------------------------------------------------
# Each takes the candidate, the rules, the GPU, the recommendation the ladder reads and the
# step's own data, and returns whether it decided.


def _disagrees(c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: Any) -> bool:
    """A headroom below 1: it ran faster than its ceiling allows. Shown as a disagreement
    between measurement and ceiling, never a verdict input (``skip (ceiling-disagrees)``)."""
    if c.headroom is None or c.headroom >= 1.0:
        return False
    c.verdict, c.reason, c.builtin = Verdict.SKIP, Reason.CEILING_DISAGREES, None
    c.expected_saving_share = 0.0
    words = verdicts().words.disagrees
    if "ncu" in c.roofline.source:
        text = words.counters
    elif _implausible_estimate(c, rules):
        text = words.implausible
    else:
        text = words.shape_model
    c.note = text.format(times=_times(c.headroom))
    return True


def _cold(c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: Any) -> bool:
    return skip_cold(c)


def _no_ceiling(
    c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: NoCeilingStep
) -> bool:
    """No ceiling: tuned library kernels (cuDNN, cuBLAS, MIOpen, …) are no kernel to write
    (counters would say whether the library is at its roof); anything else needs one."""
    if c.conditions["headroom"].passed is not None:
        return False
    c.verdict = Verdict.SKIP
    if step.library_kernels and c.attrs.get("vendor_share", 0.0) >= rules.cutoffs.library_vendor_share:
        c.reason = Reason.LIBRARY_KERNEL
        c.note = step.library_kernels.format(library=c.attrs.get("kernel_library") or "library")
        return True
    c.reason = Reason.NO_CEILING
    words, why = verdicts().words, c.attrs.get("estimate")
    if gpu is None:
        c.note = words.no_gpu
    elif step.estimate_unavailable and why:
        c.note = str(rec.get("estimate_unavailable", "{why}")).format(why=why)
    else:
        c.note = words.no_counters
    return True


def _failed_estimate(
    c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: FailedEstimateStep
) -> bool:
    """No verdict is built on a shape estimate that cannot be right (beyond the rules'
    ``max_estimated_headroom`` on a candidate that matters); counters would place it."""
    t = rules.thresholds
    failed = (
        c.headroom is not None
        and c.roofline.source in ("estimate", "fused estimate")
        and c.headroom > t.max_estimated_headroom
        and c.time_share >= t.min_share_floor
        and not (c.kind == "attention" and c.attrs.get("written") == "naive")
    )
    if not failed:
        return False
    c.verdict, c.reason = Verdict.SKIP, Reason.ESTIMATE_FAILED
    c.expected_saving_share = 0.0
    c.note = verdicts().words.failed_estimate.format(why=step.why.format(headroom=c.headroom))
    return True


def _launch_bound(
    c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: LaunchBoundStep
) -> bool:
    """Its launches, not its bytes or FLOPs, set its time: a faster kernel cannot help."""
    if not c.roofline.launch_bound:
        return False
    if step.near_floor_only and (c.level == "region" or not _launches_near_floor(c, rules)):
        return False
    if c.conditions["headroom"].passed:
        c.verdict, c.reason = Verdict.COMPILE, Reason.LAUNCH_BOUND
        c.builtin = step.builtin
        c.note = step.note.format(launches=c.roofline.launches_per_step)
    else:
        c.verdict, c.reason = Verdict.SKIP, Reason.LAUNCH_BOUND
        c.note = verdicts().words.launch_floor
    return True


def _below_headroom(
    c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: BelowHeadroomStep
) -> bool:
    """At its roof (a library's op: ``library-at-roof``), or short of the rules' headroom."""
    if c.conditions["headroom"].passed:
        return False
    library = step.library_at_roof is not None and (c.attrs.get("library_op") or already_uses(c, rec))
    c.verdict, c.note = Verdict.SKIP, ""
    headroom = shown_headroom(c.headroom or 1.0)
    if headroom < rules.thresholds.at_roof:
        c.reason = step.library_at_roof if library and step.library_at_roof else step.at_roof
        if step.rules_at_roof_note:
            c.note = str(rec.get("at_roof_note", "")).format(headroom=f"{headroom:g}×")
    else:
        low_headroom(c, rules, step.library_what if library and step.library_what is not None else step.what)
    return True


def _unstable(
    c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: UnstableStep
) -> bool:
    return skip_unstable(c, step.note)


def _recommend(
    c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: RecommendStep
) -> bool:
    """All three conditions hold: the rules' verdict and built-in (for naive attention the
    faster of SDPA and the built-in), unless it already runs the fused kernel they name."""
    c.verdict = Verdict(rec["verdict"])
    c.builtin = rec.get("builtin")
    if c.kind == "attention" and gpu is not None:  # a ceiling passed: there is a GPU
        c.builtin, c.reason = choose_attention(c, rec, gpu)
    else:
        c.reason = Reason.ALL_CONDITIONS
    used = already_uses(c, rec)
    alone = rec.get("already_alone") if used and _alone(c, used) else None
    if alone is not None:
        # The fused kernel alone: nothing beside it for a compile to fuse, nothing to swap in,
        # and the rules say what was measured of the fixes that remain.
        c.verdict, c.builtin = Verdict.SKIP, None
        c.reason = rules_reason(alone)
        c.note = alone.note.format(op=used)
        c.attrs["already_alone"] = used  # a compile around it still takes its headroom (attach.py)
        return True
    if used:
        # It already runs the fused kernel the rules would recommend: nothing to swap in, and
        # torch.compile still covers it, so this is not yet a kernel to write by hand.
        c.verdict, c.builtin = Verdict.COMPILE, step.already_builtin
        c.reason = Reason.ALREADY_USES.text(op=used)
        c.note = step.already_note
    kept = c.verdict == Verdict.COMPILE and kept_library_kernel(c, rules)
    if kept and not step.compiled_modes.search(c.builtin or ""):
        # Compiling the model again leaves a library kernel its compiled graph kept as it is.
        library = c.attrs.get("kernel_library") or "library"
        c.note = step.compiled_library.format(library=library, builtin=c.builtin or "torch.compile")
        c.verdict, c.reason, c.builtin = Verdict.SKIP, Reason.LIBRARY_KERNEL, None
    return True


def _alone(c: Candidate, used: str) -> bool:
    """``c`` is the op ``used`` and nothing a kernel would fuse with it: an op of its own, or a
    region whose other ops touch 0-dim tensors only (BatchNorm's ``num_batches_tracked += 1``)."""
    if c.level == "op":
        return True
    others = [op for op in c.example if op.get("name") != used]
    return len(others) < len(c.example) and all(
        all(not d for d, _ in tensor_inputs(op.get("dims"), op.get("types"))) for op in others
    )


def kept_library_kernel(c: Candidate, rules: Rules) -> bool:
    """A library kernel in a compiled graph (cuBLAS, CUTLASS, cuDNN, …: Inductor left the op to
    it), not one Inductor generated: compiling again does not change it."""
    vendor = c.attrs.get("vendor_share", 0.0)
    return c.compiled and not c.inductor and vendor >= rules.cutoffs.library_vendor_share


def _compiled_write(c: Candidate, rules: Rules, gpu: GPUSpec | None, rec: Recommendation, step: Any) -> bool:
    """An Inductor kernel, hot and below its roof: `write`, after what Inductor could try
    first (its fix), on the rung of the optimization ladder its bound says."""
    bound = c.roofline.bound or "memory"
    c.verdict = Verdict.WRITE
    achieved = f"{1.0 / c.headroom:.0%}" if c.headroom else "?"
    c.reason = str(rec.get("reason", Reason.ALL_CONDITIONS)).format(achieved=achieved, bound=bound)
    rung = (rec.get("rungs") or {}).get(bound, "")
    c.note = str(rec.get("note", "{rung}")).format(rung=rung)
    return True


#: Step name (``verdicts.yaml``) -> the step.
STEPS: dict[str, Callable[[Candidate, Rules, GPUSpec | None, Recommendation, Any], bool]] = {
    "disagrees": _disagrees,
    "cold": _cold,
    "no-ceiling": _no_ceiling,
    "failed-estimate": _failed_estimate,
    "launch-bound": _launch_bound,
    "below-headroom": _below_headroom,
    "unstable": _unstable,
    "recommend": _recommend,
    "compiled-write": _compiled_write,
}
