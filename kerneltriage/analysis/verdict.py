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

import math
import re
from typing import Any

from kerneltriage.analysis.attention_rates import BACKENDS, HOW, attention_rates, measured_range
from kerneltriage.analysis.estimate import attention_case, attention_work
from kerneltriage.analysis.fixes import (
    Environment,
    choose,
    combine_overlaps,
    detect_params,
    environment,
    gemm_diagnostics,
)
from kerneltriage.analysis.gpus import GPUSpec, attention_perf
from kerneltriage.analysis.model import Candidate, Condition
from kerneltriage.analysis.rules import Rules

# Below this share of the best measured backend a library backend is worth switching.
_SWITCH_RATIO = 1.15


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
            # Within the rules' at_roof of the ceiling is at the roof whatever --min-headroom says; below 1
            # the measurement and its ceiling disagree: no verdict is built on it.
            passed=None if h is None or h < 1.0 else shown_headroom(h) >= max(t.min_headroom, t.at_roof),
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
        _library_advice(c, gpu)
        if c.verdict == "skip":
            # A skip saves nothing: what a fix could take, if any, is in its note.
            c.expected_saving_share = 0.0
        c.attrs["headroom_basis"] = headroom_basis(c, gpu)
    env = env or environment(gpu, None, None)
    for c in candidates:
        _fix(c, candidates, rules, env)
    combine_overlaps(candidates)
    for c in candidates:
        shape = gemm_diagnostics(c, candidates, env)
        if shape:
            c.note = "; ".join([c.note, *shape] if c.note else shape)
        _saving_basis(c)


def _saving_basis(c: Candidate) -> None:
    """How the row's saving was computed, for every renderer (``attrs["saving_basis"]``):
    Amdahl on the headroom unless a scoped model set its own; none without a saving."""
    if not c.expected_saving_share:
        c.attrs.pop("saving_basis", None)
        return
    scoped = c.attrs.get("saving_scoped")
    if scoped and not c.attrs.get("saving_basis"):
        c.attrs["saving_basis"] = str(scoped)
    c.attrs.setdefault("saving_basis", "share × (1 − 1/headroom)")


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


# A launch-bound candidate is told to launch less only when its launches run near the floor;
# launches that take many times the floor are slow kernels, and a faster kernel pays.
_NEAR_FLOOR = 3.0


def _launches_near_floor(c: Candidate) -> bool:
    r = c.roofline
    if not r.launches_per_step or not r.launch_floor_ms:
        return True
    return c.time_ms_per_step <= _NEAR_FLOOR * r.launch_floor_ms


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
    c.verdict, c.reason, c.builtin = "skip", "ceiling-disagrees", None
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
    c.reason = "low-headroom"
    c.note = (
        f"{library}kernel at {1 / h:.0%} of its ceiling ({shown_headroom(h):g}× headroom, the rules ask "
        f"≥ {rules.thresholds.min_headroom:g}×); if fixed, up to {c.time_share * (1 - 1 / h):.1%} of the step"
    )


def _skip_failed_estimate(c: Candidate, why: str) -> None:
    """No verdict is built on an estimate that cannot be right; counters would place it."""
    c.verdict, c.reason = "skip", "estimate-failed"
    c.expected_saving_share = 0.0
    c.note = f"{why}; run kerneltriage profile for Nsight Compute counters"


