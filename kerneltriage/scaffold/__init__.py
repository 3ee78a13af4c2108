"""``kerneltriage scaffold``: a working Triton kernel package for a report candidate.

from kerneltriage.scaffold import scaffold_candidate, scaffold_kind
result = scaffold_candidate("runs/exp1", "C3", "kernels/c3")
result = scaffold_kind("rmsnorm", ["16384x4096"], "bf16", "kernels/my_norm")

The family (``families.FAMILIES``: its template folder under ``templates/`` and the code that
fills it) comes from the candidate's kind: attention → ``attention``, norm → ``rownorm``,
softmax and cross-entropy → ``softmax``, gemm → ``gemm_epilogue``, elementwise →
``elementwise``, a depthwise convolution → ``depthwise_conv``; every other kind, or a candidate
the family cannot model (a dense or grouped convolution), gets ``generic`` (a correct
elementwise/reduction starting point), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltriage.analysis.gpus import resolve_gpu
from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.errors import InputError, KernelTriageError
from kerneltriage.scaffold import inductor
from kerneltriage.scaffold.common import Origin, require_gpu
from kerneltriage.scaffold.families import (
    FAMILIES,
    GENERIC,
    TemplateClass,
    for_kind,
    for_report_kind,
    kinds_text,
)
from kerneltriage.scaffold.identifiers import comment_text, parse_dtype, parse_shape
from kerneltriage.scaffold.parent_ops import borrowed, parent_run
from kerneltriage.scaffold.writer import FILES, check_out, render, write

__all__ = [
    "FAMILIES",
    "FILES",
    "ScaffoldResult",
    "TemplateClass",
    "kinds_text",
    "plan_candidate",
    "plan_kind",
    "render",
    "scaffold_candidate",
    "scaffold_kind",
]

DEFAULT_GPU = "H100-SXM"


@dataclass
class ScaffoldResult:
    out: Path
    template: str
    name: str
    files: list[Path]
    messages: list[str] = field(default_factory=list)


def plan_candidate(
    report: Report,
    candidate_id: str,
    *,
    run_ref: str = "RUN",
    out: str = "OUT",
    rank: int | None = None,
    candidate: Candidate | None = None,
) -> tuple[str, dict[str, Any], list[str]]:
    """(template, context, messages) for one candidate of a report, without writing anything.
    ``rank``: the process rank the report is of, named in the commands (multi-rank runs);
    ``candidate``: that candidate as planned instead (its ops taken from another run)."""
    cand = candidate or report.candidate(str(candidate_id))
    of_rank = f" (rank {rank})" if rank is not None else ""
    if cand is None:
        valid = ", ".join(c.id for c in report.candidates) or "none"
        raise InputError(
            f"no candidate {comment_text(candidate_id, 40)!r} in {run_ref}{of_rank}; valid ids: {valid}"
        )
    gpu = require_gpu(report.gpu)
    rank_option = f" --rank {rank}" if rank is not None else ""
    origin = Origin(
        command=comment_text(f"kerneltriage scaffold {run_ref} {cand.id}{rank_option} --out {out}", 300),
        short=comment_text(f"{cand.id} of {run_ref}{of_rank}", 200),
        title=comment_text(cand.name, 120),
        report=report,
        candidate=cand,
    )
    messages: list[str] = []
    if cand.inductor:
        # A kernel Inductor generated: the eager ops it fuses are the reference.
        planned = inductor.plan(cand)
        if planned is not None:
            template, kind, dims, dtype, notes = planned
            origin.notes.extend(notes[1:])
            context = FAMILIES[template].from_kind(origin, gpu, kind, [dims], dtype)
            context["inductor"] = notes[0]
            messages.append(
                f"{cand.id}: Inductor kernel; reference = the eager ops it fuses ({kind or 'copy'} at "
                f"{'x'.join(map(str, dims))}, {dtype}), template {template}"
            )
            return template, context, messages
        messages.append(
            f"{cand.id}: Inductor kernel without a decoded name or recorded arguments; the template of its kind"
        )
    family = for_report_kind(cand.kind)
    if family is not None:
        built = family.from_candidate(origin, gpu)
        if built is not None:
            return family.name, built, messages
    if family is None:
        why = f"there is no template for its op class ({cand.kind})"
    else:
        why = f"the {family.name} template does not model it ({comment_text(cand.name, 60)})"
    messages.append(
        f"{cand.id}: {why}; wrote the generic one (a correct elementwise/reduction starting point)"
    )
    origin.fallback = f"No template fits {cand.id}: {why}. This is the generic starting point."
    origin.notes = []  # notes of the family that gave up do not apply
    generic = GENERIC.from_candidate(origin, gpu)
    if generic is None:  # the generic starting point takes every candidate
        raise RuntimeError(f"{cand.id}: the generic template gave no context")
    return GENERIC.name, generic, messages


def scaffold_candidate(
    run: str | Path,
    candidate_id: str,
    out: str | Path,
    *,
    force: bool = False,
    report: Report | None = None,
    rank: int | None = None,
    ncu: str | Path | None = None,
    rules_file: str | Path | None = None,
    gpu: str | None = None,
) -> ScaffoldResult:
    """Scaffold a candidate of ``kerneltriage report RUN`` into ``out``.

    Candidate ids are numbered per rank. ``rank`` picks the rank of a multi-rank run; left
    out, the only rank, or with several the one Nsight Compute profiled (as
    ``kerneltriage.report``), and a message says which rank and candidate that was.
    """
    out = check_out(Path(out), force)  # refuse before the (slow) analysis
    messages: list[str] = []
    named_rank = rank
    if report is None:
        from kerneltriage.api import load

        profile = load(run, ncu=ncu, ranks=None if rank is None else [rank], rules_file=rules_file)
        chosen = profile.default_rank if rank is None else rank
        report = profile.report(chosen, gpu=gpu)
        if rank is None and len(profile.ranks) > 1:
            named_rank = chosen
            cand = report.candidate(str(candidate_id))
            what = f"{cand.id} of rank {chosen} ({comment_text(cand.name, 80)})" if cand else f"rank {chosen}"
            messages.append(
                f"{run} has ranks {', '.join(map(str, profile.ranks))}: scaffolding {what}, the rank "
                "Nsight Compute profiled; candidate ids are numbered per rank, --rank N picks another"
            )
    candidate, borrowed_messages = _ops_from_parent(run, report, candidate_id, named_rank, rules_file, gpu)
    template, context, plan_messages = plan_candidate(
        report, candidate_id, run_ref=str(run), out=str(out), rank=named_rank, candidate=candidate
    )
    plan_messages = borrowed_messages + plan_messages
    files = write(out, render(template, context), force)
    return ScaffoldResult(out, template, context["name"], files, messages + plan_messages)


def plan_kind(
    kind: str, shapes: list[str], dtype: str | None = None, *, gpu: str | None = None, out: str = "OUT"
) -> tuple[str, dict[str, Any], list[str]]:
    """(template, context, messages) for ``--kind/--shape/--dtype``."""
    kind_l = str(kind or "").strip().lower().replace("-", "_")
    if not shapes:
        raise InputError("--kind needs at least one --shape")
    dims = [parse_shape(s) for s in shapes]
    dtype_name = parse_dtype("bf16" if dtype is None else dtype)  # an empty --dtype is refused
    family = for_kind(kind_l)
    if family is None:
        raise InputError(f"unknown --kind {comment_text(kind, 40)!r}; expected one of {kinds_text()}")
    command = f"kerneltriage scaffold --kind {kind_l} " + " ".join(
        f"--shape {'x'.join(map(str, d))}" for d in dims
    )
    command = comment_text(command + f" --dtype {dtype_name} --out {out}", 300)
    origin = Origin(command=command, short=f"--kind {kind_l}", title=f"{kind_l} (no trace)")
    gpu_spec = require_gpu(resolve_gpu(None, gpu or DEFAULT_GPU, None))
    context = family.from_kind(origin, gpu_spec, kind_l, dims, dtype_name)
    return family.name, context, []


def _ops_from_parent(
    run: str | Path,
    report: Report,
    candidate_id: str,
    rank: int | None,
    rules_file: str | Path | None,
    gpu: str | None,
) -> tuple[Candidate | None, list[str]]:
    """A candidate that no recorded op launched (a CUDA graph's kernels) in a run profiled with
    fixes applied: its ops and shapes from the run before them (``parent_ops.py``), and what
    was taken from where; (None, []) where it has ops or nothing can be borrowed."""
    cand = report.candidate(str(candidate_id))
    if cand is None or cand.example or cand.inductor:
        return None, []
    parent = parent_run(run, report)
    if parent is None:
        recorded = (report.source or {}).get("parent_run")
        return None, [
            f"{cand.id}: no recorded op launched its kernels (a CUDA graph replays them), and the run before "
            f"the fixes ({recorded}), whose ops ran them, is not at hand: copy it beside {run} for its shapes"
        ] if recorded else []
    from kerneltriage.api import load

    try:
        profile = load(parent, ranks=None if rank is None else [rank], rules_file=rules_file)
        found = borrowed(cand, profile.report(profile.default_rank if rank is None else rank, gpu=gpu))
    except KernelTriageError as exc:  # the candidate's own run is fine: its generic package still comes
        return None, [
            f"{cand.id}: no recorded op launched its kernels, and the run before the fixes ({parent}) "
            f"could not be read for them: {exc}"
        ]
    if found is None:
        return None, [
            f"{cand.id}: no recorded op launched its kernels, and no candidate of the run before the fixes "
            f"({parent}) ran them either"
        ]
    merged, matched = found
    ids = ", ".join(c.id for c in matched)
    return merged, [
        f"{cand.id}: no recorded op launched its kernels (a CUDA graph replays them); its ops and shapes are "
        f"those of {ids} in the run before the fixes ({parent}), which ran the same kernels: "
        f"{comment_text(matched[0].name, 80)}"
    ]


def scaffold_kind(
    kind: str,
    shapes: list[str],
    dtype: str | None,
    out: str | Path,
    *,
    force: bool = False,
    gpu: str | None = None,
) -> ScaffoldResult:
    """Scaffold an op class without a run: ``--kind rmsnorm --shape 16384x4096 --dtype bf16``."""
    out = check_out(Path(out), force)
    template, context, messages = plan_kind(kind, shapes, dtype, gpu=gpu, out=str(out))
    files = write(out, render(template, context), force)
    return ScaffoldResult(out, template, context["name"], files, messages)
