"""kerneltriage.kernels.patch: swapping torch.nn norms and Hugging Face RMSNorms for the Triton
drop-ins in place (tiny transformers models built from configs, no download)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import GemmaConfig, GemmaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.cohere.modeling_cohere import CohereLayerNorm

from kerneltriage.kernels import GemmaRMSNorm, LayerNorm, RMSNorm, patch
from kerneltriage.kernels import LlamaRMSNorm as KTLlamaRMSNorm


class LlamaRMSNorm(nn.Module):
    """A look-alike with Hugging Face's class name but not from transformers: reported, not
    swapped."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MyLayerNorm(nn.LayerNorm):
    pass


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm1 = nn.RMSNorm(n, eps=None)
        self.proj = nn.Linear(n, n)
        self.norm2 = nn.LayerNorm(n)

    def forward(self, x):
        return self.norm2(self.proj(self.norm1(x)))


def _model(n=64):
    torch.manual_seed(0)
    shared = nn.LayerNorm(n, bias=False)
    model = nn.Sequential(Block(n), shared, nn.GELU(), shared, LlamaRMSNorm(n), MyLayerNorm(n))
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(0.5, 1.5)
    return model


def test_patch_swaps_in_place_and_reports(device):
    model = _model().to(device)
    x = torch.randn(5, 7, 64, device=device)
    old_params = {name: p for name, p in model.named_parameters()}
    expected = model(x)
    expected.sum().backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    report = patch(model)

    assert [name for name, _, _ in report.swapped] == ["0.norm1", "0.norm2", "1", "3"]
    assert type(model[0].norm1) is RMSNorm and type(model[0].norm2) is LayerNorm
    assert model[1] is model[3], "a shared module stays shared"
    assert type(model[1]) is LayerNorm and model[1].bias is None
    assert type(model[4]) is LlamaRMSNorm and type(model[5]) is MyLayerNorm
    skipped = dict(report.skipped)
    assert (
        "is neither a torch.nn norm nor a known Hugging Face norm, and its math does not check out"
        in skipped["4"]
    )
    assert "subclasses a torch.nn norm" in skipped["5"]
    text = str(report)
    assert "swapped 4 norm module(s)" in text
    assert "0.norm1: torch.nn.modules.normalization.RMSNorm -> " in text
    assert "kerneltriage.kernels.norms.modules.RMSNorm" in text
    # The very same Parameter objects (an optimizer built earlier keeps working).
    for name, p in model.named_parameters():
        assert p is old_params[name], name
    assert model[0].norm1.eps is None  # torch.nn.RMSNorm(eps=None) semantics carried over

    got = model(x)
    got.sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_grads[name], rtol=1e-4, atol=1e-4)

    assert patch(model).swapped == [], "patching twice swaps nothing more"


def test_patch_keeps_mode_and_skips_what_it_cannot_run(device):
    model = nn.Sequential(nn.LayerNorm(32), nn.RMSNorm(32)).to(device).eval()
    model[1].register_forward_hook(lambda *args: None)
    model.append(nn.LayerNorm(32, device=device, dtype=torch.float64))
    report = patch(model)
    assert [name for name, _, _ in report.swapped] == ["0"]
    assert not model[0].training
    skipped = dict(report.skipped)
    assert skipped["1"] == "has forward hooks, which the swap would drop"
    assert skipped["2"] == "parameters are float64; the kernels take bf16, fp16, fp32"


def test_patch_skips_parameters_on_an_unsupported_device():
    model = nn.Sequential(nn.LayerNorm(8, device="meta"))
    report = patch(model)
    assert report.swapped == []
    assert report.skipped == [("0", "parameters are on meta; the kernels need a CUDA device")]


def test_patch_root_norm_is_reported():
    norm = nn.RMSNorm(16)
    report = patch(norm)
    assert report.swapped == []
    assert report.skipped[0][0] == "<root>"


# ---- Hugging Face models ------------------------------------------------------------------------

TINY = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "config_cls,model_cls,drop_in,norms",
    [
        # Llama's math; Qwen3 also normalizes q and k per head (4-D inputs, N = head_dim).
        # LlamaRMSNorm itself, Qwen2's and Mistral's: tests/kernels/norms/test_hf_semantics.py
        (Qwen3Config, Qwen3ForCausalLM, KTLlamaRMSNorm, 9),
        (GemmaConfig, GemmaForCausalLM, GemmaRMSNorm, 5),
    ],
    ids=["qwen3", "gemma"],
)
def test_patch_swaps_hugging_face_norms(config_cls, model_cls, drop_in, norms, device):
    """A whole (tiny) model: every RMSNorm swapped for the drop-in of its math, the same
    Parameters and eps kept, logits and gradients unchanged (fp32)."""
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY)).to(device).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if drop_in is GemmaRMSNorm else 1.0, 0.3)
    ids = torch.randint(0, TINY["vocab_size"], (2, 11), device=device)
    expected = model(ids).logits
    expected.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if "norm" in n}
    params = dict(model.named_parameters())
    old_eps = {n: getattr(m, "variance_epsilon", getattr(m, "eps", None)) for n, m in model.named_modules()}
    model.zero_grad()

    report = patch(model)

    assert len(report.swapped) == norms and report.skipped == []
    for name, old, new in report.swapped:
        module = model.get_submodule(name)
        assert type(module) is drop_in and not module.training
        assert old.startswith("transformers.models.") and new.endswith(drop_in.__name__)
        assert getattr(module, drop_in.eps_attribute) == old_eps[name]
    for name, p in model.named_parameters():
        assert p is params[name], name
    got = model(ids).logits
    got.square().mean().backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(params[name].grad, g, rtol=1e-4, atol=1e-6)
    assert patch(model).swapped == []


