"""The Hugging Face drop-ins (LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm semantics) against the
real transformers classes, and the kernel flags behind them (``cast_before_weight``,
``weight_offset``) on every code path.

Each case runs the transformers module and ours on the same input and weights (ours loads the
transformers module's state dict), in the same dtype, and compares outputs and every gradient
with a float64 reference of the same math and with each other; in bf16/fp16 the outputs must
also be the same numbers bit for bit (almost all of them), which only the same roundings at
the same points give. Every buffer the host code allocates is NaN-poisoned.
"""

from __future__ import annotations

import importlib
import time

import pytest
import torch

from kerneltriage.kernels import GemmaRMSNorm, LlamaRMSNorm, Olmo2RMSNorm, config
from kerneltriage.kernels import norms as N
from kerneltriage.kernels.norms.launch import kernel_config, row_config
from kerneltriage.kernels.norms.reference import fused_add_rms_norm_ref, rms_norm_ref
from kerneltriage.resources import load_yaml
from tests.kernels.norms.checks import BF16, DTYPES, FP16, FP32, TOL, assert_close, randn

# transformers class -> its module; each is matched to a drop-in through the shipped table.
HF_CLASSES = {
    "LlamaRMSNorm": "llama",
    "Qwen2RMSNorm": "qwen2",
    "Qwen3RMSNorm": "qwen3",
    "MistralRMSNorm": "mistral",
    "GemmaRMSNorm": "gemma",
    "Gemma3RMSNorm": "gemma3",
    "Olmo2RMSNorm": "olmo2",
}
DROP_INS = {"LlamaRMSNorm": LlamaRMSNorm, "GemmaRMSNorm": GemmaRMSNorm, "Olmo2RMSNorm": Olmo2RMSNorm}
FLAGS = {  # semantics -> (weight_offset, cast_before_weight) of the reference
    "llama": (0.0, True),
    "gemma": (1.0, False),
    "weight_then_cast": (0.0, False),
}


@pytest.fixture(autouse=True)
def _poison_buffers():
    with config.override(poison=True):
        yield


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(time.time_ns() % 2**63)


def _hf_class(name: str) -> type:
    return getattr(
        importlib.import_module(f"transformers.models.{HF_CLASSES[name]}.modeling_{HF_CLASSES[name]}"), name
    )


def _semantics(name: str) -> str:
    return load_yaml("hf_norms.yaml")["classes"][name]


def _run(module, x, dy):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(HF_CLASSES))
def test_drop_in_matches_transformers(name, dtype, device, rng):
    semantics = _semantics(name)
    table = load_yaml("hf_norms.yaml")["semantics"][semantics]
    n, eps = 257, 1e-5
    hf = _hf_class(name)(n, eps=eps)
    with torch.no_grad():  # Gemma's weight is an offset from 1: keep it small there
        hf.weight.copy_(randn(rng, (n,), FP32, "cpu", 0.3, 0.0 if semantics == "gemma" else 1.0))
    hf = hf.to(device=device, dtype=dtype)
    ours = DROP_INS[table["drop_in"]](n, eps=0.5, device=device, dtype=dtype)
    ours.load_state_dict(hf.state_dict())
    setattr(ours, table["eps_attribute"], getattr(hf, table["eps_attribute"]))

    x = randn(rng, (2, 37, n), dtype, device, 2.0)
    dy = randn(rng, (2, 37, n), dtype, device)
    y_hf, dx_hf, dw_hf = _run(hf, x, dy)
    y, dx, dw = _run(ours, x, dy)

    offset, cast = FLAGS[semantics]
    x64 = x.double().requires_grad_()
    w64 = hf.weight.detach().double().requires_grad_()
    y64 = rms_norm_ref(x64, w64, eps, weight_offset=offset, cast_before_weight=cast, normed_dtype=dtype)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())

    seed = rng.initial_seed()
    assert (y.dtype, dx.dtype, dw.dtype) == (y_hf.dtype, dx_hf.dtype, dw_hf.dtype) == (dtype,) * 3
    for what, got, theirs, ref in (("y", y, y_hf, y64), ("dx", dx, dx_hf, dx64), ("dw", dw, dw_hf, dw64)):
        assert_close(theirs, ref.detach(), dtype, f"{name} transformers {what} vs float64", seed)
        assert_close(got, ref.detach(), dtype, f"{name} ours {what} vs float64", seed)
        assert_close(got, theirs, dtype, f"{name} ours {what} vs transformers", seed, tol=2 * TOL[dtype])
    if dtype != FP32:
        # Same math, same roundings: the outputs are the same numbers, bit for bit, except where
        # an fp32 statistic summed in another order lands next to a rounding boundary. Rounding
        # at another point (e.g. Llama's cast before the weight left out) changes ~1/4 of them.
        same = (y == y_hf).double().mean().item()
        assert same >= 0.99, f"{name} {dtype}: {same:.2%} of outputs equal to transformers' bit for bit"


