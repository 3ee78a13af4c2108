"""What a GPU engineer checks first on library GEMMs and convolutions, read from their kernels
and recorded shapes: FP32 SIMT kernels on a GPU with tensor cores, NCHW↔NHWC transposes around
a convolution, a depthwise convolution's slow backward, GEMM dims the aligned kernels cannot
take. Each adds a line to the candidate's note, and some change a verdict the three conditions
gave (a hot skip off the tensor cores is a `use-builtin`).
"""

from __future__ import annotations

from collections.abc import Callable

from kerneltriage.analysis.candidates.estimate import dtype_bytes, kernel_precision
from kerneltriage.analysis.fixes.gemm_shapes import gemm_dims
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.judge.gemm_alignment import alignment_data, padding_gain, shape_pad_gains
from kerneltriage.analysis.judge.verdict_data import verdicts
from kerneltriage.analysis.kernel_classes import has_trait
from kerneltriage.analysis.model import Candidate, Condition, KernelInfo
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Reason, Verdict


def _fp32_simt(k: KernelInfo) -> bool:
    if has_trait(k.full_name, "tensor_op"):
        return False
    return has_trait(k.name, "fp32_simt") or has_trait(k.full_name, "fp32_template")


def library_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
    """What a GPU engineer checks first on library GEMMs and convolutions, from their kernels
    and shapes: the advice steps ``verdicts.yaml`` names for the candidate's kind, in order."""
    steps = verdicts().advice.get(c.kind)
    if not steps:
        return
    total = sum(k.time_ms_per_step for k in c.kernels) or 1.0
    advice: list[str] = []
    for step in steps:
        advice += ADVICE[step](c, rules, gpu, total)
    if advice:
        c.note = "; ".join([c.note, *advice]) if c.note else "; ".join(advice)


def _fp32_simt_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None, total: float) -> list[str]:
    """FP32 SIMT kernels (the rules' ``fp32_simt_share`` of its time) on a GPU with tensor cores."""
    fp32 = sum(k.time_ms_per_step for k in c.kernels if _fp32_simt(k))
    if fp32 < rules.cutoffs.fp32_simt_share * total:
        return []
    return _fp32_advice(c, rules, gpu, fp32 / total)


def _channels_last_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None, total: float) -> list[str]:
    """Layout transposes (the rules' ``layout_kernels``, ``layout_share`` of its time) around a
    convolution: channels_last removes them, before the autotuner."""
    layout = sum(
        k.time_ms_per_step for k in c.kernels if any(p.search(k.full_name) for p in rules.layout_kernels)
    )
    if layout < rules.cutoffs.layout_share * total:
        return []
    words = verdicts().channels_last
    advice = [words.note.format(share=layout / total)]
    if c.verdict == Verdict.USE_BUILTIN and "cudnn.benchmark" in (c.builtin or ""):
        # The transposes are the first thing to remove; the autotuner comes after.
        c.builtin = words.builtin
        advice.append(words.then)
        # What channels_last removes for sure: the transposes' time.
        c.expected_saving_share = min(c.expected_saving_share, c.time_share * layout / total)
        c.attrs["saving_basis"] = (
            f"share × {layout / total:.0%} NCHW↔NHWC transpose time: the kernels channels_last removes"
        )
    return advice


