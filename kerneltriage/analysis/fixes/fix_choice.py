"""Choosing and rendering a candidate's fix: its template fields, the first matching recipe
whose preconditions the trace meets and that carries every detected parameter (else which
parameter or precondition blocked it), and the recipe's text and ``apply`` mapping rendered on
those fields. Templates name fields only; nothing is evaluated.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from kerneltriage.analysis.fixes.fix_environment import Environment, unmet
from kerneltriage.analysis.fixes.fix_recipes import Recipe
from kerneltriage.analysis.fixes.liger import hf_arch, liger_switches
from kerneltriage.analysis.fixes.loss_fixes import UPCAST_KEPT
from kerneltriage.resources import load_yaml


class _Strict(dict):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


#: FSDP2's ``fully_shard`` turns each module it shards into an instance of a class made on the
#: spot, ``FSDP<Class>`` (a subclass of ``FSDPModule`` and the module's own class: torch
#: ``distributed/fsdp/_fully_shard/_fully_shard.py``): the recipes match the class underneath.
_FSDP2_CLASS = re.compile(r"^FSDP(?=[A-Z])")


def model_class(name: str) -> str:
    """A module's class as the model defines it: FSDP2's ``FSDP`` prefix taken off."""
    return _FSDP2_CLASS.sub("", name)


def candidate_fields(c: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The template fields of a candidate and its detected parameters."""
    path, _, cls = (c.module or "").partition(" (")
    cls = model_class(cls.rstrip(")"))
    arch = hf_arch(cls) or ""
    head, _, leaf = path.partition(".*.")
    enclosing = [m.partition(":")[2] for m in c.attrs.get("enclosing_modules") or []]
    classes = sorted({x for x in enclosing if x}) or ([cls] if cls and c.kind == "norm" else [])
    backend = re.search(r"SDPBackend\.(\w+)", c.builtin or "")
    norm_class = _norm_class(cls)
    norm_function = "layer_norm" if "layer_norm" in (c.builtin or "") else "rms_norm"
    causal = bool(params.get("causal"))
    ce = []
    if "ignore-index" in params and params["ignore-index"] != -100:
        ce.append(f"ignore_index={params['ignore-index']}")
    if params.get("label-smoothing"):
        ce.append(f"label_smoothing={_fmt(params['label-smoothing'])}")
    if isinstance(params.get("softcap"), float) and c.kind == "cross-entropy":
        ce.append(f"softcap={_fmt(params['softcap'])}")
    softcap = params.get("softcap") if isinstance(params.get("softcap"), float) else None
    return {
        "candidate_id": getattr(c, "id", None) or "ID",  # what `verify --by-hand` takes
        "verdict": c.verdict,
        "reason": c.reason or "",
        "builtin": c.builtin or "",
        "kind": c.kind,
        "written": str(c.attrs.get("written") or ""),
        "module_class": cls or "matching",
        "in_module": f" in {path}" if path else "",
        "module_path": path or "?",
        "module_list": head or "?",
        "module_leaf": leaf or "?",
        "variant": c.variant or "",
        "compiled": str(bool(c.inductor or c.compiled)),
        "classes": classes,
        # The candidate's own module class: what a norm swap replaces (``classes`` holds the
        # modules around a region, a residual add's Block among them).
        "module_classes": [cls] if cls else [],
        # A set literal spelled in sorted order: the same text on every run (set order is not).
        "classes_repr": "{" + ", ".join(repr(c) for c in sorted(set(classes))) + "}" if classes else "set()",
        "arch": arch,
        "causal": str(causal),
        "causal_value": causal,
        "scale": params.get("scale"),
        "scale_arg": f", scale={_fmt(params['scale'])}" if "scale" in params else "",
        "softcap": softcap,
        "softcap_arg": f", softcap={_fmt(softcap)}" if softcap else "",
        "sliding_window": None,  # read from the model's config by use_flash_attention
        "gqa": params.get("gqa") or 1,
        "gqa_arg": ", enable_gqa=True" if (params.get("gqa") or 1) > 1 else "",
        "dropout_arg": f", dropout_p={_fmt(params['dropout'])}"
        if isinstance(params.get("dropout"), float)
        else "",
        "ce_args": ", ".join(ce),
        "bias_arg": ", bias=lm_head.bias" if params.get("bias") else "",
        "backend": backend[1] if backend else "",
        "kernels": f"{c.roofline.launches_per_step:.0f}",
        "fused_path_edit": str(c.attrs.get("fused_path_edit") or ""),
        "pad_edit": str(c.attrs.get("pad_edit") or ""),
        "norm_class": norm_class,
        "norm_check": (
            f"; {cls} is not a listed class: patch checks its math on a tiny CPU copy first and, if it differs, "
            "leaves it and says why"
            if norm_class == "checkable"
            else ""
        ),
        "norm_function": norm_function,
        "norm_call": (
            f"{norm_function}(x, norm.weight, norm.bias, norm.eps)"
            if norm_function == "layer_norm"
            else f"{norm_function}(x, norm.weight, norm.eps)  # cast_before_weight= / weight_offset= as the norm's math"
        ),
        "server": str(bool(c.attrs.get("server"))),
        "op_name": str((getattr(c, "ops", None) or [getattr(c, "name", "") or "the op"])[0]).partition("(")[
            0
        ],
    }


