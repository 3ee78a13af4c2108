"""What a fix covers, on runs made on an H100 (two with `kerneltriage verify` beside them,
examples/runs/gemma2-h100 and examples/runs/bert-mlm-h100): the prediction a module compile is
judged by counts what the compile takes from the other candidates inside that module; a
Hugging Face loss patch is judged without the upcast it keeps; a verify result for another fix
than the one offered is not shown as the offered fix's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneltriage import verify_record as record
from kerneltriage.api import report

RUNS = Path(__file__).resolve().parents[3] / "examples" / "runs"


@pytest.fixture(scope="module")
def gemma2():
    return report(RUNS / "gemma2-h100")


@pytest.fixture(scope="module")
def bert():
    return report(RUNS / "bert-mlm-h100")


def by_id(rep, cid):
    return next(c for c in rep.candidates if c.id == cid)


def test_compiling_the_attention_module_counts_the_eager_softmax_chain(gemma2):
    rope, attention = by_id(gemma2, "C6"), by_id(gemma2, "C1")
    assert rope.recipe["id"] == "compile-module-class" and rope.recipe["apply"]["classes"] == [
        "Gemma2Attention"
    ]
    assert rope.attrs["compiles_also"] == ["C1"]
    whole = rope.attrs["fix_saving_share"]
    # The row keeps its own saving (the rotary embedding's); the fix adds the attention's
    # non-GEMM time less one fused pass over its score matrix each way.
    assert rope.expected_saving_share < 0.05 < 0.3 < whole < rope.expected_saving_share + attention.time_share
    assert f"predicted to save {whole:.1%}" in rope.note
    # What verify measured on an H100 for that compile: within 1.5× of the whole fix's prediction,
    # and nine times the row's own.
    v = rope.verification
    assert v["status"] == "verified" and v["predicted_saving_share"] == pytest.approx(whole, rel=1e-3)
    assert whole / 1.5 < v["realized_saving_share"] < whole * 1.5
    assert v["realized_saving_share"] > 5 * rope.expected_saving_share


def test_a_region_inside_the_compiled_block_reaches_its_neighbours(bert):
    # The dropout + add region's own module is a Dropout leaf: the BertSelfOutput blocks that
    # enclose it are what the compile takes, LayerNorm (C7) included.
    add = by_id(bert, "C8")
    assert set(add.recipe["apply"]["classes"]) == {"BertOutput", "BertSelfOutput"}
    assert add.attrs["compiles_also"] == ["C7"]
    norm = by_id(bert, "C7")
    # ATen's LayerNorm alone is skipped (no fix of its own was measured to take its headroom),
    # but the compile around it fuses the residual add and dropout into it: the fix counts the
    # norm's headroom all the same (realized 6.9% in verify.json against 7.9% predicted).
    assert (norm.verdict, norm.reason, norm.expected_saving_share) == ("skip", "already-fused", 0.0)
    assert add.attrs["fix_saving_share"] == pytest.approx(
        add.expected_saving_share + norm.time_share * (1.0 - 1.0 / norm.headroom)
    )
    assert add.verification["status"] == "verified"


def test_the_loss_only_kernel_is_offered_when_it_saves_more_than_fused_linear_ce(gemma2):
    loss = by_id(gemma2, "C8")
    judged = loss.attrs["fused_linear_ce"]
    # The loss-only share it is compared with leaves out the upcast a Hugging Face patch keeps.
    assert judged["saving_share"] < judged["loss_only_share"] <= loss.expected_saving_share
    assert loss.recipe["id"] == "liger-cross-entropy"
    assert "below the" in loss.note and "the loss-only kernel saves" in loss.note


def test_a_verify_result_for_another_fix_is_left_out_with_a_warning(gemma2):
    # verify.json refuted the fused linear CE the report offered when it ran; the report now
    # offers the loss-only kernel, which nothing has measured.
    measured = {c.id: c for c in record.read(RUNS / "gemma2-h100").candidates}
    assert measured["C8"].recipe_id == "liger-fused-linear-ce-hf" and measured["C8"].status == "refuted"
    assert by_id(gemma2, "C8").verification is None
    assert any("measured C8 with the fix liger-fused-linear-ce-hf" in w for w in gemma2.warnings)


def test_the_hugging_face_loss_patch_is_judged_without_the_upcast_it_keeps():
    # HF Llama (examples/runs/hf-llama-h100): transformers' loss upcasts the 4x2048x32000 bf16
    # logits to fp32 before cross_entropy; Liger's loss-only patch replaces cross_entropy alone,
    # so its saving leaves that copy out. Here the fused linear CE, which never materializes
    # the logits, predicts more (its lm_head GEMM is 2048 -> 32000), and is the fix.
    llama = report(RUNS / "hf-llama-h100")
    loss = next(c for c in llama.candidates if c.kind == "cross-entropy")
    assert loss.recipe["id"] == "liger-fused-linear-ce-hf" and "fused_linear_cross_entropy=True" in loss.fix
    step_ms = loss.time_ms_per_step / loss.time_share
    kept = 12 * 4 * 2048 * 32000 / llama.gpu.bandwidth * 1e3 / step_ms  # read 2 + write 4 bytes, each way
    judged = loss.attrs["fused_linear_ce"]
    assert 0 < judged["loss_only_share"] <= loss.time_share - kept
    assert judged["loss_only_share"] < judged["saving_share"] == pytest.approx(loss.expected_saving_share)
    assert "lm_head GEMM" in loss.note and "upcast_kept_share" not in loss.recipe["params"]


def test_a_model_sharded_by_fsdp2_keeps_its_hugging_face_recipes():
    """FSDP2's fully_shard makes the model an instance of ``FSDPLlamaForCausalLM``: the loss is
    still transformers' own, and Liger's patch for the architecture (which the runner applies)
    is the fix, not the by-hand loss edit."""
    import copy

    from kerneltriage.analysis.fixes.fix_choice import choose, model_class
    from kerneltriage.analysis.fixes.fix_environment import environment
    from kerneltriage.analysis.fixes.fix_params import detect_params
    from kerneltriage.analysis.rules import load_rules

    assert model_class("FSDPQwen2ForCausalLM") == "Qwen2ForCausalLM"
    assert model_class("FSDPQwen2DecoderLayer") == "Qwen2DecoderLayer"
    assert model_class("FSDPrelu") == "FSDPrelu" and model_class("LlamaForCausalLM") == "LlamaForCausalLM"
    llama = report(RUNS / "hf-llama-h100")
    loss = next(c for c in llama.candidates if c.kind == "cross-entropy")
    sharded = copy.deepcopy(loss)
    sharded.module = sharded.module.replace("(LlamaForCausalLM)", "(FSDPLlamaForCausalLM)")
    assert "FSDPLlamaForCausalLM" in sharded.module
    env = environment(llama.gpu, llama.source, {})
    params = detect_params(sharded, llama.candidates, env, loss.time_ms_per_step / loss.time_share)
    chosen = choose(sharded, load_rules().recipes, env, params)
    assert (
        chosen["id"] == loss.recipe["id"] == "liger-fused-linear-ce-hf" and chosen["apply"]["kind"] == "liger"
    )
    assert "apply_liger_kernel_to_llama(" in chosen["text"]


def test_compiling_the_model_counts_every_candidate_a_compile_fuses(bert):
    """BERT-base's GEMM fix compiles the whole model (max-autotune): its prediction, which
    verify judges, adds what the compile takes from the loss, the norms and the residual adds,
    the row keeping its own saving."""
    gemm = by_id(bert, "C2")
    assert gemm.recipe["apply"]["kind"] == "compile-model"
    covered = [by_id(bert, cid) for cid in gemm.attrs["compiles_also"]]
    assert covered and all(
        c.kind in {"elementwise", "reduction", "softmax", "norm", "cross-entropy"} for c in covered
    )
    assert {"C7", "C8"} <= {c.id for c in covered}
    whole = gemm.attrs["fix_saving_share"]
    assert (
        gemm.expected_saving_share < whole <= gemm.expected_saving_share + sum(c.time_share for c in covered)
    )
    assert "compiling the model also compiles" in gemm.note and f"predicted to save {whole:.1%}" in gemm.note
