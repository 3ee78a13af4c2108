"""SDPA on its unfused math path: GEMMs and a softmax ran where a fused attention kernel would
have, on the unit its kernels' names show, for the cause its recorded op shows (q's or the
mask's dtype, the head dim, dropout). Placed against the first-principles ceiling of that
unit; the fix puts it on its fused kernels, predicted at what fused attention reaches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kerneltriage.analysis.candidates.estimate import TENSOR_PRECISION, kernel_precision
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.attention_ceilings import (
    LibraryRate,
    attention_ideal,
    first_principles_ceiling,
    no_attention_rates,
    set_first_principles,
    table_rate,
)
from kerneltriage.analysis.judge.attention_rates import first_principles
from kerneltriage.analysis.judge.verdict_data import verdicts
from kerneltriage.analysis.judge.verdict_steps import skip_cold
from kerneltriage.analysis.kernel_classes import has_trait
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Reason, Verdict


def _kernel_unit_name(name: str) -> str | None:
    """The precision a kernel of an unfused attention runs in, from its name: a GEMM's or
    convolution's name (``kernel_classes.yaml`` precisions), else the template type of a
    softmax or elementwise kernel (``softmax<float>``)."""
    unit = kernel_precision(name)
    if unit is not None:
        return unit
    if has_trait(name, "half_template"):
        return "bf16"
    if has_trait(name, "float_template"):
        return "fp32"
    return None


@dataclass(frozen=True)
class MathPath:
    """SDPA's unfused math path: which unit its kernels ran on, their share, and why."""

    unit: str  # "fp32", "tf32", "bf16", ...
    share: float  # of the candidate's kernel time, in GEMMs and softmax
    cause: str
    edit: str  # the edit that puts SDPA on its fused kernels


def math_path(c: Candidate, rules: Rules) -> MathPath | None:
    """SDPA that ran GEMMs and a softmax instead of a fused attention kernel (its math path),
    with the unit they ran on and the cause the recorded op shows (q's or the mask's dtype,
    the head dim, dropout); None when fused attention kernels ran."""
    if not any(verdicts().attention.math_path.sdpa_ops.match(op) for op in c.ops):
        return None
    total = sum(k.time_ms_per_step for k in c.kernels)
    if not total:
        return None
    kinds = [(k, rules.kernel_kind(k.full_name)) for k in c.kernels]
    if sum(k.time_ms_per_step for k, kind in kinds if kind == "attention") >= 0.5 * total:
        return None
    math_ms = sum(k.time_ms_per_step for k, kind in kinds if kind in ("gemm", "softmax"))
    # The math path is batched GEMMs and a softmax, with the scale, the mask's add and dropout
    # as elementwise kernels between them: under a float mask and dropout those took 49% of
    # T5-base's SDPA time on an H100, the GEMMs 35% and the softmax 11%.
    ran = {kind for k, kind in kinds if k.time_ms_per_step > 0}
    if not {"gemm", "softmax"} <= ran or math_ms < 0.25 * total:
        return None
    by: dict[str, float] = {}
    for k, kind in kinds:
        unit = _kernel_unit_name(k.full_name)
        if unit is not None and kind in ("gemm", "softmax"):
            by[unit] = by.get(unit, 0.0) + k.time_ms_per_step
    unit = max(by, key=lambda u: by[u]) if by else "fp32"
    cause, edit = _math_path_cause(c, unit)
    return MathPath(unit, math_ms / total, cause, edit)


_SHORT_DTYPE = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}


def _last_stride(strides: object, index: int) -> int | None:
    """The last-dimension stride of input ``index`` where the trace recorded it."""
    if not isinstance(strides, list) or len(strides) <= index:
        return None
    mine = strides[index]
    if not isinstance(mine, list) or not mine or not isinstance(mine[-1], int):
        return None
    return mine[-1]


