"""Fix recipes: every shipped recipe renders, preconditions and blocked parameters decide what
is offered, fused linear CE is judged as GEMM + loss, overlapping savings count once."""

from __future__ import annotations

import pytest

from kerneltriage.analysis.fixes.fix_choice import choose, render
from kerneltriage.analysis.fixes.fix_environment import Environment
from kerneltriage.analysis.fixes.fix_params import detect_params
from kerneltriage.analysis.fixes.fix_recipes import APPLY_KINDS, FIELDS, load_recipes, parse_recipes
from kerneltriage.analysis.fixes.gemm_shapes import gemm_diagnostics
from kerneltriage.analysis.fixes.loss_fixes import combine_overlaps, fused_linear_ce
from kerneltriage.analysis.model import ATTRS_FIELDS, Candidate, Roofline, Shapes
from kerneltriage.analysis.rules import load_rules
from kerneltriage.errors import RulesError

H100 = Environment(
    torch="2.11.0",
    torch_source="manifest",
    capability=(9, 0),
    bf16=True,
    gpu="H100",
    vendor="nvidia",
    sms=132,
    bandwidth=3.0e12,
    rates={"fp32": 50e12, "tf32": 400e12, "bf16": 750e12, "fp16": 750e12},
)
V100_PT19 = Environment(
    torch_source="legacy Kineto categories (PyTorch < 1.10)",
    torch_below="1.10",
    capability=(7, 0),
    bf16=False,
    gpu="V100",
    vendor="nvidia",
    sms=80,
)


def cand(kind="norm", verdict="use-builtin", builtin="", module=None, example=(), **kw) -> Candidate:
    c = Candidate(
        id=kw.pop("id", "C1"),
        name="x",
        kind=kind,
        level="region",
        variant=kw.pop("variant", None),
        time_ms_per_step=kw.pop("time_ms", 5.0),
        time_share=kw.pop("share", 0.1),
        gpu_share=0.1,
        fwd_ms_per_step=1.0,
        bwd_ms_per_step=2.0,
        instances_per_step=kw.pop("instances", 24.0),
        ops=[],
        module=module,
        kernels=[],
        roofline=Roofline(None, None, None, None, None, "memory", None, "estimate", launches_per_step=100),
        headroom=kw.pop("headroom", 4.0),
        shapes=Shapes(1, 1.0, [], []),
        conditions={},
        verdict=verdict,
        reason=kw.pop("reason", "all three conditions hold"),
        builtin=builtin,
        example=list(example),
    )
    for key, value in kw.pop("attrs", {}).items():
        if key in ATTRS_FIELDS:  # what the report reads is a typed field of the candidate
            setattr(c, key, value)
        else:
            c.attrs[key] = value
    assert not kw
    return c


def op(name, dims, types, concrete=None):
    return {"name": name, "dims": dims, "types": types, "concrete": concrete or [""] * len(dims)}


BF = "c10::BFloat16"
GEMMA2_ATTENTION = [
    op("aten::matmul", [[2, 8, 1024, 128], [2, 8, 128, 1024]], [BF, BF]),
    op("aten::mul", [[2, 8, 1024, 1024], []], [BF, "Scalar"], ["", "0.0625"]),
    op("aten::div", [[2, 8, 1024, 1024], []], [BF, "Scalar"], ["", "50."]),
    op("aten::tanh", [[2, 8, 1024, 1024]], [BF]),
    op("aten::mul", [[2, 8, 1024, 1024], []], [BF, "Scalar"], ["", "50."]),
    op("aten::add", [[2, 8, 1024, 1024], [2, 1, 1024, 1024]], [BF, BF]),
    op("aten::softmax", [[2, 8, 1024, 1024], [], []], [BF, "Scalar", ""], ["", "-1", ""]),
    op("aten::matmul", [[2, 8, 1024, 1024], [2, 8, 1024, 128]], [BF, BF]),
]


