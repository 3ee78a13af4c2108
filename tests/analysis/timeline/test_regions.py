"""Fused regions on one step of the shipped GPT run (naive causal attention, eager RMSNorm):
the segmenter cuts the forward op sequence into the attention pattern, norm runs and single
boundary ops, and a region's ceiling counts only what a fused kernel must move."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kerneltriage.analysis.candidates.grouping import group_candidates
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.regions import OpInfo, enclosing_module, segment
from kerneltriage.ingest.source import load_profile

NAIVE = Path(__file__).resolve().parents[3] / "examples" / "runs" / "gpt-naive-h200"
BF16 = 2


@pytest.fixture(scope="module")
def step():
    """The forward top-level ops of the first step, in order, and the shipped rules."""
    timeline = load_profile(NAIVE).timelines[0]
    rules = load_rules()
    groups = group_candidates(timeline, attribute(timeline, None), rules)
    starts = timeline.cpu["start"]
    ops = [op for g in groups.values() for s, seg in g.segments if s == 0 for op in seg.ops]
    return sorted(ops, key=lambda op: starts.iloc[op.row]), rules


def test_the_step_is_cut_into_regions_and_boundary_ops(step):
    ops, rules = step
    segments = segment(ops, rules)
    assert len(ops) == 135 and len(segments) == 51
    assert sum(len(s.ops) for s in segments) == len(ops)  # every op in one segment, in order
    assert [op.row for s in segments for op in s.ops] == [op.row for op in ops]
    boundary = set(rules.regions.boundary_kinds)
    for s in segments:
        # Boundary ops (GEMMs, the embedding, copies) stand alone; attention is the pattern.
        if s.kind in boundary and s.kind != "attention":
            assert s.level == "op" and len(s.ops) == 1, s.signature_ops
    regions = [(s.kind, s.variant) for s in segments if s.level == "region"]
    assert regions.count(("attention", "causal")) == 4  # one per layer
    assert regions.count(("norm", "rmsnorm")) == 5  # each layer's first norm, and the final one
    assert regions.count(("norm", "fused_add_rmsnorm")) == 4  # the residual add joins the second


def test_naive_attention_is_one_region_with_a_fused_ceiling(step):
    ops, rules = step
    attention = next(s for s in segment(ops, rules) if s.kind == "attention")
    assert attention.signature_ops == (
        "aten::matmul",
        "aten::div",
        "aten::ones",
        "aten::tril",
        "aten::bitwise_not",
        "aten::masked_fill",
        "aten::softmax",
        "aten::matmul",
    )
    a = attention.attrs
    assert (a["mask"], a["softcap"], a["dropout"], a["written"]) == ("causal", False, False, "naive")
    assert a["q"] == a["k"] == a["v"] == [4, 16, 2048, 64] and a["head_dim"] == 64 and a["heads"] == 16
    # A fused kernel reads q, k, v and writes o once (bf16), plus the fp32 log-sum-exp per
    # row: the 16 × 2048 × 2048 scores the eager code materializes are not in its ceiling.
    qkvo = 4 * (4 * 16 * 2048 * 64) * BF16
    assert attention.ideal.bytes == qkvo + 4 * 16 * 2048 * 4
    # Causal: 2048·2049/2 visible pairs per head, two matmuls of 2·D FLOPs per pair.
    assert attention.ideal.flops == 2.0 * 64 * (2048 * 2049 // 2) * (64 + 64)


def test_a_residual_add_before_the_norm_joins_it_and_names_its_enclosing_block(step):
    ops, rules = step
    fused = next(s for s in segment(ops, rules) if s.variant == "fused_add_rmsnorm")
    assert fused.signature_ops[0] == "aten::add" and len(fused.ops) == 7
    assert enclosing_module(fused.ops) == "blocks.0:Block"
    # Without the residual-add pattern the add stays out of the norm region.
    regions = rules.regions.model_copy(update={"residual_add_ops": ()})
    plain = replace(rules, file=rules.file.model_copy(update={"regions": regions}), _memo={})
    variants = [s.variant for s in segment(ops, plain) if s.kind == "norm"]
    assert "fused_add_rmsnorm" not in variants and variants.count("rmsnorm") == 9


def test_sibling_modules_are_never_one_region(step):
    """Ops of two sibling modules are separate runs, whatever lies between them."""
    ops, rules = step
    norm = next(s for s in segment(ops, rules) if s.variant == "rmsnorm")
    moved = [replace(op, module="elsewhere:Other") if i == 2 else op for i, op in enumerate(norm.ops)]
    parts = segment(moved, rules)
    assert len(parts) > 1 and sum(len(p.ops) for p in parts) == len(norm.ops)


def _batch_norm_ops(training: str) -> list[OpInfo]:
    """timm EfficientNet-B0's first BatchNormAct2d as an H200 recorded it: the
    num_batches_tracked increment, the norm (channels-last, bf16) and its SiLU."""
    x = [128, 32, 112, 112]
    stats = [[32]] * 4
    return [
        OpInfo(
            0, "aten::add_", "elementwise", [[], [], []], ["long int", "long int", "Scalar"], ["", "", "1"]
        ),
        OpInfo(
            1,
            "aten::batch_norm",
            "norm",
            [x, *stats, [], [], [], []],
            ["c10::BFloat16", *["float"] * 4, *["Scalar"] * 4],
            ["", "", "", "", "", training, "0.1", "1e-05", "True"],
        ),
        OpInfo(2, "aten::silu_", "elementwise", [x], ["c10::BFloat16"], [""]),
    ]


def test_a_batch_norm_in_training_counts_the_pass_its_statistics_take():
    """Its statistics span N·H·W: x is read once for them and once to normalize, so the
    region's fused kernel moves x once more than its inputs and outputs say."""
    rules = load_rules()
    (norm,) = segment(_batch_norm_ops("True"), rules)
    assert (norm.level, norm.kind) == ("region", "norm")
    assert norm.stats_bytes == 128 * 32 * 112 * 112 * BF16
    assert norm.attrs["batch_statistics"] is True
    # Read x, write y: the one-pass ideal the statistics' pass comes on top of.
    assert norm.ideal is not None and norm.ideal.bytes >= 2 * norm.stats_bytes


def test_a_batch_norm_in_eval_or_unrecorded_takes_one_pass():
    rules = load_rules()
    for training in ("False", ""):
        (norm,) = segment(_batch_norm_ops(training), rules)
        assert norm.stats_bytes == 0.0 and "batch_statistics" not in norm.attrs
