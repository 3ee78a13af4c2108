"""Loss fixes judged as what they run: Liger's fused linear cross-entropy replaces the lm_head
GEMM and the loss (``fused_linear_ce`` models its time, ``combine_overlaps`` counts the two
candidates' savings once), and a loss-only patch leaves transformers' fp32 upcast of the
logits in place (``kept_upcast_ms``).
"""

from __future__ import annotations

import math
from typing import Any

from kerneltriage.analysis.candidates.estimate import dtype_bytes, tensor_inputs
from kerneltriage.analysis.fixes.fix_environment import Environment
from kerneltriage.analysis.fixes.fix_recipes import Recipe
from kerneltriage.analysis.fixes.gemm_shapes import gemm_dims

#: The share of the step a loss-only patch leaves in place (``params``, not a template field).
UPCAST_KEPT = "upcast_kept_share"


def kept_upcast_ms(c: Any, env: Environment) -> float:
    """The fp32 upcast of 16-bit logits in a loss region (``aten::to`` to float), at the memory
    ceiling: forward reads 2 bytes and writes 4 an element, backward the reverse. transformers'
    ``ForCausalLMLoss`` upcasts before ``cross_entropy``, so Liger's loss-only patch, which
    replaces ``cross_entropy``, leaves it."""
    if not env.bandwidth:
        return 0.0
    for o in c.example or []:
        if o.get("name") not in ("aten::to", "aten::_to_copy"):
            continue
        tensors = tensor_inputs(o.get("dims"), o.get("types"))
        conc = o.get("concrete") or []
        # aten::to(self, dtype, …): ScalarType 6 is float32.
        if tensors and dtype_bytes(tensors[0][1]) == 2 and len(conc) > 1 and str(conc[1]).strip() == "6":
            elements = math.prod(tensors[0][0])
            return 12.0 * elements / env.bandwidth * 1e3 * (c.instances_per_step or 1.0)
    return 0.0


def _logits_dims(c: Any) -> tuple[int, int] | None:
    """(tokens, vocabulary) of a loss candidate's logits: its largest 2-D+ float tensor."""
    best = None
    for o in c.example or []:
        for d, t in tensor_inputs(o.get("dims"), o.get("types")):
            if len(d) >= 2 and t in ("float", "c10::BFloat16", "c10::Half"):
                n = math.prod(d)
                if best is None or n > math.prod(best):
                    best = d
    if not best:
        return None
    return math.prod(best[:-1]), best[-1]


def lm_head_for(loss: Any, candidates: list[Any]) -> Any | None:
    """The GEMM candidate producing a loss candidate's logits: N is the vocabulary and M the
    tokens (the lm_head, BERT's decoder)."""
    dims = _logits_dims(loss)
    if not dims:
        return None
    tokens, vocab = dims
    best = None
    for g in candidates:
        if g.kind != "gemm":
            continue
        d = gemm_dims(g)
        if d and d[1] == vocab and d[0] == tokens and (best is None or g.time_share > best.time_share):
            best = g
    return best


def fused_linear_ce(loss: Any, gemm: Any | None, env: Environment, step_ms: float) -> dict[str, Any] | None:
    """Liger's fused linear cross-entropy replaces the lm_head GEMM (forward and both backward
    GEMMs) and the loss. It runs every GEMM in the weights' dtype (fp32 weights under autocast:
    fp32 GEMMs), in chunks of ``next_pow2(BT / ceil(V / H))`` rows, and accumulates the weight
    gradient into a V×H buffer once per chunk. Its time: the GEMMs' FLOPs at the dtype's
    ceiling, plus the per-chunk logits passes and weight-gradient read-modify-writes at the
    memory ceiling. Against today's GEMM + loss time (measured)."""
    if gemm is None or not env.rates or not env.bandwidth:
        return None
    d = gemm_dims(gemm)
    if not d:
        return None
    bt, vocab, hidden, act_type = d
    op = (gemm.example or [{}])[0]
    tensors = tensor_inputs(op.get("dims"), op.get("types"))
    weight_type = tensors[1][1] if len(tensors) >= 2 else act_type
    precision = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}.get(weight_type, "fp32")
    rate = env.rates.get(precision) or env.rates.get("fp32")
    if not rate:
        return None
    inc = math.ceil(vocab / hidden)
    chunk = min(bt, 1 << max(0, math.ceil(math.log2(max(1, math.ceil(bt / inc))))))
    chunks = math.ceil(bt / chunk)
    es = dtype_bytes(weight_type)
    flops = 3 * 2.0 * bt * hidden * vocab
    grad_weight = chunks * 2 * vocab * hidden * es  # addmm into the V×H gradient, per chunk
    logits = 4 * bt * vocab * es  # logits chunk written, read, gradient written and read
    fused_ms = (flops / rate + (grad_weight + logits) / env.bandwidth) * 1e3
    today_ms = gemm.time_ms_per_step + loss.time_ms_per_step
    gain = today_ms - fused_ms
    why = (
        f"fused linear CE predicted at {fused_ms:.3g} ms against {today_ms:.3g} ms today "
        f"(lm_head GEMM {gemm.time_ms_per_step:.3g} + loss {loss.time_ms_per_step:.3g}): "
        f"{flops / 1e12:.3g} TFLOP in {precision} (the weights' dtype), {chunks} chunks of {chunk} rows "
        f"re-reading the {vocab}x{hidden} weight gradient"
    )
    return {
        "fused_ms": fused_ms,
        "today_ms": today_ms,
        "gain_ms": gain,
        "saving_share": max(0.0, gain) / step_ms if step_ms else 0.0,
        "precision": precision,
        "chunks": chunks,
        "chunk_rows": chunk,
        "gemm": gemm.id,
        "why": why,
    }


def combine_overlaps(candidates: list[Any], recipes: tuple[Recipe, ...]) -> None:
    """Candidates one fix replaces together (a fused linear CE recipe, ``saving:
    fused-linear-ce``, replaces the lm_head GEMM and the loss) are one saving: the loss's recipe
    carries the combined figure, and the GEMM keeps only what its own fix adds beyond it, so
    their sum is the combined figure."""
    fused = {r.id for r in recipes if r.saving == "fused-linear-ce"}
    by_id = {c.id: c for c in candidates}
    for c in candidates:
        r = c.recipe or {}
        judged = c.attrs.get("fused_linear_ce")
        if r.get("id") not in fused or r.get("blocked") or not judged:
            continue
        gemm = by_id.get(judged["gemm"])
        if gemm is None:
            continue
        combined = max(c.expected_saving_share, gemm.expected_saving_share)
        gemm_alone = gemm.expected_saving_share
        gemm.expected_saving_share = max(0.0, combined - c.expected_saving_share)
        if gemm_alone:
            gemm.attrs["saving_alone"] = gemm_alone
            gemm.attrs["saving_scoped"] = f"counted once with {c.id}'s fused linear CE"
            gemm.note = "; ".join(
                x
                for x in (
                    gemm.note,
                    f"{c.id}'s fused linear CE replaces this GEMM too: their savings count once "
                    f"({combined:.1%} together)",
                )
                if x
            )
        r["covers"] = dict(r.get("covers") or {}, also=[gemm.id])
