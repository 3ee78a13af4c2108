"""GEMM alignment read from kernel names and recorded shapes (``library_advice._alignment_advice``):
a library GEMM below its roof whose N or K the aligned tensor-core kernels cannot take gets the
padding as its fix instead of max-autotune; where the trace records no shape (a CUDA graph
replays the GEMMs), the unaligned kernels say so, and without counters what padding measured at
their precision (``gemm_alignment.yaml``) is the prediction."""

from __future__ import annotations

import pytest

from kerneltriage.analysis.fixes.attach import assign_fixes
from kerneltriage.analysis.fixes.fix_environment import Environment
from kerneltriage.analysis.gpus import spec_for
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.vocabulary import Verdict
from tests.analysis.judge.test_verdict import RULES, cand, judge, kernel

A100 = spec_for("A100-80GB", "test", "test")
ENV = Environment(torch="2.4", capability=(8, 0), bf16=True, vendor="nvidia")
# CUTLASS's TF32 GEMMs as a DLRM trace on an A100 spells them: the unaligned variant, and the
# aligned one of the same tile.
ALIGN1 = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_tn_align1>(cutlass_80_tensorop_s1688gemm_256x128_32x3_tn_align1::Params)"
ALIGN4 = ALIGN1.replace("align1", "align4")
ALIGN1_BF16 = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x128_32x3_tn_align2>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x128_32x3_tn_align2::Params)"
F32 = "float"


def linear(m: int, n: int, k: int) -> dict:
    return {"name": "aten::linear", "dims": [[m, k], [n, k], [n]], "types": [F32] * 3, "concrete": [""] * 3}


def graph_gemm(name: str = ALIGN1, headroom: float | None = 3.0, compiled: bool = True) -> Candidate:
    """A GEMM kernel a CUDA graph replays: no op, no shape; its counters give the headroom."""
    c = cand("gemm", headroom=headroom, share=0.08, ops=(), kernels=(kernel(name),), compiled=compiled)
    c.level = "kernel"
    return c


def fixed(c: Candidate) -> dict:
    """Its recipe as the report attaches it, with the text it prints."""
    assign_fixes([c], RULES, ENV)
    assert c.recipe is not None and c.fix is not None
    return {**c.recipe, "text": c.fix}


def test_a_replayed_unaligned_gemm_in_a_compiled_program_is_padded_by_hand_too():
    # Inductor's force_shape_pad measured next to nothing at unaligned shapes (TF32 on an H100:
    # 0.91-1.06x over its default, gemm_alignment.yaml), so the layer is padded by hand.
    c = judge(graph_gemm(), A100)
    assert c.verdict == Verdict.USE_BUILTIN and c.builtin.startswith("pad the GEMM dimension")
    assert "100% of its time runs CUTLASS's unaligned" in c.note
    assert "force_shape_pad gained only 0.91–1.06× over its default" in c.note
    recipe = fixed(c)
    assert recipe["id"] == "gemm-pad" and recipe["apply"] is None
    assert c.expected_saving_share == pytest.approx(0.08 * (1 - 1 / 3.0))


def test_a_replayed_unaligned_gemm_outside_a_compiled_program_is_padded_by_hand():
    c = judge(graph_gemm(compiled=False), A100)
    assert c.verdict == Verdict.USE_BUILTIN and c.builtin.startswith("pad the GEMM dimension")
    assert "force_shape_pad" not in c.note
    recipe = fixed(c)
    assert (
        recipe["id"] == "gemm-pad" and recipe["apply"] is None and "apply by hand" in recipe["apply_why_not"]
    )
    assert "records no shape" in recipe["text"] and "torch.nn.functional.pad" in recipe["text"]


def test_aligned_or_near_roof_replayed_gemms_keep_their_verdict():
    aligned = judge(graph_gemm(ALIGN4), A100)
    assert aligned.verdict == Verdict.COMPILE and "max-autotune" in aligned.builtin
    near = judge(graph_gemm(headroom=1.2), A100)
    assert near.verdict == Verdict.SKIP


def test_without_counters_tf32_padding_is_predicted_from_what_it_measured_and_stays_a_note():
    # TF32: padding K=2798 measured 2.919 -> 2.220 ms on an H100, 1.31x, the least of the four
    # TF32 cases: below the rules' 2x, so no verdict, and the note says what it would take.
    c = judge(graph_gemm(headroom=None), A100)
    assert c.verdict == Verdict.SKIP and "unaligned (align1/align2)" in c.note
    saving = 0.08 * (1 - 2.220 / 2.919)
    assert "padding measured 1.31× faster at K=2798 (a DLRM top MLP), tf32, on an H100" in c.note
    assert f"about {saving:.1%} of the step" in c.note
    assert c.expected_saving_share == 0.0


