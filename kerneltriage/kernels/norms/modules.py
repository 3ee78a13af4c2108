"""``nn.Module`` drop-ins: ``RMSNorm``, ``LayerNorm`` (state dicts of ``torch.nn``'s), the fused
``FusedAddRMSNorm``, and the Hugging Face-semantics ``LlamaRMSNorm``, ``GemmaRMSNorm`` and
``Olmo2RMSNorm``."""

from __future__ import annotations

import torch
from torch import nn

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels.norms.functional import fused_add_rms_norm, layer_norm, rms_norm
from kerneltriage.kernels.norms.launch import like


def _normalized_shape(shape: int | tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


class _NormBase(nn.Module):
    """Shared parameters and state-dict layout of torch.nn.RMSNorm / torch.nn.LayerNorm.

    A ``normalized_shape`` of several dims is handled by flattening those dims into one."""

    def __init__(self, normalized_shape, eps, elementwise_affine, bias, device, dtype):
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, **factory))
            if bias:
                self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **factory))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def _flat(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        k = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - k :]) != self.normalized_shape:
            raise KernelInputError(
                f"{type(self).__name__}: input has shape {tuple(x.shape)}; its last dims must be "
                f"{self.normalized_shape}"
            )
        return (x if k == 1 else x.flatten(x.dim() - k)), tuple(x.shape)

    @staticmethod
    def _vec(p: torch.Tensor | None) -> torch.Tensor | None:
        return None if p is None else p.reshape(-1)

    def _eps(self, x: torch.Tensor) -> float:
        # torch.nn.RMSNorm(eps=None) means the input dtype's machine epsilon.
        return torch.finfo(x.dtype).eps if self.eps is None else self.eps

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(_NormBase):
    """Drop-in for ``torch.nn.RMSNorm`` (same parameters and state dict)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, False, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, shape = self._flat(x)
        return like(rms_norm(xf, self._vec(self.weight), self._eps(x)), shape)


class LayerNorm(_NormBase):
    """Drop-in for ``torch.nn.LayerNorm`` (same parameters and state dict)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, shape = self._flat(x)
        return like(layer_norm(xf, self._vec(self.weight), self._vec(self.bias), self.eps), shape)


class FusedAddRMSNorm(_NormBase):
    """``forward(x, residual) -> (rms_norm(x + residual), x + residual)``; its state dict loads
    from ``torch.nn.RMSNorm``."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, False, device, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf, shape = self._flat(x)
        rf, _ = self._flat(residual)
        y, h = fused_add_rms_norm(xf, rf, self._vec(self.weight), self._eps(x))
        return like(y, shape), like(h, shape)


class _HFRMSNorm(nn.Module):
    """A Hugging Face-style RMSNorm: one ``weight`` Parameter and the eps under the original's
    attribute name, so that its state dict and attribute reads carry over."""

    eps_attribute = "variance_epsilon"
    weight_offset = 0.0
    cast_before_weight = False

    def __init__(self, hidden_size: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        init = torch.zeros if self.weight_offset else torch.ones  # Gemma's (1 + w) starts at 0
        self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        setattr(self, self.eps_attribute, eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(
            hidden_states,
            self.weight,
            getattr(self, self.eps_attribute),
            weight_offset=self.weight_offset,
            cast_before_weight=self.cast_before_weight,
        )

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={getattr(self, self.eps_attribute)}"


class LlamaRMSNorm(_HFRMSNorm):
    """Drop-in for Hugging Face's ``LlamaRMSNorm`` and the classes that share its math (Qwen2,
    Qwen3, Mistral, ...): normalize in fp32, round to the input's dtype, then scale,
    ``weight * hidden.to(input_dtype)`` (output in the promotion of the two dtypes).
    ``weight`` starts at ones; eps is ``variance_epsilon``."""

    cast_before_weight = True


class GemmaRMSNorm(_HFRMSNorm):
    """Drop-in for Hugging Face's ``GemmaRMSNorm`` (Gemma 1-3, Qwen3-Next, ...): ``normed ·
    (1 + weight)`` in fp32, then cast to the input's dtype. ``weight`` starts at zeros; eps is
    ``eps``."""

    eps_attribute = "eps"
    weight_offset = 1.0


class Olmo2RMSNorm(_HFRMSNorm):
    """Drop-in for Hugging Face's ``Olmo2RMSNorm`` (OLMo 2/3, GPT-OSS, ...): ``(weight ·
    normed)`` in fp32, then cast to the input's dtype, as ``torch.nn.RMSNorm`` computes it.
    ``weight`` starts at ones; eps is ``variance_epsilon``."""
