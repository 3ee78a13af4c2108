"""data/liger.yaml against the Liger-Kernel it names (installed with the test extras): each
architecture's patch exists with the kernel switches listed, in its signature's order, and a
model class is mapped to a patch only where that patch replaces its classes."""

from __future__ import annotations

import inspect

import pytest
import yaml

from kerneltriage.analysis.fixes.liger import hf_arch, liger_switches
from kerneltriage.resources import data_path

monkey_patch = pytest.importorskip("liger_kernel.transformers.monkey_patch")


def _table() -> dict:
    return yaml.safe_load(data_path("liger.yaml").read_text())


def test_the_table_is_the_installed_liger_kernels():
    import importlib.metadata

    table = _table()
    assert importlib.metadata.version("liger-kernel") == table["liger_kernel"]
    for arch, switches in table["switches"].items():
        patch = getattr(monkey_patch, f"apply_liger_kernel_to_{arch}")
        flags = [n for n, p in inspect.signature(patch).parameters.items() if isinstance(p.default, bool)]
        assert flags == switches, arch
    # Every architecture mapped can switch each kernel the fix recipes ask of it on alone.
    for entry in table["architectures"]:
        switches = table["switches"][entry["arch"]]
        assert {"rms_norm", "cross_entropy", "fused_linear_cross_entropy"} <= set(switches), entry
        assert liger_switches(entry["arch"], "rms_norm").count("=True") == 1


def test_each_prefix_names_a_model_that_transformers_has():
    transformers = pytest.importorskip("transformers")
    missing = [
        e["prefix"]
        for e in _table()["architectures"]
        if not any(hasattr(transformers, f"{e['prefix']}{s}") for s in ("ForCausalLM", "Model", "TextModel"))
    ]
    assert not missing


@pytest.mark.parametrize(
    ("module_class", "arch"),
    [
        ("Qwen2Attention", "qwen2"),
        ("Qwen2ForCausalLM", "qwen2"),
        ("Qwen3MoeSparseMoeBlock", "qwen3_moe"),
        ("Qwen3NextAttention", "qwen3_next"),
        ("MixtralSparseMoeBlock", "mixtral"),
        ("MinistralDecoderLayer", "ministral"),
        ("Gemma3RMSNorm", "gemma3_text"),
        # Variants of a listed model, which its patch leaves as they are.
        ("Qwen2MoeSparseMoeBlock", None),
        ("Qwen2_5_VLAttention", None),
        ("Qwen2VLDecoderLayer", None),
        ("Llama4TextAttention", None),
        ("Gemma3nRMSNorm", None),
        ("GraniteMoeDecoderLayer", None),
        ("Mistral3ForConditionalGeneration", None),
        ("BertLayer", None),
    ],
)
def test_a_class_maps_to_the_patch_of_its_own_model(module_class, arch):
    assert hf_arch(module_class) == arch