def test_without_counters_bf16_padding_is_a_fix_with_the_measured_prediction():
    # bf16: the least padding gained is 2.73x (N=30522): hot and past the rules' 2x, the
    # padding is the fix, its saving share × (1 − 1/2.73), the headroom condition saying why.
    c = judge(graph_gemm(name=ALIGN1_BF16, headroom=None, compiled=False), A100)
    assert c.verdict == Verdict.USE_BUILTIN and c.builtin.startswith("pad the GEMM dimension")
    gain = 1.685 / 0.618
    assert c.expected_saving_share == pytest.approx(0.08 * (1 - 1 / gain))
    head = c.conditions["headroom"]
    assert head.passed and head.value == pytest.approx(gain)
    assert "no counters and no shape: padding measured 2.73× faster at N=30522" in head.detail
    assert "the least padding gained at that precision" in c.attrs["saving_basis"]
    assert fixed(c)["id"] == "gemm-pad"
    # The same GEMMs on 0.1% of the step: cold, no verdict and no padding line.
    cold = cand("gemm", headroom=None, share=0.001, ops=(), kernels=(kernel(ALIGN1_BF16),), compiled=False)
    cold.level = "kernel"
    judge(cold, A100)
    assert cold.verdict == Verdict.SKIP and "unaligned (align1/align2)" in cold.note
    assert "padding measured" not in cold.note
    # Hot, but on twenty shapes: no verdict; the note says what padding would take.
    unstable = cand(
        "gemm", headroom=None, share=0.08, distinct=20, ops=(), kernels=(kernel(ALIGN1_BF16),), compiled=False
    )
    unstable.level = "kernel"
    judge(unstable, A100)
    assert unstable.conditions["stability"].passed is False
    assert unstable.verdict == Verdict.SKIP and "padding measured 2.73×" in unstable.note


def test_a_recorded_k_off_the_multiple_is_padded_to_it():
    # fp32 operands (TF32): K 647 is not a multiple of 4; N=30 is not either.
    c = cand("gemm", headroom=3.0, share=0.08, ops=("aten::linear",), kernels=(kernel(ALIGN1),))
    c.example = [linear(98304, 30, 647)]
    c.roofline.precision = "tf32"
    judge(c, A100)
    assert c.verdict == Verdict.USE_BUILTIN and c.builtin == "pad K=647 → 648, N=30 → 32"
    recipe = fixed(c)
    assert recipe["id"] == "gemm-pad" and recipe["apply"] is None
    assert "x = torch.nn.functional.pad(x, (0, 1))  # K 647 → 648" in recipe["text"]
    assert "out_features 30 → 32" in recipe["text"]


def test_an_unaligned_linear_layer_is_padded_by_the_runner():
    # GPT-2's lm_head (bf16 under autocast): N=50257. A Linear's N and K are known, so the runner
    # pads its GEMM (gemm-pad-linear) and verify can measure the padding; any other layer, or one
    # of unknown dimensions, stays a fix by hand.
    c = cand("gemm", headroom=6.4, share=0.168, ops=("aten::linear",), kernels=(kernel(ALIGN1_BF16),))
    c.example = [linear(8192, 50257, 1024)]
    c.roofline.precision = "bf16"
    c.module = "lm_head (Linear)"
    judge(c, A100)
    assert c.verdict == Verdict.USE_BUILTIN and c.builtin == "pad N=50257 → 50264"
    recipe = fixed(c)
    assert recipe["id"] == "gemm-pad-linear"
    assert recipe["apply"] == {"kind": "gemm-pad", "modules": "lm_head", "multiple": 64}
    assert "out_features 50257 → 50264" in recipe["text"]
    assert "verify pads this layer's GEMM to a multiple of 64" in recipe["text"]
    c.module, c.recipe, c.fix = "transformer.h.*.attn.c_attn (Conv1D)", None, None
    assert fixed(c)["id"] == "gemm-pad" and fixed(c)["apply"] is None


def test_fp32_simt_gemms_name_the_tensor_unit_the_gpu_has():
    """A hot FP32 SIMT GEMM: TF32 where the GPU has it, bf16 autocast on AMD's CDNA2 (bf16 matrix
    units, no TF32), fp16 with a loss scaler on a V100 (its bf16 is emulated)."""
    wanted = {
        "A100-80GB": "TF32 or bf16 autocast",
        "MI250": "bf16 autocast",
        "V100-SXM2": "fp16 autocast with a GradScaler",
    }
    for key, fix in wanted.items():
        c = cand("gemm", headroom=1.02, kernels=(kernel("ampere_sgemm_128x64_nn"),), library_op="aten::mm")
        judge(c, spec_for(key, "test", "test"))
        assert (c.verdict, c.builtin) == (Verdict.USE_BUILTIN, fix), key
        assert c.expected_saving_share > 0