def attention(module, example, mask, softcap=False, builtin="kerneltriage.kernels.flash_attention", **attrs):
    return cand(
        "attention",
        builtin=builtin,
        module=module,
        example=example,
        attrs={
            "written": "naive",
            "mask": mask,
            "softcap": softcap,
            "head_dim": example[0]["dims"][0][-1],
            "q": example[0]["dims"][0],
            **attrs,
        },
    )


def recipes():
    return load_rules().recipes


def test_every_recipe_renders_with_its_apply_kind():
    fields = {name: "x" for name in FIELDS}
    fields.update(
        classes=["LayerNorm"], gqa=2, causal_value=True, softcap=50.0, scale=0.1, sliding_window=None
    )
    ids = set()
    for r in recipes():
        text, apply, why = render(r, fields)
        assert text and "{" not in text.replace("{'", "").replace("{coordinate", ""), r.id
        assert (apply is None) == (why is not None), r.id
        if apply is not None:
            assert set(apply) - {"kind"} == set(APPLY_KINDS[apply["kind"]]), r.id
        ids.add(r.id)
    assert {"sdpa-for-naive-attention", "hf-attention-builtin", "builtin-norm", "autocast-fp16-legacy"} <= ids


def test_unknown_template_field_and_apply_kind_are_refused():
    base = {
        "id": "x",
        "title": "t",
        "when": {},
        "scope": "model",
        "text": "{nope}",
        "apply": {"kind": "tf32"},
    }
    with pytest.raises(RulesError, match="unknown template field"):
        parse_recipes([base], "test")
    with pytest.raises(RulesError, match="apply kind"):
        parse_recipes([{**base, "text": "ok", "apply": {"kind": "magic"}}], "test")
    with pytest.raises(RulesError, match="apply_why_not"):
        parse_recipes([{**base, "text": "ok", "apply": None}], "test")
    with pytest.raises(RulesError, match=r"renames_builtin\.of: bad regular expression"):
        parse_recipes([{**base, "text": "ok", "renames_builtin": {"of": "(", "to": "x"}}], "test")
    with pytest.raises(RulesError, match="saving"):
        parse_recipes([{**base, "text": "ok", "saving": "everything"}], "test")


def test_liger_architectures_and_switches_come_from_the_data_file():
    from kerneltriage.analysis.fixes.liger import hf_arch, liger_switches

    assert hf_arch("Qwen3MoeForCausalLM") == "qwen3_moe" and hf_arch("Qwen3Attention") == "qwen3"
    assert hf_arch("Gemma3RMSNorm") == "gemma3_text" and hf_arch("Gemma2RMSNorm") == "gemma2"
    assert hf_arch("BertLayer") is None and hf_arch("") is None
    assert liger_switches("gemma2", "rms_norm") == (
        "rope=False, cross_entropy=False, fused_linear_cross_entropy=False, rms_norm=True, geglu=False"
    )
    assert liger_switches("", "rms_norm") == "rms_norm=True"


def test_the_loss_recipes_say_what_their_prediction_counts():
    by_id = {r.id: r for r in load_recipes()}
    assert (
        by_id["liger-fused-linear-ce-hf"].saving == by_id["liger-fused-linear-ce"].saving == "fused-linear-ce"
    )
    assert by_id["liger-cross-entropy-hf"].saving == "upcast-kept"
    renames = by_id["liger-cross-entropy"].renames_builtin
    assert renames is not None and renames[0].search("LigerFusedLinearCrossEntropyLoss")


def test_user_recipes_go_in_front():
    mine = parse_recipes(
        [
            {
                "id": "mine",
                "title": "t",
                "when": {"verdict": "^compile$"},
                "scope": "model",
                "text": "mine()",
                "apply": {"kind": "tf32"},
            }
        ],
        "user",
    )
    merged = load_recipes(extra=mine)
    assert merged[0].id == "mine" and len(merged) == len(load_recipes()) + 1


