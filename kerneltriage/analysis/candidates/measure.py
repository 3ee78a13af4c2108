"""Candidate assembly: the numbers of one group (time, shares, kernels, roofline, shapes),
before the conditions and the verdict (``verdict.py``)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.candidates.grouping import Group, module_label
from kerneltriage.analysis.candidates.roofline import fusion_headroom, place_on_roofline
from kerneltriage.analysis.candidates.shapes import candidate_shapes
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Candidate, KernelInfo
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.timeline.attribution import Attribution, factorize_text
from kerneltriage.analysis.timeline.join import JoinResult
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.ncu_csv import Counters


def build_candidate(
    g: Group,
    attr: Attribution,
    join: JoinResult | None,
    counters: Counters | None,
    gpu: GPUSpec | None,
    n_steps: int,
    step_ms: float,
    busy_ms: float,
    rules: Rules,
) -> Candidate:
    """The candidate of group ``g``: its time per step, kernels, roofline and shapes."""
    k = attr.kernels.take(g.kernel_index)
    _follow_kernels(g, k, attr, rules)
    total_ns = float(k["dur"].sum())
    per_step_ms = total_ns / n_steps / 1e6
    fwd_ms = float(k.loc[k["phase"] != "bwd", "dur"].sum()) / n_steps / 1e6
    bwd_ms = float(k.loc[k["phase"] == "bwd", "dur"].sum()) / n_steps / 1e6
    rows = join.row.loc[k.index] if join is not None else pd.Series(-1, index=k.index)
    kernels_info = _kernel_info(k, attr, rows, n_steps)
    module = module_label(k["module"].dropna().tolist())
    scale = join.scale_of(k.index) if join is not None else None
    roof = place_on_roofline(g, k, rows, counters, gpu, n_steps, scale)
    headroom = (total_ns / n_steps / 1e6) / roof.ceiling_ms if roof.ceiling_ms else None
    shapes = candidate_shapes(g, k)
    instances = len(g.segments) / n_steps if g.segments else float(len(k)) / n_steps
    name = g.name
    if module and g.level != "kernel":
        name = f"{name} in {module}"
    full_name, name = g.full_name or name, short_name(name)
    attrs = _json_attrs(g) | ({"full_name": full_name} if full_name != name else {})
    fusion = fusion_headroom(g, k)
    if fusion is not None:
        attrs["fusion_headroom"] = round(fusion, 3)
    order = tuple(attrs)
    # What the report reads becomes a typed field; the rest stays in attrs for the analysis.
    full, fused_ops, q = attrs.pop("full_name", None), attrs.pop("fused_ops", None), attrs.pop("q", None)
    compiled, inductor = bool(attrs.pop("compiled", False)), bool(attrs.pop("inductor", False))
    return Candidate(
        id="",
        name=name,
        kind=g.kind,
        level=g.level,
        variant=g.variant,
        time_ms_per_step=per_step_ms,
        time_share=per_step_ms / step_ms if step_ms else 0.0,
        gpu_share=per_step_ms / busy_ms if busy_ms else 0.0,
        fwd_ms_per_step=fwd_ms,
        bwd_ms_per_step=bwd_ms,
        instances_per_step=instances,
        ops=g.ops,
        module=module,
        kernels=kernels_info,
        roofline=roof,
        headroom=headroom,
        shapes=shapes,
        conditions={},
        attrs=attrs,
        builtin=None,
        example=_example(g),
        full_name=full,
        compiled=compiled,
        inductor=inductor,
        fused_ops=list(fused_ops) if fused_ops is not None else None,
        q=list(q) if q is not None else None,
        attrs_order=order,
    )


# Candidate names longer than this are cut at a joint (Tensile kernel names run to 700
# characters); the full name stays in ``Candidate.full_name`` (JSON, HTML tooltips).
NAME_LIMIT = 80
_JOINT = re.compile(r"[_.:,<(\s]")


def short_name(name: str, limit: int = NAME_LIMIT) -> str:
    """``name`` within ``limit`` characters, cut after its last joint (``_ . : , < (`` or a
    space) before the limit and ended with an ellipsis; as is when short enough."""
    if len(name) <= limit:
        return name
    head = name[: limit - 1]
    cuts = [m.start() for m in _JOINT.finditer(head) if m.start() >= limit // 2]
    return (head[: cuts[-1]] if cuts else head).rstrip("_.:,<( ") + "…"


def _follow_kernels(g: Group, k: pd.DataFrame, attr: Attribution, rules: Rules) -> None:
    """A candidate's kind agrees with what most of its kernel time is: when GEMM, convolution,
    attention or communication kernels hold most of it, that is its kind (a pattern region —
    naive attention, an eager norm — keeps the kind of its pattern). The kernel mix and the
    library holding most of the time go into ``attrs``."""
    total = float(k["dur"].sum())
    if not total:
        return
    names, name_values = attr.kernel_name_codes[k.index.to_numpy()], attr.kernel_name_uniques
    # Classed once per distinct (name, activity), in order of first launch; the times are
    # whole nanoseconds, so their sums do not depend on the order they are added in.
    activities, activity_values = factorize_text(k["kind"])
    pair_codes, pairs = pd.factorize(names * (len(activity_values) + 1) + activities)
    time = np.bincount(pair_codes, weights=k["dur"].to_numpy(dtype=float), minlength=len(pairs))
    by_kind: dict[str, float] = {}
    by_lib: dict[str, float] = {}
    vendor = 0.0
    for p, d in zip(pairs.tolist(), time):  # numpy floats, as rounded below
        pair = (name_values[p // (len(activity_values) + 1)], activity_values[p % (len(activity_values) + 1)])
        kind, cls = rules.kernel_kind(*pair), rules.kernel_class(*pair)
        by_kind[kind] = by_kind.get(kind, 0.0) + d
        if cls.library:
            by_lib[cls.library] = by_lib.get(cls.library, 0.0) + d
        if cls.vendor_library:
            vendor += d
    g.attrs["kernel_mix"] = {
        kk: round(v / total, 3) for kk, v in sorted(by_kind.items(), key=lambda kv: -kv[1])[:4]
    }
    if by_lib:
        lib = max(by_lib, key=by_lib.__getitem__)
        g.attrs["kernel_library"] = lib
    g.attrs["vendor_share"] = round(vendor / total, 3)
    top = max(by_kind, key=by_kind.__getitem__)
    pattern = g.level == "region" and (g.kind in ("attention", "norm") or "region" in g.attrs)
    if top != g.kind and top in rules.unabsorbed_kinds and by_kind[top] >= 0.5 * total and not pattern:
        g.kind = top
        g.variant = None
    if g.level != "region" and vendor >= 0.5 * total:
        # Mostly tuned library kernels (cuBLAS, cuDNN, FBGEMM, …): nothing to write at the roof.
        g.library = True


def _example(g: Group) -> list[dict[str, Any]]:
    if not g.segments:
        return []
    _, seg = g.segments[0]
    return [
        {
            "name": op.name,
            "dims": op.dims,
            "types": op.types,
            "concrete": op.concrete,
            "compute_type": op.compute_type,
            **({"strides": op.strides} if op.strides else {}),
        }
        for op in seg.ops
    ]


def _json_attrs(g: Group) -> dict[str, Any]:
    attrs = dict(g.attrs)
    if g.library:
        attrs["library_op"] = True
    return attrs


def _kernel_info(k: pd.DataFrame, attr: Attribution, rows: pd.Series, n_steps: int) -> list[KernelInfo]:
    # One entry per (name, phase), in order of first launch.
    names, name_values = attr.kernel_name_codes[k.index.to_numpy()], attr.kernel_name_uniques
    phases, phase_values = factorize_text(k["phase"])
    pairs, pair_values = pd.factorize(names * (len(phase_values) + 1) + phases)
    by_pair = pd.DataFrame({"dur": k["dur"].to_numpy(), "joined": (rows >= 0).to_numpy()}).groupby(pairs)
    launches, time, joined = by_pair.size(), by_pair["dur"].sum(), by_pair["joined"].all()
    out = []
    for p, n, t, j in zip(pair_values.tolist(), launches.tolist(), time.tolist(), joined.tolist()):
        name = name_values[p // (len(phase_values) + 1)]
        out.append(
            KernelInfo(
                name=base_name(name),
                full_name=name,
                launches_per_step=n / n_steps,
                time_ms_per_step=float(t) / n_steps / 1e6,
                phase=phase_values[p % (len(phase_values) + 1)],
                joined=bool(j),
            )
        )
    out.sort(key=lambda x: -x.time_ms_per_step)
    return out
