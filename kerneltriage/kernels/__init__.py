"""Built-in Triton kernels that the report recommends (``use-builtin``) when they cover a candidate.

- Norms (``norms.py``): ``rms_norm``, ``layer_norm``, ``fused_add_rms_norm`` and the
  ``nn.Module`` drop-ins ``RMSNorm``, ``LayerNorm``, ``FusedAddRMSNorm``; ``patch(model)``
  swaps matching modules of a model in place.
- Attention (``attention.py``): ``flash_attention`` (causal, GQA, sliding window, softcap).

Each kernel module has a pure-torch reference beside it (``norms_ref.py``,
``attention_ref.py``). Names resolve lazily so that importing this package does not import
Triton until a kernel is used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "rms_norm": "norms",
    "layer_norm": "norms",
    "fused_add_rms_norm": "norms",
    "RMSNorm": "norms",
    "LayerNorm": "norms",
    "FusedAddRMSNorm": "norms",
    "patch": "patch",
    "flash_attention": "attention",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kerneltriage.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kerneltriage.kernels.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