def test_gemma2_softcap_attention_gets_the_hf_attention_function_with_its_parameters():
    c = attention("model.layers.*.self_attn (Gemma2Attention)", GEMMA2_ATTENTION, "custom-mask", softcap=True)
    params = detect_params(c, [c], H100, 50.0)
    assert params["causal"] is True and params["softcap"] == 50.0
    assert params["scale"] == 0.0625  # not 1/sqrt(128)
    r = choose(c, recipes(), H100, params)
    assert r["id"] == "hf-attention-builtin" and r["blocked"] is None
    assert "use_flash_attention(model)" in r["text"]
    assert r["apply"] == {
        "kind": "hf-attention",
        "causal": True,
        "softcap": 50.0,
        "scale": 0.0625,
        "sliding_window": None,
        "gqa": 1,
    }


def test_gqa_from_the_projections_and_causal_sdpa():
    ex = [
        op("aten::matmul", [[2, 8, 512, 64], [2, 8, 64, 512]], [BF, BF]),
        op("aten::div", [[2, 8, 512, 512], []], [BF, "Scalar"], ["", "8."]),
        op("aten::tril", [[512, 512]], [BF]),
        op("aten::softmax", [[2, 8, 512, 512]], [BF]),
        op("aten::matmul", [[2, 8, 512, 512], [2, 8, 512, 64]], [BF, BF]),
    ]
    c = attention(
        "blocks.*.attn (Attention)", ex, "causal", builtin="torch.nn.functional.scaled_dot_product_attention"
    )
    q = cand(
        "gemm",
        "skip",
        module="blocks.*.attn.q_proj (Linear)",
        example=[op("aten::linear", [[2, 512, 512], [512, 512], []], [BF, BF, ""])],
        id="C2",
    )
    k = cand(
        "gemm",
        "skip",
        module="blocks.*.attn.k_proj (Linear)",
        example=[op("aten::linear", [[2, 512, 512], [128, 512], []], [BF, BF, ""])],
        id="C3",
    )
    params = detect_params(c, [c, q, k], H100, 50.0)
    assert params == {"causal": True, "gqa": 4}  # scale 1/8 = 1/sqrt(64): the default, not carried
    r = choose(c, recipes(), H100, params)
    assert r["id"] == "sdpa-for-naive-attention"
    assert "is_causal=True" in r["text"] and "enable_gqa=True" in r["text"]


def test_sdpa_cannot_carry_a_softcap_and_says_so():
    c = attention(
        "blocks.*.attn (Attention)",
        GEMMA2_ATTENTION,
        "causal",
        softcap=True,
        builtin="torch.nn.functional.scaled_dot_product_attention",
    )
    r = choose(c, recipes(), H100, detect_params(c, [c], H100, 50.0))
    assert (
        r["blocked"].startswith("softcap 50") and r["text"] is None and r["id"] == "sdpa-for-naive-attention"
    )


def test_precision_fix_follows_gpu_and_pytorch_version():
    c = cand("convolution", reason="fp32-off-tensor-cores", builtin="fp16 autocast with a GradScaler")
    v100 = choose(c, recipes(), V100_PT19, {})
    assert v100["id"] == "autocast-fp16-legacy"
    assert (
        "torch.cuda.amp.autocast()" in v100["text"]
        and "GradScaler" in v100["text"]
        and "bfloat16" not in v100["text"]
    )
    a100 = Environment(torch="2.1", capability=(8, 0), bf16=True, vendor="nvidia")
    assert choose(c, recipes(), a100, {})["id"] == "tf32"
    v100_new = Environment(torch="2.1", capability=(7, 0), bf16=False, vendor="nvidia")
    assert choose(c, recipes(), v100_new, {})["id"] == "autocast-fp16"


def test_no_compile_below_pytorch_2():
    c = cand("elementwise", verdict="compile", builtin="torch.compile")
    r = choose(c, recipes(), V100_PT19, {})
    assert r["blocked"] and "1.10" in r["blocked"] and r["text"] is None


