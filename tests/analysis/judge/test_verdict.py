"""Every verdict and every reason ``verdict.decide`` can give, one row of the table each: a
minimal candidate built to reach that branch, judged with the shipped rules on the shipped
GPU and attention tables. The vocabulary must equal what the table reaches, so a new verdict
or reason without a row here fails."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kerneltriage.analysis.candidates.estimate import attention_work
from kerneltriage.analysis.gpus import GPUSpec, spec_for
from kerneltriage.analysis.judge import attention_choice
from kerneltriage.analysis.judge.verdict import decide
from kerneltriage.analysis.model import Candidate, KernelInfo, Roofline, Shapes
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.vocabulary import Reason, Verdict

RULES = load_rules()
H100 = spec_for("H100-SXM", "test", "test")
H200 = spec_for("H200", "test", "test")
BF = "c10::BFloat16"
FLASH = "flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::bfloat16_t>, false>"
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0"
# SDPA on H100 at B=8, H=16, S=1024, D=64, non-causal: the H100 table measures it (S=1024 row).
SDPA_OP = {
    "name": "aten::scaled_dot_product_attention",
    "dims": [[8, 16, 1024, 64]] * 3 + [[], [], []],
    "types": [BF] * 3 + ["", "Scalar", "Scalar"],
    "concrete": ["", "", "", "", "0.", "False"],
}
# timm EfficientNet-B0's first BatchNormAct2d as an H200 recorded it (channels-last, bf16):
# the num_batches_tracked increment, the norm in training, its SiLU.
BN_X = [128, 32, 112, 112]
BN_COUNT = {
    "name": "aten::add_",
    "dims": [[], [], []],
    "types": ["long int", "long int", "Scalar"],
    "concrete": ["", "", "1"],
}
BN_TRAIN = {
    "name": "aten::batch_norm",
    "dims": [BN_X, [32], [32], [32], [32], [], [], [], []],
    "types": [BF, "float", "float", "float", "float", "Scalar", "Scalar", "Scalar", "Scalar"],
    "concrete": ["", "", "", "", "", "True", "0.1", "1e-05", "True"],
}
BN_SILU = {"name": "aten::silu_", "dims": [BN_X], "types": [BF], "concrete": [""]}
SDPA_FLOPS = attention_work([8, 16, 1024, 64], [8, 16, 1024, 64], [8, 16, 1024, 64], BF, False).flops


def cand(
    kind: str = "elementwise",
    headroom: float | None = 5.0,
    share: float = 0.2,
    time_ms: float = 10.0,
    source: str = "ncu",
    distinct: int = 1,
    kernels: tuple[KernelInfo, ...] = (),
    ops: tuple[str, ...] = ("aten::add",),
    example: tuple[dict, ...] = (),
    variant: str | None = None,
    **attrs,
) -> Candidate:
    """A candidate as ``candidates.build`` leaves it: its time, shapes and roofline measured,
    no condition or verdict yet."""
    roofline = Roofline(
        None, None, None, None, None, "memory", time_ms / headroom if headroom else None, source
    )
    c = Candidate(
        id="",
        name="subject",
        kind=kind,
        level="op",
        variant=variant,
        time_ms_per_step=time_ms,
        time_share=share,
        gpu_share=share,
        fwd_ms_per_step=time_ms,
        bwd_ms_per_step=0.0,
        instances_per_step=1.0,
        ops=list(ops),
        module=None,
        kernels=list(kernels),
        roofline=roofline,
        headroom=headroom,
        shapes=Shapes(
            distinct, 0.0, [], [{"shape": str(i), "share": 1.0 / distinct} for i in range(distinct)]
        ),
        conditions={},
        example=list(example),
    )
    # The keys the report reads are typed fields; the rest stay analysis-internal attrs.
    for key in ("full_name", "compiled", "inductor", "fused_ops", "q"):
        if key in attrs:
            setattr(c, key, attrs.pop(key))
    c.attrs.update(attrs)
    return c


def kernel(name: str, ms: float = 10.0) -> KernelInfo:
    return KernelInfo(name, name, 1.0, ms, "fwd", True)


def launch_bound(c: Candidate, near: bool = True) -> Candidate:
    """Its launches set its time: within the rules' near_floor of the launch floor, or not."""
    floor = c.time_ms_per_step / (2.0 if near else 10.0)
    c.roofline = replace(c.roofline, launch_bound=True, launches_per_step=100.0, launch_floor_ms=floor)
    return c


