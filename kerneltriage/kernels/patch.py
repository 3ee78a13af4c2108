"""``patch(model)``: swap a model's norm modules for the Triton drop-ins, in place, and report
what was swapped and what was not.

Two kinds of module are swapped:

- exact ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` (not subclasses, whose forward may
  differ) -> ``kerneltriage.kernels.RMSNorm`` / ``LayerNorm``;
- Hugging Face RMSNorm classes whose math a kernel variant reproduces, listed by class name in
  ``kerneltriage/data/hf_norms.yaml`` (``LlamaRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm``,
  ``MistralRMSNorm``, ``GemmaRMSNorm``, ...): recognized by the name, a class from the
  ``transformers`` package, a 1-D ``weight`` Parameter and a numeric eps attribute
  (``variance_epsilon`` or ``eps``), and swapped for ``LlamaRMSNorm``, ``GemmaRMSNorm``,
  ``Olmo2RMSNorm`` or ``T5RMSNorm`` (``T5LayerNorm`` and its relatives);
- any other one-weight ``*RMSNorm`` / ``*LayerNorm`` class (a script's own, a newer
  transformers class) whose forward, run on a tiny CPU copy of the module in fp32 and bf16,
  gives one of those semantics' outputs in dtype and value (``checked_semantics``).

The new modules take over the old ones' Parameter objects (an optimizer built before the patch
keeps training them) and their train/eval mode. Any other class whose name ends in ``RMSNorm``
or ``LayerNorm`` is left alone and listed as skipped, with the reason.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
from torch import nn

from kerneltriage.kernels import config
from kerneltriage.kernels.norms import GemmaRMSNorm, LayerNorm, LlamaRMSNorm, Olmo2RMSNorm, RMSNorm
from kerneltriage.kernels.norms.modules import _HFRMSNorm


class T5RMSNorm(_HFRMSNorm):
    """Drop-in for Hugging Face's ``T5LayerNorm`` (T5, mT5, LongT5, UMT5, Switch, Pix2Struct,
    ...): no mean, no bias, the statistics and the normalized x in fp32, cast to the weight's
    dtype where the weight is 16-bit, then ``weight * normed`` (fp32 weights: an fp32 output).
    ``weight`` starts at ones; eps is ``variance_epsilon``."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        from kerneltriage.kernels.norms.functional import rms_norm

        w, eps = self.weight, float(getattr(self, self.eps_attribute))
        if w.dtype == torch.float32:
            # fp32 weights: T5 computes weight * normed in fp32 whatever the input's dtype;
            # x.float() is exact, so the fp32 kernel gives T5's every bit.
            return rms_norm(hidden_states.float(), w, eps)
        if hidden_states.dtype == w.dtype:
            # 16-bit weights and input: normed rounded to their dtype, then scaled (Llama's math).
            return rms_norm(hidden_states, w, eps, cast_before_weight=True)
        return t5_reference(hidden_states, w, eps)  # a mix the kernels do not take: T5's own math


def t5_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """T5LayerNorm.forward's math (transformers/models/t5/modeling_t5.py)."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        x = x.to(weight.dtype)
    return weight * x


def _llama_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _gemma_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * (1.0 + weight.float())).to(x.dtype)


def _weight_then_cast_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


#: The math of each semantics of ``hf_norms.yaml``, as the reference classes compute it: what a
#: norm class's own forward is checked against on a tiny CPU instance.
REFERENCES = {
    "llama": _llama_reference,
    "gemma": _gemma_reference,
    "weight_then_cast": _weight_then_cast_reference,
    "t5": t5_reference,
}

_TORCH_SWAPS: dict[type, type] = {nn.RMSNorm: RMSNorm, nn.LayerNorm: LayerNorm}
_DROP_INS = {cls.__name__: cls for cls in (LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm, T5RMSNorm)}
#: Where a norm class keeps its eps, in the order they are looked for.
_EPS_ATTRIBUTES = ("variance_epsilon", "eps", "epsilon")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_TABLE = "kerneltriage/data/hf_norms.yaml"


@dataclass
class PatchReport:
    """What ``patch`` did: ``swapped`` holds (module name, old class, new class) and ``skipped``
    holds (module name, reason) for norm-like modules left alone."""

    swapped: list[tuple[str, str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} norm module(s)"]
        lines += [f"  {name}: {old} -> {new}" for name, old, new in self.swapped]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)}")
            lines += [f"  {name}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)


def _named(cls: type, names: Collection[str]) -> bool:
    return cls.__name__ in names or _qualname(cls) in names


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _hf_table() -> tuple[dict[str, str], dict[str, dict]]:
    """(class name -> semantics, semantics -> {drop_in, eps_attribute, ...}) from the shipped YAML."""
    from kerneltriage.resources import load_yaml

    table = load_yaml("hf_norms.yaml")
    return table["classes"], table["semantics"]


def _runnable(module: nn.Module) -> str | None:
    """Why the kernels cannot take this module's place, or None if they can."""
    if module._forward_hooks or module._forward_pre_hooks:
        return "has forward hooks, which the swap would drop"
    for p in module.parameters(recurse=False):
        if p.dtype not in _DTYPES:
            return f"parameters are {str(p.dtype).replace('torch.', '')}; the kernels take bf16, fp16, fp32"
        if p.device.type != "cuda" and not (p.device.type == "cpu" and config.current().interpreter):
            return f"parameters are on {p.device}; the kernels need a CUDA device"
    return None


