"""The built-in flash attention as a Hugging Face attention function (``use_flash_attention``)
on causal-LM families beyond the two it was written against: each one it applies to trains
like eager (its fp16 step no further from eager fp32 than eager fp16 is, or within the
tolerance of ``test_hf_attention``), and each one it cannot carry is refused with the reason.
Tiny models from configs, no download; the Triton interpreter on CPU."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kerneltriage.errors import InputError  # noqa: E402
from kerneltriage.kernels import use_flash_attention  # noqa: E402
from tests.kernels.test_hf_attention import FP16, TOL, _step  # noqa: E402

#: One tiny size for every family (the keys each config does not know are ignored by it).
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    initializer_range=0.2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    num_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
)

APPLIED = [
    "Qwen2",
    "Qwen3",
    "Mistral",
    "Ministral",
    "Gemma",
    "Starcoder2",
    "Cohere",
    "Granite",
    "Phi",
    "Olmo",
    "Olmo2",
    "Exaone4",
    "Mixtral",
    "Qwen2Moe",
    "Ernie4_5",
    "Apertus",
    "Arcee",
    "GPTNeoX",
]
REFUSED = ["Bloom", "StableLm"]


def _model(family: str) -> torch.nn.Module:
    config_cls = getattr(transformers, f"{family}Config", None)
    model_cls = getattr(transformers, f"{family}ForCausalLM", None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"this transformers has no {family}ForCausalLM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = config_cls(**TINY, attn_implementation="eager")
    torch.manual_seed(0)
    return model_cls(config)


def _deviation(got: dict, ref: dict) -> dict[str, float]:
    grads = [((got["grads"][n] - g).abs().max() / g.abs().max()).item() for n, g in ref["grads"].items()]
    return {
        "loss": (got["loss"] - ref["loss"]).abs().item(),
        "logits": (got["logits"] - ref["logits"]).abs().max().item(),
        "grads": max(grads, default=0.0),  # (a fused qkv projection has no q_proj to compare)
    }


@pytest.mark.parametrize("family", APPLIED)
def test_a_family_it_applies_to_trains_like_eager(family, device):
    model = _model(family)
    carried = use_flash_attention(copy.deepcopy(model))
    assert carried["layers"] == 2 and carried["causal"] is True
    ref = _step(model, device, torch.float32)
    eager = _deviation(_step(model, device, FP16), ref)
    got = _deviation(_step(model, device, FP16, "kerneltriage"), ref)
    assert all(got[k] <= max(TOL[k], 2 * eager[k]) for k in TOL), (got, eager)


@pytest.mark.parametrize("family", REFUSED)
def test_a_family_it_cannot_carry_is_refused_with_the_reason(family):
    model = _model(family)
    with pytest.raises(InputError, match=f"{family}ForCausalLM does not dispatch its attention"):
        use_flash_attention(model)
