"""What every template's context holds: provenance, verdict and conditions, roofline, GPU,
shapes and dtypes as Python literals. The families (``families/``) add their own keys."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kerneltriage import __version__
from kerneltriage.analysis.gpus import GPUSpec, known_gpus
from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.errors import InputError
from kerneltriage.scaffold.identifiers import SHORT_DTYPE, comment_text, dims_text, literal, parse_signature
from kerneltriage.scaffold.op_chains import op_label

# (absolute relative to max|expected|, relative) per output dtype; families may override.
DEFAULT_TOL = {"float32": (1e-5, 1e-4), "bfloat16": (1e-2, 2e-2), "float16": (2e-3, 5e-3)}


@dataclass
class Observed:
    """One observed shape signature: named dims (``{"x": [4, 2048, 1024]}``) and its share."""

    dims: dict[str, list[int]]
    share: float = 1.0
    count: int = 0
    text: str = ""


@dataclass
class Origin:
    """Where the scaffold comes from: a report's candidate, or ``--kind`` options."""

    command: str
    short: str
    title: str
    report: Report | None = None
    candidate: Candidate | None = None
    notes: list[str] = field(default_factory=list)
    fallback: str | None = None  # why the generic template was used instead of the class's own


def shape_literal(dims: dict[str, Any]) -> str:
    items = []
    for k, v in dims.items():
        value = tuple(int(d) for d in v) if isinstance(v, (list, tuple)) else v
        items.append(f"{literal(k)}: {literal(value)}")
    return "{" + ", ".join(items) + "}"


def dtypes_literal(dtypes: dict[str, str]) -> str:
    return "{" + ", ".join(f"{literal(k)}: torch.{v}" for k, v in dtypes.items()) + "}"


def dtype_configs(
    observed: dict[str, str], roles: list[str], extra=("float32", "bfloat16")
) -> list[dict[str, str]]:
    """Observed dtypes first, then each extra dtype for every float role (deduplicated)."""
    configs = [dict(observed)]
    for dt in extra:
        cfg = {
            r: (dt if observed.get(r) in ("float32", "bfloat16", "float16", None) else observed[r])
            for r in roles
        }
        if cfg not in configs:
            configs.append(cfg)
    return configs


def signatures(cand: Candidate) -> list[Observed]:
    out = []
    for sig in cand.shapes.signatures or []:
        dims = parse_signature(sig.get("shape", ""))
        if dims:
            out.append(
                Observed(
                    dims,
                    float(sig.get("share") or 0.0),
                    int(sig.get("count") or 0),
                    comment_text(sig.get("shape", ""), 120),
                )
            )
    return out


def _fmt_bytes(value: float | None) -> str:
    if not value:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _fmt_flops(value: float | None) -> str:
    if not value:
        return "no FLOPs"
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} FLOP"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g} ms" if value >= 0.1 else f"{value * 1e3:.3g} µs"


def require_gpu(gpu: GPUSpec | None) -> GPUSpec:
    """The GPU, refused when there is none: bench.py measures the kernel against its ceilings,
    so a package needs a GPU."""
    if gpu is None:
        raise InputError(
            "scaffold needs the GPU's ceilings (bench.py measures the kernel against them) and "
            "the trace names no GPU kerneltriage knows: pass --gpu KEY",
            hint=f"one of: {', '.join(known_gpus())}",
        )
    return gpu


def gpu_context(gpu: GPUSpec | None) -> dict[str, Any]:
    """The GPU and the ceilings the report used (measured, else datasheet × achievable)."""
    gpu = require_gpu(gpu)
    peaks = {p: round(v, 2) for p, v in gpu.ceiling_tflops.items()}
    shown = [f"{peaks[p]:g} {p}" for p in ("bf16", "fp16_tensor", "tf32", "fp32") if p in peaks]
    return {
        "name": comment_text(gpu.name or "unknown GPU", 80),
        "key": comment_text(gpu.key, 40),
        "bandwidth_gbs": round(gpu.ceiling_bandwidth_gbs, 1),
        "peak_tflops": peaks,
        "peak_text": ", ".join(shown) + " TFLOP/s" if shown else "no compute peaks",
        "source": comment_text(gpu.source or "GPU table", 120),
    }


def _conditions(cand: Candidate) -> list[dict[str, str]]:
    """The three conditions as the README's table rows."""
    conditions = []
    for key in ("headroom", "hotness", "stability"):
        c = cand.conditions.get(key)
        if c is None:
            continue
        if key == "headroom":
            value = f"{c.value:.3g}×" if c.value is not None else "unknown"
            threshold = f"≥ {c.threshold:g}×"
        elif key == "hotness":
            value = f"{c.value:.1%}" if c.value is not None else "unknown"
            threshold = f"≥ {c.threshold:.0%} of step"
        else:
            value = f"{c.value:g} shape(s)" if c.value is not None else "unknown"
            threshold = f"≤ {c.threshold:g}"
        passed = "yes" if c.passed else ("unknown" if c.passed is None else "no")
        conditions.append(
            {
                "name": key,
                "value": value,
                "threshold": threshold,
                "passed": passed,
                "detail": comment_text(c.detail, 160).replace("|", "/"),
            }
        )
    return conditions


