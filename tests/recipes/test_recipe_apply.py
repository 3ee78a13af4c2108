"""The recipes added for model families the shipped runs did not cover, end to end on CPU: the
report's candidate gets the recipe (``verdict.decide`` with the shipped rules and fixes), its
``apply`` mapping goes through verify's runner (``kerneltriage.recipes.install.install``) into a
tiny model, and the model's loss and gradients stay those of eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from kerneltriage.analysis.gpus import spec_for  # noqa: E402
from kerneltriage.analysis.judge.verdict import decide  # noqa: E402
from kerneltriage.analysis.model import Candidate, KernelInfo, Roofline, Shapes  # noqa: E402
from kerneltriage.analysis.rules import load_rules  # noqa: E402
from kerneltriage.analysis.vocabulary import Verdict  # noqa: E402
from kerneltriage.recipes.install import install  # noqa: E402

RULES = load_rules()
H100 = spec_for("H100-SXM", "test", "test")
CUDNN_FPROP = (
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1"
)
TRANSPOSE = "void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, (cudnnKernelDataType_t)0>"


def _candidate(
    kind: str,
    kernels: list[tuple[str, float]],
    *,
    module: str | None = None,
    variant: str | None = None,
    example: list[dict] | None = None,
    headroom: float = 4.0,
    ops: tuple[str, ...] = ("aten::conv2d",),
) -> Candidate:
    time_ms = sum(ms for _, ms in kernels)
    roofline = Roofline(None, None, None, None, None, "memory", time_ms / headroom, "ncu", "bf16")
    return Candidate(
        id="",
        name="subject",
        kind=kind,
        level="op",
        variant=variant,
        time_ms_per_step=time_ms,
        time_share=0.2,
        gpu_share=0.2,
        fwd_ms_per_step=time_ms,
        bwd_ms_per_step=0.0,
        instances_per_step=1.0,
        ops=list(ops),
        module=module,
        kernels=[KernelInfo(n, n, 1.0, ms, "fwd", True) for n, ms in kernels],
        roofline=roofline,
        headroom=headroom,
        shapes=Shapes(1, 1.0, [], [{"shape": "0", "share": 1.0}]),
        conditions={},
        example=example or [],
    )


def _judged(c: Candidate) -> Candidate:
    other = _candidate("communication", [("ncclKernel_AllReduce", 25.0)], ops=("nccl:all_reduce",))
    other.time_share = 0.5
    decide([c, other], RULES, H100)
    return c


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.dw(torch.relu(self.conv(x))).mean((2, 3)))


def _loss_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    # A compiled module names its parameters under ``_orig_mod.``: the same parameters.
    grads = {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return loss.detach(), grads


def _eager_then_fixed(apply: dict, make=None, x=None, y=None, run=None):
    """The loss and gradients of a model (``make()``, a ``ConvNet`` by default) in eager, then
    of a copy of it with ``apply`` installed (``run`` wraps the copy, e.g. in a compile, while
    the fix is in place)."""
    make = make or ConvNet
    torch.manual_seed(0)
    if x is None:
        x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 2, (4,))
    model = make()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager = _loss_and_grads(model, x, y)
    applied = install(apply)
    try:
        fixed_model = make()
        fixed_model.load_state_dict(state)
        fixed = _loss_and_grads(run(fixed_model) if run else fixed_model, x, y)
        return applied, fixed_model, eager, fixed
    finally:
        applied.remove()


def _same(eager, fixed):
    torch.testing.assert_close(fixed[0], eager[0], rtol=1e-5, atol=1e-6)
    for name, g in eager[1].items():
        torch.testing.assert_close(fixed[1][name], g, rtol=1e-4, atol=1e-5)


def test_a_convolution_below_its_roof_gets_cudnn_benchmark_not_compile():
    c = _judged(_candidate("convolution", [(CUDNN_FPROP, 8.0)]))
    assert c.verdict == Verdict.USE_BUILTIN and c.recipe["id"] == "cudnn-benchmark"
    assert "torch.compile" not in (c.fix or "")
    assert c.fix.startswith("torch.backends.cudnn.benchmark = True")
    before = torch.backends.cudnn.benchmark
    applied, _, eager, fixed = _eager_then_fixed(c.recipe["apply"])
    assert applied.done and applied.problem is None
    assert torch.backends.cudnn.benchmark == before  # undone
    _same(eager, fixed)


def test_layout_transposes_around_a_convolution_get_channels_last():
    c = _judged(_candidate("convolution", [(CUDNN_FPROP, 6.0), (TRANSPOSE, 2.0)]))
    assert c.verdict == Verdict.USE_BUILTIN and c.recipe["id"] == "channels-last"
    assert "channels_last" in c.fix and "then torch.backends.cudnn.benchmark = True" in c.note
    assert c.expected_saving_share == pytest.approx(0.2 * 2.0 / 8.0)  # the transposes' time, not the headroom
    applied, model, eager, fixed = _eager_then_fixed(c.recipe["apply"])
    assert applied.done
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    _same(eager, fixed)


def test_a_depthwise_convolution_slow_in_its_backward_is_a_kernel_to_write():
    # ConvNeXt's 7×7 depthwise convolution: 80% of its time in dgrad/wgrad.
    op = {
        "name": "aten::conv2d",
        "dims": [[64, 96, 56, 56], [96, 1, 7, 7], [96], [], [], [], []],
        "types": ["c10::BFloat16"] * 3 + ["ScalarList"] * 3 + ["Int"],
        "concrete": ["", "", "", "[1, 1]", "[3, 3]", "[1, 1]", "96"],
    }
    c = _judged(
        _candidate(
            "convolution",
            [
                ("conv_depthwise2d_forward_kernel", 2.0),
                ("conv_depthwise2d_backward_kernel", 3.0),
                ("conv_depthwise2d_grad_weight_kernel", 5.0),
            ],
            example=[op],
        )
    )
    assert c.verdict == Verdict.WRITE and c.fix is None
    assert "depthwise 7×7 convolution over 96 channels, 80% of its time in its backward" in c.note
    assert "torch.backends.cudnn.benchmark = True first" in c.note
    assert c.expected_saving_share == pytest.approx(0.2 * 0.8 * (1 - 1 / 4.0), rel=1e-3)


def test_t5_layer_norm_candidate_is_swapped_by_the_runner_and_keeps_the_loss():
    """T5LayerNorm: the report offers patch(model), and verify's runner applies it to T5's
    own class (no longer "not a class whose math the kernels are known to match")."""
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    from kerneltriage.kernels.patch import T5RMSNorm

    norm_ops = ("aten::to", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::mul")
    c = _judged(
        _candidate(
            "norm",
            [("vectorized_elementwise_kernel", 4.0)],
            module="encoder.block.*.layer.*.layer_norm (T5LayerNorm)",
            variant="rmsnorm",
            ops=norm_ops,
        )
    )
    assert c.verdict == Verdict.USE_BUILTIN and c.recipe["id"] == "builtin-norm"
    assert c.recipe["apply"] == {"kind": "norm-swap", "classes": ["T5LayerNorm"]}

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.layer_norm = T5LayerNorm(32, eps=1e-6)
            self.head = nn.Linear(32, 3)

        def forward(self, x):
            return self.head(self.layer_norm(self.fc(x)))

    def make() -> Tiny:
        model = Tiny()
        with torch.no_grad():
            model.layer_norm.weight.normal_(1.0, 0.3)
        return model

    torch.manual_seed(0)
    x, y = torch.randn(6, 32), torch.randint(0, 3, (6,))
    applied, fixed_model, eager, fixed = _eager_then_fixed(c.recipe["apply"], make, x, y)
    assert applied.done and applied.details["swapped"] == 1
    assert type(fixed_model.layer_norm) is T5RMSNorm
    _same(eager, fixed)


def test_a_permuted_position_bias_is_laid_out_row_by_row_with_the_same_math():
    """T5's bias as transformers 5.17 builds it: a bucket embedding looked up as (q, k, H) and
    permuted to (1, H, q, k), stride H on its last dimension, which every fused SDPA kernel
    refuses on a GPU. The runner makes it contiguous: output and the bias's gradient are
    eager's exactly (fp32, no cast)."""
    torch.manual_seed(0)
    heads, q_len, k_len = 4, 6, 10
    table = torch.nn.Embedding(8, heads)
    buckets = torch.randint(0, 8, (q_len, k_len))
    q, k, v = (torch.randn(2, heads, n, 8) for n in (q_len, k_len, k_len))

    def run(apply: dict | None):
        table.zero_grad()
        applied = install(apply) if apply else None
        try:
            bias = table(buckets).permute([2, 0, 1]).unsqueeze(0)
            assert bias.stride(-1) == heads
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            out.square().sum().backward()
        finally:
            if applied:
                applied.remove()
        return out.detach(), table.weight.grad.clone(), applied

    out, grad, _ = run(None)
    fixed_out, fixed_grad, applied = run({"kind": "sdpa-mask"})
    assert applied.done and applied.details == {"mask_layout": "last-dimension stride 4 -> 1"}
    torch.testing.assert_close(fixed_out, out, rtol=0, atol=0)
    torch.testing.assert_close(fixed_grad, grad, rtol=1e-6, atol=1e-7)
    assert grad.abs().max() > 0


