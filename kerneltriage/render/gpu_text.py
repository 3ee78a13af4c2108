"""The GPU line of a report's header: which ceilings it used and where they come from, or why
there are none. Shared by the terminal, Markdown and HTML renderings."""

from __future__ import annotations

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Report

NO_CEILINGS = "no ceilings: headroom and write/compile verdicts need one; pass --gpu KEY"


def tflops_text(value: float) -> str:
    """737, 56.9, 1620: three significant digits without an exponent."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def precision_label(gpu: GPUSpec, precision: str) -> str:
    """A ceiling's name as a reader takes it: fp16 runs on two kinds of unit, so its two rates
    read ``fp16 vector`` and ``fp16 tensor`` (not ``fp16`` beside ``fp16_tensor``, which reads
    as if fp16 itself were several times slower than bf16)."""
    if precision.endswith("_tensor"):
        return f"{precision.removesuffix('_tensor')} tensor"
    if f"{precision}_tensor" in gpu.ceiling_tflops:
        return f"{precision} vector"
    return precision


def header_precisions(gpu: GPUSpec) -> list[str]:
    """The compute ceilings a header shows: the bf16 tensor rate (fp16's where the GPU has no
    bf16 entry) and fp32."""
    ceilings = gpu.ceiling_tflops
    # A precision the GPU only emulates (V100's bf16 on its FP32 units) is no tensor ceiling.
    tensor = next((p for p in ("bf16", "fp16_tensor") if p in ceilings and p not in gpu.emulated), None)
    return [p for p in (tensor, "fp32") if p and p in ceilings]


def ceilings_text(gpu: GPUSpec) -> str:
    """``ceilings 3015 GB/s, 737 bf16, 56.9 fp32 TFLOP/s (0.9 / 0.745 / 0.85 of datasheet, …)``:
    the ceilings the report used and where they come from."""
    shown = header_precisions(gpu)
    ceilings = gpu.ceiling_tflops
    values = f"{gpu.ceiling_bandwidth_gbs:.0f} GB/s"
    if shown:
        values += (
            ", "
            + ", ".join(f"{tflops_text(ceilings[p])} {precision_label(gpu, p)}" for p in shown)
            + " TFLOP/s"
        )
    if gpu.is_measured:
        return f"ceilings {values} ({gpu.source})"
    a = gpu.achievable
    fractions = [a.bandwidth] + [gpu.fraction(p) for p in shown]
    return f"ceilings {values} ({' / '.join(f'{f:g}' for f in fractions)} of datasheet, {a.label})"


def unresolved_text(report: Report) -> str:
    """Why the report has no GPU (set by ``parallel.rank_report``), in a few words."""
    return str(report.source.get("gpu_unresolved") or "not resolved")


def gpu_lines(report: Report) -> list[str]:
    """The header's GPU line, and how the row was chosen when the trace's name did not say."""
    gpu = report.gpu
    if gpu is None:
        return [f"GPU: unknown ({unresolved_text(report)}) — {NO_CEILINGS}"]
    lines = [f"GPU: {gpu.name} — {ceilings_text(gpu)}"]
    if gpu.resolved_by in ("--gpu", "deviceProperties"):
        lines.append(f"GPU row: {gpu.resolution}")
    return lines