def library_attention(backend: str, tflops: float, **kw) -> Candidate:
    """A FlashAttention or cuDNN attention candidate running at ``tflops`` on the H100 case."""
    return cand(
        "attention",
        headroom=None,
        time_ms=SDPA_FLOPS / (tflops * 1e12) * 1e3,
        kernels=(kernel(FLASH if backend == "flash" else CUDNN),),
        ops=("aten::scaled_dot_product_attention",),
        example=(SDPA_OP,),
        **kw,
    )


# SDPA on H100 at S=512: below the S=1024–8192 the H100 table measures.
SDPA_512 = {**SDPA_OP, "dims": [[32, 16, 512, 64]] * 3 + [[], [], []]}
SDPA_512_FLOPS = attention_work([32, 16, 512, 64], [32, 16, 512, 64], [32, 16, 512, 64], BF, False).flops
# T5-base under bf16 autocast: its fp32 position bias, a permuted view (stride 12 on its last
# dimension, as an H100 recorded it), keeps SDPA on its math path (fp32 GEMMs, softmax<float>).
T5_SDPA = {
    "name": "aten::scaled_dot_product_attention",
    "dims": [[32, 12, 512, 64]] * 3 + [[1, 12, 512, 512], [], [], []],
    "types": [BF] * 3 + ["float", "Scalar", "Scalar", "Scalar"],
    "concrete": ["", "", "", "", "0.", "False", ""],
    "strides": [[393216, 64, 768, 1]] * 3 + [[12, 1, 6144, 12], [], [], []],
}
T5_FLOPS = attention_work([32, 12, 512, 64], [32, 12, 512, 64], [32, 12, 512, 64], BF, False).flops
SGEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_cublas"
SOFTMAX_F32 = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 9, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"


def t5_attention(tflops: float = 15.4, **kw) -> Candidate:
    """T5's SDPA on its math path at ``tflops`` (fwd only): 80% GEMM, 20% softmax time."""
    ms = T5_FLOPS / (tflops * 1e12) * 1e3
    return cand(
        "attention",
        headroom=None,
        time_ms=ms,
        kernels=(kernel(SGEMM, 0.8 * ms), kernel(SOFTMAX_F32, 0.2 * ms)),
        ops=("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math", "aten::bmm"),
        example=(T5_SDPA,),
        **kw,
    )


def short_library_attention(tflops: float, backend: str = "cudnn", **kw) -> Candidate:
    """cuDNN (or FlashAttention) attention at S=512 on an H100 (no measured row) at ``tflops``."""
    return cand(
        "attention",
        headroom=None,
        time_ms=SDPA_512_FLOPS / (tflops * 1e12) * 1e3,
        kernels=(kernel(FLASH if backend == "flash" else CUDNN),),
        ops=("aten::scaled_dot_product_attention",),
        example=(SDPA_512,),
        **kw,
    )


def naive_attention(**attrs) -> Candidate:
    return cand("attention", ops=("aten::matmul", "aten::softmax"), written="naive", **attrs)


def inductor(headroom: float | None = 5.0, **kw) -> Candidate:
    return cand("other", headroom=headroom, source="estimate", inductor=True, **kw)


