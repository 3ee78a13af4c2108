"""Built-in Triton kernels that the report recommends (``use-builtin``) when they cover a candidate.

- Norms (package ``norms``): ``rms_norm``, ``layer_norm``, ``fused_add_rms_norm`` and the
  ``nn.Module`` drop-ins ``RMSNorm``, ``LayerNorm``, ``FusedAddRMSNorm``, and the Hugging Face
  drop-ins ``LlamaRMSNorm`` (Qwen2/3, Mistral, ...), ``GemmaRMSNorm``, ``Olmo2RMSNorm``.
- Attention (package ``attention``): ``flash_attention`` (causal, GQA, sliding window, softcap).
- Hugging Face attention (module ``hf_attention``): ``use_flash_attention(model)`` registers
  ``flash_attention`` with transformers' ``AttentionInterface`` as ``"kerneltriage"`` and
  switches a model to it (softcap, per-layer sliding window, scale and GQA carried).
- ``patch(model)`` swaps a model's matching norm modules in place and reports what it did.
- ``config``: the settings the host code reads per call (``KernelConfig``; tests change them
  with ``config.override(...)``).
- ``set_fast_launch(enabled)`` and ``launch_path()`` (module ``host_path``): the switch of the
  fast host path, and which path launches the kernels and why (``LaunchPath``).

Each package splits by role: ``triton_kernels`` (device code), ``launch`` (checks, tile
configurations, cached launch plans, host functions), ``autograd`` (the eager
``autograd.Function`` and the ``kerneltriage::`` custom ops that ``torch.compile`` sees),
``functional`` / ``modules`` (the API), ``reference`` (pure torch). Names resolve lazily so
that importing this package does not import torch or Triton until a kernel is used.

Host paths (``host_path``, the one module that picks): the fast path, which relies on Triton 3.6
internals (fastest first: the norms' C++ bound calls, ``native``, built on first use,
``KERNELTRIAGE_NATIVE=0`` turns them off; the Python bound calls, ``norms/fast.py``; direct
launches, ``fast_launch``; each falls back to the next), or plain ``kernel[grid](...)``
launches, always correct, taken when the fast path is off (``KERNELTRIAGE_FAST_LAUNCH=0``,
``set_fast_launch(False)``) or cannot be set up (another Triton, the interpreter).
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
    "LlamaRMSNorm": "norms",
    "GemmaRMSNorm": "norms",
    "Olmo2RMSNorm": "norms",
    "patch": "patch",
    "PatchReport": "patch",
    "flash_attention": "attention",
    "use_flash_attention": "hf_attention",
    "KernelConfig": "config",
    "LaunchPath": "host_path",
    "launch_path": "host_path",
    "set_fast_launch": "host_path",
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
