"""Conditions and verdicts: the three conditions of every candidate against the rules'
thresholds, and the verdict and recommendation the rules give.

Expected saving = share × (1 − 1/headroom) (Amdahl). Beyond the three conditions:

- naive attention gets the faster of SDPA and the built-in on this GPU (shipped benchmarks);
- library attention (FlashAttention, cuDNN, CK, aiter, …) is judged against the best backend
  measured on its GPU (``attention_rates``), never against the GEMM peak: a faster backend is
  a `use-builtin`, and `write` only below half the best known rate;
- a launch-bound candidate (its launches × the per-launch floor exceed what its bytes and
  FLOPs need) is told to launch less (`compile`), never to write a faster kernel;
- a headroom estimated from shapes above ``max_estimated_headroom`` on a candidate that
  matters, or below ``min_estimated_headroom`` on any, is a failed estimate, reported as such,
  with no verdict built on it;
- a kernel Inductor generated is never told to `compile` (it is compiled): at its roof
  `skip (compiled-at-roof)`, launch-bound `compile` with mode="reduce-overhead", hot and below
  its roof `write` with a fix that tries Inductor's own search first (the rules'
  ``recommendations.compiled``); a launch-bound compiled graph gets the same CUDA-graphs advice
  (``compiled_graph_advice``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from kerneltriage.analysis.attention_rates import (
    BACKENDS,
    HOW,
    AttentionRates,
    attention_rates,
    first_principles,
    measured_range,
)
from kerneltriage.analysis.estimate import (
    BWD_BYTES,
    BWD_FLOPS,
    TENSOR_PRECISION,
    attention_case,
    attention_work,
    dtype_bytes,
    kernel_precision,
)
from kerneltriage.analysis.fix_choice import choose
from kerneltriage.analysis.fix_environment import Environment, environment
from kerneltriage.analysis.fixes import assign_fixes
from kerneltriage.analysis.gpus import GPUSpec, attention_perf
from kerneltriage.analysis.model import Candidate, Condition
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.rules_schema import Recommendation
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
    max_shapes = t.max_shapes
    for c in candidates:
        shares = [s["share"] for s in c.shapes.signatures]
        c.shapes.dominant_coverage = float(sum(shares[:max_shapes])) if shares else 0.0
        h = c.headroom
        c.conditions["headroom"] = Condition(
            value=h,
            threshold=t.min_headroom,
            # Within the rules' at_roof of the ceiling is at the roof whatever --min-headroom
            # says; below 1 the measurement and its ceiling disagree: no verdict is built on it.
            passed=None
            if h is None or h < 1.0
            else shown_headroom(h) >= max(t.min_headroom, rules.thresholds.at_roof),
            detail=_headroom_detail(c),
        )
        share = shown_share(c.time_share)
        hot = share >= t.min_share or (id(c) in top and share >= t.min_share_floor)
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
        _library_advice(c, rules, gpu)
        if c.verdict == Verdict.SKIP:
            # A skip saves nothing: what a fix could take, if any, is in its note.
            c.expected_saving_share = 0.0
        c.attrs["headroom_basis"] = headroom_basis(c, gpu)
    assign_fixes(candidates, rules, env or environment(gpu, None, None))


def shown_share(share: float) -> float:
    """A share as the report shows it (one decimal of a percent): thresholds are compared on
    the figure the row shows, so a row reading "3.0%" passes "≥ 3%"."""
    return round(share * 1000.0) / 1000.0


def shown_headroom(h: float) -> float:
    """A headroom as the report shows it (``report.text.times``: one decimal, none from 100)."""
    return float(round(h)) if h >= 100 else round(h, 1)


def headroom_basis(c: Candidate, gpu: GPUSpec | None) -> dict[str, Any] | None:
    """What a candidate's headroom rests on, in the JSON: its kind (ncu counters, a shape
    model of this trace's recorded shapes, a fused-region model, a measured attention rate,
    the launch floor), the shapes' origin, the precision and fill of the ceiling, and whether
    the GPU's achievable fractions were measured on its family. None without a headroom."""
    if c.headroom is None:
        return None
    r = c.roofline
    kind = {
        "ncu": "ncu counters",
        "ncu+estimate": "ncu counters (raised to the shape model's ceiling)",
        "estimate": "shape model",
        "fused estimate": "fused-region shape model",
        "attention table": "measured attention rate",
        "first principles": "first-principles ceiling",
    }.get(r.source, r.source)
    basis: dict[str, Any] = {
        "kind": "launch floor" if r.launch_bound and r.source != "attention table" else kind,
        "source": r.source,
        "shapes": c.attrs.get("shapes_from") or ("recorded op shapes" if c.example else "none"),
        "precision": r.precision,
        "disagreement": c.headroom < 1.0,
    }
    if r.source == "attention table":
        basis["table"] = c.attrs.get("attention_table")
    elif r.source == "first principles":
        basis["first_principles"] = c.attrs.get("first_principles")
    else:
        basis["fill"] = round(r.fill, 3)
        if r.launch_bound:
            basis["launches_per_step"] = r.launches_per_step
    if gpu is not None:
        basis["gpu"] = gpu.key
        basis["achievable"] = gpu.achievable.label
    return basis


