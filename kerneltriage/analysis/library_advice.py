"""What a GPU engineer checks first on library GEMMs and convolutions, read from their kernels
and recorded shapes: FP32 SIMT kernels on a GPU with tensor cores, NCHW↔NHWC transposes around
a convolution, a depthwise convolution's slow backward, GEMM dims the aligned kernels cannot
take. Each adds a line to the candidate's note, and some change a verdict the three conditions
gave (a hot skip off the tensor cores is a `use-builtin`).
"""

from __future__ import annotations

import re

from kerneltriage.analysis.estimate import (
    dtype_bytes,
)
from kerneltriage.analysis.gemm_shapes import gemm_dims
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.kernel_classes import has_trait
from kerneltriage.analysis.model import Candidate, Condition
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Reason, Verdict


def _fp32_simt(k) -> bool:
    if has_trait(k.full_name, "tensor_op"):
        return False
    return has_trait(k.name, "fp32_simt") or has_trait(k.full_name, "fp32_template")


def library_advice(c: Candidate, rules: Rules, gpu: GPUSpec | None) -> None:
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


def _alignment_advice(c: Candidate) -> list[str]:
    """GEMM dimensions the tensor cores' aligned kernels cannot take: N or K not a multiple of
    8 (16-bit operands, 16 bytes) or 4 (fp32 / TF32), or kernels named ``align1`` / ``align2``
    (CUTLASS's unaligned variants). A library GEMM below its roof with such a dim gets
    `use-builtin` with the padding as its fix (apply by hand), predicted as the aligned GEMM at
    its ceiling."""

    total = sum(k.time_ms_per_step for k in c.kernels) or 1.0
    unaligned = sum(k.time_ms_per_step for k in c.kernels if has_trait(k.full_name, "unaligned"))
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
    bwd = sum(k.time_ms_per_step for k in c.kernels if has_trait(k.full_name, "backward") or k.phase == "bwd")
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
