"""Grouping on the shipped GPT run (H200, 4 layers of eager code, 3 profiled steps): ops and
regions of every step grouped across layers and steps, each in-step kernel in one group."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from kerneltriage.analysis.candidates.grouping import _compute_types, group_candidates
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.ingest.source import load_profile

NAIVE = Path(__file__).resolve().parents[3] / "examples" / "runs" / "gpt-naive-h200"


@pytest.fixture(scope="module")
def run():
    timeline = load_profile(NAIVE).timelines[0]
    attr = attribute(timeline, None)
    rules = load_rules()
    return timeline, attr, rules, group_candidates(timeline, attr, rules)


def test_every_in_step_kernel_is_in_exactly_one_group(run):
    _, attr, _, groups = run
    in_step = set(attr.kernels.index[attr.kernels["step"] >= 0].tolist())
    held = [i for g in groups.values() for i in g.kernel_index]
    assert len(held) == len(set(held)) == len(in_step) == 1533
    assert set(held) == in_step


def test_layers_and_steps_fold_into_one_group_per_op_and_region(run):
    _, _, _, groups = run
    assert len(groups) == 17
    (attention,) = (g for g in groups.values() if g.kind == "attention")
    assert attention.variant == "causal" and attention.name.startswith("attention (naive, causal)")
    # 4 layers × 3 steps of the naive pattern, its kernels forward and backward.
    assert attention.level == "region" and len(attention.segments) == 12
    assert {step for step, _ in attention.segments} == {0, 1, 2}
    assert attention.attrs["dtype"] == "c10::BFloat16" and len(attention.kernel_index) == 336
    # The eager RMSNorm: one per layer plus the final norm (5 × 3); the residual add joins
    # the norm after the attention block (4 × 3).
    norms = {g.variant: g for g in groups.values() if g.kind == "norm"}
    assert len(norms["rmsnorm"].segments) == 15 and norms["rmsnorm"].name.startswith("RMSNorm (eager, 6 ops)")
    assert len(norms["fused_add_rmsnorm"].segments) == 12
    # GEMMs are grouped by shape: QKV, output projection, MLP up and down, LM head.
    gemms = [g for g in groups.values() if g.kind == "gemm"]
    assert len(gemms) == 5 and all(g.library and g.level == "op" for g in gemms)
    assert Counter(len(g.segments) for g in gemms) == Counter({12: 4, 3: 1})


def test_gemm_compute_type_comes_from_the_rules_leaf_ops(run):
    """aten::linear records the dtype of its innermost matmul (``regions.gemm_leaf_ops``)."""
    timeline, attr, rules, _ = run
    names = timeline.cpu["name"].astype(str)
    roots = {
        int(r) for r in attr.kernels["fwd_root"].unique() if r >= 0 and names.iloc[int(r)] == "aten::linear"
    }
    assert len(roots) == (4 * 4 + 1) * 3  # 4 per layer of 4 layers, and the LM head; 3 steps
    assert set(_compute_types(timeline, attr, roots, rules).values()) == {"c10::BFloat16"}
    regions = rules.regions.model_copy(update={"gemm_leaf_ops": ()})
    none = replace(rules, file=rules.file.model_copy(update={"regions": regions}), _memo={})
    assert set(_compute_types(timeline, attr, roots, none).values()) == {None}