def _headroom_detail(c: Candidate) -> str:
    r = c.roofline
    if c.headroom is None:
        if r.source == "no GPU":
            return "no GPU spec (the trace names no known GPU): no ceiling; pass --gpu"
        return "no counters and no shape model for this op: headroom unknown"
    if r.source == "attention table":
        return c.attrs.get("attention_rates", "")
    if c.headroom < 1.0:
        return (
            f"{c.time_ms_per_step:.3g} ms measured vs {r.ceiling_ms:.3g} ms ceiling [{r.source}]: it ran "
            f"{1 / c.headroom:.2f}× faster than its ceiling allows, a measurement disagreement, not a headroom"
        )
    what = (
        "fused ceiling (external inputs/outputs only)"
        if r.source == "fused estimate"
        else f"{r.bound}-bound ceiling"
    )
    if r.launch_bound:
        what = f"launch floor ({r.launches_per_step:.3g} launches per step as launched × {_floor_us(r):.3g} µs, no launch above what it ran; the work alone needs {_ms(r.work_ceiling_ms)})"
    elif r.fill < 0.95:
        what += f" (its output tiles fill {r.fill:.0%} of the SMs)"
    return f"{c.time_ms_per_step:.3g} ms measured vs {r.ceiling_ms:.3g} ms {what} [{r.source}]"


def _launches_near_floor(c: Candidate, rules: Rules) -> bool:
    """A launch-bound candidate is told to launch less only when its launches run within the
    rules' ``near_floor`` launch floors; launches many times the floor are slow kernels."""
    r = c.roofline
    if not r.launches_per_step or not r.launch_floor_ms:
        return True
    return c.time_ms_per_step <= rules.cutoffs.near_floor * r.launch_floor_ms


def _floor_us(r) -> float:
    return r.launch_floor_ms * 1e3 / r.launches_per_step if r.launches_per_step else 0.0


def _ms(value: float | None) -> str:
    return "nothing measurable" if not value else f"{value:.3g} ms"


def _failed_estimate(c: Candidate, rules: Rules) -> bool:
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


def _disagrees(c: Candidate, rules: Rules) -> bool:
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


def _low_headroom(c: Candidate, rules: Rules, library: str) -> None:
    """Below the rules' headroom but not at the roof: not worth a kernel by the rules, with
    what a fix could take (not counted as a saving: the row is a skip)."""
    h = c.headroom or 1.0
    c.reason = Reason.LOW_HEADROOM
    c.note = (
        f"{library}kernel at {1 / h:.0%} of its ceiling ({shown_headroom(h):g}× headroom, the rules ask "
        f"≥ {rules.thresholds.min_headroom:g}×); if fixed, up to {c.time_share * (1 - 1 / h):.1%} of the step"
    )


def _skip_failed_estimate(c: Candidate, why: str) -> None:
    """No verdict is built on an estimate that cannot be right; counters would place it."""
    c.verdict, c.reason = Verdict.SKIP, Reason.ESTIMATE_FAILED
    c.expected_saving_share = 0.0
    c.note = f"{why}; run kerneltriage profile for Nsight Compute counters"


