"""Every headroom of every real trace of ``../shared/external-traces`` rests on a basis that
applies to its op, and every row reads by one grammar.

Each trace is reported once through the CLI (JSON); the assertions read the JSON the way a
performance engineer reads the report: where did this headroom come from, does it apply here,
and does the row say the same thing as the conditions behind it.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.analysis.attention_rates import measured_range
from kerneltriage.analysis.estimate import kernel_precision
from kerneltriage.analysis.rules import load_rules
from kerneltriage.cli import main

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "external-traces"
TRACES = sorted(CORPUS.glob("*/*.json.gz"))
AT_ROOF = load_rules().cutoffs.at_roof
BASES = {
    "ncu counters",
    "ncu counters (raised to the shape model's ceiling)",
    "shape model",
    "fused-region shape model",
    "measured attention rate",
    "launch floor",
}

pytestmark = pytest.mark.slow


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name[:24]}"


@cache
def _reports(path: Path) -> tuple[dict, ...]:
    result = CliRunner().invoke(main, ["report", str(path), "--format", "json"])
    assert result.exit_code == 0, f"{_id(path)}: exit {result.exit_code}: {result.output[-400:]}"
    data = json.loads(result.output)
    if "candidates" in data:
        return (data,)
    reps = data["reports"]
    return tuple(reps.values() if isinstance(reps, dict) else reps)


def _candidates(path: Path):
    for rep in _reports(path):
        for c in rep["candidates"]:
            yield rep, c


def _trace(folder: str) -> Path:
    found = [p for p in TRACES if p.parent.name == folder]
    assert found, f"{folder} missing from {CORPUS}"
    return found[0]


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_no_headroom_without_a_basis_that_applies(path):
    for rep, c in _candidates(path):
        basis = c["attrs"].get("headroom_basis")
        if c["headroom"] is None:
            assert basis is None, (c["id"], basis)
            continue
        assert rep["gpu"] is not None, f"{c['id']}: a headroom without a GPU"
        assert basis and basis["kind"] in BASES, (c["id"], basis)
        if basis["source"] in ("estimate", "fused estimate"):
            # A shape model's inputs came from this trace: recorded op shapes, or the shapes of
            # the op its kernel's External id names.
            assert basis["shapes"] != "none" and c["example"], (c["id"], c["name"])
        if basis["kind"] == "launch floor":
            # Launches counted as launched: the floor is the kernels this candidate launched.
            launched = sum(k["launches_per_step"] for k in c["kernels"] if "memcpy" not in k["name"].lower())
            assert c["roofline"]["launches_per_step"] >= 0.5 * launched, (c["id"], c["roofline"])


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_attention_table_rows_only_within_their_range(path):
    for _rep, c in _candidates(path):
        if c["roofline"]["source"] != "attention table":
            continue
        table = c["attrs"]["attention_table"]
        lo, hi = measured_range(table["gpu"], table["head_dim"], table["causal"])
        assert lo <= table["seq_len"] <= hi, (c["id"], table)
        assert table["rows"][0] <= table["seq_len"] <= table["rows"][1]
        # One achieved rate for the candidate: the roofline line's is the headroom line's.
        assert c["roofline"]["achieved_tflops"] == pytest.approx(table["achieved_tflops"], rel=0.01)


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_no_headroom_below_one_feeds_a_verdict(path):
    for _rep, c in _candidates(path):
        h = c["headroom"]
        if h is None or h >= 1.0:
            continue
        assert c["verdict"] == "skip" and c["reason"] == "ceiling-disagrees", (c["id"], c["reason"])
        assert c["conditions"]["headroom"]["passed"] is None
        assert c["expected_saving_share"] == 0.0
        assert c["attrs"]["headroom_basis"]["disagreement"] is True


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_no_fp32_ceiling_for_tf32_kernels(path):
    for _rep, c in _candidates(path):
        if c["kind"] not in ("gemm", "convolution") or c["roofline"]["precision"] is None:
            continue
        total = sum(k["time_ms_per_step"] for k in c["kernels"]) or 1.0
        tf32 = sum(k["time_ms_per_step"] for k in c["kernels"] if kernel_precision(k["full_name"]) == "tf32")
        if tf32 >= 0.5 * total:
            assert c["roofline"]["precision"] == "tf32", (c["id"], c["name"], c["roofline"]["precision"])


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_one_display_grammar(path):
    for rep, c in _candidates(path):
        t = rep["thresholds"]
        # A skip never shows a saving.
        if c["verdict"] == "skip":
            assert c["expected_saving_share"] == 0.0, (c["id"], c["reason"])
        # "at-roof" only within the roof threshold, on the headroom the row shows.
        if c["reason"] in ("at-roof", "library-at-roof", "compiled-at-roof") and c["headroom"] is not None:
            assert round(c["headroom"], 1) < AT_ROOF, (c["id"], c["headroom"])
        # Hotness is judged on the share the row shows.
        shown = round(c["time_share"] * 1000) / 1000
        hot = c["conditions"]["hotness"]["passed"]
        if shown >= t["min_share"]:
            assert hot, (c["id"], c["time_share"])
        if shown < t["min_share_floor"]:
            assert not hot, (c["id"], c["time_share"])
        # Names are short; the full one is kept.
        assert len(c["name"]) <= 80, c["name"]
        if c["name"].endswith("…"):
            assert c["attrs"]["full_name"].startswith(c["name"][:-1])
    for rep in _reports(path):
        cands = rep["candidates"]
        acting = [c for c in cands if c["verdict"] != "skip"]
        assert cands[: len(acting)] == acting  # by verdict: the actionable rows first ...
        savings = [c["expected_saving_share"] for c in acting]
        assert savings == sorted(savings, reverse=True)  # ... by saving
        shares = [c["time_share"] for c in cands[len(acting) :]]
        assert shares == sorted(shares, reverse=True)  # then the skips by their share


def test_attention_shapes_come_through_the_external_id():
    # torch.compile on an MI300X: attn_fwd's own op is the compiled region; the op that
    # launched it, aten::_flash_attention_forward 8×4096×16×128, is linked by External id.
    (rep,) = _reports(_trace("tracelens-compile-mi300x"))
    c = next(c for c in rep["candidates"] if c["name"] == "attn_fwd")
    assert c["attrs"]["shapes_from"].startswith("launching op")
    assert c["example"][0]["name"] == "aten::_flash_attention_forward"
    assert c["example"][0]["dims"][0] == [8, 4096, 16, 128]
    # No attention rates are measured on the MI300X: the rate, no ceiling, and why.
    assert c["headroom"] is None and c["reason"] == "no-ceiling"
    assert 250 < c["roofline"]["achieved_tflops"] < 350
    assert "no attention rates measured" in c["note"]


def test_library_gemms_with_two_d_shapes_get_a_shape_model():
    # SGLang on an MI300X: aiter::gemm_a16w16(x [M, K], w [N, K]) is a linear.
    (rep,) = _reports(_trace("tracelens-sglang-qwen3-8b-mi300x"))
    gemms = [c for c in rep["candidates"] if c["name"].startswith("aiter::gemm_a16w16")]
    assert gemms and all(c["headroom"] is not None for c in gemms)
    for c in gemms:
        assert c["attrs"]["headroom_basis"]["kind"] in ("shape model", "launch floor")
        assert 100 < c["roofline"]["achieved_tflops"] < 1307  # MI300X bf16 datasheet


def test_gated_activation_counts_input_and_output_once():
    (rep,) = _reports(_trace("tracelens-sglang-qwen3-8b-mi300x"))
    c = next(c for c in rep["candidates"] if "silu_and_mul" in c["name"])
    out = c["example"][0]["dims"][0]  # the output buffer comes first
    per_instance = c["roofline"]["bytes"] / c["instances_per_step"]
    assert per_instance == pytest.approx(3 * out[0] * out[1] * 2, rel=1e-6)  # 3× the output


def test_rope_cache_counted_by_the_rows_read():
    (rep,) = _reports(_trace("tracelens-moe-8rank-b200"))
    c = next(c for c in rep["candidates"] if "rotary_embedding" in c["name"])
    dims = c["example"][0]["dims"]
    tokens, cache = dims[0][0], dims[4]
    whole = cache[0] * cache[1] * 2
    per_instance = c["roofline"]["bytes"] / c["instances_per_step"]
    assert per_instance < whole  # not the whole cos/sin cache
    assert per_instance >= tokens * cache[1] * 2


def test_tensor_op_sgemm_is_placed_against_tf32():
    # recsys on an A100: aten::linear(1024x512, 96x512) runs cutlass …s1688gemm… (TF32)
    (rep,) = _reports(_trace("hta-recsys-8rank-a100"))
    c = next(c for c in rep["candidates"] if c["name"].startswith("aten::linear(1024x512, 96x512"))
    assert any(re.search("s1688", k["full_name"]) for k in c["kernels"])
    assert c["roofline"]["precision"] == "tf32"
    # and its 1024×96 output is 32 tiles of 64×64: it cannot fill the A100's 108 SMs
    assert c["roofline"]["fill"] == pytest.approx(32 / 108, rel=1e-3)
