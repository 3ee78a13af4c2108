"""What a fix must carry, read from the trace: an attention's causal mask, custom mask, logit
softcap (``div → tanh → mul`` and its constant), scale, GQA group and dropout; a loss's
ignore_index, label smoothing, final-logit softcap and lm_head bias, the upcast a loss-only
patch leaves and the fused linear CE judged against the lm_head GEMM; a norm's residual add.
``choose`` offers only a recipe that carries every parameter found here.
"""

from __future__ import annotations

import math
import re
from typing import Any

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.fixes.fix_environment import Environment
from kerneltriage.analysis.fixes.gemm_shapes import gemm_dims
from kerneltriage.analysis.fixes.liger import hf_arch
from kerneltriage.analysis.fixes.loss_fixes import UPCAST_KEPT, fused_linear_ce, kept_upcast_ms, lm_head_for


def _scalar(value: Any) -> float | None:
    try:
        x = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _op_scalar(op: dict[str, Any]) -> float | None:
    """The scalar operand of a binary op (``aten::mul(x, 0.088)``): a concrete value recorded
    where the dims are empty."""
    dims, concrete = op.get("dims") or [], op.get("concrete") or []
    for i, d in enumerate(dims[:2]):
        if d == [] and i < len(concrete):
            x = _scalar(concrete[i])
            if x is not None:
                return x
    return None


def _attention_params(c: Any, by_module: dict[str, Any]) -> dict[str, Any]:
    a, ops = c.attrs, c.example or []
    names = [o.get("name", "") for o in ops]
    params: dict[str, Any] = {}
    mask = a.get("mask")
    head_dim = a.get("head_dim")
    q = c.q or []
    seq = q[-2] if len(q) >= 2 else None
    mask_shape = None
    for o in ops:
        if o.get("name") in ("aten::add", "aten::add_", "aten::masked_fill", "aten::where"):
            tensors = tensor_inputs(o.get("dims"), o.get("types"))
            if len(tensors) >= 2:
                mask_shape = tensors[1][0]
    cls = _module_class(c)
    if mask == "causal":
        params["causal"] = True
    elif mask == "custom-mask":
        # An HF decoder's eager attention adds the model's S×S mask (causal, and the sliding
        # window where the config has one): use_flash_attention rebuilds it from the config.
        if mask_shape and len(mask_shape) >= 2 and mask_shape[-1] == mask_shape[-2] == seq and hf_arch(cls):
            params["causal"] = True
            params["mask_from"] = "the model's S×S causal mask"
        else:
            params["custom-mask"] = "x".join(map(str, mask_shape)) if mask_shape else True
    else:
        params["causal"] = False
    # Scale: the first scalar mul/div after the scores matmul, before softmax and any tanh.
    scale = None
    for o, n in zip(ops[1:], names[1:]):
        if n in ("aten::mul", "aten::div") and scale is None:
            x = _op_scalar(o)
            if x:
                scale = x if n == "aten::mul" else 1.0 / x
            break
        if n in ("aten::tanh", "aten::_softmax", "aten::softmax"):
            break
    if a.get("softcap"):
        cap = None
        for i, n in enumerate(names):
            if n == "aten::tanh":
                for o, m in zip(reversed(ops[:i]), reversed(names[:i])):
                    if m in ("aten::div", "aten::mul"):
                        x = _op_scalar(o)
                        if x:
                            cap = x if m == "aten::div" else 1.0 / x
                        break
                break
        params["softcap"] = round(cap, 6) if cap else True
    if scale is not None and head_dim and abs(scale * math.sqrt(head_dim) - 1.0) > 1e-3:
        params["scale"] = round(scale, 6)
    if a.get("dropout"):
        p = None
        for o, n in zip(ops, names):
            if "dropout" in n:
                conc = o.get("concrete") or []
                p = next((x for x in map(_scalar, conc[1:2]) if x is not None), None)
        if p != 0.0:
            params["dropout"] = p if p is not None else True
    gqa = _gqa(c, by_module)
    if gqa and gqa > 1:
        params["gqa"] = gqa
    return params


def _gqa(c: Any, by_module: dict[str, Any]) -> int | None:
    """Query heads per key head, from the attention module's q and k projections' weights."""
    path = (c.module or "").partition(" (")[0]
    q = k = None
    for qn, kn in (("q_proj", "k_proj"), ("query", "key"), ("wq", "wk")):
        q, k = by_module.get(f"{path}.{qn}"), by_module.get(f"{path}.{kn}")
        if q and k:
            break
    if not (q and k):
        return None
    if q % k == 0:
        return q // k
    return None


def _loss_params(c: Any, gemm: Any | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    ops, names = c.example or [], [o.get("name", "") for o in c.example or []]
    for o, n in zip(ops, names):
        if n in ("aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward"):
            conc = o.get("concrete") or []
            # cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing)
            if n == "aten::cross_entropy_loss" and len(conc) >= 6:
                ls = _scalar(conc[5])
                if ls:
                    params["label-smoothing"] = ls
            ii = _scalar(conc[4]) if len(conc) >= 5 else None
            if ii is not None:
                params["ignore-index"] = int(ii)
    if "aten::tanh" in names:
        i = names.index("aten::tanh")
        cap = None
        for o, m in zip(reversed(ops[:i]), reversed(names[:i])):
            if m in ("aten::div", "aten::mul"):
                x = _op_scalar(o)
                if x:
                    cap = x if m == "aten::div" else 1.0 / x
                break
        params["softcap"] = round(cap, 6) if cap else True
    if gemm is not None:
        op = (gemm.example or [{}])[0]
        tensors = tensor_inputs(op.get("dims"), op.get("types"))
        if op.get("name") in ("aten::linear", "aten::addmm") and len(tensors) >= 3:
            params["bias"] = True
    return params


#: A Hugging Face causal LM: its loss is transformers' own (``ForCausalLMLoss``).
_HF_LM = re.compile(r".+ForCausalLM$")


def _module_class(c: Any) -> str:
    return (c.module or "").partition(" (")[2].rstrip(")")


def detect_params(c: Any, candidates: list[Any], env: Environment, step_ms: float) -> dict[str, Any]:
    """The parameters a fix of ``c`` must carry, read from its recorded ops (and, for a
    loss, from the lm_head GEMM that feeds it)."""
    by_module = {}
    for g in candidates:
        d = gemm_dims(g) if g.kind == "gemm" else None
        if d:
            by_module[(g.module or "").partition(" (")[0]] = d[1]
    if c.kind == "attention" and c.attrs.get("written") == "naive":
        return _attention_params(c, by_module)
    if c.kind == "cross-entropy":
        gemm = lm_head_for(c, candidates)
        params = _loss_params(c, gemm)
        kept = kept_upcast_ms(c, env) / step_ms if step_ms and _HF_LM.match(_module_class(c)) else 0.0
        if kept:
            params[UPCAST_KEPT] = kept
        if "FusedLinear" in (c.builtin or ""):
            judged = fused_linear_ce(c, gemm, env, step_ms)
            if judged:
                # What the loss-only kernel saves (the candidate's own prediction, less the
                # upcast it leaves): a fused linear CE that saves less is declined for it.
                judged["loss_only_share"] = max(0.0, c.expected_saving_share - kept)
                params["fused_linear_ce"] = judged
        return params
    if c.kind == "norm" and c.attrs.get("residual_add"):
        return {"residual-add": True}
    return {}