def _verdict(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """The verdict of the rules' recommendation for ``c``, or the first step that decides
    otherwise (each returns whether it decided)."""
    rec = rules.recommendation(c.kind, c.variant)
    c.note = str(rec.get("note", ""))
    if rec["verdict"] == Verdict.SKIP:
        c.verdict, c.reason = Verdict.SKIP, _rules_reason(rec)
        return
    if c.kind == "attention" and c.attrs.get("written") != "naive":
        _library_attention(c, rules, gpu)
        return
    if c.inductor:
        _inductor_verdict(c, rules, gpu)
        return
    decided = (
        _disagrees(c, rules)
        or _skip_cold(c)
        or _skip_without_ceiling(c, rules, gpu)
        or _skip_failed_shape_model(c, rules)
        or _launch_bound(c, rules)
        or _skip_below_headroom(c, rules, rec)
        or _skip_unstable(c)
    )
    if not decided:
        _recommend(c, rec, gpu)


def _rules_reason(rec: Recommendation) -> str:
    """A skip reason the rules give: the vocabulary's word when it is one, else the file's."""
    reason = str(rec["reason"])
    try:
        return Reason(reason)
    except ValueError:
        return reason


def _skip_cold(c: Candidate, keep_note: bool = False) -> bool:
    if c.conditions["hotness"].passed:
        return False
    c.verdict, c.reason = Verdict.SKIP, Reason.COLD
    if not keep_note:
        c.note = ""
    return True


def _skip_without_ceiling(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> bool:
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


def _skip_failed_shape_model(c: Candidate, rules: Rules) -> bool:
    if not _failed_estimate(c, rules):
        return False
    _skip_failed_estimate(
        c,
        f"the shape model puts the ceiling at 1/{c.headroom:.0f} of the measured time: the estimate "
        "is missing shapes or ops, not a finding",
    )
    return True


def _launch_bound(c: Candidate, rules: Rules) -> bool:
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


def _skip_below_headroom(c: Candidate, rules: Rules, rec: Recommendation) -> bool:
    """At its roof (a library's op: ``library-at-roof``), or short of the rules' headroom."""
    if c.conditions["headroom"].passed:
        return False
    library = c.attrs.get("library_op") or _already_uses(c, rec)
    c.verdict, c.note = Verdict.SKIP, ""
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = Reason.LIBRARY_AT_ROOF if library else Reason.AT_ROOF
    else:
        _low_headroom(c, rules, "library " if library else "")
    return True


def _skip_unstable(c: Candidate, note: str | None = None) -> bool:
    if c.conditions["stability"].passed:
        return False
    c.verdict, c.reason = Verdict.SKIP, Reason.UNSTABLE_SHAPES
    if note is not None:
        c.note = note
    return True


def _recommend(c: Candidate, rec: Recommendation, gpu: GPUSpec | None) -> None:
    """All three conditions hold: the rules' verdict and built-in (for naive attention the
    faster of SDPA and the built-in), unless it already runs the fused kernel they name."""
    c.verdict = Verdict(rec["verdict"])
    c.builtin = rec.get("builtin")
    if c.kind == "attention" and gpu is not None:  # a ceiling passed: there is a GPU
        c.builtin, c.reason = _attention_choice(c, rec, gpu)
    else:
        c.reason = Reason.ALL_CONDITIONS
    used = _already_uses(c, rec)
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
        _disagrees(c, rules)
        or _skip_cold(c)
        or _inductor_without_ceiling(c, rec, gpu, why)
        or _inductor_failed_estimate(c, rules)
        or _inductor_launch_bound(c)
        or _inductor_below_headroom(c, rules, rec)
        or _skip_unstable(
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
    if not _failed_estimate(c, rules):
        return False
    _skip_failed_estimate(
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
        _low_headroom(c, rules, "Inductor ")
    return True


_FP32_SIMT = re.compile(r"(^|[_:\s])(sgemm|scudnn|sgemv)", re.IGNORECASE)
# cuDNN's generic engines say their type in the template: dgrad_engine<float, …>.
_FP32_TEMPLATE = re.compile(r"<float\s*,")
_TENSOR_OP = re.compile(
    r"tensorop|hmma|xmma|h884|h1688|s1688|s16816|i8816|bf16|f16|half|wgmma", re.IGNORECASE
)


def _fp32_simt(k) -> bool:
    if _TENSOR_OP.search(k.full_name):
        return False
    return bool(_FP32_SIMT.search(k.name) or _FP32_TEMPLATE.search(k.full_name))


def _library_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """What a GPU engineer checks first on library GEMMs and convolutions, from their kernels:
    FP32 SIMT kernels on a GPU with tensor cores, and layout transposes around convolutions."""
    if c.kind not in ("gemm", "convolution"):
        return
    cut = rules.cutoffs
    total = sum(k.time_ms_per_step for k in c.kernels) or 1.0
    advice = []
    fp32 = sum(k.time_ms_per_step for k in c.kernels if _fp32_simt(k))
    if fp32 >= cut.fp32_simt_share * total:
        advice += _fp32_advice(c, rules, gpu, fp32 / total)
    layout = sum(
        k.time_ms_per_step for k in c.kernels if any(p.search(k.full_name) for p in rules.layout_kernels)
    )
    if c.kind == "convolution" and layout >= cut.layout_share * total:
        advice.append(
            f"{layout / total:.0%} of its time is NCHW↔NHWC transposes: "
            "model.to(memory_format=torch.channels_last) (and the inputs) removes them"
        )
        if c.verdict == Verdict.USE_BUILTIN and "cudnn.benchmark" in (c.builtin or ""):
            # The transposes are the first thing to remove; the autotuner comes after.
            c.builtin = "model.to(memory_format=torch.channels_last)"
            advice.append("then torch.backends.cudnn.benchmark = True")
            # What channels_last removes for sure: the transposes' time.
            c.expected_saving_share = min(c.expected_saving_share, c.time_share * layout / total)
            c.attrs["saving_basis"] = (
                f"share × {layout / total:.0%} NCHW↔NHWC transpose time: the kernels channels_last removes"
            )
    if c.kind == "convolution":
        advice += _depthwise_advice(c, rules)
    if c.kind == "gemm":
        advice += _alignment_advice(c)
    if advice:
        c.note = "; ".join([c.note, *advice]) if c.note else "; ".join(advice)


_ALIGN = re.compile(r"align(1|2)\b|_align(1|2)(?!\d)", re.IGNORECASE)


def _alignment_advice(c: Candidate) -> list[str]:
    """GEMM dimensions the tensor cores' aligned kernels cannot take: N or K not a multiple of
    8 (16-bit operands, 16 bytes) or 4 (fp32 / TF32), or kernels named ``align1`` / ``align2``
    (CUTLASS's unaligned variants). A library GEMM below its roof with such a dim gets
    `use-builtin` with the padding as its fix (apply by hand), predicted as the aligned GEMM at
    its ceiling."""
    from kerneltriage.analysis.gemm_shapes import gemm_dims

    total = sum(k.time_ms_per_step for k in c.kernels) or 1.0
    unaligned = sum(k.time_ms_per_step for k in c.kernels if _ALIGN.search(k.full_name))
    d = gemm_dims(c)
    if d is None:
        if unaligned >= 0.5 * total:
            return [
                f"{unaligned / total:.0%} of its time runs CUTLASS's unaligned (align1/align2) kernels: a GEMM "
                "dimension is not a multiple of 8 (16-bit) or 4 (TF32); padding it to one runs the aligned kernels"
            ]
        return []
    m, n, k, dtype = d
    # The unit it runs on (under autocast an fp32 op's GEMM runs bf16): 16 bytes of operands.
    unit = c.roofline.precision or ("bf16" if dtype_bytes(dtype) == 2 else "fp32")
    multiple = 4 if unit in ("fp32", "tf32") else 8
    off = [(name, v) for name, v in (("K", k), ("N", n)) if v % multiple]
    if not off and unaligned < 0.5 * total:
        return []
    if not off:
        return [
            f"{unaligned / total:.0%} of its time runs unaligned (align1/align2) kernels at M={m}, N={n}, K={k}"
        ]
    padded = {name: -(-v // multiple) * multiple for name, v in off}
    what = ", ".join(f"{name}={v} → {padded[name]}" for name, v in off)
    edits = []
    for name, v in off:
        if name == "K":
            edits.append(
                f"x = torch.nn.functional.pad(x, (0, {padded[name] - v}))  # K {v} → {padded[name]}, and the weight's "
                f"in_features padded with zero columns to {padded[name]}"
            )
        else:
            edits.append(
                f"out_features {v} → {padded[name]} (zero rows in the weight), then y = y[..., :{v}]  # N {v} → {padded[name]}"
            )
            if re.search(r"lm_head|decoder|embed", c.module or ""):
                edits.append(
                    "# a Hugging Face model's vocabulary: model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)"
                )
    c.attrs["pad_edit"] = "\n".join(edits)
    note = (
        f"{what}: not a multiple of {multiple}, so cuBLAS/CUTLASS run their unaligned kernels; pad to a multiple of "
        f"{multiple} (of 64 to fill whole tiles)"
    )
    if (
        c.verdict == Verdict.COMPILE
        and "max-autotune" in (c.builtin or "")
        and c.headroom
        and c.headroom > 1.0
    ):
        c.verdict, c.builtin = Verdict.USE_BUILTIN, f"pad {what}"
        c.note = "the library GEMM runs below its roof at this shape"
    return [note]


_CONV_OPS = re.compile(r"^aten::(conv\d?d|convolution|_convolution|cudnn_convolution)$")
_BACKWARD_KERNEL = re.compile(r"dgrad|wgrad|backward|grad_weight|grad_input|bprop", re.IGNORECASE)


def _depthwise(c: Candidate) -> tuple[int, list[int]] | None:
    """(channels, kernel size) of a depthwise convolution (groups = input channels, one input
    channel per filter), from its recorded op."""
    for op in c.example:
        if not _CONV_OPS.match(op.get("name", "")):
            continue
        dims = op.get("dims") or []
        if len(dims) < 2 or len(dims[0]) < 3 or len(dims[1]) < 3:
            continue
        x, w = dims[0], dims[1]
        if w[1] == 1 and w[0] == x[1] and x[1] > 1:
            return int(x[1]), [int(d) for d in w[2:]]
    return None


def _depthwise_advice(c: Candidate, rules: Rules) -> list[str]:
    """A depthwise convolution whose backward takes most of its time: cuDNN's and ATen's
    depthwise backward kernels run far below the roof, and no library or compile covers it;
    on a hot candidate below its roof it is a kernel to write (after the autotuner)."""
    dw = _depthwise(c)
    if dw is None:
        return []
    total = sum(k.time_ms_per_step for k in c.kernels) or 1.0
    bwd = sum(
        k.time_ms_per_step for k in c.kernels if _BACKWARD_KERNEL.search(k.full_name) or k.phase == "bwd"
    )
    channels, size = dw
    what = f"depthwise {'×'.join(map(str, size))} convolution over {channels} channels"
    if bwd < 0.5 * total:
        return [f"{what}: torch.backends.cudnn.benchmark = True picks its fastest algorithm"]
    if (
        c.verdict == Verdict.USE_BUILTIN
        and c.conditions["headroom"].passed
        and c.conditions["stability"].passed
    ):
        c.verdict, c.reason, c.builtin = Verdict.WRITE, Reason.ALL_CONDITIONS, None
        c.expected_saving_share = c.time_share * (bwd / total) * (1.0 - 1.0 / (c.headroom or 1.0))
        c.attrs["saving_basis"] = (
            f"share × {bwd / total:.0%} backward time × (1 − 1/headroom): the backward kernels, which a kernel of its own replaces"
        )
    return [
        f"{what}, {bwd / total:.0%} of its time in its backward (dgrad/wgrad): cuDNN's depthwise backward runs far "
        "below the roof and torch.compile leaves it to cuDNN; try torch.backends.cudnn.benchmark = True first, then "
        "a kernel of its own for the backward (kerneltriage scaffold)"
    ]


def _tensor_core_gain(c: Candidate, gpu: GPUSpec, tensor: str, ratio: float) -> tuple[float, str]:
    """How much faster the FP32 SIMT kernels of ``c`` run on the tensor cores, and why: at most
    the ratio of the GPU's tensor to FP32 ceilings, and no faster than the byte model of its
    shapes allows (16-bit operands halve its bytes; its FLOPs at the tensor ceiling, on the
    share of the SMs its tiles fill). Without a byte model only the halved bytes are sure (the
    gain of a layer at the memory roof): compute-bound layers gain more, which shapes or
    counters would show."""
    r = c.roofline
    if r.bytes and r.flops and r.source in ("estimate", "ncu", "ncu+estimate") and c.time_ms_per_step:
        work_ms = max(r.flops / (gpu.peak(tensor) * (r.fill or 1.0)), r.bytes / 2.0 / gpu.bandwidth) * 1e3
        after_ms = max(work_ms, r.launch_floor_ms or 0.0)
        gain = max(1.0, min(ratio, c.time_ms_per_step / after_ms))
        return gain, (
            f"its shapes' bytes (halved) and FLOPs need {after_ms:.3g} ms per step on the tensor cores; "
            f"at most {ratio:.0f}×, {gpu.name}'s tensor ÷ FP32 ceilings"
        )
    gain = min(ratio, 2.0)
    return gain, (
        "no byte model of its shapes, so only the halved bytes of 16-bit operands are sure; compute-bound "
        f"layers gain up to {ratio:.0f}× ({gpu.name}'s tensor ÷ FP32 ceilings), which counters would show"
    )


def _fp32_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None, share: float) -> list[str]:
    """FP32 SIMT kernels take ``share`` of its time: the tensor-core setting to try, and on a
    hot skip `use-builtin (fp32-off-tensor-cores)`, the cheapest win on the table."""
    tf32 = gpu is not None and "tf32" in gpu.peak_tflops
    # Words, not code: the fix line (a recipe) gives the code for this GPU and PyTorch.
    fix = "TF32 or bf16 autocast" if tf32 else "fp16 autocast with a GradScaler"
    advice = [f"{share:.0%} of its time is FP32 SIMT kernels, off the tensor cores: {fix}"]
    if (
        gpu is None
        or not c.conditions["hotness"].passed
        or c.verdict != Verdict.SKIP
        or c.reason == Reason.COMMUNICATION
    ):
        return advice
    tensor = "tf32" if tf32 else "fp16_tensor"
    ratio = gpu.peak(tensor) / gpu.peak("fp32")
    if ratio >= rules.cutoffs.fp32_min_speedup:
        gain, why = _tensor_core_gain(c, gpu, tensor, ratio)
        if c.headroom is not None and c.headroom < 1.0:
            # It ran faster than the FP32 ceiling allows: that roof is off (an estimate on this
            # GPU's family), so no headroom is shown; the verdict rests on the kernels' names.
            h = c.conditions["headroom"]
            c.conditions["headroom"] = Condition(
                None,
                h.threshold,
                None,
                f"{h.detail}; the FP32 ceiling disagrees, so the verdict rests on its kernels",
            )
            c.headroom = None
        c.verdict, c.reason, c.builtin = Verdict.USE_BUILTIN, Reason.FP32_OFF_TENSOR_CORES, fix
        c.expected_saving_share = c.time_share * share * (1.0 - 1.0 / gain)
        c.attrs["saving_basis"] = f"share × {share:.0%} FP32 SIMT time × (1 − 1/{gain:.2g}): {why}"
        advice.append(f"the saving counts those kernels only, {gain:.2g}× faster on the tensor cores")
    return advice


def _already_uses(c: Candidate, rec: Recommendation) -> str | None:
    """The op of ``c`` that is already the fused kernel ``rec`` would recommend, if any."""
    for pattern in rec.get("already") or []:
        for op in c.ops:
            if pattern.search(op):
                return op
    return None


@dataclass(frozen=True)
class _LibraryRate:
    """A library attention candidate's backend and the rate it achieved."""

    name: str  # the library that wrote its kernel ("library" when none is known)
    backend: str | None  # that library's row in the attention tables
    achieved: float  # TFLOP/s, 0 without recorded shapes


def _library_attention(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """Library attention against the best backend measured on this GPU for its case: the
    table's rate interpolated at its sequence length, never one measured at another length
    (outside the table's range there is no ceiling, and the note says why)."""
    case = _attention_case(c)
    kernel = next((k.full_name for k in c.kernels if rules.kernel_kind(k.full_name) == "attention"), None)
    library = rules.kernel_class(kernel).library if kernel else None
    lib = _LibraryRate(library or "library", BACKENDS.get(library or ""), 0.0)
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
    math = _math_path(c, rules) if case is not None and gpu is not None else None
    if math is not None and gpu is not None and case is not None:
        _unfused_attention(c, rules, gpu, lib, math)
        return
    if rates is None or case is None or gpu is None:
        ideal = _attention_ideal(c) if gpu is not None else None
        if ideal is not None and gpu is not None:
            if not lib.achieved and c.time_ms_per_step:
                lib = dataclasses.replace(lib, achieved=ideal[0] / (c.time_ms_per_step * 1e-3) / 1e12)
                c.roofline.achieved_tflops = lib.achieved or None
            why = (
                _no_attention_ceiling(case, gpu)
                if case is not None
                else f"no measured attention rate covers its op ({c.example[0]['name'] if c.example else c.name})"
            )
            _first_principles_attention(c, rules, gpu, lib, why)
            return
        _no_attention_rates(c, rules, lib, _no_attention_ceiling(case, gpu))
        return
    passed = _place_on_attention_table(c, rules, gpu, lib, rates, case)
    decided = (
        _attention_disagrees(c, gpu, lib, rates)
        or _skip_cold(c, keep_note=True)
        or _switch_backend(c, rules, gpu, lib, rates)
        or _write_library_attention(c, passed, lib, rates)
    )
    if not decided:
        _skip_library_attention(c, rules, lib, rates)


_SDPA_OPS = re.compile(r"^aten::(_?scaled_dot_product_attention(_math)?)$")
_FLOAT_TEMPLATE = re.compile(r"<float\b|\bfloat\s*>|_f32_|\bsgemm|\bfp32\b", re.IGNORECASE)
_HALF_TEMPLATE = re.compile(r"BFloat16|bfloat16|\bbf16|c10::Half|\bhalf\b|\bfp16|\bf16", re.IGNORECASE)


def _kernel_unit_name(name: str) -> str | None:
    """The precision a kernel of an unfused attention runs in, from its name: a GEMM's or
    convolution's name (``kernel_classes.yaml`` precisions), else the template type of a
    softmax or elementwise kernel (``softmax<float>``)."""
    unit = kernel_precision(name)
    if unit is not None:
        return unit
    if _HALF_TEMPLATE.search(name):
        return "bf16"
    if _FLOAT_TEMPLATE.search(name):
        return "fp32"
    return None


@dataclass(frozen=True)
class _MathPath:
    """SDPA's unfused math path: which unit its kernels ran on, their share, and why."""

    unit: str  # "fp32", "tf32", "bf16", ...
    share: float  # of the candidate's kernel time, in GEMMs and softmax
    cause: str
    edit: str  # the edit that puts SDPA on its fused kernels


def _math_path(c: Candidate, rules: Rules) -> _MathPath | None:
    """SDPA that ran GEMMs and a softmax instead of a fused attention kernel (its math path),
    with the unit they ran on and the cause the recorded op shows (q's or the mask's dtype,
    the head dim, dropout); None when fused attention kernels ran."""
    if not any(_SDPA_OPS.match(op) for op in c.ops):
        return None
    total = sum(k.time_ms_per_step for k in c.kernels)
    if not total:
        return None
    kinds = [(k, rules.kernel_kind(k.full_name)) for k in c.kernels]
    if sum(k.time_ms_per_step for k, kind in kinds if kind == "attention") >= 0.5 * total:
        return None
    math_ms = sum(k.time_ms_per_step for k, kind in kinds if kind in ("gemm", "softmax"))
    if math_ms < 0.5 * total:
        return None
    by: dict[str, float] = {}
    for k, kind in kinds:
        unit = _kernel_unit_name(k.full_name)
        if unit is not None and kind in ("gemm", "softmax"):
            by[unit] = by.get(unit, 0.0) + k.time_ms_per_step
    unit = max(by, key=lambda u: by[u]) if by else "fp32"
    cause, edit = _math_path_cause(c, unit)
    return _MathPath(unit, math_ms / total, cause, edit)


_SHORT_DTYPE = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}


def _math_path_cause(c: Candidate, unit: str) -> tuple[str, str]:
    """Why SDPA took its math path, as far as the recorded op shows, and the edit."""
    op = next((o for o in c.example if _SDPA_OPS.match(o.get("name", ""))), None)
    if op is None:
        return (
            "the trace records no SDPA inputs to say why",
            "run SDPA on 16-bit q, k, v (and mask) of D ≤ 256",
        )
    dims, types, conc = op.get("dims") or [], op.get("types") or [], op.get("concrete") or []
    q_type = types[0] if types else ""
    head_dim = dims[0][-1] if dims and dims[0] else None
    causes, edits = [], []
    if q_type in ("float", "double"):
        causes.append(f"q, k, v are {_SHORT_DTYPE.get(q_type, q_type)}, which no fused kernel takes")
        edits.append("run the attention under bf16 autocast (or cast q, k, v to bf16)")
    mask_type = types[3] if len(types) > 3 else ""
    if mask_type and len(dims) > 3 and dims[3] and mask_type not in ("bool", q_type):
        shown = "x".join(map(str, dims[3]))
        causes.append(
            f"the attention mask / position bias ({shown}) is {_SHORT_DTYPE.get(mask_type, mask_type)} while q is "
            f"{_SHORT_DTYPE.get(q_type, q_type)}: the fused kernels take a mask of q's dtype only"
        )
        edits.append("attn_mask = attn_mask.to(q.dtype)  # the position bias in q's dtype")
    if head_dim and (head_dim > 256 or head_dim % 8):
        causes.append(f"head dim D={head_dim}: the fused kernels take D ≤ 256, a multiple of 8")
        edits.append(
            f"pad the head dim to {min(256, -(-head_dim // 8) * 8)} (zeros in q, k, v; slice the output)"
        )
    dropout = None
    if len(conc) > 4:
        try:
            dropout = float(str(conc[4]).strip())
        except ValueError:
            dropout = None
    if dropout and mask_type and mask_type != "bool" and not causes:
        causes.append(f"dropout {dropout:g} with an additive mask")
    if not causes:
        return (
            "the trace does not record why (q, k, v dtype, mask and head dim look fusable)",
            "check torch.backends.cuda.can_use_flash_attention / can_use_efficient_attention(params, debug=True)",
        )
    return "; ".join(causes), "; ".join(edits) or "make the inputs fusable"


def _attention_ideal(c: Candidate) -> tuple[float, float, str] | None:
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


def _first_principles_ceiling(
    c: Candidate, gpu: GPUSpec, unit: str, fraction: float
) -> tuple[float, float, str] | None:
    """(ceiling ms per step, compute rate in FLOP/s, what it rests on) of an attention case:
    its FLOPs at ``fraction`` of the achievable rate of ``unit``, its ideal bytes at the
    achievable bandwidth."""
    ideal = _attention_ideal(c)
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


def _set_first_principles(
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


def _table_rate(c: Candidate, gpu: GPUSpec, backend: str | None) -> tuple[int, str, float] | None:
    """(length, backend, TFLOP/s) the GPU's table gives ``backend`` (None: the best) for the
    candidate's case: at its length, or at the shortest measured where it is shorter; None
    where the table has no row for it, or the sequence is longer than any row."""
    case = _attention_case(c)
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


def _switch_below_the_table(
    c: Candidate, rules: Rules, gpu: GPUSpec, lib: _LibraryRate, shortest: int
) -> bool:
    """Shorter than any row, and another backend measured faster than this one at every
    length of the table: the same attention through that backend, predicted at the ratio of
    their rates at the shortest length (rates there are an upper bound for both)."""
    case = _attention_case(c)
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
    c.verdict, c.builtin = Verdict.USE_BUILTIN, HOW[best_name]
    basis = f"S={shortest}, the shortest row (S={case[1]} is shorter; {best_name} is faster at every length measured)"
    c.reason = Reason.FASTER_BACKEND.text(
        backend=best_name, best=best, this=this, current=lib.backend, basis=basis
    )
    c.expected_saving_share = c.time_share * (1.0 - this / best)
    c.attrs["saving_basis"] = (
        f"share × (1 − {this:.0f}/{best:.0f}): {lib.backend}'s measured rate over {best_name}'s at S={shortest}"
    )
    c.note = f"the same attention through a faster backend on {gpu.name}"
    return True


def _below_the_table(c: Candidate, gpu: GPUSpec) -> tuple[int, str, float] | None:
    """(shortest length measured, its best backend, its TFLOP/s) where the candidate's sequence
    is shorter than any row of its GPU, head dim and causality; None otherwise."""
    case = _attention_case(c)
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


def _first_principles_attention(
    c: Candidate, rules: Rules, gpu: GPUSpec, lib: _LibraryRate, why: str
) -> None:
    """A fused library attention kernel no measured row applies to: its FLOPs at the share of
    the achievable tensor-core rate fused attention reaches, its bytes at the bandwidth."""
    ideal = _attention_ideal(c)
    assert ideal is not None  # the caller checked
    dtype = ideal[2]
    unit = kernel_unit_of(c) or TENSOR_PRECISION.get(dtype, "bf16")
    fp = first_principles()
    fraction, capped = fp.fused_fraction, None
    shorter = _below_the_table(c, gpu)
    if shorter is not None and shorter[2] * 1e12 < gpu.peak(unit) * fraction:
        # Below the shortest length measured: no backend runs faster there than the best did
        # at that length (rates fall as sequences shorten).
        fraction, capped = shorter[2] * 1e12 / gpu.peak(unit), shorter
    placed = _first_principles_ceiling(c, gpu, unit, fraction)
    assert placed is not None
    ceiling_ms, rate, what = placed
    if capped is not None:
        what += f"; capped at {capped[1]}'s {capped[2]:.0f} TFLOP/s at S={capped[0]}, the shortest length measured"
    detail = (
        f"{c.time_ms_per_step:.3g} ms measured ({lib.achieved:.0f} TFLOP/s, {lib.name}) vs {ceiling_ms:.3g} ms "
        f"first-principles ceiling: {what} [first principles; {why}]"
    )
    passed = _set_first_principles(
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
    if _skip_cold(c, keep_note=True):
        c.note = f"{lib.name} attention at {lib.achieved:.0f} TFLOP/s; first-principles ceiling ({basis})"
        return
    if capped is not None and _switch_below_the_table(c, rules, gpu, lib, capped[0]):
        return
    if passed and c.conditions["stability"].passed:
        c.verdict = Verdict.WRITE
        c.reason = Reason.BELOW_FIRST_PRINCIPLES.text(achieved=lib.achieved, ceiling=rate / 1e12)
        c.expected_saving_share = c.time_share * (1.0 - 1.0 / (c.headroom or 1.0))
        c.note = (
            "first try the other SDPA backends (cuDNN, FlashAttention, memory-efficient) at this shape, and measure "
            "this GPU at it (no backend rate was measured here); check the shapes (short sequences and few heads "
            "starve any attention kernel)"
        )
        return
    c.verdict = Verdict.SKIP
    if _skip_unstable(c):
        return
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = Reason.LIBRARY_AT_ROOF
        c.note = f"{lib.name} attention at {lib.achieved:.0f} of the {rate / 1e12:.0f} TFLOP/s first-principles ceiling"
    else:
        _low_headroom(c, rules, f"{lib.name} attention ")


def _unfused_attention(c: Candidate, rules: Rules, gpu: GPUSpec, lib: _LibraryRate, math: _MathPath) -> None:
    """SDPA on its math path: placed against the first-principles ceiling of the unit its
    kernels ran on (a finding in itself); the fix puts it on its fused 16-bit kernels,
    predicted at the share of the tensor-core rate fused attention reaches."""
    ideal = _attention_ideal(c)
    if ideal is None:
        _no_attention_rates(c, rules, lib, "no attention shapes recorded for its op")
        return
    placed = _first_principles_ceiling(c, gpu, math.unit, 1.0)
    assert placed is not None
    ceiling_ms, rate, what = placed
    name = "SDPA math path"
    lib = dataclasses.replace(lib, name=name)
    c.attrs["kernel_library"] = name
    detail = (
        f"{c.time_ms_per_step:.3g} ms measured ({lib.achieved:.0f} TFLOP/s, unfused {math.unit}) vs {ceiling_ms:.3g} ms "
        f"first-principles ceiling: {what} [first principles]"
    )
    _set_first_principles(
        c,
        rules,
        ceiling_ms,
        detail,
        {
            "unit": gpu.unit(math.unit),
            "fused_fraction": 1.0,
            "tflops": round(rate / 1e12, 1),
            "math_path": True,
        },
    )
    c.attrs["math_path"] = {"unit": math.unit, "share": round(math.share, 3), "cause": math.cause}
    c.attrs["fused_path_edit"] = math.edit
    c.reason = Reason.MATH_PATH.text(unit=math.unit, share=math.share, cause=math.cause)
    if _skip_cold(c, keep_note=True):
        c.reason = Reason.COLD
        c.note = Reason.MATH_PATH.text(unit=math.unit, share=math.share, cause=math.cause)
        return
    dtype = ideal[2]
    fused_unit = TENSOR_PRECISION.get(dtype) if dtype in ("c10::BFloat16", "c10::Half") else None
    fused_unit = fused_unit or (
        "bf16" if "bf16" in gpu.peak_tflops and "bf16" not in gpu.emulated else "fp16_tensor"
    )
    fp = first_principles()
    fused = gpu.peak(fused_unit) * fp.fused_fraction
    what = f"{fp.fused_fraction:.0%} of the achievable {gpu.unit(fused_unit)} rate"
    # A mask or bias leaves SDPA its memory-efficient kernels only: that backend's measured rate
    # at this length (or the shortest measured) where the GPU's table has it.
    backend = "efficient" if "mask" in math.cause else None
    measured = _table_rate(c, gpu, backend)
    if measured is not None and measured[2] * 1e12 < fused:
        fused = measured[2] * 1e12
        what = f"{measured[1]}'s rate measured at S={measured[0]}"
    fused_ms = max(ideal[0] / fused, ideal[1] / gpu.bandwidth) * 1e3
    if fused_ms >= c.time_ms_per_step:
        c.verdict, c.expected_saving_share = Verdict.SKIP, 0.0
        c.reason = Reason.LOW_HEADROOM
        c.note = f"{Reason.MATH_PATH.text(unit=math.unit, share=math.share, cause=math.cause)}; a fused kernel would not be faster here"
        return
    c.verdict, c.builtin = (
        Verdict.USE_BUILTIN,
        f"scaled_dot_product_attention on its fused {gpu.unit(fused_unit)} kernels",
    )
    c.expected_saving_share = c.time_share * (1.0 - fused_ms / c.time_ms_per_step)
    c.attrs["saving_scoped"] = (
        f"share × (1 − {fused_ms:.3g}/{c.time_ms_per_step:.3g} ms): fused attention at {fused / 1e12:.0f} TFLOP/s "
        f"({what})"
    )
    c.attrs["saving_basis"] = c.attrs["saving_scoped"]
    c.note = (
        f"the S×S scores go through HBM in {math.unit} instead of one fused pass; fix the cause and SDPA picks "
        "its fused kernels"
    )


def _no_attention_rates(c: Candidate, rules: Rules, lib: _LibraryRate, why: str) -> None:
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


def _place_on_attention_table(
    c: Candidate,
    rules: Rules,
    gpu: GPUSpec,
    lib: _LibraryRate,
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


def _attention_disagrees(c: Candidate, gpu: GPUSpec, lib: _LibraryRate, rates: AttentionRates) -> bool:
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
    c: Candidate, rules: Rules, gpu: GPUSpec, lib: _LibraryRate, rates: AttentionRates
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
    c.verdict, c.builtin = Verdict.USE_BUILTIN, HOW[best_name]
    c.reason = Reason.FASTER_BACKEND.text(
        backend=best_name, best=best, this=this, current=lib.backend, basis=rates.basis
    )
    c.expected_saving_share = c.time_share * (1.0 - this / best)
    c.attrs["saving_basis"] = (
        f"share × (1 − {this:.0f}/{best:.0f}): {lib.backend}'s measured rate over {best_name}'s"
    )
    c.note = f"the same attention through a faster backend on {gpu.name}"
    return True


def _write_library_attention(
    c: Candidate, passed: bool | None, lib: _LibraryRate, rates: AttentionRates
) -> bool:
    """Below half of the best library rate, hot and stable: a kernel to write."""
    c.expected_saving_share = 0.0
    if not (passed and c.conditions["stability"].passed):
        return False
    best = rates.best[1]
    c.verdict = Verdict.WRITE
    c.reason = Reason.BELOW_BEST_RATE.text(achieved=lib.achieved, best=best)
    c.expected_saving_share = c.time_share * (1.0 - lib.achieved / best)
    c.note = "check the shapes first (tiny head counts or sequence lengths starve any attention kernel)"
    return True


def _skip_library_attention(c: Candidate, rules: Rules, lib: _LibraryRate, rates: AttentionRates) -> None:
    """Near the best library rate, or short of the rules' headroom."""
    c.verdict = Verdict.SKIP
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = Reason.LIBRARY_AT_ROOF
        c.note = f"{lib.name} attention at {lib.achieved:.0f} of the {rates.best[1]:.0f} TFLOP/s best measured here"
    else:
        _low_headroom(c, rules, f"{lib.name} attention ")


def _no_attention_ceiling(case: tuple[int, int, bool, float] | None, gpu: GPUSpec | None) -> str:
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


def _attention_case(c: Candidate) -> tuple[int, int, bool, float] | None:
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


def _attention_choice(c: Candidate, rec: Recommendation, gpu: GPUSpec) -> tuple[str | None, str]:
    """SDPA or the built-in flash attention: variants SDPA cannot fuse get the built-in; plain
    attention gets whichever the shipped benchmark table measured faster on this GPU."""
    library, ours = rec.get("builtin"), rec.get("variant_builtin")
    if c.attrs.get("softcap") or c.attrs.get("mask") == "custom-mask":
        return ours, Reason.VARIANT_NEEDS_BUILTIN
    perf = attention_perf(gpu, c.attrs.get("head_dim"), c.attrs.get("mask") == "causal")
    if perf is None:
        q = c.q or [0, 0]
        rates = attention_rates(
            gpu.key,
            int(c.attrs.get("head_dim") or 0),
            c.attrs.get("mask") == "causal",
            int(q[-2]),
            c.bwd_ms_per_step > 0,
        )
        if rates is None:
            return library, Reason.NO_BUILTIN_BENCHMARK.text(gpu=gpu.name)
        best, rate = rates.best
        return library, Reason.SDPA_BEST_BACKEND.text(
            gpu=gpu.name,
            backend=best,
            rate=rate,
            head_dim=rates.head_dim,
            seq_len=rates.seq_len,
            how=HOW[best],
        )
    sdpa, built = perf
    if built > sdpa:
        return ours, Reason.BUILTIN_FASTER.text(built=built, sdpa=sdpa)
    return library, Reason.SDPA_FASTER.text(sdpa=sdpa, built=built)


class _GraphCandidate:
    """A launch-bound compiled graph seen as a candidate by the recipes."""

    def __init__(self, g: dict[str, Any]) -> None:
        self.verdict, self.reason, self.builtin = Verdict.COMPILE, Reason.LAUNCH_BOUND, g.get("builtin")
        self.kind, self.variant, self.module = "other", None, None
        self.attrs: dict[str, Any] = {}
        self.compiled, self.inductor = True, False
        self.instances_per_step = 1.0
        self.roofline = type("R", (), {"launches_per_step": float(g.get("kernels_per_step") or 0.0)})()


def compiled_graph_advice(
    compiled: dict[str, Any] | None, rules: Rules, env: Environment | None = None
) -> None:
    """A launch-bound compiled graph (many small kernels, the GPU idle between them) gets
    `compile (launch-bound)`: mode="reduce-overhead" (CUDA graphs), with its fix and note."""
    if not compiled:
        return
    lb = rules.regions.compiled_launch_bound
    for g in compiled.get("graphs", []):
        if not g.get("launch_bound"):
            continue
        g.update(
            verdict=Verdict.COMPILE,
            reason=Reason.LAUNCH_BOUND,
            builtin='torch.compile(mode="reduce-overhead")',
        )
        idle = f"{g['host_launch_idle_ms_per_step']:.2f} ms per step"
        g["note"] = lb.note.format(
            kernels=g["kernels_per_step"],
            median_us=g["median_kernel_us"],
            idle=idle,
            idle_share=g["idle_share_of_span"],
        )
        graph = _GraphCandidate(g)
        recipe = choose(graph, rules.recipes, env or Environment(), {})
        if recipe and not recipe["blocked"]:
            g["fix"] = recipe.pop("text")
            recipe.pop("needs", None)
            recipe.pop("declined", None)
            recipe.pop("fuses_residual_add", None)
            g["recipe"] = recipe
