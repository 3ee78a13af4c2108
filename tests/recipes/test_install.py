"""Each apply kind of the fix recipes, applied in this process to tiny models (CPU): what it
changes, and what it says when it cannot apply."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from kerneltriage.recipes.install import KINDS, ApplyFailed, check, install  # noqa: E402
from tests.helpers import tiny_llama  # noqa: E402


@pytest.fixture
def applied():
    """Install a fix for one test and undo it after (hooks, patched functions, flags)."""
    done = []

    def _install(mapping):
        a = install(mapping)
        done.append(a)
        return a

    yield _install
    for a in done:
        a.remove()


class Block(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(16, 4)
        self.seen_dtype = None

    def forward(self, x):
        y = self.head(self.blocks(x))
        self.seen_dtype = y.dtype
        return y


def tiny_bert():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return BertForMaskedLM(config)


def test_every_contract_kind_is_known_and_checked():
    from kerneltriage.analysis.fixes.fix_recipes import APPLY_KINDS

    # The runner applies exactly the kinds the recipes may name (fixes.yaml is validated
    # against APPLY_KINDS): neither side can add a kind the other does not know.
    assert set(KINDS) == set(APPLY_KINDS)
    assert check({"kind": "rewrite-everything"}) == "unknown apply kind 'rewrite-everything'"
    assert check({"kind": "norm-swap"}) == "apply kind 'norm-swap' lacks classes"
    assert "neither bfloat16 nor float16" in check({"kind": "autocast", "dtype": "float64"})
    assert check({"kind": "tf32"}) is None
    with pytest.raises(ApplyFailed, match="lacks arch, kernel"):
        install({"kind": "liger"})


def test_norm_swap_on_a_plain_module_swaps_only_the_named_class_at_the_first_forward(applied):
    from kerneltriage.kernels import LayerNorm

    a = applied({"kind": "norm-swap", "classes": ["LayerNorm"]})
    model = Net()
    weight = model.blocks[0].norm.weight
    assert not a.done and type(model.blocks[0].norm) is nn.LayerNorm  # nothing before the forward
    x = torch.randn(2, 3, 16)
    expected = Net.forward(model, x)  # a plain call, no module hooks: the eager reference
    out = model(x)
    assert a.done and a.details["swapped"] == 2
    assert type(model.blocks[0].norm) is LayerNorm and model.blocks[0].norm.weight is weight
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_norm_swap_on_hugging_face_llama_takes_the_drop_in(applied):
    from kerneltriage.kernels import LlamaRMSNorm

    ids = torch.randint(0, 64, (1, 8))
    before = tiny_llama()(input_ids=ids, labels=ids).loss.item()
    a = applied({"kind": "norm-swap", "classes": ["LlamaRMSNorm"]})
    model = tiny_llama()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert loss.item() == pytest.approx(before, rel=1e-5)  # the fix as applied keeps the model's loss
    assert a.details["root"] == "LlamaForCausalLM" and a.details["swapped"] == 5  # 2 per layer + final
    assert all(type(m) is LlamaRMSNorm for n, m in model.named_modules() if n.endswith("norm"))


def test_norm_swap_that_finds_nothing_says_so(applied):
    applied({"kind": "norm-swap", "classes": ["GemmaRMSNorm"]})
    with pytest.raises(ApplyFailed, match="found no GemmaRMSNorm module"):
        Net()(torch.randn(2, 16))


def test_compile_module_compiles_every_instance_of_the_class(applied):
    a = applied({"kind": "compile-module", "classes": ["Block"], "mode": None})
    model = Net()
    model(torch.randn(2, 16))
    assert a.details["compiled"] == 2
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert model._compiled_call_impl is None and model.head._compiled_call_impl is None


def test_compile_model_compiles_the_root_of_a_bert_mlm(applied):
    ids = torch.randint(0, 64, (1, 8))
    labels = torch.where(torch.rand(1, 8) < 0.5, ids, torch.full_like(ids, -100))
    eager = tiny_bert().eval()
    before = eager(input_ids=ids, labels=labels).loss.item()
    a = applied({"kind": "compile-model", "mode": "default"})
    model = tiny_bert().eval()
    model(input_ids=ids)
    assert a.details == {"mode": "default", "root": "BertForMaskedLM"}
    assert model._compiled_call_impl is not None
    # From the second call on the model runs compiled, with the eager model's loss.
    assert model(input_ids=ids, labels=labels).loss.item() == pytest.approx(before, rel=1e-4)


def test_compile_mode_changes_the_scripts_own_compile_calls(applied, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model=None, **kw: calls.append(kw) or model)
    a = applied({"kind": "compile-mode", "mode": "reduce-overhead", "options": {}})
    model = Net()
    torch.compile(model, mode="default", fullgraph=True)
    model.compile()  # nn.Module.compile goes through torch.compile too
    assert calls[0] == {"mode": "reduce-overhead", "fullgraph": True}
    assert calls[1]["mode"] == "reduce-overhead" and a.details["compile_calls"] == 2
    applied({"kind": "compile-mode", "mode": "max-autotune", "options": {"epilogue_fusion": False}})
    torch.compile(model)
    assert calls[-1]["options"]["max_autotune"] is True and calls[-1]["options"]["epilogue_fusion"] is False
    assert "mode" not in calls[-1]  # torch.compile takes a mode or options, not both


def test_compile_mode_without_a_compile_call_is_a_problem(applied):
    a = applied({"kind": "compile-mode", "mode": "reduce-overhead"})
    assert a.problem == "the script never called torch.compile, so there was no mode to change"


def test_sdpa_backend_for_the_whole_process_and_undone(applied):
    from torch.nn.attention import SDPBackend

    before = torch.backends.cuda.flash_sdp_enabled()
    a = applied({"kind": "sdpa-backend", "backend": "SDPBackend.MATH"})
    assert a.details["backend"] == SDPBackend.MATH.name
    assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    a.remove()
    assert torch.backends.cuda.flash_sdp_enabled() == before
    with pytest.raises(ApplyFailed, match="unknown SDPA backend 'FASTEST'"):
        install({"kind": "sdpa-backend", "backend": "FASTEST"})


def test_hf_attention_calls_the_registration_with_the_root(applied, monkeypatch):
    seen = []
    fake = types.ModuleType("kerneltriage.kernels.hf_attention")
    fake.use_flash_attention = lambda model: (
        seen.append(model) or {"layers": 2, "implementation": "kerneltriage"}
    )
    monkeypatch.setitem(sys.modules, "kerneltriage.kernels.hf_attention", fake)
    a = applied(
        {"kind": "hf-attention", "causal": True, "softcap": None, "scale": 0.125, "sliding_window": None}
    )
    model = tiny_llama()
    model(input_ids=torch.randint(0, 64, (1, 8)))
    assert seen == [model] and a.details["hf_attention"]["layers"] == 2


def test_hf_attention_without_the_module_says_why(applied, monkeypatch):
    monkeypatch.setitem(sys.modules, "kerneltriage.kernels.hf_attention", None)  # import fails
    applied({"kind": "hf-attention", "causal": True})
    with pytest.raises(ApplyFailed, match="built-in attention for Hugging Face models cannot be imported"):
        Net()(torch.randn(2, 16))


def test_autocast_runs_the_root_forward_under_autocast_from_the_first_call(applied):
    a = applied({"kind": "autocast", "dtype": "bfloat16"})
    model = Net()
    model(torch.randn(2, 16))
    assert model.seen_dtype == torch.bfloat16 and a.details["device"] == "cpu"
    model(torch.randn(2, 16))
    assert model.seen_dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")  # only inside the root's forward


def test_tf32_flags_set_and_restored(applied):
    before = torch.backends.cuda.matmul.allow_tf32
    a = applied({"kind": "tf32"})
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    a.remove()
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_inductor_config_set_for_every_compile_and_restored(applied):
    import torch._inductor.config as inductor_config

    before = inductor_config.force_shape_pad
    a = applied({"kind": "inductor-config", "settings": {"force_shape_pad": True}})
    assert inductor_config.force_shape_pad is True and a.problem is None
    assert a.details["settings"] == {"force_shape_pad": True}
    a.remove()
    assert inductor_config.force_shape_pad == before
    # A name this torch's Inductor does not have is refused, and nothing is set.
    with pytest.raises(ApplyFailed, match="has no config 'pad_everything'"):
        applied({"kind": "inductor-config", "settings": {"force_shape_pad": True, "pad_everything": 1}})
    assert inductor_config.force_shape_pad == before
    assert "takes settings" in check({"kind": "inductor-config", "settings": ["force_shape_pad"]})
    assert check({"kind": "inductor-config"}) == "apply kind 'inductor-config' lacks settings"


def test_channels_last_converts_the_model(applied):
    applied({"kind": "channels-last"})
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    model(torch.randn(1, 3, 8, 8))
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_fused_optimizer_constructs_adamw_fused(applied):
    a = applied({"kind": "fused-optimizer"})
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]
    assert sgd.defaults["fused"] is True
    assert a.details["optimizers"] == ["AdamW", "SGD"] and a.problem is None
    a.remove()
    assert not torch.optim.AdamW(model.parameters(), lr=1e-3).defaults["fused"]


@pytest.fixture
def fake_liger(tmp_path, monkeypatch):
    package = tmp_path / "liger_kernel" / "transformers"
    package.mkdir(parents=True)
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(
        "CALLS = []\n"
        "def apply_liger_kernel_to_gemma2(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,\n"
        "                                  rms_norm=True, geglu=True, model=None):\n"
        "    CALLS.append(dict(rope=rope, cross_entropy=cross_entropy,\n"
        "                      fused_linear_cross_entropy=fused_linear_cross_entropy, rms_norm=rms_norm, geglu=geglu))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("liger_kernel", "liger_kernel.transformers"):
        sys.modules.pop(name, None)  # the fake must not outlive the test


def test_liger_switches_on_only_the_candidates_kernel(applied, fake_liger):
    a = applied({"kind": "liger", "arch": "gemma2", "kernel": "rms_norm"})
    import liger_kernel.transformers as lt

    assert lt.CALLS == [
        {
            "rope": False,
            "cross_entropy": False,
            "fused_linear_cross_entropy": False,
            "rms_norm": True,
            "geglu": False,
        }
    ]
    assert a.done and a.details["function"] == "apply_liger_kernel_to_gemma2"
    with pytest.raises(ApplyFailed, match="has no switch 'swiglu'"):
        install({"kind": "liger", "arch": "gemma2", "kernel": "swiglu"})
    with pytest.raises(ApplyFailed, match="has no apply_liger_kernel_to_llama"):
        install({"kind": "liger", "arch": "llama", "kernel": "rms_norm"})


def test_liger_missing_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    with pytest.raises(ApplyFailed, match="liger_kernel is not importable in the script's Python"):
        install({"kind": "liger", "arch": "gemma2", "kernel": "rms_norm"})