def report_context(origin: Origin) -> dict[str, Any]:
    """Verdict, conditions, time and roofline of the candidate (empty-ish in --kind mode)."""
    cand, report = origin.candidate, origin.report
    if cand is None or report is None:
        return {
            "has_report": False,
            "verdict": None,
            "reason": "",
            "builtin": None,
            "note": "",
            "conditions": [],
            "roofline": {},
            "report_numbers": {},
            "time_text": "",
            "saving_text": "",
        }
    rf = cand.roofline
    calls = cand.instances_per_step or 1.0
    includes_bwd = (cand.bwd_ms_per_step or 0.0) > 0 and (cand.fwd_ms_per_step or 0.0) > 0
    conditions = _conditions(cand)
    ceiling_call = rf.ceiling_ms / calls if rf.ceiling_ms else None
    roofline = {
        "calls_per_step": f"{calls:g}",
        "bytes_text": _fmt_bytes(rf.bytes),
        "flops_text": _fmt_flops(rf.flops),
        "intensity_text": f"{rf.intensity:.3g} FLOP/byte" if rf.intensity else "—",
        "bound": rf.bound or "unknown",
        "ceiling_ms_per_step": rf.ceiling_ms,
        "ceiling_text": _fmt_ms(rf.ceiling_ms),
        "ceiling_call_text": _fmt_ms(ceiling_call),
        "measured_text": _fmt_ms(cand.time_ms_per_step),
        "source": rf.source,
        "includes_backward": includes_bwd,
    }
    numbers = {
        "candidate": cand.id,
        "gpu": comment_text(require_gpu(report.gpu).name, 80),
        "calls_per_step": _round(calls),
        "measured_ms_per_step": _round(cand.time_ms_per_step),
        "measured_ms_per_call": _round(cand.time_ms_per_step / calls),
        "ceiling_ms_per_step": _round(rf.ceiling_ms),
        "ceiling_ms_per_call": _round(ceiling_call),
        "bytes_per_step": _round(rf.bytes),
        "flops_per_step": _round(rf.flops),
        "bound": rf.bound,
        "source": rf.source,
        "headroom": _round(cand.headroom),
        "mode": "fwd+bwd" if includes_bwd else "fwd",
    }
    time_text = (
        f"{_fmt_ms(cand.time_ms_per_step)} per step ({cand.time_share:.1%} of step time; "
        f"forward {_fmt_ms(cand.fwd_ms_per_step)}, backward {_fmt_ms(cand.bwd_ms_per_step)}), "
        f"{calls:g} call(s) per step"
    )
    step_ms = cand.time_ms_per_step / cand.time_share if cand.time_share else None
    saving = cand.expected_saving_share or 0.0
    # A skip counts no saving, yet its kernel may sit below the ceiling (low-headroom: the note
    # says "if fixed, up to …"): say what reaching the ceiling would give, and that it is not counted.
    at_ceiling = cand.time_share * (1 - 1 / cand.headroom) if cand.headroom and cand.headroom > 1 else 0.0
    shown = saving or at_ceiling
    saving_text = f"up to {shown:.1%} of step time" + (f" ({_fmt_ms(shown * step_ms)})" if step_ms else "")
    if not saving and at_ceiling:
        saving_text += f", which the report does not count as a saving ({cand.verdict}: {cand.reason})"
    return {
        "has_report": True,
        "verdict": cand.verdict,
        "reason": comment_text(cand.reason or "", 200),
        "builtin": comment_text(cand.builtin, 100) if cand.builtin else None,
        "note": comment_text(cand.note or "", 200).rstrip("."),
        "conditions": conditions,
        "roofline": roofline,
        "report_numbers": numbers,
        "time_text": time_text,
        "saving_text": saving_text,
    }


def _round(value):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return float(f"{float(value):.6g}")


def trace_ops(cand: Candidate | None, limit: int = 40) -> list[str]:
    """One comment-safe line per op of the candidate's example instance."""
    if cand is None:
        return []
    lines = [op_label(op) for op in cand.example[:limit]]
    if len(cand.example) > limit:
        lines.append(f"… and {len(cand.example) - limit} more ops")
    return lines


def shapes_context(observed: list[Observed], dtypes: dict[str, str], extra: dict | None = None) -> list[dict]:
    out = []
    for o in observed:
        dims = {**o.dims, **(extra or {})}
        out.append(
            {
                "literal": shape_literal(dims),
                "dtypes": dtypes_literal(dtypes),
                "share": _round(o.share) if o.share else 1.0,
                "share_text": f"{o.share:.1%}" if o.share else "—",
                "count": o.count or "—",
                "text": o.text or " ".join(f"{k}={dims_text(v)}" for k, v in o.dims.items()),
            }
        )
    return out


def tol_context(overrides: dict[str, tuple[float, float]] | None = None) -> dict[str, str]:
    tol = {**DEFAULT_TOL, **(overrides or {})}
    return {k: f"({v[0]:g}, {v[1]:g})" for k, v in tol.items()}


def short_dtypes(dtypes: dict[str, str]) -> str:
    names = []
    for v in dtypes.values():
        s = SHORT_DTYPE.get(v, v)
        if s not in names:
            names.append(s)
    return "/".join(names)


def base_context(origin: Origin, gpu: GPUSpec | None) -> dict[str, Any]:
    ctx = {
        "version": __version__,
        "origin_command": origin.command,
        "origin_short": origin.short,
        "title": origin.title,
        "trace_ops": trace_ops(origin.candidate),
        "gpu": gpu_context(gpu),
        "notes": list(origin.notes),
        "constants": [],
        "varying": [
            comment_text(v, 40) for v in (origin.candidate.shapes.varying_dims if origin.candidate else [])
        ],
        "bench_imports": [],
        "builtin_label": None,
        "dtype_configs_note": "",
        "inductor": None,  # an Inductor kernel's provenance: the eager ops it fuses
    }
    ctx.update(report_context(origin))
    return ctx
