"""The built-in flash attention as a Hugging Face attention function: registered with
transformers' ``AttentionInterface`` under the name ``"kerneltriage"``, so that a model built by
transformers (Llama, Mistral, Qwen2, Gemma2, ...) runs ``flash_attention`` in place of its
eager attention, carrying causality, the sliding window of each layer, the logit softcap, the
module's scale and GQA. No edit of the model's code::

    from kerneltriage.kernels import use_flash_attention

    carried = use_flash_attention(model)   # {"layers": 26, "softcap": 50.0, ...}

Semantics (those of transformers' flash-attention integration, checked against its eager path):

- causal: ``module.is_causal`` (a call's ``is_causal`` keyword wins); masks aligned
  bottom-right, as transformers' masks are once a cache holds the earlier keys;
- sliding window ``w`` (the ``sliding_window`` the model passes for that layer): a query sees
  the ``w`` most recent keys, itself included, i.e. ``window=(w - 1, 0)`` when causal and
  ``(w - 1, w - 1)`` otherwise (transformers' mask: ``q - w < k <= q``);
- ``softcap`` and ``scaling`` passed through; GQA by the kernel's own support (no repeat_kv);
- dtype: the kernel runs bf16/fp16. float32 queries (e.g. after the rotary embedding under
  ``torch.autocast``) run in autocast's dtype, as eager's matmuls do under autocast; float32
  without autocast is refused, since it would change the model's precision.

Masks: transformers builds each layer's mask through the mask interface registered under the
implementation's name (without one it passes no mask at all). The one registered here returns
``None`` when the mask is only causality and the window (no padding, an all-ones padding mask,
no packed sequences, no custom mask function): the kernel then carries it. Any other mask is
built as eager's additive mask, and that call runs the model's own eager attention function
(same results as ``attn_implementation="eager"``, not accelerated; logged once, counted in
``CALLS``). Dropout, attention sinks, position biases and packed sequences without a mask are
refused with ``InputError``, as is any model that ``use_flash_attention`` cannot carry.

transformers is imported inside the functions only: importing this module needs neither it
nor torch.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from typing import Any

from kerneltriage.errors import InputError

NAME = "kerneltriage"
_log = logging.getLogger("kerneltriage.kernels")

# How calls ran since the process started: "kernel", or "eager: <reason>" for a fallback.
CALLS: Counter[str] = Counter()
_WARNED: set[str] = set()

# Keywords a model may pass that the kernel cannot carry: refused when set.
_REFUSED_KWARGS = {
    "s_aux": "attention sinks (s_aux)",
    "position_bias": "a position bias added to the logits",
    "head_mask": "a head mask",
}
_LAYER_TYPES = {"full_attention", "sliding_attention"}


def _warn_once(reason: str, message: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        _log.warning(message)


# ----------------------------------------------------------------------------- the attention function


def _kernel_dtype(query):
    """The dtype the kernel runs the call in (see the module's docstring)."""
    import torch

    if query.dtype in (torch.bfloat16, torch.float16):
        return query.dtype
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        if dtype in (torch.bfloat16, torch.float16):
            return dtype
    raise InputError(
        f"{NAME} attention: the queries are {str(query.dtype).removeprefix('torch.')} and autocast "
        "is off; the built-in flash attention runs bf16/fp16 only",
        hint="load the model in bf16 (torch_dtype=torch.bfloat16) or run it under torch.autocast",
    )


def _window(sliding_window: int | None, causal: bool) -> tuple[int, int] | None:
    if sliding_window is None:
        return None
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise InputError(f"{NAME} attention: sliding_window must be a positive int; got {sliding_window!r}")
    left = sliding_window - 1
    return (left, 0) if causal else (left, left)


def _eager_fallback(
    module, query, key, value, attention_mask, *, scaling, dropout, sliding_window, softcap, kwargs
):
    """The model's own eager attention with the mask: eager's results for a mask the kernel
    cannot carry."""
    import torch

    if attention_mask.dtype == torch.bool:  # a 4-D boolean mask the caller made: eager's additive form
        zero = torch.zeros((), dtype=query.dtype, device=attention_mask.device)
        attention_mask = torch.where(attention_mask, zero, torch.finfo(query.dtype).min)
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        eager = _generic_eager
    CALLS["eager: mask"] += 1
    _warn_once(
        "mask",
        f"{NAME} attention: a call's mask carries more than causality and the sliding window "
        "(padding or a custom mask); such calls run the model's eager attention (same results, "
        "not accelerated)",
    )
    return eager(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
        **kwargs,
    )


def _generic_eager(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs
):
    """transformers' eager attention (Gemma2's, which adds the softcap to Llama's), for a model
    module that defines none."""
    import torch

    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
):
    """transformers' attention-function signature: ``query`` (B, H, Sq, D), ``key``/``value``
    (B, Hkv, Sk, D) → ``(output (B, Sq, H, D), None)``. Extra keywords (position ids, cache
    positions, ``output_attentions``, ...) are accepted; see the module's docstring for what is
    carried, what falls back to eager and what is refused."""
    from kerneltriage.kernels.attention import flash_attention

    if dropout:
        raise InputError(
            f"{NAME} attention: attention dropout {dropout} in training; the built-in flash attention has none",
            hint="set the model's attention dropout to 0 (config.attention_dropout) or keep its eager attention",
        )
    for name, what in _REFUSED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise InputError(
                f"{NAME} attention: the model passes {what}, which the built-in flash attention cannot carry"
            )
    is_causal = kwargs.pop("is_causal", None)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if kwargs.get("output_attentions"):
        _warn_once("weights", f"{NAME} attention returns no attention weights (output_attentions)")

    if attention_mask is not None:
        return _eager_fallback(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            sliding_window=sliding_window,
            softcap=softcap,
            kwargs=kwargs,
        )
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        raise InputError(
            f"{NAME} attention: packed sequences (cu_seq_lens) without a mask; the built-in flash "
            "attention has no variable-length mode",
            hint="pass position_ids so that transformers builds the packed mask, or do not pack",
        )
    dtype = _kernel_dtype(query)
    q, k, v = (t if t.dtype == dtype else t.to(dtype) for t in (query, key, value))
    out = flash_attention(
        q,
        k,
        v,
        causal=bool(is_causal),
        sm_scale=scaling,
        window=_window(sliding_window, bool(is_causal)),
        softcap=softcap,
    )
    assert not isinstance(out, tuple)  # without return_lse: the output alone
    CALLS["kernel"] += 1
    return out.transpose(1, 2).contiguous(), None