# (case, the candidate, the GPU, the verdict and reason it must get)
CASES: list[tuple[str, Candidate, GPUSpec | None, Verdict, Reason]] = [
    ("rules' skip: collectives", cand("communication"), H100, Verdict.SKIP, Reason.COMMUNICATION),
    ("rules' skip: copies", cand("memcpy"), H100, Verdict.SKIP, Reason.NOT_A_KERNEL),
    ("cold", cand(share=0.001), H100, Verdict.SKIP, Reason.COLD),
    ("faster than its ceiling", cand(headroom=0.5), H100, Verdict.SKIP, Reason.CEILING_DISAGREES),
    (
        "vendor kernels, no ceiling",
        cand(headroom=None, vendor_share=0.9),
        H100,
        Verdict.SKIP,
        Reason.LIBRARY_KERNEL,
    ),
    ("no ceiling", cand(headroom=None), H100, Verdict.SKIP, Reason.NO_CEILING),
    (
        "shape model far off",
        cand(headroom=100.0, source="estimate"),
        H100,
        Verdict.SKIP,
        Reason.ESTIMATE_FAILED,
    ),
    ("launch-bound, below its floor", launch_bound(cand()), H100, Verdict.COMPILE, Reason.LAUNCH_BOUND),
    ("launch-bound at its floor", launch_bound(cand(headroom=1.5)), H100, Verdict.SKIP, Reason.LAUNCH_BOUND),
    ("at its roof", cand(headroom=1.02), H100, Verdict.SKIP, Reason.AT_ROOF),
    (
        "a library op at its roof",
        cand(headroom=1.02, library_op="aten::mm"),
        H100,
        Verdict.SKIP,
        Reason.LIBRARY_AT_ROOF,
    ),
    ("short of min_headroom", cand(headroom=1.5), H100, Verdict.SKIP, Reason.LOW_HEADROOM),
    ("unstable shapes", cand(distinct=10), H100, Verdict.SKIP, Reason.UNSTABLE_SHAPES),
    ("elementwise: compile", cand(), H100, Verdict.COMPILE, Reason.ALL_CONDITIONS),
    (
        "eager RMSNorm: the built-in",
        cand("norm", variant="rmsnorm"),
        H100,
        Verdict.USE_BUILTIN,
        Reason.ALL_CONDITIONS,
    ),
    ("no template: write", cand("other", ops=("my::op",)), H100, Verdict.WRITE, Reason.ALL_CONDITIONS),
    (
        "already the fused norm",
        cand("norm", variant="rmsnorm", ops=("aten::rms_norm",)),
        H100,
        Verdict.COMPILE,
        Reason.ALREADY_USES,
    ),
    (
        "ATen's LayerNorm alone: no fix of its own measured to take its headroom",
        cand("norm", variant="layernorm", ops=("aten::layer_norm",)),
        H100,
        Verdict.SKIP,
        Reason.ALREADY_FUSED,
    ),
    (
        "ATen's LayerNorm inside a region: a compile fuses its neighbours",
        replace(cand("norm", variant="layernorm", ops=("aten::to", "aten::layer_norm")), level="region"),
        H100,
        Verdict.COMPILE,
        Reason.ALREADY_USES,
    ),
    (
        "ATen's batch norm in training, its num_batches_tracked add aside: nothing to fuse",
        replace(
            cand("norm", ops=("aten::add_", "aten::batch_norm"), example=(BN_COUNT, BN_TRAIN)), level="region"
        ),
        H100,
        Verdict.SKIP,
        Reason.ALREADY_FUSED,
    ),
    (
        "ATen's batch norm with the SiLU after it: a compile fuses the activation",
        replace(
            cand(
                "norm",
                ops=("aten::add_", "aten::batch_norm", "aten::silu_"),
                example=(BN_COUNT, BN_TRAIN, BN_SILU),
            ),
            level="region",
        ),
        H100,
        Verdict.COMPILE,
        Reason.ALREADY_USES,
    ),
    (
        "naive softcap attention",
        naive_attention(softcap=50.0),
        H100,
        Verdict.USE_BUILTIN,
        Reason.VARIANT_NEEDS_BUILTIN,
    ),
    (
        "naive attention, no benchmark, SDPA's backends measured",
        naive_attention(head_dim=64, mask="none", q=[8, 16, 1024, 64]),
        H100,
        Verdict.USE_BUILTIN,
        Reason.SDPA_BEST_BACKEND,
    ),
    (
        "naive attention, nothing measured",
        naive_attention(head_dim=96, mask="none", q=[8, 16, 1024, 96]),
        H100,
        Verdict.USE_BUILTIN,
        Reason.NO_BUILTIN_BENCHMARK,
    ),
    (
        "naive attention, SDPA faster",
        naive_attention(head_dim=64, mask="none"),
        H200,
        Verdict.USE_BUILTIN,
        Reason.SDPA_FASTER,
    ),
    # The shipped table measures SDPA faster everywhere: the built-in's row comes from a patch below.
    (
        "naive attention, built-in faster",
        naive_attention(head_dim=64, mask="none"),
        H200,
        Verdict.USE_BUILTIN,
        Reason.BUILTIN_FASTER,
    ),
    (
        "library attention, no shapes",
        cand("attention", headroom=None, kernels=(kernel(FLASH),)),
        H100,
        Verdict.SKIP,
        Reason.NO_CEILING,
    ),
    (
        "library attention above the table",
        library_attention("cudnn", 500.0),
        H100,
        Verdict.SKIP,
        Reason.CEILING_DISAGREES,
    ),
    (
        "library attention, cold",
        library_attention("flash", 100.0, share=0.001),
        H100,
        Verdict.SKIP,
        Reason.COLD,
    ),
    (
        "FlashAttention where cuDNN is faster",
        library_attention("flash", 280.0),
        H100,
        Verdict.USE_BUILTIN,
        Reason.FASTER_BACKEND,
    ),
    (
        "library attention far below the best",
        library_attention("flash", 100.0),
        H100,
        Verdict.WRITE,
        Reason.BELOW_BEST_RATE,
    ),
    (
        "cuDNN attention at the best rate",
        library_attention("cudnn", 400.0),
        H100,
        Verdict.SKIP,
        Reason.LIBRARY_AT_ROOF,
    ),
    (
        "cuDNN attention a little below",
        library_attention("cudnn", 300.0),
        H100,
        Verdict.SKIP,
        Reason.LOW_HEADROOM,
    ),
    (
        "library attention outside the table: first principles",
        short_library_attention(90.0),
        H100,
        Verdict.WRITE,
        Reason.BELOW_FIRST_PRINCIPLES,
    ),
    (
        "SDPA on its fp32 math path",
        t5_attention(),
        H100,
        Verdict.USE_BUILTIN,
        Reason.MATH_PATH,
    ),
    ("Inductor kernel below its roof", inductor(), H100, Verdict.WRITE, Reason.ALL_CONDITIONS),
    ("Inductor kernel at its roof", inductor(1.02), H100, Verdict.SKIP, Reason.COMPILED_AT_ROOF),
    ("Inductor kernel, cold", inductor(share=0.001), H100, Verdict.SKIP, Reason.COLD),
    (
        "Inductor kernel, no ceiling",
        inductor(None, estimate="an opaque extern call"),
        H100,
        Verdict.SKIP,
        Reason.NO_CEILING,
    ),
    ("Inductor kernel, estimate far off", inductor(100.0), H100, Verdict.SKIP, Reason.ESTIMATE_FAILED),
    ("Inductor kernel faster than its estimate", inductor(0.5), H100, Verdict.SKIP, Reason.CEILING_DISAGREES),
    ("Inductor kernel, launch-bound", launch_bound(inductor()), H100, Verdict.COMPILE, Reason.LAUNCH_BOUND),
    (
        "Inductor kernel at its launch floor",
        launch_bound(inductor(1.5)),
        H100,
        Verdict.SKIP,
        Reason.LAUNCH_BOUND,
    ),
    ("Inductor kernel a little below", inductor(1.5), H100, Verdict.SKIP, Reason.LOW_HEADROOM),
    ("Inductor kernel, unstable shapes", inductor(distinct=10), H100, Verdict.SKIP, Reason.UNSTABLE_SHAPES),
    (
        "FP32 SIMT GEMM on tensor cores",
        cand("gemm", headroom=1.02, kernels=(kernel("ampere_sgemm_128x64_nn"),), library_op="aten::mm"),
        H100,
        Verdict.USE_BUILTIN,
        Reason.FP32_OFF_TENSOR_CORES,
    ),
]