def test_llama_output_dtype_follows_the_weight(device, rng):
    """LlamaRMSNorm with an fp32 weight on bf16 activations returns fp32 (weight * bf16 tensor
    promotes), and so does the drop-in, with the same values."""
    hf = _hf_class("LlamaRMSNorm")(96, eps=1e-6).to(device)
    with torch.no_grad():
        hf.weight.copy_(randn(rng, (96,), FP32, device, 0.3, 1.0))
    ours = LlamaRMSNorm(96, eps=1e-6, device=device)
    ours.load_state_dict(hf.state_dict())
    x = randn(rng, (5, 96), BF16, device)
    y_hf, y = hf(x), ours(x)
    assert y.dtype == y_hf.dtype == FP32
    # Both round the normalized x to bf16 before an fp32 product: a bf16 ulp apart at most.
    assert_close(y, y_hf, BF16, "llama mixed dtypes", rng.initial_seed())


@pytest.mark.parametrize(
    "offset,cast,path",
    [(1.0, True, "looped+split"), (0.0, True, "fused add"), (1.0, False, "fused add")],
)
def test_flags_on_every_kernel_path(offset, cast, path, device, rng):
    """The flags through the looped forward, the split backward (row constants, then column
    tiles) and the fused residual add, in bf16 against the float64 reference."""
    seed = rng.initial_seed()
    x = randn(rng, (19, 2300), BF16, device, 2.0)
    w = randn(rng, (2300,), BF16, device, 0.3, 0.0 if offset else 1.0)
    dy = randn(rng, (19, 2300), BF16, device)
    leaves = [x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
    refs = [t.double().requires_grad_() for t in (x, w)]
    if path == "looped+split":
        settings = {
            "norm_configs": {
                "fwd": row_config(4, 2, 1024, True, 1),
                "bwd_dots": kernel_config(4, BLOCK_N=1024),
                "bwd_split": kernel_config(4, BLOCK_M=2, BLOCK_N=1024, PROGS_PER_SM=4),
            },
            "norm_split_bwd_above": 1000,
        }
        with config.override(**settings):
            outs = [N.rms_norm(*leaves, 1e-6, weight_offset=offset, cast_before_weight=cast)]
            torch.autograd.backward(outs, [dy])
        ref_outs = [
            rms_norm_ref(*refs, 1e-6, weight_offset=offset, cast_before_weight=cast, normed_dtype=BF16)
        ]
        ref_grads = torch.autograd.grad(ref_outs, refs, [dy.double()])
    else:
        r = randn(rng, (19, 2300), BF16, device)
        dres = randn(rng, (19, 2300), BF16, device)
        leaves.append(r.detach().clone().requires_grad_())
        refs.append(r.double().requires_grad_())
        outs = list(
            N.fused_add_rms_norm(
                leaves[0], leaves[2], leaves[1], 1e-6, weight_offset=offset, cast_before_weight=cast
            )
        )
        torch.autograd.backward(outs, [dy, dres])
        ref_outs = list(
            fused_add_rms_norm_ref(
                refs[0],
                refs[2],
                refs[1],
                1e-6,
                residual_dtype=BF16,
                weight_offset=offset,
                cast_before_weight=cast,
            )
        )
        ref_grads = torch.autograd.grad(ref_outs, refs, [dy.double(), dres.double()])
    for i, (o, ref) in enumerate(zip(outs, ref_outs)):
        assert_close(o, ref.detach(), BF16, f"{path} output {i}", seed)
    for name, leaf, ref in zip(("dx", "dw", "dresidual"), leaves, ref_grads):
        assert_close(leaf.grad, ref, BF16, f"{path} {name}", seed)


@pytest.mark.parametrize("dtype", [FP16, FP32], ids=str)
def test_weight_offset_without_cast_is_gemma_math(dtype, device, rng):
    """rms_norm(weight_offset=1) is (normed · (1 + w)) in fp32, cast once: no rounding of the
    normalized x, unlike the Llama flag (checked at fp32 precision for fp32 inputs)."""
    x = randn(rng, (7, 300), dtype, device)
    w = randn(rng, (300,), dtype, device, 0.2)
    ref = rms_norm_ref(x.double(), w.double(), 1e-6, weight_offset=1.0)
    assert_close(N.rms_norm(x, w, 1e-6, weight_offset=1.0), ref, dtype, "gemma math", rng.initial_seed())
