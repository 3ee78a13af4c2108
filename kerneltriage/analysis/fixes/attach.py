"""Each candidate's fix: the recipe chosen for its verdict (``fix_choice``), its prediction
scoped to what that recipe covers (fused linear CE as the lm_head GEMM and the loss, a loss-only
patch without the upcast it leaves, a norm swap without its residual add, a module compile with
what it fuses beside the candidate), overlapping savings counted once, the GEMM shape notes, and
the basis of every row's saving.
"""

from __future__ import annotations

import math
import re

from kerneltriage.analysis.candidates.estimate import dtype_bytes
from kerneltriage.analysis.fixes.fix_choice import choose
from kerneltriage.analysis.fixes.fix_environment import Environment
from kerneltriage.analysis.fixes.fix_params import detect_params
from kerneltriage.analysis.fixes.fix_recipes import Recipe
from kerneltriage.analysis.fixes.gemm_shapes import gemm_diagnostics
from kerneltriage.analysis.fixes.loss_fixes import UPCAST_KEPT, combine_overlaps
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Verdict

#: Ops a serving engine records (SGLang's profiler ranges, vLLM's custom ops): the model is
#: the engine's, not a ``model`` the user holds.
_SERVER_OPS = re.compile(r"^(sglang\w*|sgl_kernel|vllm)::|\bsglang_profiler\b", re.IGNORECASE)


def _server(candidates: list[Candidate]) -> bool:
    """A serving engine's trace: its ops name SGLang or vLLM, and it runs no backward."""
    if any(c.bwd_ms_per_step > 0 or c.kind == "optimizer" for c in candidates):
        return False
    return any(_SERVER_OPS.search(op) for c in candidates for op in c.ops)


def assign_fixes(candidates: list[Candidate], rules: Rules, env: Environment) -> None:
    """The fix of every candidate, overlapping savings counted once, and the GEMM shape notes."""
    if _server(candidates):
        for c in candidates:
            c.attrs["server"] = True
    by_id = {r.id: r for r in rules.recipes}
    for c in candidates:
        _fix(c, candidates, rules, env, by_id)
    combine_overlaps(candidates, rules.recipes)
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


def _fix(
    c: Candidate, candidates: list[Candidate], rules: Rules, env: Environment, by_id: dict[str, Recipe]
) -> None:
    """The fix of a use-builtin or compile verdict, and of a `write` on an Inductor kernel
    (what Inductor could try first): the first recipe that matches it, whose preconditions the
    trace meets and that carries every parameter detected on it. The prediction counts what
    that recipe covers."""
    if c.verdict not in (Verdict.USE_BUILTIN, Verdict.COMPILE) and not (
        c.verdict == Verdict.WRITE and c.inductor
    ):
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
    chosen = by_id[recipe["id"]]
    renames = chosen.renames_builtin
    if renames and renames[0].search(c.builtin or ""):
        # The verdict names what the fix pastes (a declined fused linear CE: the loss-only kernel).
        c.builtin = renames[1]
    if needs:
        c.note = "; ".join([c.note, *needs] if c.note else needs)
    if judged and chosen.saving == "fused-linear-ce":
        # Judged as the lm_head GEMM + the loss it replaces, not the loss region alone.
        c.expected_saving_share = judged["saving_share"]
        c.attrs["saving_scoped"] = "lm_head GEMM + loss, fused linear CE model"
        c.note = "; ".join(x for x in (c.note, judged["why"]) if x)
    elif chosen.saving == "upcast-kept" and params.get(UPCAST_KEPT):
        # The patch replaces cross_entropy; transformers' loss still upcasts the logits first.
        kept = params[UPCAST_KEPT]
        c.expected_saving_share = max(0.0, c.expected_saving_share - kept)
        c.attrs["saving_scoped"] = "the loss without the logits' fp32 upcast, which the patch leaves"
        c.note = "; ".join(
            x
            for x in (
                c.note,
                f"transformers' loss upcasts the logits to fp32 before cross_entropy and the patch keeps that "
                f"copy ({kept:.1%} of the step): the prediction leaves it out",
            )
            if x
        )
    elif params.get("residual-add") and not fuses_add and c.headroom and c.headroom > 1.0:
        # The fix swaps the norm; the residual add stays an eager op (3 streams beside the
        # fused kernel's 4): the prediction counts what the fix covers.
        c.expected_saving_share = max(0.0, c.time_share * (1.0 - 1.25 / c.headroom))
        c.attrs["saving_scoped"] = "the norm without its residual add"
        c.attrs["saving_basis"] = "share × (1 − 1.25/headroom): the norm without its residual add"
        c.note = "; ".join(
            x for x in (c.note, "the fix swaps the norm only: the residual add before it stays eager") if x
        )
        # The verdict names what the fix pastes: the plain norm, not the fused add + norm.
        c.builtin = (c.builtin or "").replace("fused_add_rms_norm", "rms_norm")
    apply = recipe.get("apply") or {}
    if apply.get("kind") == "compile-module":
        _compile_coverage(c, candidates, rules, apply.get("classes") or [], env)
    elif apply.get("kind") == "compile-model":
        _compile_coverage(c, candidates, rules, None, env)


