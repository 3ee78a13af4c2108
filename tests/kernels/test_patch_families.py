"""kerneltriage.kernels.patch over every norm class the installed transformers ships: whatever
it swaps keeps the model's math, on model families nobody here chose (each class built alone,
random weights, no download)."""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import warnings

import pytest
import torch
from torch import nn

from kerneltriage.kernels import patch

transformers_models = pytest.importorskip("transformers.models")

#: Fewest classes the sweep must swap: transformers 5.24 ships 259 *RMSNorm / *LayerNorm
#: classes, of which patch swapped 195 (the rest: a bias, no weight, channels-first layouts).
LEAST_SWAPPED = 150


def _norm_classes() -> list[type[nn.Module]]:
    found = []
    for info in pkgutil.iter_modules(transformers_models.__path__):
        name = f"transformers.models.{info.name}.modeling_{info.name}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # an optional dependency missing, or no modeling file
            continue
        for cls_name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, nn.Module)
                and cls_name.endswith(("RMSNorm", "LayerNorm"))
                and obj.__module__ == name
            ):
                found.append(obj)
    return found


def _built(cls: type[nn.Module], n: int) -> nn.Module | None:
    for args in ((n,), (n, 1e-6)):
        try:
            return cls(*args)
        except Exception:
            continue
    return None


def test_every_norm_class_patch_swaps_keeps_its_math(device):
    n = 48
    swapped, mismatched = [], []
    for cls in _norm_classes():
        module = _built(cls, n)
        if module is None:
            continue
        torch.manual_seed(0)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
        model = nn.Sequential(module).to(device)
        eager = copy.deepcopy(model)
        patch(model)
        if type(model[0]) is cls:
            continue  # left as is: its math matches no drop-in (said in the report)
        swapped.append(cls.__qualname__)
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            x = (torch.randn(3, 5, n, generator=torch.Generator().manual_seed(1)) * 2).to(device, dtype)
            with torch.no_grad():
                want, got = eager(x), model(x)
            if not (
                got.dtype == want.dtype
                and got.shape == want.shape
                and torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
            ):
                mismatched.append(f"{cls.__module__}.{cls.__qualname__} ({dtype})")
    assert not mismatched
    assert len(swapped) >= LEAST_SWAPPED