def _math_path_cause(c: Candidate, unit: str) -> tuple[str, str]:
    """Why SDPA took its math path, as far as the recorded op shows, and the edit."""
    words = verdicts().attention.math_path
    op = next((o for o in c.example if words.sdpa_ops.match(o.get("name", ""))), None)
    if op is None:
        return words.no_inputs.cause, words.no_inputs.edit
    dims, types, conc = op.get("dims") or [], op.get("types") or [], op.get("concrete") or []
    q_type = types[0] if types else ""
    head_dim = dims[0][-1] if dims and dims[0] else None
    causes, edits = [], []
    if q_type in ("float", "double"):
        causes.append(words.fp32_inputs.cause.format(dtype=_SHORT_DTYPE.get(q_type, q_type)))
        edits.append(words.fp32_inputs.edit)
    mask_type = types[3] if len(types) > 3 else ""
    mask_dims = dims[3] if len(dims) > 3 and dims[3] else None
    shown = "x".join(map(str, mask_dims or []))
    mask_edits = []
    if mask_dims and mask_type not in ("", "bool", q_type):
        causes.append(
            words.mask_dtype.cause.format(
                shape=shown,
                mask_dtype=_SHORT_DTYPE.get(mask_type, mask_type),
                q_dtype=_SHORT_DTYPE.get(q_type, q_type),
            )
        )
        mask_edits.append(words.mask_dtype.edit)
    stride = _last_stride(op.get("strides"), 3)
    if mask_dims and mask_dims[-1] > 1 and stride not in (None, 1):
        causes.append(words.mask_layout.cause.format(shape=shown, stride=stride))
        mask_edits.append(words.mask_layout.edit)
    if mask_edits:
        edits.append(mask_edits[0] if len(mask_edits) == 1 else words.mask_both_edit)
    if head_dim and (head_dim > 256 or head_dim % 8):
        causes.append(words.head_dim.cause.format(head_dim=head_dim))
        edits.append(words.head_dim.edit.format(padded=min(256, -(-head_dim // 8) * 8)))
    dropout = None
    if len(conc) > 4:
        try:
            dropout = float(str(conc[4]).strip())
        except ValueError:
            dropout = None
    if dropout and mask_type and mask_type != "bool" and not causes:
        causes.append(words.dropout.format(p=dropout))
    if not causes:
        return words.unknown.cause, words.unknown.edit
    return "; ".join(causes), "; ".join(edits) or words.any_edit


def unfused_attention(c: Candidate, rules: Rules, gpu: GPUSpec, lib: LibraryRate, math: MathPath) -> None:
    """SDPA on its math path: placed against the first-principles ceiling of the unit its
    kernels ran on (a finding in itself); the fix puts it on its fused 16-bit kernels,
    predicted at the share of the tensor-core rate fused attention reaches."""
    ideal = attention_ideal(c)
    if ideal is None:
        no_attention_rates(c, rules, lib, "no attention shapes recorded for its op")
        return
    placed = first_principles_ceiling(c, gpu, math.unit, 1.0)
    assert placed is not None
    ceiling_ms, rate, what = placed
    name = "SDPA math path"
    lib = dataclasses.replace(lib, name=name)
    c.attrs["kernel_library"] = name
    detail = (
        f"{c.time_ms_per_step:.3g} ms measured ({lib.achieved:.0f} TFLOP/s, unfused {math.unit}) vs {ceiling_ms:.3g} ms "
        f"first-principles ceiling: {what} [first principles]"
    )
    set_first_principles(
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
    if skip_cold(c, keep_note=True):
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
    measured = table_rate(c, gpu, backend)
    if measured is not None and measured[2] * 1e12 < fused:
        fused = measured[2] * 1e12
        what = f"{measured[1]}'s rate measured at S={measured[0]}"
    fused_ms = max(ideal[0] / fused, ideal[1] / gpu.bandwidth) * 1e3
    if fused_ms >= c.time_ms_per_step:
        c.verdict, c.expected_saving_share = Verdict.SKIP, 0.0
        c.reason = Reason.LOW_HEADROOM
        c.note = f"{Reason.MATH_PATH.text(unit=math.unit, share=math.share, cause=math.cause)}; a fused kernel would not be faster here"
        return
    words = verdicts().attention.math_path
    c.verdict, c.builtin = Verdict.USE_BUILTIN, words.builtin.format(unit=gpu.unit(fused_unit))
    c.expected_saving_share = c.time_share * (1.0 - fused_ms / c.time_ms_per_step)
    c.attrs["saving_scoped"] = (
        f"share × (1 − {fused_ms:.3g}/{c.time_ms_per_step:.3g} ms): fused attention at {fused / 1e12:.0f} TFLOP/s "
        f"({what})"
    )
    c.attrs["saving_basis"] = c.attrs["saving_scoped"]
    c.note = words.note.format(unit=math.unit)
