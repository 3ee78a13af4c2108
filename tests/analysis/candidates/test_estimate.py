"""Shape models: touched bytes, GEMM tiles, attention layouts, kernel precisions."""

from __future__ import annotations

import pytest

from kerneltriage.analysis.candidates import estimate
from kerneltriage.analysis.candidates.estimate import (
    attention_case,
    fill,
    gemm_work,
    kernel_precision,
    op_work,
    simple_work,
)

BF16 = "c10::BFloat16"


def test_a_gated_activation_reads_its_input_and_writes_half_of_it():
    # sgl_kernel::silu_and_mul(out [T, N], x [T, 2N]): 3× the output bytes, not 5×
    w = simple_work("elementwise", [[15360, 12288], [15360, 24576]], [BF16, BF16], "sgl_kernel::silu_and_mul")
    assert w.bytes == 3 * 15360 * 12288 * 2


def test_a_rope_cache_is_counted_at_the_rows_the_positions_select():
    dims = [[888], [888, 512], [888, 64], [], [131072, 64], []]
    types = ["long int", BF16, BF16, "Scalar", BF16, "Scalar"]
    w = simple_work("elementwise", dims, types, "_C::rotary_embedding")
    touched = 888 * 8 + (888 * 512 + 888 * 64 + 888 * 64) * 2 + 888 * 512 * 2
    assert w.bytes == touched
    assert w.bytes < 131072 * 64 * 2  # the whole cache alone is larger


def test_a_kv_cache_is_counted_at_the_slots_written():
    # reshape_and_cache(key [T, H, D], value, key_cache [blocks, block, H, D], value_cache, slots [T])
    t, h, d = 64, 8, 128
    dims = [[t, h, d], [t, h, d], [4096, 16, h, d], [4096, 16, h, d], [t]]
    types = [BF16, BF16, BF16, BF16, "long int"]
    w = simple_work("elementwise", dims, types, "_C_cache_ops::reshape_and_cache")
    assert w.bytes == 4 * t * h * d * 2 + t * 8 + t * h * d * 2


def test_broadcast_inputs_count_once():
    w = simple_work("elementwise", [[8, 1024, 4096], [4096]], [BF16, BF16], "aten::add")
    assert w.bytes == (8 * 1024 * 4096 + 4096 + 8 * 1024 * 4096) * 2


def test_attention_ops_of_an_elementwise_kind_get_no_elementwise_model():
    dims = [[8192, 64, 64], [8192, 8, 64], [8192, 8, 64], [8192, 64, 64]]
    assert op_work("elementwise", "vllm::unified_attention_with_output", dims, [BF16] * 4, None, None) is None


def test_linear_like_library_gemms_are_modelled():
    w = gemm_work("aiter::gemm_a16w16", [[15360, 4096], [24576, 4096], []], [BF16, BF16, ""], None)
    assert w.flops == 2.0 * 15360 * 24576 * 4096 and w.precision == "bf16"
    assert gemm_work("aiter::gemm_a16w16", [[15360, 4096], [24576, 2048]], [BF16, BF16], None) is None


def test_small_gemm_outputs_cannot_fill_the_gpu():
    # a 1024×96 output is 16×2 tiles of 64×64: 32 of 108 SMs on an A100
    w = gemm_work("aten::linear", [[1024, 512], [96, 512], [96]], ["float"] * 3, None)
    assert w.tiles == 32
    assert fill(w.tiles, 108) == pytest.approx(32 / 108)
    assert fill(216, 108) == 1.0 and fill(109, 108) == pytest.approx(109 / 216)
    assert fill(None, 108) == 1.0


def test_flash_layout_attention_is_read_in_its_own_layout():
    # aten::_flash_attention_forward takes (batch, sequence, heads, head dim)
    dims = [[8, 4096, 16, 128]] * 3 + [[]] * 12
    concrete = ["", "", "", "", "", "4096", "4096", "0.", "False", "False", "0.088", "", "", "", ""]
    case = attention_case("aten::_flash_attention_forward", dims, [BF16] * 3 + [""] * 12, concrete)
    assert (case.q, case.seq_len, case.head_dim, case.causal) == ([8, 16, 4096, 128], 4096, 128, False)
    concrete[8] = "True"
    assert attention_case("aten::_flash_attention_forward", dims, [BF16] * 3 + [""] * 12, concrete).causal
    sdpa = attention_case(
        "aten::scaled_dot_product_attention",
        [[2, 12, 197, 64]] * 3,
        [BF16] * 3,
        ["", "", "", "", "", "False"],
    )
    assert (sdpa.seq_len, sdpa.head_dim) == (197, 64)


@pytest.mark.parametrize(
    ("name", "precision"),
    [
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)", "tf32"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32", "tf32"),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn", "bf16"),
        ("ampere_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", "fp16_tensor"),
        ("volta_sgemm_128x32_nt", "fp32"),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64", "bf16"),
        # CUTLASS templates spell the type, demangled and mangled (a grouped GEMM's operands).
        (
            "void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::kernel::"
            "GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::bfloat16_t",
            "bf16",
        ),
        ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS_10bfloat16_tE", "bf16"),
        ("attn_fwd", None),
    ],
)
def test_kernel_names_say_their_unit(name, precision):
    assert kernel_precision(name) == precision


def test_work_scaled_keeps_its_tiles():
    w = estimate.Work(10.0, 20.0, "bf16", 7).scaled(2.0, 2.0)
    assert (w.flops, w.bytes, w.tiles) == (20.0, 40.0, 7)


