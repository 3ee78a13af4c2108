"""The steps of the decision ladder: each looks at a candidate whose conditions are set, and
either decides its verdict (a skip and why, or launching less) and says so, or leaves it to the
next step. ``verdict.py`` runs them in order; library attention runs the ones it shares.
"""

from __future__ import annotations

from kerneltriage.analysis.conditions import shown_headroom
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.rules_schema import Recommendation
from kerneltriage.analysis.vocabulary import Reason, Verdict


def _launches_near_floor(c: Candidate, rules: Rules) -> bool:
    """A launch-bound candidate is told to launch less only when its launches run within the
    rules' ``near_floor`` launch floors; launches many times the floor are slow kernels."""
    r = c.roofline
    if not r.launches_per_step or not r.launch_floor_ms:
        return True
    return c.time_ms_per_step <= rules.cutoffs.near_floor * r.launch_floor_ms


def failed_estimate(c: Candidate, rules: Rules) -> bool:
    t = rules.thresholds
    return (
        c.headroom is not None
        and c.roofline.source in ("estimate", "fused estimate")
        and c.headroom > t.max_estimated_headroom
        and c.time_share >= t.min_share_floor
        and not (c.kind == "attention" and c.attrs.get("written") == "naive")
    )


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


def disagrees(c: Candidate, rules: Rules) -> bool:
    """A headroom below 1: it ran faster than its ceiling allows. Shown as a disagreement
    between measurement and ceiling, never a verdict input (``skip (ceiling-disagrees)``)."""
    if c.headroom is None or c.headroom >= 1.0:
        return False
    c.verdict, c.reason, c.builtin = Verdict.SKIP, Reason.CEILING_DISAGREES, None
    c.expected_saving_share = 0.0
    faster = f"measured {_times(c.headroom)} faster than its ceiling allows"
    if "ncu" in c.roofline.source:
        c.note = (
            f"{faster}: the roof is too low for this kernel (run kerneltriage calibrate with this run "
            "to measure it); no verdict rests on it"
        )
    elif _implausible_estimate(c, rules):
        c.note = (
            f"{faster}: its kernels did not move the tensors its shapes name (a fill, a gather, a custom "
            "op whose work runs elsewhere); run kerneltriage profile for Nsight Compute counters"
        )
    else:
        c.note = (
            f"{faster}: within the error of a shape model (caches, or bytes the model over-counts); "
            "run kerneltriage profile for Nsight Compute counters"
        )
    return True


def low_headroom(c: Candidate, rules: Rules, library: str) -> None:
    """Below the rules' headroom but not at the roof: not worth a kernel by the rules, with
    what a fix could take (not counted as a saving: the row is a skip)."""
    h = c.headroom or 1.0
    c.reason = Reason.LOW_HEADROOM
    c.note = (
        f"{library}kernel at {1 / h:.0%} of its ceiling ({shown_headroom(h):g}× headroom, the rules ask "
        f"≥ {rules.thresholds.min_headroom:g}×); if fixed, up to {c.time_share * (1 - 1 / h):.1%} of the step"
    )


def skip_failed_estimate(c: Candidate, why: str) -> None:
    """No verdict is built on an estimate that cannot be right; counters would place it."""
    c.verdict, c.reason = Verdict.SKIP, Reason.ESTIMATE_FAILED
    c.expected_saving_share = 0.0
    c.note = f"{why}; run kerneltriage profile for Nsight Compute counters"


def rules_reason(rec: Recommendation) -> str:
    """A skip reason the rules give: the vocabulary's word when it is one, else the file's."""
    reason = str(rec["reason"])
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


def skip_without_ceiling(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> bool:
    """No ceiling: tuned library kernels (cuDNN, cuBLAS, MIOpen, …) are no kernel to write
    (counters would say whether the library is at its roof); anything else needs one."""
    if c.conditions["headroom"].passed is not None:
        return False
    c.verdict = Verdict.SKIP
    if c.attrs.get("vendor_share", 0.0) >= rules.cutoffs.library_vendor_share:
        lib = c.attrs.get("kernel_library") or "library"
        c.reason = Reason.LIBRARY_KERNEL
        c.note = (
            f"{lib} kernels, no ceiling without counters (kerneltriage profile runs Nsight Compute on them)"
        )
        return True
    c.reason = Reason.NO_CEILING
    c.note = (
        "no GPU spec: pass --gpu to place it on the roofline"
        if gpu is None
        else "run with Nsight Compute counters (kerneltriage profile) to place it on the roofline"
    )
    return True


def skip_failed_shape_model(c: Candidate, rules: Rules) -> bool:
    if not failed_estimate(c, rules):
        return False
    skip_failed_estimate(
        c,
        f"the shape model puts the ceiling at 1/{c.headroom:.0f} of the measured time: the estimate "
        "is missing shapes or ops, not a finding",
    )
    return True


def launch_bound(c: Candidate, rules: Rules) -> bool:
    """Its launches, not its bytes or FLOPs, set its time: a faster kernel cannot help."""
    if not (c.roofline.launch_bound and c.level != "region" and _launches_near_floor(c, rules)):
        return False
    if c.conditions["headroom"].passed:
        c.verdict, c.reason = Verdict.COMPILE, Reason.LAUNCH_BOUND
        c.builtin = 'torch.compile (fuse with the neighbouring ops), or mode="reduce-overhead" (CUDA graphs)'
        c.note = (
            f"{c.roofline.launches_per_step:.3g} launches per step doing almost no work each: "
            "fewer launches pay, a faster kernel does not"
        )
    else:
        c.verdict, c.reason = Verdict.SKIP, Reason.LAUNCH_BOUND
        c.note = "each launch already runs near the GPU's per-launch floor"
    return True


def skip_below_headroom(c: Candidate, rules: Rules, rec: Recommendation) -> bool:
    """At its roof (a library's op: ``library-at-roof``), or short of the rules' headroom."""
    if c.conditions["headroom"].passed:
        return False
    library = c.attrs.get("library_op") or already_uses(c, rec)
    c.verdict, c.note = Verdict.SKIP, ""
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = Reason.LIBRARY_AT_ROOF if library else Reason.AT_ROOF
    else:
        low_headroom(c, rules, "library " if library else "")
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