def judge(c: Candidate, gpu: GPUSpec | None) -> Candidate:
    """``c`` judged beside a hotter candidate (a collective), as in a real report."""
    other = cand("communication", share=0.5, time_ms=25.0)
    decide([c, other], RULES, gpu)
    return c


@pytest.fixture
def builtin_faster(monkeypatch, request):
    if "built-in faster" in request.node.callspec.id:
        monkeypatch.setattr(attention_choice, "attention_perf", lambda gpu, head_dim, causal: (300.0, 400.0))


@pytest.mark.parametrize(("name", "c", "gpu", "verdict", "reason"), CASES, ids=[case[0] for case in CASES])
def test_every_branch_gives_its_verdict_and_reason(builtin_faster, name, c, gpu, verdict, reason):
    judge(c, gpu)
    assert (c.verdict, Reason.of(c.reason)) == (verdict, reason), (name, c.reason, c.note)
    assert type(c.verdict) is Verdict
    # On the wire a member is its value: JSON, f-strings and str() give the word itself.
    assert json.loads(json.dumps({"verdict": c.verdict, "reason": c.reason})) == {
        "verdict": verdict.value,
        "reason": str(c.reason),
    }
    assert f"{c.verdict}" == str(c.verdict) == verdict.value


def test_the_table_reaches_the_whole_vocabulary():
    assert {case[3] for case in CASES} == set(Verdict)
    assert {case[4] for case in CASES} == set(Reason)