def test_compile_covers_every_module_class_holding_the_region():
    c = cand(
        "norm",
        verdict="compile",
        builtin="torch.compile",
        module="encoder.layer.*.attention.output.LayerNorm (LayerNorm)",
        attrs={
            "enclosing_modules": [
                "encoder.layer.*.attention.output:BertSelfOutput",
                "encoder.layer.*.output:BertOutput",
            ]
        },
    )
    r = choose(c, recipes(), H100, {})
    assert r["id"] == "compile-module-class"
    assert r["apply"] == {"kind": "compile-module", "classes": ["BertOutput", "BertSelfOutput"], "mode": None}


def test_a_norm_swap_swaps_the_norm_class_not_the_modules_around_its_region():
    c = cand(
        "norm",
        builtin="kerneltriage.kernels.fused_add_rms_norm",
        module="blocks.*.n2 (RMSNorm)",
        attrs={"enclosing_modules": ["blocks.*:Block"]},
    )
    r = choose(c, recipes(), H100, {})
    assert r["id"] == "builtin-norm" and r["apply"] == {"kind": "norm-swap", "classes": ["RMSNorm"]}


def test_liger_norm_switches_on_only_its_kernel():
    c = cand(
        "norm",
        builtin="kerneltriage.kernels.rms_norm",
        module="model.layers.*.input_layernorm (Gemma2RMSNorm)",
    )
    r = choose(c, recipes(), H100, {})
    assert r["apply"] == {"kind": "norm-swap", "classes": ["Gemma2RMSNorm"]}
    assert (
        "apply_liger_kernel_to_gemma2(rope=False, cross_entropy=False, fused_linear_cross_entropy=False, rms_norm=True, geglu=False)"
        in r["text"]
    )


def _gpt2_loss(weight_type):
    lm = cand(
        "gemm",
        "skip",
        module="lm_head (Linear)",
        id="C2",
        time_ms=2.0,
        example=[op("aten::linear", [[8, 1024, 768], [50257, 768], []], [BF, weight_type, ""])],
    )
    loss = cand(
        "cross-entropy",
        builtin="liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss",
        module="GPT2LMHeadModel (GPT2LMHeadModel)",
        time_ms=3.0,
        example=[
            op(
                "aten::cross_entropy_loss",
                [[8192, 50257], [8192], [], [], [], []],
                ["float", "long int", "", "Scalar", "Scalar", "Scalar"],
                ["", "", "", "1", "-100", "0."],
            )
        ],
    )
    return lm, loss


def test_fused_linear_ce_is_refused_where_it_loses():
    lm, loss = _gpt2_loss("float")  # fp32 weights under bf16 autocast: fp32 GEMMs inside Liger
    judged = fused_linear_ce(loss, lm, H100, 28.0)
    assert judged["gain_ms"] < 0 and judged["precision"] == "fp32" and judged["chunks"] == 64
    r = choose(loss, recipes(), H100, detect_params(loss, [lm, loss], H100, 28.0))
    assert r["id"] == "liger-cross-entropy" and r["blocked"] is None  # the loss-only kernel instead
    lm16, loss16 = _gpt2_loss(BF)
    assert fused_linear_ce(loss16, lm16, H100, 28.0)["gain_ms"] < 0  # chunks re-read the gradient


def test_loss_parameters_and_bias():
    lm = cand(
        "gemm",
        "skip",
        module="cls.predictions.decoder (Linear)",
        id="C2",
        example=[op("aten::linear", [[8, 512, 768], [30522, 768], [30522]], [BF, BF, BF])],
    )
    loss = cand(
        "cross-entropy",
        builtin="liger_kernel.transformers.LigerCrossEntropyLoss",
        example=[
            op(
                "aten::cross_entropy_loss",
                [[4096, 30522], [4096], [], [], [], []],
                ["float", "long int", "", "Scalar", "Scalar", "Scalar"],
                ["", "", "", "1", "0", "0.1"],
            )
        ],
    )
    params = detect_params(loss, [lm, loss], H100, 50.0)
    assert params == {"ignore-index": 0, "label-smoothing": 0.1, "bias": True}
    r = choose(loss, recipes(), H100, params)
    assert "ignore_index=0" in r["text"] and "label_smoothing=0.1" in r["text"]