def _compile_coverage(
    c: Candidate, candidates: list[Candidate], rules: Rules, classes: list[str] | None, env: Environment
) -> None:
    """Compiling a module class compiles everything its instances run, and compiling the model
    (``classes`` None) everything. The row keeps this candidate's own saving (its rank among
    the others); the fix's prediction, which verify judges, adds what the compile takes from
    the other candidates it covers."""
    inside = _compiled_with(c, candidates, classes, rules.cutoffs.compiles_also_min_share)
    if not inside:
        return
    c.attrs["compiles_also"] = [o.id for o in inside]
    taken = {o.id: _compile_takes(o, env) for o in inside}
    whole = c.expected_saving_share + sum(taken.values())
    c.attrs["fix_saving_share"] = whole
    # The ones it takes most from: a covered candidate it takes nothing from is no news.
    named = sorted((o for o in inside if taken[o.id] > 0.0), key=lambda o: -taken[o.id])[:3]
    if not named:
        return
    listed = ", ".join(f"{o.id} ({o.kind}, {taken[o.id]:.1%} of the step)" for o in named)
    c.note = "; ".join(
        x
        for x in (
            c.note,
            f"compiling {' and '.join(classes) if classes is not None else 'the model'} also compiles {listed}: "
            "the fix as a whole is predicted "
            f"to save {whole:.1%} (this candidate {c.expected_saving_share:.1%}), an alternative to their own fixes",
        )
        if x
    )


#: Score-matrix passes of naive attention's softmax chain once Inductor fuses it: forward reads
#: the scores and writes the probabilities; backward reads the probabilities and their gradient
#: and writes the scores' gradient.
_FUSED_SOFTMAX_PASSES = (2, 3)


def _compile_takes(o: Candidate, env: Environment) -> float:
    """The share of the step a compile of its module takes from candidate ``o``: the saving its
    own fused fix predicts for norms and elementwise chains (Inductor fuses them the same
    way); for naive attention, its non-GEMM time (the softmax chain, scaling, masking,
    softcap) against that chain fused into one pass over the score matrix each way. The
    GEMMs stay cuBLAS calls."""
    if o.kind != "attention":
        if o.attrs.get("already_alone") and (o.headroom or 0.0) > 1.0:
            # A fused op alone, skipped as no fix of its own takes its headroom: a compile of
            # the module around it fuses its neighbours into it, and that does (a batch
            # norm's own passes stay: what fusing removes, ``compile_headroom``).
            return o.time_share * (1.0 - 1.0 / o.compile_headroom)
        return (
            o.expected_saving_share
            if o.verdict in (Verdict.COMPILE, Verdict.USE_BUILTIN, Verdict.WRITE)
            else 0.0
        )
    step_ms = o.time_ms_per_step / o.time_share if o.time_share else 0.0
    q, k = o.q, o.attrs.get("k")
    if not step_ms or not q or not k or not env.bandwidth:
        return 0.0
    chain_ms = o.time_ms_per_step * (1.0 - float((o.attrs.get("kernel_mix") or {}).get("gemm", 0.0)))
    scores = math.prod(q[:-1]) * k[-2]
    passes = _FUSED_SOFTMAX_PASSES[0] + (_FUSED_SOFTMAX_PASSES[1] if o.bwd_ms_per_step > 0 else 0)
    fused_ms = (
        passes * scores * dtype_bytes(o.attrs.get("dtype") or "") / env.bandwidth * 1e3 * o.instances_per_step
    )
    return max(0.0, chain_ms - fused_ms) / step_ms


#: Kinds whose ops Inductor fuses when their module is compiled.
FUSABLE_KINDS = frozenset({"elementwise", "reduction", "softmax", "norm", "cross-entropy"})


def _fused_by_compile(o: Candidate) -> bool:
    """Work a compile fuses: elementwise ops, norms, naive attention's softmax and scaling; a
    library GEMM or attention stays the library's call."""
    return o.kind in FUSABLE_KINDS or (o.kind == "attention" and o.attrs.get("written") == "naive")


def _compiled_with(
    c: Candidate, candidates: list[Candidate], classes: list[str] | None, min_share: float
) -> list[Candidate]:
    """The other candidates (``min_share`` of the step or more) that run inside the instances of
    ``classes`` (None: anywhere in the model) and that a compile of them fuses too (elementwise
    work, norms, naive attention's softmax and scaling)."""
    if classes is None:
        return sorted(
            (o for o in candidates if o is not c and o.time_share >= min_share and _fused_by_compile(o)),
            key=lambda o: -o.time_share,
        )
    roots = {
        o.module.partition(" (")[0]
        for o in candidates
        if o.module and o.module.partition(" (")[2].rstrip(")") in classes
    }
    # A region's own module may be a leaf (a Dropout) inside the class compiled: its enclosing
    # modules name the instances too.
    for entry in c.attrs.get("enclosing_modules") or []:
        path, _, cls = entry.partition(":")
        if cls in classes:
            roots.add(path)
    inside = []
    for o in candidates:
        path = (o.module or "").partition(" (")[0]
        if o is c or not path or o.time_share < min_share:
            continue
        if not _fused_by_compile(o):
            continue  # a library GEMM or attention stays the library's call when compiled
        if any(path == r or path.startswith(r + ".") for r in roots):
            inside.append(o)
    return sorted(inside, key=lambda o: -o.time_share)