def test_reason_texts_are_the_words_the_report_always_gave():
    """Codes are the bare word; sentences read as before the vocabulary existed."""
    cold = judge(cand(share=0.001), H100)
    assert cold.reason == "cold" and cold.note == ""
    norm = judge(cand("norm", variant="rmsnorm", ops=("aten::rms_norm",)), H100)
    assert norm.reason == (
        "all three conditions hold; it already uses aten::rms_norm, which runs well below its ceiling here"
    )
    switch = judge(library_attention("flash", 280.0), H100)
    assert switch.reason.startswith("cudnn measured faster here (") and switch.reason.endswith(
        "TFLOP/s for flash at S=1024, the S=1024 row)"
    )
    assert switch.builtin.startswith("SDPA's cuDNN backend")
    written = judge(inductor(), H100)
    assert (
        written.reason
        == "all three conditions hold; Inductor's kernel reaches 20% of its memory-bound ceiling"
    )
    # A skip the rules give keeps the rules' word; a made-up one is read back as nothing.
    assert Reason.of("not-a-kernel") is Reason.NOT_A_KERNEL and Reason.of("my-own-reason") is None


def test_the_cutoffs_decide_where_the_rules_put_them():
    """The verdicts read their cut-offs from the rules: moving one moves the verdict."""
    tight = load_rules()
    assert tight.thresholds.at_roof == 1.1 and tight.cutoffs.switch_ratio == 1.15
    c = cand(headroom=1.02)
    decide([c, cand("communication", share=0.5)], tight, H100)
    assert c.reason == Reason.AT_ROOF
    loose = replace(tight, thresholds=replace(tight.thresholds, at_roof=1.0))  # 1.02 shows as 1.0×
    c = cand(headroom=1.02)
    decide([c, cand("communication", share=0.5)], loose, H100)
    assert c.reason == Reason.LOW_HEADROOM
    # FlashAttention at 280 of cuDNN's 416: switched at 1.15×, kept (write) at a 1.5× ratio.
    c = library_attention("flash", 280.0)
    decide(
        [c, cand("communication", share=0.5)],
        replace(tight, cutoffs=replace(tight.cutoffs, switch_ratio=1.5)),
        H100,
    )
    assert c.verdict == Verdict.SKIP and c.reason == Reason.LOW_HEADROOM


def test_attention_outside_the_table_is_judged_from_first_principles():
    """S=512 lies below the H100 rows: a ceiling from its FLOPs and bytes, not no ceiling."""
    c = judge(short_library_attention(90.0), H100)
    assert c.headroom is not None and c.roofline.source == "first principles"
    basis = c.attrs["headroom_basis"]
    assert basis["kind"] == "first-principles ceiling" and basis["first_principles"]["unit"] == "bf16"
    rate = basis["first_principles"]["tflops"]
    # Its FLOPs at 60% of the achievable bf16 rate, capped below the table's lengths at the best
    # rate measured at its shortest one (cuDNN forward at S=1024, D=64: 416 TFLOP/s).
    assert 0.6 * H100.ceiling_tflop("bf16") > rate == pytest.approx(416.0, rel=1e-3)
    assert basis["first_principles"]["capped_by"] == {"seq_len": 1024, "backend": "cudnn"}
    assert c.headroom == pytest.approx(rate / 90.0, rel=0.02)  # compute-bound at S=512
    # FlashAttention there: cuDNN is faster at every length the H100 table measured, so the
    # verdict is the backend switch, predicted at their ratio at the shortest row.
    flash = judge(short_library_attention(90.0, backend="flash"), H100)
    assert flash.verdict == Verdict.USE_BUILTIN and "CUDNN_ATTENTION" in flash.builtin
    assert "S=1024, the shortest row (S=512 is shorter" in flash.reason
    assert flash.expected_saving_share == pytest.approx(0.2 * (1 - 283 / 416), rel=1e-3)
    # A head dim never measured: no row to cap it, 60% of the achievable bf16 rate.
    d96 = {**SDPA_512, "dims": [[32, 16, 512, 96]] * 3 + [[], [], []]}
    other = judge(replace(short_library_attention(90.0), example=[d96]), H100)
    fp = other.attrs["headroom_basis"]["first_principles"]
    assert fp["tflops"] == pytest.approx(0.6 * H100.ceiling_tflop("bf16"), rel=1e-3) and "capped_by" not in fp
    assert "S=512 lies outside" in c.conditions["headroom"].detail
    # Near the first-principles rate it is at its roof, not a kernel to write.
    near = judge(short_library_attention(0.99 * rate), H100)
    assert near.verdict == Verdict.SKIP and near.reason == Reason.LIBRARY_AT_ROOF