def test_overlapping_savings_count_once():
    lm, loss = _gpt2_loss(BF)
    lm.expected_saving_share, loss.expected_saving_share = 0.05, 0.08
    loss.recipe = {"id": "liger-fused-linear-ce", "blocked": None, "covers": {}}
    loss.attrs["fused_linear_ce"] = {"gemm": "C2"}
    combine_overlaps([lm, loss], recipes())
    assert lm.expected_saving_share + loss.expected_saving_share == pytest.approx(0.08)
    assert "C1" in lm.note and loss.recipe["covers"]["also"] == ["C2"]


def test_gemm_shape_diagnostics():
    dec = cand(
        "gemm",
        "compile",
        module="cls.predictions.decoder (Linear)",
        headroom=1.6,
        attrs={"library_op": True},
        example=[op("aten::linear", [[8, 512, 768], [30522, 768], [30522]], [BF, BF, BF])],
    )
    notes = " | ".join(gemm_diagnostics(dec, [dec], H100))
    assert "N=30522 is not a multiple of 64: pad it to 30528" in notes
    assert "masked positions" in notes
    qkv = [
        cand(
            "gemm",
            "skip",
            module=f"encoder.layer.*.attention.self.{n} (Linear)",
            headroom=2.0,
            attrs={"library_op": True},
            id=f"C{i}",
            example=[op("aten::linear", [[8, 512, 768], [768, 768], [768]], [BF, BF, BF])],
        )
        for i, n in enumerate(("query", "key", "value"))
    ]
    assert any("one fused projection (2304x768" in n for n in gemm_diagnostics(qkv[0], qkv, H100))


def test_a_faster_sdpa_backend_is_named_for_the_process_and_needs_torch_2_3():
    c = cand("attention", builtin="torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)")
    r = choose(c, recipes(), H100, {})
    assert r["id"] == "sdpa-backend" and r["blocked"] is None
    assert "sdpa_kernel(SDPBackend.CUDNN_ATTENTION)" in r["text"]
    assert r["apply"] == {"kind": "sdpa-backend", "backend": "CUDNN_ATTENTION"}
    old = Environment(**{**H100.__dict__, "torch": "2.1.0"})
    blocked = choose(c, recipes(), old, {})
    assert blocked["blocked"] == "PyTorch 2.1.0 (needs >=2.3)" and blocked["text"] is None


def test_compiling_a_module_class_names_the_other_candidates_it_fuses():
    from kerneltriage.analysis.fixes.attach import _compiled_with

    rope = cand("elementwise", "compile", module="model.layers.*.self_attn (Gemma2Attention)", id="C6")
    naive = cand(
        "attention", "use-builtin", module="model.layers.*.self_attn (Gemma2Attention)", id="C1", share=0.44
    )
    naive.attrs["written"] = "naive"
    qproj = cand("gemm", "skip", module="model.layers.*.self_attn.q_proj (Linear)", id="C5", share=0.08)
    norm = cand("norm", "use-builtin", module="model.layers.*.input_layernorm (Gemma2RMSNorm)", id="C2")
    min_share = load_rules().cutoffs.compiles_also_min_share
    inside = _compiled_with(rope, [rope, naive, qproj, norm], ["Gemma2Attention"], min_share)
    # The naive attention's softmax and scaling fuse; the q projection stays cuBLAS's; the norm
    # runs outside the compiled class.
    assert [o.id for o in inside] == ["C1"]