# ----------------------------------------------------------------------------- the mask function


def _kernel_covers_mask(
    q_length,
    kv_length,
    q_offset,
    kv_offset,
    attention_mask,
    allow_is_causal_skip,
    allow_is_bidirectional_skip,
    local_size,
    config,
) -> bool:
    """Whether the mask transformers asks for is only causality (or none) plus the layer's
    window, which the attention function carries from the module and its keywords."""
    import torch

    # transformers clears both flags for custom mask functions, packed sequences and blocks
    if not (allow_is_causal_skip or allow_is_bidirectional_skip):
        return False
    if local_size is not None and local_size == getattr(config, "attention_chunk_size", None):
        return False  # chunked attention (Llama 4): not a window
    if isinstance(q_offset, torch.Tensor) or isinstance(kv_offset, torch.Tensor):
        return False  # static caches: the keys hold unwritten slots
    # the kernel aligns causal masks and windows bottom-right: the keys must end at the last query
    if (allow_is_causal_skip or local_size is not None) and q_offset + q_length != kv_offset + kv_length:
        return False
    if attention_mask is None:
        return True
    if attention_mask.dim() != 2 or attention_mask.shape[-1] < kv_offset + kv_length:
        return False
    return bool(attention_mask[:, kv_offset : kv_offset + kv_length].all())


def mask_interface(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask=None,
    allow_is_causal_skip: bool = False,
    allow_is_bidirectional_skip: bool = False,
    local_size: int | None = None,
    config=None,
    **kwargs: Any,
):
    """transformers' mask-interface signature: ``None`` where the kernel carries the mask,
    else eager's additive 4-D mask (the attention function then runs eager for that call)."""
    from transformers import masking_utils

    if _kernel_covers_mask(
        q_length,
        kv_length,
        q_offset,
        kv_offset,
        attention_mask,
        allow_is_causal_skip,
        allow_is_bidirectional_skip,
        local_size,
        config,
    ):
        return None
    if mask_function is None:
        mask_function = masking_utils.causal_mask_function
    return masking_utils.eager_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        local_size=local_size,
        config=config,
        **kwargs,
    )


# ----------------------------------------------------------------------------- registration


def register() -> str:
    """Register the attention function and its mask function with transformers under
    ``"kerneltriage"`` (idempotent); returns the name to pass as ``attn_implementation``."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise InputError(
            f"{NAME} attention needs transformers 5 (AttentionInterface and masking_utils): {e}"
        ) from e
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_interface)
    return NAME


def _configs(model) -> list:
    """The model's config and its sub-configs, each once."""
    seen, todo, out = set(), [model.config], []
    while todo:
        cfg = todo.pop()
        if cfg is None or id(cfg) in seen:
            continue
        seen.add(id(cfg))
        out.append(cfg)
        todo.extend(getattr(cfg, key, None) for key in getattr(cfg, "sub_configs", {}) or {})
    return out