def _torch_replacement(module: nn.Module) -> nn.Module:
    new = _TORCH_SWAPS[type(module)](module.normalized_shape, eps=module.eps, elementwise_affine=False)
    # Take over the Parameter objects themselves (None where the module has none).
    new.elementwise_affine = module.elementwise_affine
    new.weight = module.weight
    if isinstance(module, nn.LayerNorm):
        new.bias = module.bias
    return new


_CHECKED: dict[type, str | None] = {}  # class -> the semantics its math matched (None: none)


def _probe_eps(module: nn.Module) -> str | None:
    for attr in _EPS_ATTRIBUTES:
        eps = getattr(module, attr, None)
        if isinstance(eps, numbers.Real) and not isinstance(eps, bool):
            return attr
    return None


def checked_semantics(module: nn.Module) -> str | None:
    """The semantics of ``hf_norms.yaml`` whose math ``module``'s class computes, checked on a
    tiny CPU copy: random weights and inputs, in fp32 and bf16 inputs with the module's own
    weight dtype (and an fp32 one), each output compared, dtype and values, with each
    reference's. None when its math matches none, or it is not a one-weight norm module."""
    cls = type(module)
    if cls in _CHECKED:
        return _CHECKED[cls]
    result = None
    weight = getattr(module, "weight", None)
    own = list(module.parameters(recurse=False))
    if (
        isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and len(own) == 1
        and not list(module.children())
        and _probe_eps(module) is not None
    ):
        result = _check_math(module)
    _CHECKED[cls] = result
    return result


def _same(got: object, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.dtype == want.dtype
        and got.shape == want.shape
        and torch.allclose(got.float(), want.float(), rtol=1e-6, atol=1e-6)
    )


def _check_math(module: nn.Module) -> str | None:
    import copy

    eps_attr = _probe_eps(module)
    assert eps_attr is not None
    try:
        probe: nn.Module = copy.deepcopy(module).to("cpu")
    except Exception:
        return None
    eps = float(getattr(probe, eps_attr))
    gen = torch.Generator().manual_seed(0)
    weight = probe.weight
    own_dtype = module.weight.dtype
    assert isinstance(weight, torch.Tensor) and isinstance(own_dtype, torch.dtype)
    n = int(weight.shape[0])
    for name, reference in REFERENCES.items():
        ok = True
        for w_dtype in dict.fromkeys((own_dtype, torch.float32)):
            with torch.no_grad():
                weight.data = (torch.randn(n, generator=gen) * 0.3 + 1.0).to(w_dtype)
            for x_dtype in (torch.float32, torch.bfloat16):
                x = (torch.randn(3, n, generator=gen) * 2.0).to(x_dtype)
                try:
                    with torch.no_grad():
                        got = probe(x)
                except Exception:
                    return None
                ok = ok and _same(got, reference(x, weight.detach(), eps))
        if ok:
            return name
    return None


def _checked_match(module: nn.Module, semantics: dict) -> tuple[type | None, str | None]:
    """(drop-in, eps attribute) for a norm class not listed whose math checks out."""
    sem = checked_semantics(module)
    if sem is None or sem not in semantics:
        return None, None
    return _DROP_INS[semantics[sem]["drop_in"]], _probe_eps(module)