def test_t5_position_bias_is_cast_by_the_runner_and_keeps_its_gradient():
    """T5 under bf16 autocast: its fp32 relative position bias, a permuted view beside bf16 q,
    keeps SDPA on its math path. The report offers the fix as a runner fix (``sdpa-mask``);
    applied to a tiny T5, SDPA gets the bias in q's dtype with a contiguous last dimension, and
    the loss and the bias's gradient stay eager's."""
    from transformers import T5Config, T5ForConditionalGeneration

    from tests.analysis.judge.test_verdict import H100 as H100_TABLE
    from tests.analysis.judge.test_verdict import judge, t5_attention

    c = judge(t5_attention(), H100_TABLE)  # T5-base's SDPA as its trace records it
    assert c.recipe["id"] == "sdpa-mask" and c.recipe["apply"] == {"kind": "sdpa-mask"}

    config = T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    config._attn_implementation = "sdpa"
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))

    def loss_and_bias_grad(apply: dict | None):
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(config)
        applied = install(apply) if apply else None
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        finally:
            if applied:
                applied.remove()
        bias = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        return loss.detach(), bias.grad, applied

    loss, grad, _ = loss_and_bias_grad(None)
    fixed_loss, fixed_grad, applied = loss_and_bias_grad(c.recipe["apply"])
    assert applied.done and applied.details["mask_dtype"] == "float32 -> bfloat16"
    torch.testing.assert_close(fixed_loss, loss, rtol=1e-2, atol=1e-3)
    assert grad.abs().max() > 0 and fixed_grad is not None
    torch.testing.assert_close(fixed_grad, grad, rtol=5e-2, atol=1e-3)


