"""``kerneltriage scaffold``: a working Triton kernel package for a report candidate.

from kerneltriage.scaffold import scaffold_candidate, scaffold_kind
result = scaffold_candidate("runs/exp1", "C3", "kernels/c3")
result = scaffold_kind("rmsnorm", ["16384x4096"], "bf16", "kernels/my_norm")

The op class (and its template folder under ``templates/``) comes from the candidate's kind:
attention → ``attention``, norm → ``rownorm``, softmax and cross-entropy → ``softmax``, gemm →
``gemm_epilogue``, elementwise → ``elementwise``; every other kind, or a candidate the class
cannot model, gets ``generic`` (a correct elementwise/reduction starting point), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kerneltriage.analysis.gpus import GPUSpec, resolve_gpu
from kerneltriage.errors import InputError
from kerneltriage.scaffold import classes, inductor
from kerneltriage.scaffold.common import Origin
from kerneltriage.scaffold.identifiers import comment_text, parse_dtype, parse_shape
from kerneltriage.scaffold.writer import FILES, check_out, render, write

__all__ = [
    "FILES",
    "KINDS",
    "TEMPLATES",
    "ScaffoldResult",
    "plan_candidate",
    "scaffold_candidate",
    "scaffold_kind",
]

TEMPLATES = ("elementwise", "rownorm", "softmax", "gemm_epilogue", "attention", "generic")
# Report kinds with a template; the rest get the generic one.
KIND_TEMPLATES = {
    "attention": "attention",
    "norm": "rownorm",
    "softmax": "softmax",
    "cross-entropy": "softmax",
    "gemm": "gemm_epilogue",
    "elementwise": "elementwise",
}
# ``--kind`` values (besides elementwise op chains such as ``gelu`` or ``mul+silu``).
KINDS = {
    "rmsnorm": "rownorm",
    "layernorm": "rownorm",
    "add_rmsnorm": "rownorm",
    "add_layernorm": "rownorm",
    "fused_add_rmsnorm": "rownorm",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "cross_entropy": "softmax",
    "attention": "attention",
    "causal_attention": "attention",
    "gemm": "gemm_epilogue",
    "linear": "gemm_epilogue",
    "generic": "generic",
}
DEFAULT_GPU = "H100-SXM"


@dataclass
class ScaffoldResult:
    out: Path
    template: str
    name: str
    files: list[Path]
    messages: list[str] = field(default_factory=list)


def _build(template: str, origin: Origin, gpu: GPUSpec, **kind_args) -> dict | None:
    builders = {
        "rownorm": (classes.rownorm_from_candidate, classes.rownorm_from_kind),
        "softmax": (classes.softmax_from_candidate, classes.softmax_from_kind),
        "attention": (classes.attention_from_candidate, classes.attention_from_kind),
        "gemm_epilogue": (classes.gemm_from_candidate, classes.gemm_from_kind),
        "elementwise": (classes.elementwise_from_candidate, classes.elementwise_from_kind),
        "generic": (classes.generic_from_candidate, classes.generic_from_kind),
    }
    from_candidate, from_kind = builders[template]
    if kind_args:
        return from_kind(origin, gpu, **kind_args)
    return from_candidate(origin, gpu)


def plan_candidate(
    report, candidate_id: str, *, run_ref: str = "RUN", out: str = "OUT", rank: int | None = None
) -> tuple[str, dict, list[str]]:
    """(template, context, messages) for one candidate of a report, without writing anything.
    ``rank``: the process rank the report is of, named in the commands (multi-rank runs)."""
    cand = report.candidate(str(candidate_id))
    of_rank = f" (rank {rank})" if rank is not None else ""
    if cand is None:
        valid = ", ".join(c.id for c in report.candidates) or "none"
        raise InputError(
            f"no candidate {comment_text(candidate_id, 40)!r} in {run_ref}{of_rank}; valid ids: {valid}"
        )
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
            context = _build(template, origin, report.gpu, kind=kind, shapes=[dims], dtype=dtype)
            context["inductor"] = notes[0]
            messages.append(
                f"{cand.id}: Inductor kernel; reference = the eager ops it fuses ({kind or 'copy'} at "
                f"{'x'.join(map(str, dims))}, {dtype}), template {template}"
            )
            return template, context, messages
        messages.append(
            f"{cand.id}: Inductor kernel without a decoded name or recorded arguments; the template of its kind"
        )
    template = KIND_TEMPLATES.get(cand.kind)
    context = _build(template, origin, report.gpu) if template else None
    if context is None:
        if template is None:
            why = f"there is no template for its op class ({cand.kind})"
        else:
            why = f"the {template} template does not model it ({comment_text(cand.name, 60)})"
        messages.append(
            f"{cand.id}: {why}; wrote the generic one (a correct elementwise/reduction starting point)"
        )
        origin.fallback = f"No template fits {cand.id}: {why}. This is the generic starting point."
        origin.notes = []  # notes of the class that gave up do not apply
        template = "generic"
        context = _build("generic", origin, report.gpu)
    return template, context, messages


def scaffold_candidate(
    run: str | Path,
    candidate_id: str,
    out: str | Path,
    *,
    force: bool = False,
    report=None,
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
    template, context, plan_messages = plan_candidate(
        report, candidate_id, run_ref=str(run), out=str(out), rank=named_rank
    )
    files = write(out, render(template, context), force)
    return ScaffoldResult(out, template, context["name"], files, messages + plan_messages)


def _gpu_spec(gpu: str | None) -> GPUSpec:
    return resolve_gpu(None, gpu or DEFAULT_GPU, None)


def plan_kind(
    kind: str, shapes: list[str], dtype: str | None = None, *, gpu: str | None = None, out: str = "OUT"
):
    """(template, context, messages) for ``--kind/--shape/--dtype``."""
    kind_l = str(kind or "").strip().lower().replace("-", "_")
    if not shapes:
        raise InputError("--kind needs at least one --shape")
    dims = [parse_shape(s) for s in shapes]
    dtype_name = parse_dtype(dtype or "bf16")
    ops = [o for o in kind_l.split("+") if o]
    template = KINDS.get(kind_l)
    if template is None and ops and ops[0] in ("gemm", "linear", "matmul"):
        template = "gemm_epilogue"
    if template is None and ops and all(o in classes.ELEMENTWISE_KIND_OPS for o in ops):
        template = "elementwise"
    if template is None:
        valid = (
            ", ".join(sorted(KINDS))
            + "; gemm+bias+gelu style epilogues; elementwise chains of "
            + ", ".join(classes.ELEMENTWISE_KIND_OPS)
        )
        raise InputError(f"unknown --kind {comment_text(kind, 40)!r}; expected one of {valid}")
    command = f"kerneltriage scaffold --kind {kind_l} " + " ".join(
        f"--shape {'x'.join(map(str, d))}" for d in dims
    )
    command = comment_text(command + f" --dtype {dtype_name} --out {out}", 300)
    origin = Origin(command=command, short=f"--kind {kind_l}", title=f"{kind_l} (no trace)")
    context = _build(template, origin, _gpu_spec(gpu), kind=kind_l, shapes=dims, dtype=dtype_name)
    return template, context, []


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