def _attention_modules(model) -> list:
    """The modules that call the attention interface: transformers' attention classes carry
    ``is_causal`` and a ``config``; their ``scaling``/``head_dim`` tell them from wrappers."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "is_causal")
        and hasattr(m, "config")
        and (hasattr(m, "scaling") or _head_dim(m) is not None)
    ]


def _head_dim(module) -> int | None:
    return getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)  # BERT's name


def _one(values: list):
    """The value the layers share, the distinct values if they differ (each layer carries its
    own all the same), None if none has one."""
    distinct = sorted(set(values), key=repr)
    if len(distinct) > 1:
        return distinct
    return distinct[0] if distinct else None


def use_flash_attention(model) -> dict:
    """Switch a transformers model (and its sub-models) to the built-in flash attention and
    return what it carries, read from the model: ``layers`` (attention modules switched),
    ``causal``, ``softcap``, ``sliding_window``, ``sliding_layers``, ``scaling``, ``gqa``,
    ``head_dim``. Raises ``InputError`` for a model it cannot carry: one that does not call
    transformers' attention interface, attention dropout, attention sinks, chunked attention,
    layer types other than full and sliding, a value head dim unlike the query's, a head dim
    the kernel lacks."""
    name = register()
    if not hasattr(model, "config") or not hasattr(model.config, "_attn_implementation"):
        raise InputError(
            f"{type(model).__name__} is not a transformers model (it has no config._attn_implementation)"
        )
    cls = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise InputError(f"{cls} does not dispatch its attention through transformers' AttentionInterface")
    modules = _attention_modules(model)
    if not modules:
        raise InputError(f"{cls} has no attention module that calls transformers' AttentionInterface")

    for cfg in _configs(model):
        dropout = getattr(cfg, "attention_dropout", 0.0) or getattr(cfg, "attention_probs_dropout_prob", 0.0)
        if model.training and isinstance(dropout, (int, float)) and dropout > 0:
            raise InputError(
                f"{cls}: attention dropout {dropout} in training; the built-in flash attention has none",
                hint="set the config's attention dropout to 0, or switch after model.eval()",
            )
        if getattr(cfg, "attention_chunk_size", None) is not None:
            raise InputError(f"{cls}: chunked attention (attention_chunk_size) is not a sliding window")
        kinds = set(getattr(cfg, "layer_types", None) or ()) - _LAYER_TYPES
        if kinds and getattr(cfg, "num_attention_heads", None):
            raise InputError(f"{cls}: layer types {sorted(kinds)} are not full or sliding attention")
        v_dim, qk_dim = getattr(cfg, "v_head_dim", None), getattr(cfg, "qk_head_dim", None)
        if v_dim is not None and qk_dim is not None and v_dim != qk_dim:
            raise InputError(f"{cls}: value head dim {v_dim} differs from the query's {qk_dim}")
    for m in modules:
        if getattr(m, "sinks", None) is not None:
            raise InputError(f"{cls}: attention sinks ({type(m).__name__}.sinks) are not carried")
        head_dim = _head_dim(m)
        if isinstance(head_dim, int) and (head_dim % 16 or not 16 <= head_dim <= 256):
            raise InputError(
                f"{cls}: head dim {head_dim} is not one the kernel runs (a multiple of 16 up to 256)"
            )

    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        for cfg in _configs(model):
            cfg._attn_implementation = name
    stuck = sorted({m.config._attn_implementation for m in modules} - {name}, key=str)
    if stuck:
        raise InputError(
            f"{cls}: transformers kept attention implementation {stuck} for some layers "
            "(the model cannot switch its attention implementation after loading)",
            hint=f'load it with attn_implementation="{name}" after kerneltriage.kernels.hf_attention.register()',
        )

    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    sliding = [getattr(m, "sliding_window", None) for m in modules]
    if not any(w is not None for w in sliding) and getattr(text, "sliding_window", None) is not None:
        # models that pass config.sliding_window to every layer (Mistral) rather than keep it per module
        layer_types = getattr(text, "layer_types", None)
        sliding = (
            [text.sliding_window if t == "sliding_attention" else None for t in layer_types]
            if layer_types
            else [text.sliding_window] * len(modules)
        )
    groups = [getattr(m, "num_key_value_groups", 1) for m in modules]  # none: one kv head per q head
    return {
        "implementation": name,
        "layers": len(modules),
        "causal": _one([bool(m.is_causal) for m in modules]),
        "softcap": _one([getattr(m, "attn_logit_softcapping", None) for m in modules]),
        "sliding_window": _one([w for w in sliding if w is not None]),
        "sliding_layers": sum(w is not None for w in sliding),
        "scaling": _one([getattr(m, "scaling", None) for m in modules]),
        "gqa": _one([g for g in groups if g is not None]),
        "head_dim": _one([_head_dim(m) for m in modules]),
    }
