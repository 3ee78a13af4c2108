"""``patch(model)``: swap a model's ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` modules for the
Triton drop-ins of ``norms.py``, in place, and report what was swapped and what was not.

The new modules take over the old ones' Parameter objects (an optimizer built before the patch
keeps training them) and their train/eval mode. Only exact ``torch.nn`` classes are swapped:
subclasses and look-alikes (e.g. a Hugging Face ``LlamaRMSNorm``, or Gemma's, which scales by
``1 + weight``) may compute something else, so they are listed as skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from kerneltriage.kernels._common import interpreter_mode
from kerneltriage.kernels.norms import LayerNorm, RMSNorm

_SWAPS: dict[type, type] = {nn.RMSNorm: RMSNorm, nn.LayerNorm: LayerNorm}
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _skip_reason(module: nn.Module) -> str | None:
    """Why an exact torch.nn norm cannot be swapped, or None if it can."""
    if module._forward_hooks or module._forward_pre_hooks:
        return "has forward hooks, which the swap would drop"
    for p in module.parameters(recurse=False):
        if p.dtype not in _DTYPES:
            return f"parameters are {str(p.dtype).replace('torch.', '')}; the kernels take bf16, fp16, fp32"
        if p.device.type != "cuda" and not (p.device.type == "cpu" and interpreter_mode()):
            return f"parameters are on {p.device}; the kernels need a CUDA device"
    return None


def _replacement(module: nn.Module) -> nn.Module:
    new_cls = _SWAPS[type(module)]
    kwargs = {"eps": module.eps, "elementwise_affine": False}
    new = new_cls(module.normalized_shape, **kwargs)
    # Take over the Parameter objects themselves (None where the module has none).
    new.elementwise_affine = module.elementwise_affine
    new.weight = module.weight
    if isinstance(module, nn.LayerNorm):
        new.bias = module.bias
    new.train(module.training)
    return new


def _looks_like_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm")) and not isinstance(module, (RMSNorm, LayerNorm))


def patch(model: nn.Module) -> PatchReport:
    """Replace every ``torch.nn.RMSNorm`` and ``torch.nn.LayerNorm`` inside ``model`` with
    ``kerneltriage.kernels.RMSNorm`` / ``LayerNorm``, in place. Returns a ``PatchReport``
    (``print(report)`` lists each swap and each norm-like module skipped, with the reason).

    A module shared by several parents is replaced by one shared new module. ``model`` itself
    cannot be replaced in place: if it is a norm, it is reported as skipped."""
    report = PatchReport()
    if type(model) in _SWAPS:
        report.skipped.append(("<root>", "the model itself is the norm; patch its parent instead"))
    done: dict[int, nn.Module] = {}  # id(old module) -> its replacement (shared modules)
    # Depth-first, every occurrence of a shared module (list first: the tree changes below).
    for name, child in list(model.named_modules(remove_duplicate=False))[1:]:
        parent_name, _, attr = name.rpartition(".")
        if id(child) not in done:
            reason = None
            if type(child) in _SWAPS:
                reason = _skip_reason(child)
            elif isinstance(child, tuple(_SWAPS)):
                reason = f"{_qualname(type(child))} subclasses a torch.nn norm; its forward may differ"
            elif _looks_like_norm(child):
                reason = f"{_qualname(type(child))} is not a torch.nn norm; not swapped"
            else:
                continue
            if reason is not None:
                report.skipped.append((name, reason))
                continue
            done[id(child)] = _replacement(child)
        new = done[id(child)]
        setattr(model.get_submodule(parent_name), attr, new)
        report.swapped.append((name, _qualname(type(child)), _qualname(type(new))))
    return report
