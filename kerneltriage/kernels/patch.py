"""``patch(model)``: swap a model's norm modules for the Triton drop-ins, in place, and report
what was swapped and what was not.

Two kinds of module are swapped:

- exact ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` (not subclasses, whose forward may
  differ) -> ``kerneltriage.kernels.RMSNorm`` / ``LayerNorm``;
- Hugging Face RMSNorm classes whose math a kernel variant reproduces, listed by class name in
  ``kerneltriage/data/hf_norms.yaml`` (``LlamaRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm``,
  ``MistralRMSNorm``, ``GemmaRMSNorm``, ...): recognized by the name, a class from the
  ``transformers`` package, a 1-D ``weight`` Parameter and a numeric eps attribute
  (``variance_epsilon`` or ``eps``), and swapped for ``LlamaRMSNorm``, ``GemmaRMSNorm`` or
  ``Olmo2RMSNorm``.

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

_TORCH_SWAPS: dict[type, type] = {nn.RMSNorm: RMSNorm, nn.LayerNorm: LayerNorm}
_DROP_INS = {cls.__name__: cls for cls in (LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm)}
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


def _hf_match(
    module: nn.Module, classes: dict, semantics: dict
) -> tuple[type | None, str | None, str | None]:
    """(drop-in class, eps attribute, reason not to swap) for a Hugging Face module; all None
    when the module is not a Hugging Face norm at all."""
    cls = type(module)
    name = cls.__name__
    from_hf = cls.__module__.split(".")[0] == "transformers"
    if not from_hf or name not in classes:
        if from_hf and name.endswith(("RMSNorm", "LayerNorm")):
            return (
                None,
                None,
                f"{_qualname(cls)} is not a class whose math the kernels are known to match "
                f"({_TABLE} lists those); left as is",
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
    new = drop_in(weight.shape[0], eps=float(getattr(module, eps_attr)), device="meta")
    new.weight = weight  # the Parameter object itself
    return new


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
            f"{_qualname(type(module))} is neither a torch.nn norm nor a known Hugging Face norm; left as is",
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