def test_the_backends_to_try_first_are_the_vendors_own():
    """Below the first-principles ceiling with no backend rate measured on the GPU: the note names
    the attention kernels that GPU's vendor ships, never cuDNN on an AMD GPU."""
    d96 = {**SDPA_512, "dims": [[32, 16, 512, 96]] * 3 + [[], [], []]}
    nvidia = judge(replace(short_library_attention(90.0), example=[d96]), H100)
    assert (nvidia.verdict, Reason.of(nvidia.reason)) == (Verdict.WRITE, Reason.BELOW_FIRST_PRINCIPLES)
    assert "cuDNN" in nvidia.note and "preferred_rocm_fa_library" not in nvidia.note
    mi300x = spec_for("MI300X", "test", "test")
    aotriton = replace(short_library_attention(60.0), kernels=(kernel("attn_fwd"),))
    amd = judge(aotriton, mi300x)
    assert (amd.verdict, Reason.of(amd.reason)) == (Verdict.WRITE, Reason.BELOW_FIRST_PRINCIPLES)
    assert 'preferred_rocm_fa_library("ck")' in amd.note and "aiter" in amd.note and "cuDNN" not in amd.note


def test_sdpa_math_path_is_a_finding_with_its_cause_and_an_edit():
    """T5: fp32 GEMMs and softmax<float> under SDPA, an fp32 position bias beside bf16 q."""
    c = judge(t5_attention(), H100)
    assert c.verdict == Verdict.USE_BUILTIN and Reason.of(c.reason) == Reason.MATH_PATH
    assert "position bias (1x12x512x512) is fp32 while q is bf16" in c.reason
    assert "is a permuted view, stride 12 on its last dimension" in c.reason
    assert c.roofline.source == "first principles" and c.roofline.precision in ("fp32", "tf32")
    assert c.attrs["math_path"]["unit"] in ("fp32", "tf32")
    # A position bias leaves SDPA its memory-efficient kernels: predicted at their measured
    # forward rate on the H100 at the shortest length measured (S=1024, D=64: 128 TFLOP/s).
    assert c.expected_saving_share == pytest.approx(0.2 * (1 - 15.4 / 128.0), rel=0.02)
    assert "efficient's rate measured at S=1024" in c.attrs["saving_basis"]
    assert c.fix and c.fix.startswith("attn_mask = attn_mask.to(q.dtype).contiguous()")
    # The cast and the layout are what the runner applies (verify measures it), not an edit by hand.
    assert c.recipe["id"] == "sdpa-mask" and c.recipe["apply"] == {"kind": "sdpa-mask"}
    # Either cause alone is found and fixed on its own: a contiguous fp32 bias, a permuted bf16 one.
    contiguous = {**T5_SDPA, "strides": [[393216, 64, 768, 1]] * 3 + [[3145728, 262144, 512, 1], [], [], []]}
    dtype_only = judge(replace(t5_attention(), example=(contiguous,)), H100)
    assert "is fp32 while q is bf16" in dtype_only.reason and "permuted" not in dtype_only.reason
    assert dtype_only.recipe["id"] == "sdpa-mask"
    permuted_bf16 = {**T5_SDPA, "types": [BF] * 4 + ["Scalar"] * 3}
    layout_only = judge(replace(t5_attention(), example=(permuted_bf16,)), H100)
    assert "permuted view, stride 12" in layout_only.reason and "while q is" not in layout_only.reason
    assert layout_only.recipe["id"] == "sdpa-mask"
    # A trace without strides says the dtype only, as before.
    unstrided = {k: v for k, v in T5_SDPA.items() if k != "strides"}
    assert "permuted" not in judge(replace(t5_attention(), example=(unstrided,)), H100).reason