#: Norm classes patch() swaps by name: torch.nn's own.
_TORCH_NORMS = frozenset({"RMSNorm", "LayerNorm"})


def _norm_class(cls: str) -> str:
    """How ``patch()`` treats a norm module class: ``listed`` (torch's, or hf_norms.yaml's),
    ``checkable`` (a *RMSNorm / *LayerNorm it swaps where its math checks out on a tiny CPU
    copy), ``unknown`` (none of those: the fix is applied by hand)."""
    if not cls:
        return "unknown"
    if cls in _TORCH_NORMS or cls in hf_norm_classes():
        return "listed"
    if cls.endswith(("RMSNorm", "LayerNorm")):
        return "checkable"
    return "unknown"


@functools.cache
def hf_norm_classes() -> frozenset[str]:
    """The Hugging Face norm classes ``hf_norms.yaml`` lists with the math a drop-in matches."""
    return frozenset((load_yaml("hf_norms.yaml") or {}).get("classes") or {})


def render(recipe: Recipe, fields: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str | None]:
    """(text, apply mapping, apply_why_not) of ``recipe`` on a candidate's fields."""
    values = dict(fields, id=recipe.id)
    kernel = (recipe.apply or {}).get("kernel")
    if recipe.apply and recipe.apply.get("kind") == "liger" and isinstance(kernel, str):
        values["liger_switches"] = liger_switches(str(fields.get("arch", "")), kernel)
    else:
        values.setdefault("liger_switches", "")
    strict = _Strict({k: _fmt(v) if not isinstance(v, str) else v for k, v in values.items()})
    text = recipe.text.format_map(strict)
    apply = None
    if recipe.apply is not None:
        apply = {}
        for k, v in recipe.apply.items():
            m = re.fullmatch(r"\{(\w+)\}", v) if isinstance(v, str) else None
            apply[k] = values[m[1]] if m else (v.format_map(strict) if isinstance(v, str) else v)
    why = recipe.apply_why_not.format_map(strict) if recipe.apply_why_not else None
    return text, apply, why


def _blocking(recipe: Recipe, params: dict[str, Any]) -> str | None:
    for p in recipe.cannot_carry:
        if params.get(p) not in (None, False):
            value = params[p]
            shown = "" if value is True else f" {_fmt(value)}"
            return f"{p}{shown}: {recipe.title} cannot carry it"
    return None


def choose(
    c: Any, recipes: tuple[Recipe, ...], env: Environment, params: dict[str, Any]
) -> dict[str, Any] | None:
    """The recipe of a candidate (the contract's ``recipe`` mapping, with ``text``), or None
    when no recipe matches it. ``blocked`` is set when every matching recipe was stopped."""
    fields = candidate_fields(c, params)
    matched = [r for r in recipes if r.matches(fields)]
    if not matched:
        return None
    first_block: tuple[Recipe, str] | None = None
    chosen = None
    declined: dict[str, str] = {}
    for r in matched:
        why = _blocking(r, params) or unmet(r, env, params)
        if why is None:
            chosen = r
            break
        declined[r.id] = why
        if first_block is None:
            first_block = (r, why)
    shown = {k: v for k, v in params.items() if k not in ("fused_linear_ce", UPCAST_KEPT)}
    if chosen is None:
        assert first_block is not None  # some recipe matched, and each one declined
        r, why = first_block
        return {
            "id": r.id,
            "params": shown,
            "scope": r.scope,
            "covers": None,
            "blocked": why,
            "apply": None,
            "apply_why_not": None,
            "text": None,
        }
    text, apply, why_not = render(chosen, fields)
    by_id = {r.id: r for r in recipes}
    for alt in chosen.alternatives:
        other = by_id.get(alt)
        if other and other.matches(fields) and not (_blocking(other, params) or unmet(other, env, params)):
            alt_text = render(other, fields)[0]
            text += "\n# or: " + alt_text.replace("\n", "\n#     ")
    notes = []
    if chosen.requires.packages:
        notes.append(f"needs {', '.join(p.replace('_', '-') for p in chosen.requires.packages)}")
    if chosen.requires.torch and env.torch is None and env.torch_below is None:
        notes.append(f"assumes PyTorch {chosen.requires.torch} (the trace does not say its version)")
    return {
        "id": chosen.id,
        "params": shown,
        "scope": chosen.scope,
        "covers": {"instances_per_step": c.instances_per_step, "of_candidate": c.instances_per_step},
        "blocked": None,
        "apply": apply,
        "apply_why_not": why_not,
        "text": text,
        "declined": declined,
        "needs": notes,
        "fuses_residual_add": chosen.fuses_residual_add,
    }