class TiedLM(nn.Module):
    """An LM head tied to its embedding, N and K both off every multiple (GPT-2's lm_head:
    50257 × 1024)."""

    def __init__(self, vocab: int = 1001, hidden: int = 37):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.mix(self.wte(ids)))).flatten(0, 1)


def test_an_unaligned_linear_runs_padded_with_the_same_loss_and_gradients():
    ids = torch.randint(0, 1001, (3, 5))
    labels = torch.randint(0, 1001, (15,))
    apply = {"kind": "gemm-pad", "modules": ["lm_head", "mi*"], "multiple": 64}
    seen = []

    def record(model):
        # The padded GEMM itself: N and K whole tiles, the output sliced back to the vocabulary.
        model.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.shape))
        return model

    applied, model, eager, fixed = _eager_then_fixed(apply, TiedLM, ids, labels, run=record)
    assert applied.done and applied.details["padded"] == {
        "lm_head": "N 1001 → 1024, K 37 → 64",
        "mix": "N 37 → 64, K 37 → 64",
    }
    assert seen == [torch.Size([3, 5, 1001])]
    assert model.lm_head.weight is model.wte.weight  # still tied: read, never replaced
    _same(eager, fixed)


def test_gemm_pad_refuses_what_it_cannot_pad():
    from kerneltriage.recipes.install import ApplyFailed, check

    assert "multiple must be a whole number" in check({"kind": "gemm-pad", "modules": "x", "multiple": 0})
    assert "takes modules" in check({"kind": "gemm-pad", "modules": "", "multiple": 64})
    for apply, said in (
        ({"kind": "gemm-pad", "modules": "decoder", "multiple": 64}, "found no module decoder under ConvNet"),
        ({"kind": "gemm-pad", "modules": "conv", "multiple": 64}, "conv is a Conv2d"),
        ({"kind": "gemm-pad", "modules": "head", "multiple": 2}, "a multiple of 2 already"),
    ):
        with pytest.raises(ApplyFailed, match=said):
            _eager_then_fixed(apply)
