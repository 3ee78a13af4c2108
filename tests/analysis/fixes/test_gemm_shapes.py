"""A GEMM candidate's (M, N, K) from its recorded op: a Linear's, and none for a convolution a
GEMM kernel ran (timm ResNet-50's 1×1 convolutions, whose filter [O, C, 1, 1] read as a
matmul operand gave N=1 and a Linear's padding advice)."""

from __future__ import annotations

from types import SimpleNamespace

from kerneltriage.analysis.fixes.gemm_shapes import gemm_dims

BF = "c10::BFloat16"


def _op(name: str, dims: list, types: list) -> SimpleNamespace:
    return SimpleNamespace(example=[{"name": name, "dims": dims, "types": types}])


def test_a_linear_reads_as_tokens_by_out_by_in_features():
    c = _op("aten::linear", [[8, 1024, 768], [50257, 768], []], [BF, BF, ""])
    assert gemm_dims(c) == (8 * 1024, 50257, 768, BF)


def test_an_op_of_activation_and_weight_reads_as_a_matmul():
    c = _op("aten::mm", [[4096, 2613], [2613, 512]], ["float", "float"])
    assert gemm_dims(c) == (4096, 512, 2613, "float")


def test_a_convolution_run_as_a_gemm_has_no_gemm_dims():
    for name in ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution"):
        c = _op(name, [[128, 64, 56, 56], [256, 64, 1, 1], []], [BF, BF, ""])
        assert gemm_dims(c) is None, name