def _verdict(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    rec = rules.recommendation(c.kind, c.variant)
    c.note = str(rec.get("note", ""))
    cond = c.conditions
    if rec["verdict"] == "skip":
        c.verdict, c.reason = "skip", str(rec["reason"])
        return
    if c.kind == "attention" and c.attrs.get("written") != "naive":
        _library_attention(c, rules, gpu)
        return
    if c.attrs.get("inductor"):
        _inductor_verdict(c, rules, gpu)
        return
    if _disagrees(c, rules):
        return
    if not cond["hotness"].passed:
        c.verdict, c.reason, c.note = "skip", "cold", ""
        return
    if cond["headroom"].passed is None and c.attrs.get("vendor_share", 0.0) >= 0.5:
        # Tuned library kernels (cuDNN, cuBLAS, MIOpen, …) with no shape model: not a kernel
        # to write; counters would say whether the library is at its roof.
        lib = c.attrs.get("kernel_library") or "library"
        c.verdict, c.reason = "skip", "library-kernel"
        c.note = (
            f"{lib} kernels, no ceiling without counters (kerneltriage profile runs Nsight Compute on them)"
        )
        return
    if cond["headroom"].passed is None:
        c.verdict, c.reason = "skip", "no-ceiling"
        c.note = (
            "no GPU spec: pass --gpu to place it on the roofline"
            if gpu is None
            else "run with Nsight Compute counters (kerneltriage profile) to place it on the roofline"
        )
        return
    if _failed_estimate(c, rules):
        _skip_failed_estimate(
            c,
            f"the shape model puts the ceiling at 1/{c.headroom:.0f} of the measured time: the estimate "
            "is missing shapes or ops, not a finding",
        )
        return
    if c.roofline.launch_bound and c.level != "region" and _launches_near_floor(c):
        # Its launches, not its bytes or FLOPs, set its time: a faster kernel cannot help.
        if cond["headroom"].passed:
            c.verdict, c.reason = "compile", "launch-bound"
            c.builtin = (
                'torch.compile (fuse with the neighbouring ops), or mode="reduce-overhead" (CUDA graphs)'
            )
            c.note = (
                f"{c.roofline.launches_per_step:.3g} launches per step doing almost no work each: "
                "fewer launches pay, a faster kernel does not"
            )
        else:
            c.verdict, c.reason = "skip", "launch-bound"
            c.note = "each launch already runs near the GPU's per-launch floor"
        return
    if not cond["headroom"].passed:
        library = c.attrs.get("library_op") or _already_uses(c, rec)
        c.verdict, c.note = "skip", ""
        if shown_headroom(c.headroom) < rules.thresholds.at_roof:
            c.reason = "library-at-roof" if library else "at-roof"
        else:
            _low_headroom(c, rules, "library " if library else "")
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
        # It already runs the fused kernel the rules would recommend: nothing to swap in, and
        # torch.compile still covers it (one generated kernel for the op and its neighbours),
        # so this is not yet a kernel to write by hand.
        c.verdict, c.builtin = "compile", "torch.compile"
        c.reason = (
            f"all three conditions hold; it already uses {used}, which runs well below its ceiling here"
        )
        c.note = "torch.compile generates one kernel for it and its neighbouring ops; write one only if that stays below the roof"


def _inductor_verdict(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """A kernel Inductor generated: torch.compile already runs it, so `compile` is no advice.
    At its roof: `skip (compiled-at-roof)`; launch-bound: CUDA graphs; hot and below its roof:
    `write`, after what Inductor could try first (the fix)."""
    rec = rules.recommendation("compiled")
    cond = c.conditions
    c.builtin, c.note = None, ""
    why = c.attrs.get("estimate")
    if cond["headroom"].passed is None and why and gpu is not None:
        cond["headroom"].detail = f"estimate unavailable: {why}"
    if _disagrees(c, rules):
        return
    if not cond["hotness"].passed:
        c.verdict, c.reason = "skip", "cold"
        return
    if cond["headroom"].passed is None:
        c.verdict, c.reason = "skip", "no-ceiling"
        if gpu is None:
            c.note = "no GPU spec: pass --gpu to place it on the roofline"
        elif why:
            c.note = str(rec.get("estimate_unavailable", "{why}")).format(why=why)
        else:
            c.note = "run with Nsight Compute counters (kerneltriage profile) to place it on the roofline"
        return
    if _failed_estimate(c, rules):
        _skip_failed_estimate(
            c,
            f"the estimate from its arguments puts the ceiling at 1/{c.headroom:.0f} of the measured time: "
            "a buffer it reads or writes more than once, or a gather",
        )
        return
    if c.roofline.launch_bound:
        if cond["headroom"].passed:
            c.verdict, c.reason = "compile", "launch-bound"
            c.builtin = 'torch.compile(mode="reduce-overhead")'
            c.note = (
                f"{c.roofline.launches_per_step:.3g} launches per step doing almost no work each: "
                "CUDA graphs launch the compiled graph at once"
            )
        else:
            c.verdict, c.reason = "skip", "launch-bound"
            c.note = "each launch already runs near the GPU's per-launch floor"
        return
    if not cond["headroom"].passed:
        c.verdict = "skip"
        if shown_headroom(c.headroom) < rules.thresholds.at_roof:
            c.reason = "compiled-at-roof"
            c.note = str(rec.get("at_roof_note", "")).format(headroom=f"{shown_headroom(c.headroom):g}×")
        else:
            _low_headroom(c, rules, "Inductor ")
        return
    if not cond["stability"].passed:
        c.verdict, c.reason = "skip", "unstable-shapes"
        c.note = "Inductor recompiles or runs dynamic-shape kernels for these shapes: mark_dynamic, or pad to a few sizes"
        return
    bound = c.roofline.bound or "memory"
    c.verdict = "write"
    achieved = f"{1.0 / c.headroom:.0%}" if c.headroom else "?"
    c.reason = str(rec.get("reason", "all three conditions hold")).format(achieved=achieved, bound=bound)
    rung = (rec.get("rungs") or {}).get(bound, "")
    c.note = str(rec.get("note", "{rung}")).format(rung=rung)


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


_LAYOUT = re.compile(r"nchwToNhwc|nhwcToNchw|batched_transpose|NCHWToNHWC|NHWCToNCHW")


def _library_advice(c: Candidate, gpu: GPUSpec | None) -> None:
    """What a GPU engineer checks first on library GEMMs and convolutions, from their kernels:
    FP32 SIMT kernels on a GPU with tensor cores, and layout transposes around convolutions."""
    if c.kind not in ("gemm", "convolution"):
        return
    total = sum(k.time_ms_per_step for k in c.kernels) or 1.0
    advice = []
    fp32 = sum(k.time_ms_per_step for k in c.kernels if _fp32_simt(k))
    if fp32 >= 0.5 * total:
        tf32 = gpu is not None and "tf32" in gpu.peak_tflops
        # Words, not code: the fix line (a recipe) gives the code for this GPU and PyTorch.
        fix = "TF32 or bf16 autocast" if tf32 else "fp16 autocast with a GradScaler"
        advice.append(f"{fp32 / total:.0%} of its time is FP32 SIMT kernels, off the tensor cores: {fix}")
        if (
            gpu is not None
            and c.conditions["hotness"].passed
            and c.verdict == "skip"
            and c.reason != "communication"
        ):
            # The cheapest win on the table: the same library, on the tensor cores.
            tensor = "tf32" if tf32 else "fp16_tensor"
            ratio = gpu.peak(tensor) / gpu.peak("fp32")
            if ratio >= 2.0:
                gain, why = _tensor_core_gain(c, gpu, tensor, ratio)
                c.verdict, c.reason, c.builtin = "use-builtin", "fp32-off-tensor-cores", fix
                c.expected_saving_share = c.time_share * (fp32 / total) * (1.0 - 1.0 / gain)
                c.attrs["saving_basis"] = (
                    f"share × {fp32 / total:.0%} FP32 SIMT time × (1 − 1/{gain:.2g}): {why}"
                )
                advice.append(f"the saving counts those kernels only, {gain:.2g}× faster on the tensor cores")
    layout = sum(k.time_ms_per_step for k in c.kernels if _LAYOUT.search(k.full_name))
    if c.kind == "convolution" and layout >= 0.1 * total:
        advice.append(
            f"{layout / total:.0%} of its time is NCHW↔NHWC transposes: "
            "model.to(memory_format=torch.channels_last) (and the inputs) removes them"
        )
    if advice:
        c.note = "; ".join([c.note, *advice]) if c.note else "; ".join(advice)


def _fix(c: Candidate, candidates: list[Candidate], rules: Rules, env: Environment) -> None:
    """The fix of a use-builtin or compile verdict, and of a `write` on an Inductor kernel
    (what Inductor could try first): the first recipe that matches it, whose preconditions the
    trace meets and that carries every parameter detected on it. The prediction counts what
    that recipe covers."""
    if c.verdict not in ("use-builtin", "compile") and not (c.verdict == "write" and c.attrs.get("inductor")):
        return
    step_ms = c.time_ms_per_step / c.time_share if c.time_share else 0.0
    params = detect_params(c, candidates, env, step_ms)
    recipe = choose(c, rules.recipes, env, params)
    if recipe is None:
        return
    judged = params.get("fused_linear_ce")
    if judged:
        c.attrs["fused_linear_ce"] = {k: v for k, v in judged.items() if k != "why"}
    text = recipe.pop("text")
    needs = recipe.pop("needs", [])
    declined = recipe.pop("declined", {})
    if recipe["blocked"] is None:
        needs = [*needs, *(f"not {rid}: {why}" for rid, why in declined.items())]
    fuses_add = recipe.pop("fuses_residual_add", True)
    c.recipe = recipe
    if recipe["blocked"]:
        c.fix = None
        c.note = "; ".join(x for x in (c.note, f"no fix offered: {recipe['blocked']}") if x)
        return
    c.fix = text
    if recipe["id"].startswith("liger-cross-entropy") and "FusedLinear" in (c.builtin or ""):
        # Fused linear CE was declined: the verdict names the loss-only kernel the fix pastes.
        c.builtin = "liger_kernel.transformers.LigerCrossEntropyLoss"
    if needs:
        c.note = "; ".join([c.note, *needs] if c.note else needs)
    if judged and recipe["id"].startswith("liger-fused-linear-ce"):
        # Judged as the lm_head GEMM + the loss it replaces, not the loss region alone.
        c.expected_saving_share = judged["saving_share"]
        c.attrs["saving_scoped"] = "lm_head GEMM + loss, fused linear CE model"
        c.note = "; ".join(x for x in (c.note, judged["why"]) if x)
    elif params.get("residual-add") and not fuses_add and c.headroom and c.headroom > 1.0:
        # The fix swaps the norm; the residual add stays an eager op (3 streams beside the
        # fused kernel's 4): the prediction counts what the fix covers.
        c.expected_saving_share = max(0.0, c.time_share * (1.0 - 1.25 / c.headroom))
        c.attrs["saving_scoped"] = "the norm without its residual add"
        c.attrs["saving_basis"] = "share × (1 − 1.25/headroom): the norm without its residual add"
        c.note = "; ".join(
            x for x in (c.note, "the fix swaps the norm only: the residual add before it stays eager") if x
        )
    apply = recipe.get("apply") or {}
    if apply.get("kind") == "compile-module":
        inside = _compiled_with(c, candidates, apply.get("classes") or [])
        if inside:
            # Compiling a module class compiles everything its instances run: the prediction
            # counts this candidate only, and verify will measure the whole.
            c.attrs["compiles_also"] = [o.id for o in inside]
            listed = ", ".join(f"{o.id} ({o.kind}, {o.time_share:.1%} of the step)" for o in inside[:3])
            c.note = "; ".join(
                x
                for x in (
                    c.note,
                    f"compiling {' and '.join(apply['classes'])} also compiles {listed}: the realized saving "
                    "can exceed this prediction, which counts this candidate only, and overlaps their fixes",
                )
                if x
            )


#: Kinds whose ops Inductor fuses when their module is compiled.
_FUSABLE = frozenset({"elementwise", "reduction", "softmax", "norm", "cross-entropy"})


def _compiled_with(c: Candidate, candidates: list[Candidate], classes: list[str]) -> list[Candidate]:
    """The other candidates (1% of the step or more) that run inside the instances of
    ``classes`` and that a compile of those module classes fuses too (elementwise work, norms,
    naive attention's softmax and scaling)."""
    roots = {
        o.module.partition(" (")[0]
        for o in candidates
        if o.module and o.module.partition(" (")[2].rstrip(")") in classes
    }
    inside = []
    for o in candidates:
        path = (o.module or "").partition(" (")[0]
        if o is c or not path or o.time_share < 0.01:
            continue
        if o.kind not in _FUSABLE and not (o.kind == "attention" and o.attrs.get("written") == "naive"):
            continue  # a library GEMM or attention stays the library's call when compiled
        if any(path == r or path.startswith(r + ".") for r in roots):
            inside.append(o)
    return sorted(inside, key=lambda o: -o.time_share)


def _already_uses(c: Candidate, rec: dict[str, Any]) -> str | None:
    """The op of ``c`` that is already the fused kernel ``rec`` would recommend, if any."""
    for pattern in rec.get("already") or []:
        for op in c.ops:
            if re.search(pattern, op):
                return op
    return None


def _library_attention(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """Library attention against the best backend measured on this GPU for its case: the
    table's rate interpolated at its sequence length, never one measured at another length
    (outside the table's range there is no ceiling, and the note says why)."""
    cond = c.conditions
    case = _attention_case(c)
    kernel = next((k.full_name for k in c.kernels if rules.kernel_kind(k.full_name) == "attention"), None)
    library = rules.kernel_class(kernel).library if kernel else None
    backend = BACKENDS.get(library or "")
    name = library or "library"
    rates = None
    achieved = 0.0
    if case is not None:
        head_dim, seq_len, causal, flops = case
        achieved = flops / (c.time_ms_per_step * 1e-3) / 1e12 if c.time_ms_per_step else 0.0
        # One achieved rate for the candidate: the roofline line says what the headroom uses.
        c.roofline.flops = flops
        c.roofline.achieved_tflops = achieved or None
        if gpu is not None:
            rates = attention_rates(gpu.key, head_dim, causal, seq_len, backward=c.bwd_ms_per_step > 0)
    c.builtin = None
    if rates is None:
        why = _no_attention_ceiling(case, gpu)
        c.headroom, c.expected_saving_share = None, 0.0
        c.roofline.source = "none"
        c.roofline.ceiling_ms = c.roofline.work_ceiling_ms = None
        rate = f"{name} attention at {achieved:.0f} TFLOP/s; " if achieved else f"{name} attention; "
        c.conditions["headroom"] = Condition(
            None,
            rules.thresholds.min_headroom,
            None,
            f"no ceiling: {why}; a library kernel is judged only against measured backends",
        )
        c.verdict, c.reason = "skip", "no-ceiling"
        c.note = f"{rate}no ceiling: {why}"
        return
    best_name, best = rates.best
    this = rates.rates.get(backend or "")
    c.headroom = best / achieved if achieved else None
    c.roofline.source = "attention table"
    if c.headroom:
        c.roofline.ceiling_ms = c.roofline.work_ceiling_ms = c.time_ms_per_step / c.headroom
        c.roofline.launch_bound = False
    direction = "fwd+bwd" if c.bwd_ms_per_step > 0 else "fwd"
    detail = (
        f"{achieved:.0f} TFLOP/s achieved ({name}) vs {best:.0f} for {best_name}, the best measured on "
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
        "achieved_tflops": round(achieved, 1),
    }
    disagrees = bool(c.headroom and c.headroom < 1.0)
    passed = (
        None
        if disagrees
        else bool(c.headroom and shown_headroom(c.headroom) >= rules.thresholds.min_headroom)
    )
    c.conditions["headroom"] = Condition(c.headroom, rules.thresholds.min_headroom, passed, detail)
    if disagrees:
        c.verdict, c.reason, c.expected_saving_share = "skip", "ceiling-disagrees", 0.0
        c.note = (
            f"{name} attention runs at {achieved:.0f} TFLOP/s, above the {best:.0f} measured for {best_name} "
            f"at this case on {gpu.name}: the measurement and the table disagree; no verdict rests on it"
        )
        return
    if not cond["hotness"].passed:
        c.verdict, c.reason, c.expected_saving_share = "skip", "cold", 0.0
        return
    if this and best_name != backend and best >= _SWITCH_RATIO * this and achieved >= 0.8 * this:
        # Another backend measured faster at this case, and this backend runs here about as
        # fast as the table measured it: the table's ratio applies to this run.
        c.verdict, c.reason, c.builtin = (
            "use-builtin",
            f"{best_name} measured faster here ({best:.0f} vs {this:.0f} TFLOP/s for {backend} at {rates.basis})",
            HOW[best_name],
        )
        c.expected_saving_share = c.time_share * (1.0 - this / best)
        c.attrs["saving_basis"] = (
            f"share × (1 − {this:.0f}/{best:.0f}): {backend}'s measured rate over {best_name}'s"
        )
        c.note = f"the same attention through a faster backend on {gpu.name}"
        return
    c.expected_saving_share = 0.0
    if passed and cond["stability"].passed:
        c.verdict, c.reason = (
            "write",
            f"runs at {achieved:.0f} TFLOP/s, below half of the best measured library rate ({best:.0f})",
        )
        c.expected_saving_share = c.time_share * (1.0 - achieved / best)
        c.note = "check the shapes first (tiny head counts or sequence lengths starve any attention kernel)"
        return
    c.verdict = "skip"
    if shown_headroom(c.headroom or 1.0) < rules.thresholds.at_roof:
        c.reason = "library-at-roof"
        c.note = f"{name} attention at {achieved:.0f} of the {best:.0f} TFLOP/s best measured here"
    else:
        _low_headroom(c, rules, f"{name} attention ")


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


def _attention_choice(c: Candidate, rec: dict[str, Any], gpu: GPUSpec) -> tuple[str | None, str]:
    """SDPA or the built-in flash attention: variants SDPA cannot fuse get the built-in; plain
    attention gets whichever the shipped benchmark table measured faster on this GPU."""
    library, ours = rec.get("builtin"), rec.get("variant_builtin")
    if c.attrs.get("softcap") or c.attrs.get("mask") == "custom-mask":
        return ours, "all three conditions hold; a variant SDPA cannot run fused"
    perf = attention_perf(gpu, c.attrs.get("head_dim"), c.attrs.get("mask") == "causal")
    if perf is None:
        q = c.attrs.get("q") or [0, 0]
        rates = attention_rates(
            gpu.key,
            int(c.attrs.get("head_dim") or 0),
            c.attrs.get("mask") == "causal",
            int(q[-2]),
            c.bwd_ms_per_step > 0,
        )
        if rates is not None:
            best, rate = rates.best
            return (
                library,
                f"all three conditions hold; on {gpu.name} SDPA's fastest measured backend here is {best} "
                f"({rate:.0f} TFLOP/s at D={rates.head_dim}, S≈{rates.seq_len}): {HOW[best]}",
            )
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


class _GraphCandidate:
    """A launch-bound compiled graph seen as a candidate by the recipes."""

    def __init__(self, g: dict[str, Any]) -> None:
        self.verdict, self.reason, self.builtin = "compile", "launch-bound", g.get("builtin")
        self.kind, self.variant, self.module = "other", None, None
        self.attrs = {"compiled": True}
        self.instances_per_step = 1.0
        self.roofline = type("R", (), {"launches_per_step": float(g.get("kernels_per_step") or 0.0)})()


def compiled_graph_advice(
    compiled: dict[str, Any] | None, rules: Rules, env: Environment | None = None
) -> None:
    """A launch-bound compiled graph (many small kernels, the GPU idle between them) gets
    `compile (launch-bound)`: mode="reduce-overhead" (CUDA graphs), with its fix and note."""
    if not compiled:
        return
    lb = rules.regions.get("compiled_launch_bound") or {}
    for g in compiled.get("graphs", []):
        if not g.get("launch_bound"):
            continue
        g.update(verdict="compile", reason="launch-bound", builtin='torch.compile(mode="reduce-overhead")')
        idle = f"{g['host_launch_idle_ms_per_step']:.2f} ms per step"
        g["note"] = str(lb.get("note", "")).format(
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
