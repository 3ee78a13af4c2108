"""GEMM alignment read from kernel names and recorded shapes (``library_advice._alignment_advice``):
a library GEMM below its roof whose N or K the aligned tensor-core kernels cannot take gets the
padding as its fix instead of max-autotune; where the trace records no shape (a CUDA graph
replays the GEMMs), the unaligned kernels say so, and a compiled program's Inductor pads them."""

from __future__ import annotations

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


def test_a_replayed_unaligned_gemm_in_a_compiled_program_gets_inductors_shape_padding():
    c = judge(graph_gemm(), A100)
    assert c.verdict == Verdict.USE_BUILTIN and "force_shape_pad" in c.builtin
    assert "100% of its time runs CUTLASS's unaligned" in c.note
    recipe = fixed(c)
    assert recipe["id"] == "inductor-shape-pad"
    assert recipe["apply"] == {"kind": "inductor-config", "settings": {"force_shape_pad": True}}
    assert "inductor_config.force_shape_pad = True" in recipe["text"]
    assert c.expected_saving_share > 0


def test_a_replayed_unaligned_gemm_outside_a_compiled_program_is_padded_by_hand():
    c = judge(graph_gemm(compiled=False), A100)
    assert c.verdict == Verdict.USE_BUILTIN and c.builtin.startswith("pad the GEMM dimension")
    recipe = fixed(c)
    assert (
        recipe["id"] == "gemm-pad" and recipe["apply"] is None and "apply by hand" in recipe["apply_why_not"]
    )
    assert "records no shape" in recipe["text"] and "torch.nn.functional.pad" in recipe["text"]


def test_aligned_or_unmeasured_replayed_gemms_keep_their_verdict():
    aligned = judge(graph_gemm(ALIGN4), A100)
    assert aligned.verdict == Verdict.COMPILE and "max-autotune" in aligned.builtin
    # No counters, no shape: no headroom to act on; the note still says what the names show.
    unmeasured = judge(graph_gemm(headroom=None), A100)
    assert unmeasured.verdict == Verdict.SKIP and "unaligned (align1/align2)" in unmeasured.note
    near = judge(graph_gemm(headroom=1.2), A100)
    assert near.verdict == Verdict.SKIP


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