def test_patch_leaves_unknown_hugging_face_norms_alone(device):
    """A transformers norm whose math no kernel matches (Cohere's LayerNorm: no bias, mean
    subtracted in fp32) is named in the report with the reason; the known ones beside it swap."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    model = nn.ModuleDict({"known": Qwen2RMSNorm(32), "unknown": CohereLayerNorm(32)}).to(device)
    report = patch(model)
    assert [name for name, _, _ in report.swapped] == ["known"]
    assert type(model["known"]) is KTLlamaRMSNorm and type(model["unknown"]) is CohereLayerNorm
    (name, reason), *_ = report.skipped
    assert name == "unknown"
    assert reason == (
        "transformers.models.cohere.modeling_cohere.CohereLayerNorm is not a class whose math the "
        "kernels are known to match (kerneltriage/data/hf_norms.yaml lists those) and its math, checked on "
        "a tiny CPU instance, matches none of them; left as is"
    )
    assert "unknown: transformers.models.cohere.modeling_cohere.CohereLayerNorm is not" in str(report)


def test_patch_checks_the_attributes_of_a_listed_class(device):
    """A listed class name is not enough: without its eps attribute the module is left alone."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm as HFLlamaRMSNorm

    norm = HFLlamaRMSNorm(16).to(device)
    del norm.variance_epsilon
    model = nn.Sequential(norm)
    report = patch(model)
    assert report.swapped == [] and model[0] is norm
    assert report.skipped == [
        (
            "0",
            "transformers.models.llama.modeling_llama.LlamaRMSNorm has no numeric variance_epsilon, "
            "unlike the LlamaRMSNorm the kernels match",
        )
    ]


# ---- norms recognized by their math ------------------------------------------------------------


class ScriptRMSNorm(nn.Module):
    """A training script's own RMSNorm (examples/train_gpt.py): Llama's math, eps under ``eps``."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class NoUpcastRMSNorm(ScriptRMSNorm):
    """Statistics in the input's dtype: no kernel's math (bf16 inputs give other numbers)."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@pytest.mark.parametrize(
    "w_dtype,x_dtype",
    [(torch.float32, torch.bfloat16), (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)],
    ids=["fp32-weight-bf16-input", "fp32", "bf16"],
)
def test_t5_layer_norm_is_recognized_swapped_and_matches_eager(w_dtype, x_dtype, device):
    """T5LayerNorm (no mean, no bias, fp32 variance, cast to the weight's dtype): listed in
    hf_norms.yaml, its math checked on a tiny CPU instance, swapped for T5RMSNorm; outputs (dtype
    and values) and gradients as eager T5's."""
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    from kerneltriage.kernels.patch import T5RMSNorm, checked_semantics

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 48), T5LayerNorm(48, eps=1e-6)).to(device)
    with torch.no_grad():
        model[1].weight.normal_(1.0, 0.3)
    model[1].to(w_dtype)
    assert checked_semantics(model[1]) == "t5"
    x = torch.randn(4, 9, 48, device=device)

    def step():
        h = model[0](x).to(x_dtype)
        y = model[1](h)
        loss = y.float().square().mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        return y.detach(), loss.detach(), grads

    y_eager, loss_eager, grads_eager = step()
    weight = model[1].weight
    report = patch(model)
    assert [(n, new.rpartition(".")[2]) for n, _, new in report.swapped] == [("1", "T5RMSNorm")]
    assert type(model[1]) is T5RMSNorm and model[1].weight is weight
    y, loss, grads = step()
    assert y.dtype == y_eager.dtype == (torch.float32 if w_dtype == torch.float32 else torch.bfloat16)
    tol = 1e-5 if y.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y, y_eager, rtol=tol, atol=tol)
    torch.testing.assert_close(loss, loss_eager, rtol=1e-4, atol=1e-5)
    for name, g in grads_eager.items():
        torch.testing.assert_close(
            grads[name].float(), g.float(), rtol=5e-2 if tol > 1e-4 else 1e-4, atol=1e-3
        )


def test_a_script_norm_is_swapped_when_its_math_checks_out(device):
    """A script's RMSNorm (not torch's, not transformers') is swapped for the drop-in whose math
    its forward reproduces on a tiny CPU instance; one whose math differs is left alone."""
    from kerneltriage.kernels.patch import checked_semantics

    model = nn.ModuleDict({"same": ScriptRMSNorm(32, eps=1e-5), "other": NoUpcastRMSNorm(32)}).to(device)
    with torch.no_grad():
        model["same"].weight.normal_(1.0, 0.3)
    assert checked_semantics(model["same"]) == "llama"
    assert checked_semantics(model["other"]) is None
    x = torch.randn(3, 5, 32, device=device, dtype=torch.bfloat16)
    expected = model["same"](x)
    report = patch(model, only=["ScriptRMSNorm", "NoUpcastRMSNorm"])
    assert [n for n, _, _ in report.swapped] == ["same"]
    assert type(model["same"]) is KTLlamaRMSNorm and model["same"].eps == 1e-5
    assert type(model["other"]) is NoUpcastRMSNorm
    assert "does not check out" in dict(report.skipped)["other"]
    got = model["same"](x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)