def test_sdpa_math_path_with_its_elementwise_kernels_is_still_the_math_path():
    """T5-base under autocast with dropout on an H100: the mask's add, the scale, dropout and
    where kernels took 49% of SDPA's time, the fp32 GEMMs 35% and the softmax 11%."""
    add = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::CUDAFunctor_add<float> >"
    dropout = "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>"
    ms = T5_FLOPS / (15.4e12) * 1e3
    kernels = (
        kernel(SGEMM, 0.35 * ms),
        kernel(SOFTMAX_F32, 0.11 * ms),
        kernel(add, 0.3 * ms),
        kernel(dropout, 0.19 * ms),
    )
    c = judge(replace(t5_attention(), kernels=kernels), H100)
    assert c.verdict == Verdict.USE_BUILTIN and Reason.of(c.reason) == Reason.MATH_PATH
    assert c.recipe["id"] == "sdpa-mask"
    # Elementwise kernels alone, with no GEMM and softmax, are not a math path.
    plain = judge(replace(t5_attention(), kernels=(kernel(add, ms),)), H100)
    assert Reason.of(plain.reason) != Reason.MATH_PATH


def test_the_ladders_are_data_and_every_step_they_name_exists():
    from typing import get_args

    from kerneltriage.analysis.judge.library_advice import ADVICE
    from kerneltriage.analysis.judge.verdict_data import Step, verdicts
    from kerneltriage.analysis.judge.verdict_steps import STEPS

    union = get_args(get_args(Step)[0])
    assert set(STEPS) == {get_args(m.model_fields["step"].annotation)[0] for m in union}
    data = verdicts()
    assert [s.step for s in data.ladders["eager"].steps][-1] == "recommend"
    assert [s.step for s in data.ladders["compiled"].steps][-1] == "compiled-write"
    assert {a for steps in data.advice.values() for a in steps} <= set(ADVICE)


def test_a_template_naming_an_unknown_field_is_refused():
    from pydantic import ValidationError

    from kerneltriage.analysis.judge.verdict_data import VerdictsFile
    from kerneltriage.resources import load_yaml

    data = json.loads(json.dumps(load_yaml("verdicts.yaml")))
    data["words"]["low_headroom"] = "{what} at {nope}"
    with pytest.raises(ValidationError, match=r"unknown field \{nope\}"):
        VerdictsFile.model_validate(data)
    data = json.loads(json.dumps(load_yaml("verdicts.yaml")))
    data["ladders"]["eager"]["steps"].append({"step": "cold"})
    with pytest.raises(ValidationError, match="a ladder ends with"):
        VerdictsFile.model_validate(data)


def test_a_batch_norm_ceiling_says_it_counts_the_statistics_pass():
    c = replace(
        cand("norm", source="fused estimate", ops=("aten::add_", "aten::batch_norm"), batch_statistics=True),
        level="region",
    )
    judge(c, H100)
    assert "fused ceiling (external inputs/outputs, and the pass its batch statistics take)" in (
        c.conditions["headroom"].detail
    )


def test_a_compile_around_a_batch_norm_takes_what_fusing_removes():
    """EfficientNet-B0's BatchNorm + SiLU (H200): 3.7× below its roof, but a compile removes
    only the SiLU's passes, 1.625× the fused kernel's bytes: the norm's own passes stay."""
    c = replace(
        cand(
            "norm",
            headroom=3.74,
            source="fused estimate",
            ops=("aten::add_", "aten::batch_norm", "aten::silu_"),
            example=(BN_COUNT, BN_TRAIN, BN_SILU),
            batch_statistics=True,
            fusion_headroom=1.625,
        ),
        level="region",
    )
    judge(c, H100)
    assert c.verdict == Verdict.COMPILE
    assert c.compile_headroom == 1.625
    assert c.expected_saving_share == pytest.approx(0.2 * (1 - 1 / 1.625))
    assert "1.62× the bytes of one fused kernel" in c.attrs["saving_basis"]