@pytest.fixture(scope="module")
def gpt_ops():
    """The first instance of each op-level group of the shipped GPT run (H200, autocast bf16)."""
    from pathlib import Path

    from kerneltriage.analysis.candidates.grouping import group_candidates
    from kerneltriage.analysis.rules import load_rules
    from kerneltriage.analysis.timeline.attribution import attribute
    from kerneltriage.ingest.source import load_profile

    timeline = load_profile(
        Path(__file__).resolve().parents[3] / "examples" / "runs" / "gpt-naive-h200"
    ).timelines[0]
    groups = group_candidates(timeline, attribute(timeline, None), load_rules())
    return [(g.kind, g.segments[0][1].ops[0]) for g in groups.values() if g.segments[0][1].level == "op"]


def test_an_autocast_linear_of_the_run_is_a_bf16_gemm(gpt_ops):
    """aten::linear records float inputs under autocast; its matmul computes in bf16: the
    QKV projection (8192 tokens × 1024 → 3072) moves bf16 operands and runs at the bf16 roof."""
    qkv = next(op for kind, op in gpt_ops if kind == "gemm" and op.dims[1] == [3072, 1024])
    assert qkv.types[:2] == ["float", "float"] and qkv.compute_type == "c10::BFloat16"
    w = estimate.op_work("gemm", qkv.name, qkv.dims, qkv.types, qkv.concrete, qkv.compute_type)
    m, k, n = 4 * 2048, 1024, 3072
    assert w.flops == 2.0 * m * k * n
    assert w.bytes == 2 * (m * k + n * k + m * n) and w.precision == "bf16"
    # Without the compute type the same op is an fp32 GEMM moving twice the bytes.
    fp32 = estimate.op_work("gemm", qkv.name, qkv.dims, qkv.types, qkv.concrete, None)
    assert fp32.flops == w.flops and fp32.bytes == 2 * w.bytes and fp32.precision == "fp32"


def test_the_runs_elementwise_and_embedding_ops_move_their_tensors_once(gpt_ops):
    by = {op.name: op for kind, op in gpt_ops if kind in ("elementwise", "embedding")}
    gelu = by["aten::gelu"]
    w = estimate.op_work("elementwise", gelu.name, gelu.dims, gelu.types, gelu.concrete, None)
    assert w.bytes == 2 * (4 * 2048 * 4096) * 2  # read x, write y, bf16
    # A mixed-precision residual add: an fp32 and a bf16 input, the output in fp32.
    add = by["aten::add"]
    assert add.types[:2] == ["float", "c10::BFloat16"]
    w = estimate.op_work("elementwise", add.name, add.dims, add.types, add.concrete, None)
    assert w.bytes == 4 * 2048 * 1024 * (4 + 2 + 4)
    # The embedding reads the rows it gathers and the indices, and writes the activations.
    emb = by["aten::embedding"]
    w = estimate.op_work("embedding", emb.name, emb.dims, emb.types, emb.concrete, None)
    tokens = 4 * 2048
    assert w.flops == 0.0 and w.bytes == 2 * tokens * 1024 * 4 + tokens * 8  # fp32 rows, int64 ids


def test_convolution_work_from_its_recorded_shapes():
    from kerneltriage.analysis.candidates.estimate import conv_work, op_work

    # ResNet-50's 1×1 convolution (V100 trace, fp32): 2·N·K·C·H·W FLOPs, input + weight + output bytes.
    dims = [[32, 256, 14, 14], [1024, 256, 1, 1], [], [], [], [], []]
    types = ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Int"]
    concrete = ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]
    w = op_work("convolution", "aten::conv2d", dims, types, concrete, None)
    assert w.flops == 2 * 32 * 1024 * 256 * 14 * 14
    assert w.bytes == 4 * (32 * 256 * 14 * 14 + 1024 * 256 + 32 * 1024 * 14 * 14) and w.precision == "fp32"
    # ConvNeXt's 7×7 depthwise convolution: one input channel per filter, padding 3, stride 1.
    dw = conv_work(
        "aten::conv2d",
        [[64, 96, 56, 56], [96, 1, 7, 7], [96]],
        ["c10::BFloat16"] * 3,
        ["", "", "", "[1, 1]", "[3, 3]", "[1, 1]", "96"],
        None,
    )
    assert dw.flops == 2 * 64 * 96 * 1 * 49 * 56 * 56 and dw.precision == "bf16"
    # Stride 2 without padding: the output is (56 − 3) // 2 + 1 = 27 wide.
    s2 = conv_work(
        "aten::conv2d", [[1, 8, 56, 56], [16, 8, 3, 3]], ["float"] * 2, ["", "", "", "[2, 2]", "[0, 0]"], None
    )
    assert s2.flops == 2 * 16 * 8 * 9 * 27 * 27
    assert conv_work("aten::conv2d", [[1, 8, 56, 56]], ["float"], [], None) is None


def test_grouped_mm_of_moe_experts_counts_the_tokens_and_every_expert_weight():
    from kerneltriage.analysis.candidates.estimate import op_work

    # Mixtral-class experts through torch._grouped_mm: 8192 routed rows, 8 experts of 4096→14336.
    dims = [[8192, 4096], [8, 4096, 14336], [8]]
    types = ["c10::BFloat16", "c10::BFloat16", "int"]
    w = op_work("gemm", "aten::_grouped_mm", dims, types, [], None)
    assert w.flops == 2 * 8192 * 4096 * 14336 and w.precision == "bf16"
    assert w.bytes == 2 * (8192 * 4096 + 8 * 4096 * 14336 + 8192 * 14336)