def _alignment_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None, total: float) -> list[str]:
    """GEMM dimensions the tensor cores' aligned kernels cannot take: N or K not a multiple of
    8 (16-bit operands, 16 bytes) or 4 (fp32 / TF32), or kernels named ``align1`` / ``align2``
    (CUTLASS's unaligned variants). A library GEMM below its roof with such a dim gets
    `use-builtin` with the padding as its fix (apply by hand), predicted as the aligned GEMM at
    its ceiling; without counters or a shape, as what padding measured at its precision."""
    words = verdicts().alignment
    unaligned = sum(k.time_ms_per_step for k in c.kernels if has_trait(k.full_name, "unaligned"))
    d = gemm_dims(c)
    if d is None:
        if unaligned < 0.5 * total:
            return []
        return [
            words.unaligned_kernels.format(share=unaligned / total),
            *_replayed_unaligned(c, rules, unaligned / total),
        ]
    m, n, k, dtype = d
    # The unit it runs on (under autocast an fp32 op's GEMM runs bf16): 16 bytes of operands.
    unit = c.roofline.precision or ("bf16" if dtype_bytes(dtype) == 2 else "fp32")
    multiple = 4 if unit in ("fp32", "tf32") else 8
    off = [(name, v) for name, v in (("K", k), ("N", n)) if v % multiple]
    if not off and unaligned < 0.5 * total:
        return []
    if not off:
        return [words.unaligned_at.format(share=unaligned / total, m=m, n=n, k=k)]
    padded = {name: -(-v // multiple) * multiple for name, v in off}
    what = ", ".join(f"{name}={v} → {padded[name]}" for name, v in off)
    edits = []
    for name, v in off:
        if name == "K":
            edits.append(words.pad_k.format(pad=padded[name] - v, dim=v, padded=padded[name]))
        else:
            edits.append(words.pad_n.format(dim=v, padded=padded[name]))
            if words.vocabulary_modules.search(c.module or ""):
                edits.append(words.pad_vocabulary)
    c.attrs["pad_edit"] = "\n".join(edits)
    note = words.note.format(what=what, multiple=multiple)
    if _autotune_below_roof(c):
        c.verdict, c.builtin = Verdict.USE_BUILTIN, words.builtin.format(what=what)
        c.note = words.verdict_note
    return [note]


def _replayed_unaligned(c: Candidate, rules: Rules, unaligned: float) -> list[str]:
    """Unaligned GEMMs with no recorded shape (a CUDA graph replays them): the dimension is
    found and padded by hand, compiled program or not (Inductor's ``force_shape_pad`` measured
    next to nothing at unaligned shapes, ``gemm_alignment.yaml``). Below the roof by counters,
    their headroom is the prediction; without counters, the least padding gained at their
    precision, where that passes the rules' headroom and the GEMMs are hot and stable."""
    words = verdicts().alignment
    unit = c.roofline.precision or _kernels_unit(c)
    multiple = 4 if unit in ("fp32", "tf32") else 8
    notes: list[str] = []
    if c.compiled:
        pad = shape_pad_gains(unit)
        if pad is not None:
            notes.append(words.shape_pad.format(low=pad[0], high=pad[1], gpu=alignment_data().measured_on))
    measured = padding_gain(unit) if c.headroom is None else None
    by_counters = _autotune_below_roof(c)
    by_measure = bool(
        measured
        and c.verdict == Verdict.SKIP
        and measured.gain >= rules.thresholds.min_headroom
        and c.conditions["hotness"].passed
        and c.conditions["stability"].passed is not False
    )
    if by_counters or by_measure:
        c.builtin = words.builtin.format(what=words.unknown_dims.format(multiple=multiple))
        c.attrs["pad_edit"] = words.pad_unknown.format(multiple=multiple)
        c.verdict, c.note = Verdict.USE_BUILTIN, words.verdict_note
    if measured is None or not c.conditions["hotness"].passed:
        return notes  # a cold GEMM's padding is not worth a line
    saving = c.time_share * unaligned * (1.0 - 1.0 / measured.gain)
    fields = {"gain": measured.gain, "case": measured.case, "precision": measured.precision}
    if by_measure:
        head = c.conditions["headroom"]
        head.value, head.passed = measured.gain, True
        head.detail = words.condition.format(**fields, gpu=measured.measured_on)
        c.reason = Reason.ALL_CONDITIONS
        c.expected_saving_share = saving
        c.attrs["saving_basis"] = words.saving_basis.format(**fields, gpu=measured.measured_on)
        return notes
    return [*notes, words.measured.format(**fields, gpu=measured.measured_on, saving=saving)]


def _kernels_unit(c: Candidate) -> str | None:
    """The unit the candidate's kernels name (``kernel_classes.yaml``'s precisions)."""
    for k in sorted(c.kernels, key=lambda k: -k.time_ms_per_step):
        unit = kernel_precision(k.full_name) or kernel_precision(k.name)
        if unit:
            return unit
    return None


def _autotune_below_roof(c: Candidate) -> bool:
    """The verdict the three conditions gave a library GEMM below its roof: max-autotune, which
    padding comes before (the aligned kernels are the library's own)."""
    return bool(
        c.verdict == Verdict.COMPILE
        and "max-autotune" in (c.builtin or "")
        and c.headroom
        and c.headroom > 1.0
    )


def _depthwise(c: Candidate) -> tuple[int, list[int]] | None:
    """(channels, kernel size) of a depthwise convolution (groups = input channels, one input
    channel per filter), from its recorded op; (0, []) where no op was recorded (a CUDA graph
    replays kernels without their ops) but its kernels are depthwise ones by name."""
    ops = verdicts().depthwise.ops
    for op in c.example:
        if not ops.match(op.get("name", "")):
            continue
        dims = op.get("dims") or []
        if len(dims) < 2 or len(dims[0]) < 3 or len(dims[1]) < 3:
            continue
        x, w = dims[0], dims[1]
        if w[1] == 1 and w[0] == x[1] and x[1] > 1:
            return int(x[1]), [int(d) for d in w[2:]]
    if not c.example and c.kernels and all(has_trait(k.full_name, "depthwise") for k in c.kernels):
        return 0, []
    return None


def _depthwise_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None, total: float) -> list[str]:
    """A depthwise convolution whose backward takes most of its time: cuDNN's and ATen's
    depthwise backward kernels run far below the roof, and no library or compile covers it;
    on a hot candidate below its roof it is a kernel to write (after the autotuner)."""
    dw = _depthwise(c)
    if dw is None:
        return []
    words = verdicts().depthwise
    bwd = sum(k.time_ms_per_step for k in c.kernels if has_trait(k.full_name, "backward") or k.phase == "bwd")
    channels, size = dw
    if channels:
        what = words.what.format(size="×".join(map(str, size)), channels=channels)
    else:
        what = words.what_kernels.format(kernels=", ".join(sorted({k.name for k in c.kernels})))
    if bwd < 0.5 * total:
        return [words.forward.format(what=what)]
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
    return [words.backward.format(what=what, share=bwd / total)]


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
    words = verdicts().fp32_simt
    # The tensor unit an fp32 GEMM can move to: TF32 where the GPU has it, else bf16 matrix
    # units of its own (not V100's emulated bf16), else fp16 with a loss scaler.
    tf32 = gpu is not None and "tf32" in gpu.peak_tflops
    bf16 = gpu is not None and "bf16" in gpu.peak_tflops and "bf16" not in gpu.emulated
    fix = words.fix_tf32 if tf32 else words.fix_bf16 if bf16 else words.fix_fp16
    advice = [words.note.format(share=share, fix=fix)]
    if (
        gpu is None
        or not c.conditions["hotness"].passed
        or c.verdict != Verdict.SKIP
        or c.reason == Reason.COMMUNICATION
    ):
        return advice
    tensor = "tf32" if tf32 else "bf16" if bf16 else "fp16_tensor"
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
        advice.append(words.saving.format(gain=gain))
    return advice


#: Advice step name (``verdicts.yaml``) -> the step: the lines it adds to the note.
ADVICE: dict[str, Callable[[Candidate, Rules, GPUSpec | None, float], list[str]]] = {
    "fp32-simt": _fp32_simt_advice,
    "channels-last": _channels_last_advice,
    "depthwise": _depthwise_advice,
    "alignment": _alignment_advice,
}