@pytest.mark.parametrize(
    "module,expected,checked",
    [
        ("model.layers.*.post_attention_layernorm (Qwen2RMSNorm)", "builtin-norm", False),
        ("encoder.block.*.layer.*.layer_norm (T5LayerNorm)", "builtin-norm", False),
        ("blocks.*.ln (MyFancyRMSNorm)", "builtin-norm", True),
        ("blocks.*.ln (ScaleNorm)", "builtin-norm-by-hand", False),
        (None, "builtin-norm-by-hand", False),
    ],
)
def test_patch_model_only_for_norm_classes_patch_swaps(module, expected, checked):
    """Listed classes (torch's, hf_norms.yaml's, T5LayerNorm's family) and *RMSNorm/*LayerNorm
    classes patch() checks by their math get `patch(model)`; any other class, or none known,
    the call edited in by hand."""
    c = cand("norm", builtin="kerneltriage.kernels.rms_norm", module=module)
    r = choose(c, recipes(), H100, {})
    assert r["id"] == expected
    if expected == "builtin-norm":
        assert "patch(model)" in r["text"] and r["apply"]["kind"] == "norm-swap"
        assert ("checks its math on a tiny CPU copy" in r["text"]) == checked
    else:
        assert "patch(model)" not in r["text"] and "rms_norm(x, norm.weight, norm.eps)" in r["text"]
        assert r["apply"] is None and "apply by hand" in r["apply_why_not"]


def test_a_residual_add_by_hand_is_fused_with_its_norm():
    c = cand(
        "norm", builtin="kerneltriage.kernels.fused_add_rms_norm", module=None, attrs={"residual_add": True}
    )
    params = detect_params(c, [c], H100, 50.0)
    r = choose(c, recipes(), H100, params)
    assert r["id"] == "builtin-norm-by-hand-fused-add" and r["fuses_residual_add"]
    assert "fused_add_rms_norm(x, residual, norm.weight, norm.eps)" in r["text"]


def test_compile_in_a_serving_engine_is_applied_at_the_module_by_hand():
    c = cand("norm", verdict="compile", builtin="torch.compile", attrs={"server": True})
    c.ops = ["sglang_profiler::utils_apply_qk_norm_487"]
    r = choose(c, recipes(), H100, {})
    assert r["id"] == "compile-in-server" and r["apply"] is None
    assert "torch.compile(model" not in r["text"] and "sglang_profiler::utils_apply_qk_norm_487" in r["text"]


def test_fp32_gemms_on_a_gpu_without_tf32_get_bf16_autocast():
    """AMD's CDNA2 (MI250, MI210) has bf16 matrix units and no TF32: `allow_tf32` would change
    nothing there, so the fix is bf16 autocast; an A100 keeps TF32, a V100 fp16 with a scaler."""
    from kerneltriage.analysis.fixes.fix_environment import environment
    from kerneltriage.analysis.gpus import spec_for

    c = cand("gemm", reason="fp32-off-tensor-cores", builtin="bf16 autocast")
    mi250 = environment(spec_for("MI250", "test", "test"), {"versions": {"torch": "2.4.0"}}, None)
    assert mi250.tf32 is False and mi250.bf16 is True
    r = choose(c, recipes(), mi250, {})
    assert r["id"] == "autocast-bf16" and r["apply"] == {"kind": "autocast", "dtype": "bfloat16"}
    assert r["declined"] == {"tf32": "AMD Instinct MI250 (one GCD) has no TF32 tensor cores"}
    a100 = environment(spec_for("A100-80GB", "test", "test"), {"versions": {"torch": "2.4.0"}}, None)
    assert choose(c, recipes(), a100, {})["id"] == "tf32"
    v100 = environment(spec_for("V100-SXM2", "test", "test"), {"versions": {"torch": "2.4.0"}}, None)
    assert choose(c, recipes(), v100, {})["id"] == "autocast-fp16"