def _hf_match(
    module: nn.Module, classes: dict, semantics: dict
) -> tuple[type | None, str | None, str | None]:
    """(drop-in class, eps attribute, reason not to swap) for a Hugging Face module, or for a
    norm class of any package whose math, checked on a tiny CPU instance, is one the kernels
    match; all None when the module is not a norm at all."""
    cls = type(module)
    name = cls.__name__
    from_hf = cls.__module__.split(".")[0] == "transformers"
    if not from_hf or name not in classes:
        if name.endswith(("RMSNorm", "LayerNorm")) and not isinstance(
            module, (RMSNorm, LayerNorm, _HFRMSNorm)
        ):
            drop_in, eps_attr = _checked_match(module, semantics)
            if drop_in is not None:
                return drop_in, eps_attr, None
        if from_hf and name.endswith(("RMSNorm", "LayerNorm")):
            return (
                None,
                None,
                f"{_qualname(cls)} is not a class whose math the kernels are known to match "
                f"({_TABLE} lists those) and its math, checked on a tiny CPU instance, matches none of "
                "them; left as is",
            )
        return None, None, None
    sem = semantics[classes[name]]
    eps_attr = sem["eps_attribute"]
    weight = getattr(module, "weight", None)
    eps = getattr(module, eps_attr, None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
        return (
            None,
            None,
            f"{_qualname(cls)} has no 1-D weight Parameter, unlike the {name} the kernels match",
        )
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        return None, None, f"{_qualname(cls)} has no numeric {eps_attr}, unlike the {name} the kernels match"
    return _DROP_INS[sem["drop_in"]], eps_attr, None


def _hf_replacement(module: nn.Module, drop_in: type, eps_attr: str) -> nn.Module:
    weight = module.weight
    assert isinstance(weight, nn.Parameter)  # _hf_match checked: a 1-D weight Parameter
    eps = float(getattr(module, eps_attr))
    if hasattr(weight, "_local_tensor"):
        return _swapped_in_place(module, drop_in, eps_attr, eps)
    new = drop_in(weight.shape[0], eps=eps, device="meta")
    new.weight = weight  # the Parameter object itself
    if eps_attr != getattr(drop_in, "eps_attribute", eps_attr):
        setattr(new, eps_attr, eps)  # where the original kept it, for code that reads it there
    return new


_IN_PLACE: dict[tuple[type, type], type] = {}  # (module class, drop-in) -> their union


def _swapped_in_place(module: nn.Module, drop_in: type, eps_attr: str, eps: float) -> nn.Module:
    """The module itself, its class now the drop-in's forward over the original class.

    A sharded weight (a DTensor: FSDP2's ``fully_shard``) is swapped for the gathered one on the
    module FSDP2 registered, at every forward: a new module holding the Parameter would keep the
    shard. So the module object stays, with its parameters and hooks, and only its forward
    changes."""
    key = (type(module), drop_in)
    if key not in _IN_PLACE:
        body = {"__module__": drop_in.__module__, "__qualname__": drop_in.__qualname__}
        _IN_PLACE[key] = type(drop_in.__name__, (drop_in, type(module)), body)
    module.__class__ = _IN_PLACE[key]
    reads = getattr(drop_in, "eps_attribute", eps_attr)
    if eps_attr != reads:
        setattr(module, reads, eps)  # where the drop-in's forward reads it
    return module


def _looks_like_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm")) and not isinstance(
        module, (RMSNorm, LayerNorm, _HFRMSNorm)
    )


def _decide(module: nn.Module, classes: dict, semantics: dict) -> tuple[nn.Module | None, str | None]:
    """(replacement, None), (None, reason to skip), or (None, None) for a module that is no norm."""
    if type(module) in _TORCH_SWAPS:
        reason = _runnable(module)
        return (None, reason) if reason else (_torch_replacement(module), None)
    if isinstance(module, tuple(_TORCH_SWAPS)):
        return None, f"{_qualname(type(module))} subclasses a torch.nn norm; its forward may differ"
    drop_in, eps_attr, reason = _hf_match(module, classes, semantics)
    if reason is not None:
        return None, reason
    if drop_in is not None and eps_attr is not None:  # _hf_match gives both or neither
        reason = _runnable(module)
        return (None, reason) if reason else (_hf_replacement(module, drop_in, eps_attr), None)
    if _looks_like_norm(module):
        return (
            None,
            f"{_qualname(type(module))} is neither a torch.nn norm nor a known Hugging Face norm, and its math "
            "does not check out against the kernels' on a tiny CPU instance; left as is",
        )
    return None, None


def patch(model: nn.Module, *, only: Collection[str] | None = None) -> PatchReport:
    """Replace, inside ``model`` and in place, every ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm``
    with ``kerneltriage.kernels.RMSNorm`` / ``LayerNorm``, and every Hugging Face RMSNorm whose
    math a kernel matches (``kerneltriage/data/hf_norms.yaml``) with its drop-in. Returns a
    ``PatchReport`` (``print(report)`` lists each swap and each norm-like module skipped, with
    the reason).

    A module shared by several parents is replaced by one shared new module. ``model`` itself
    cannot be replaced in place: if it is a norm, it is reported as skipped.

    ``only``: only modules whose class name (or ``module.qualname``) is listed are
    considered; the others are left alone and not reported (one candidate's fix)."""
    classes, semantics = _hf_table()
    report = PatchReport()
    if type(model) in _TORCH_SWAPS or _hf_match(model, classes, semantics)[0] is not None:
        report.skipped.append(("<root>", "the model itself is the norm; patch its parent instead"))
    done: dict[int, nn.Module] = {}  # id(old module) -> its replacement (shared modules)
    # Depth-first, every occurrence of a shared module (list first: the tree changes below).
    for name, child in list(model.named_modules(remove_duplicate=False))[1:]:
        parent_name, _, attr = name.rpartition(".")
        if only is not None and not _named(type(child), only):
            continue
        if id(child) not in done:
            new, reason = _decide(child, classes, semantics)
            if reason is not None:
                report.skipped.append((name, reason))
            if new is None:
                continue
            new.train(child.training)
            done[id(child)] = new
        new = done[id(child)]
        setattr(model.get_submodule(parent_name), attr, new)
        report.swapped.append((name, _qualname(type(child)), _qualname(type(new))))
    return report
