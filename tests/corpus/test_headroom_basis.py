"""Every headroom of every real trace of ``../shared/external-traces`` rests on a basis that
applies to its op, and every row reads by one grammar.

Each trace is reported once through the CLI (JSON); the assertions read the JSON the way a
performance engineer reads the report: where did this headroom come from, does it apply here,
and does the row say the same thing as the conditions behind it.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.analysis.candidates.estimate import GEMM_TILE, kernel_precision
from kerneltriage.analysis.gpus import gpu_table
from kerneltriage.analysis.judge.attention_rates import measured_range
from kerneltriage.cli import main
from kerneltriage.resources import load_yaml
from tests.helpers import EXTERNAL, corpus

CORPUS = EXTERNAL
TRACES = sorted(CORPUS.glob("*/*.json.gz"))
BASES = {
    "ncu counters",
    "ncu counters (raised to the shape model's ceiling)",
    "shape model",
    "fused-region shape model",
    "measured attention rate",
    "first-principles ceiling",
    "launch floor",
}

pytestmark = [pytest.mark.slow, corpus]


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


def _text(path: Path) -> str:
    result = CliRunner().invoke(main, ["report", str(path)])
    assert result.exit_code == 0, f"{_id(path)}: exit {result.exit_code}: {result.output[-400:]}"
    return result.output


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
        if c["reason"] in ("library-kernel", "no-ceiling"):
            raise AssertionError(f"{c['id']}: a {c['reason']} row with a headroom")


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_library_kernels_without_a_model_show_no_headroom(path):
    # cuDNN convolutions and BatchNorm, cuBLAS and FBGEMM kernels whose ops have no shape
    # model (and no counters): no ceiling, so no headroom, no basis and no saving from one.
    for _rep, c in _candidates(path):
        if c["roofline"]["source"] in ("none", "no GPU") or c["reason"] in ("library-kernel", "no-ceiling"):
            assert c["headroom"] is None and c["attrs"].get("headroom_basis") is None, (c["id"], c["name"])
            assert c["roofline"]["ceiling_ms"] is None, (c["id"], c["roofline"])
            if c["verdict"] != "skip":
                # Only a verdict with its own scoped model (FP32 kernels off the tensor cores)
                # may carry a saving here, and it names that model.
                assert c["reason"] == "fp32-off-tensor-cores", (c["id"], c["reason"])


# Copies and fills run on the copy engines: no kernel launch.
_COPY = re.compile(r"memcpy|memset|\b[DHP]to[DHP]\b", re.IGNORECASE)


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_launch_floor_counts_launches_as_launched(path):
    # The floor is every kernel this candidate launched, each at the GPU's per-launch floor:
    # DLRM's candidates with hundreds of launches are not "1 launches × 2 µs".
    for rep, c in _candidates(path):
        r = c["roofline"]
        if r["ceiling_ms"] is None or r["source"] == "attention table":
            continue
        launched = sum(k["launches_per_step"] for k in c["kernels"] if not _COPY.search(k["name"]))
        assert r["launches_per_step"] == pytest.approx(launched, rel=1e-3), (c["id"], c["name"], r)
        # Each launch at the GPU's floor, or at what it ran where it ran shorter: the floor
        # never exceeds the time measured (an H100's floor is an estimate on a V100).
        floor_ms = r["launches_per_step"] * rep["gpu"]["launch_floor_us"] * 1e-3
        assert r["launch_floor_ms"] <= floor_ms * (1 + 1e-3), (c["id"], r)
        assert r["launch_floor_ms"] <= c["time_ms_per_step"] * (1 + 1e-3), (c["id"], r)
        basis = c["attrs"].get("headroom_basis")
        if basis and basis["kind"] == "launch floor":
            assert r["launch_bound"] and basis["launches_per_step"] == r["launches_per_step"]
            assert r["ceiling_ms"] == pytest.approx(r["launch_floor_ms"], rel=1e-3)
            assert "as launched" in c["conditions"]["headroom"]["detail"], c["conditions"]["headroom"]


def _measured_on(vendor: str) -> list[list[int]]:
    return load_yaml("gpus.yaml")["achievable"][vendor].get("measured_compute") or []


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_ceilings_name_their_gpu_family(path):
    # Achievable fractions measured on H100/H200 (NVIDIA) or MI300X (AMD) are estimates on a
    # V100, A100, B200 or MI2xx: the JSON says so, in its flag, label and source.
    for rep in _reports(path):
        gpu = rep["gpu"]
        if gpu is None:
            continue
        row = gpu_table()[gpu["key"]]
        own = set(row.get("achievable") or {}) & {"bandwidth", "tensor", "vector"}
        estimate = list(row["compute"]) not in _measured_on(row["vendor"]) and len(own) < 3
        a = gpu["achievable"]
        assert a["estimate"] is estimate, (gpu["key"], a)
        if estimate:
            assert "estimate" in a["label"] and "not measured on" in a["source"], a
        for c in rep["candidates"]:
            basis = c["attrs"].get("headroom_basis")
            if basis:
                assert basis["gpu"] == gpu["key"] and basis["achievable"] == a["label"]


def test_the_header_says_the_fractions_are_an_estimate():
    head = _text(_trace("hta-cnn-v100")).split("Steps:")[0]
    assert "estimate for compute 7.0" in " ".join(head.split())


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_small_gemms_are_held_to_the_sms_their_tiles_fill(path):
    # A 1024×96 output is 32 tiles of 64×64: it cannot fill 108 SMs, and its compute ceiling
    # is the share its tiles fill (wave quantization), not the whole machine.
    for rep, c in _candidates(path):
        if c["kind"] != "gemm" or c["roofline"]["source"] != "estimate" or c["shapes"]["distinct"] != 1:
            continue
        op = c["example"][0]
        if op["name"] not in ("aten::linear", "aten::mm", "aten::addmm") or len(op["dims"]) < 2:
            continue
        x, w = op["dims"][0], op["dims"][1]
        if op["name"] == "aten::addmm":
            x, w = op["dims"][1], op["dims"][2]
        if not (x and w) or len(w) != 2:
            continue
        m = math.prod(x[:-1])
        n = w[0] if op["name"] == "aten::linear" else w[1]
        tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
        sms = rep["gpu"]["sms"]
        fill = tiles / (math.ceil(tiles / sms) * sms)
        assert c["roofline"]["fill"] == pytest.approx(fill, rel=1e-3), (c["id"], c["name"], tiles, sms)


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_savings_count_what_the_fix_moves(path):
    # Every saving names its formula; FP32 SIMT kernels moved to the tensor cores gain at most
    # the tensor ÷ FP32 ceiling ratio on those kernels' time, and without a byte model only
    # the halved bytes (2×).
    for rep, c in _candidates(path):
        saving = c["expected_saving_share"]
        if not saving:
            assert "saving_basis" not in c["attrs"], c["id"]
            continue
        assert c["attrs"]["saving_basis"], c["id"]
        if c["reason"] != "fp32-off-tensor-cores":
            continue
        ceilings = rep["gpu"]["ceiling_tflops"]
        ratio = ceilings.get("tf32", ceilings.get("fp16_tensor")) / ceilings["fp32"]
        gain = ratio if c["roofline"]["source"] != "none" else min(ratio, 2.0)
        assert saving <= c["time_share"] * (1 - 1 / gain) * (1 + 1e-4), (c["id"], saving, gain)
        assert "FP32 SIMT time" in c["attrs"]["saving_basis"]


def test_autocast_on_a_v100_cnn_is_scoped_to_the_convolutions():
    # hta-cnn-v100: 65% of the step in cuDNN FP32 SIMT convolutions with no shapes recorded.
    # The fp16 fix gains what halved bytes give on those kernels, not the 7× ceiling ratio
    # on the whole candidate (53% before).
    (rep,) = _reports(_trace("hta-cnn-v100"))
    c = rep["candidates"][0]
    assert c["reason"] == "fp32-off-tensor-cores" and c["headroom"] is None
    assert c["expected_saving_share"] < 0.5 * c["time_share"]
    assert "halved bytes" in c["attrs"]["saving_basis"]


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
def test_skips_show_no_saving(path):
    for _rep, c in _candidates(path):
        if c["verdict"] == "skip":
            assert c["expected_saving_share"] == 0.0, (c["id"], c["reason"])
            assert "saving_basis" not in c["attrs"], c["id"]


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_at_roof_only_below_the_rules_roof_threshold(path):
    # "at-roof" on the headroom the row shows (one decimal), against the rules' at_roof.
    for rep, c in _candidates(path):
        at_roof = rep["thresholds"]["at_roof"]
        shown = c["headroom"] is not None and round(c["headroom"], 1)
        if c["reason"] in ("at-roof", "library-at-roof", "compiled-at-roof") and c["headroom"] is not None:
            assert shown < at_roof, (c["id"], c["headroom"])
        if c["reason"] == "low-headroom":
            assert at_roof <= shown < rep["thresholds"]["min_headroom"], (c["id"], c["headroom"])


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_thresholds_are_compared_on_the_shown_figure(path):
    for rep, c in _candidates(path):
        t = rep["thresholds"]
        shown = round(c["time_share"] * 1000) / 1000
        hot = c["conditions"]["hotness"]["passed"]
        if shown >= t["min_share"]:
            assert hot, (c["id"], c["time_share"])
        if shown < t["min_share_floor"]:
            assert not hot, (c["id"], c["time_share"])
        h = c["conditions"]["headroom"]
        if h["passed"] is not None and c["roofline"]["source"] != "attention table":
            assert h["passed"] == (round(c["headroom"], 1) >= max(t["min_headroom"], t["at_roof"])), c["id"]


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_rows_ordered_by_verdict_then_saving(path):
    for rep in _reports(path):
        cands = rep["candidates"]
        acting = [c for c in cands if c["verdict"] != "skip"]
        assert cands[: len(acting)] == acting  # by verdict: the actionable rows first ...
        savings = [c["expected_saving_share"] for c in acting]
        assert savings == sorted(savings, reverse=True)  # ... by saving
        shares = [c["time_share"] for c in cands[len(acting) :]]
        assert shares == sorted(shares, reverse=True)  # then the skips by their share


_RATE = re.compile(
    r"(\d+(?:\.\d+)?) TFLOP/s achieved|runs at (\d+(?:\.\d+)?) TFLOP/s|attention at (\d+(?:\.\d+)?) TFLOP/s"
)


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_one_achieved_rate_per_candidate(path):
    # The roofline line, the headroom line, the note and the JSON say one rate.
    for _rep, c in _candidates(path):
        rate = c["roofline"]["achieved_tflops"]
        said = [
            float(next(g for g in m.groups() if g))
            for text in (c["conditions"]["headroom"]["detail"], c["note"] or "", c["reason"])
            for m in _RATE.finditer(text)
        ]
        for value in said:
            assert rate is not None and abs(value - rate) <= 0.5 + 0.01 * rate, (c["id"], value, rate)


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_names_are_short_and_the_full_name_kept(path):
    for _rep, c in _candidates(path):
        assert len(c["name"]) <= 80, c["name"]
        if c["name"].endswith("…"):
            assert c["attrs"]["full_name"].startswith(c["name"][:-1])


def test_attention_shapes_come_through_the_external_id():
    # torch.compile on an MI300X: attn_fwd's own op is the compiled region; the op that
    # launched it, aten::_flash_attention_forward 8×4096×16×128, is linked by External id.
    (rep,) = _reports(_trace("tracelens-compile-mi300x"))
    c = next(c for c in rep["candidates"] if c["name"] == "attn_fwd")
    assert c["attrs"]["shapes_from"].startswith("launching op")
    assert c["example"][0]["name"] == "aten::_flash_attention_forward"
    assert c["example"][0]["dims"][0] == [8, 4096, 16, 128]
    # No attention rates are measured on the MI300X: a first-principles ceiling (its FLOPs at
    # the share of the bf16 rate fused attention reaches), and why no measured rate applies.
    assert c["roofline"]["source"] == "first principles" and c["headroom"] is not None
    assert 250 < c["roofline"]["achieved_tflops"] < 350
    assert "no attention rates measured" in c["conditions"]["headroom"]["detail"]
    assert c["verdict"] == "skip" and c["reason"] in ("low-headroom", "library-at-roof")


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


def test_unaligned_gemms_name_the_dimension_to_pad():
    # recsys on an A100: aten::linear(98304x647, 30x647) in fp32 (TF32 kernels), K=647 and N=30
    # off the multiple of 4: the padding is its fix, by hand, with the edit.
    (rep,) = _reports(_trace("hta-recsys-8rank-a100"))
    c = next(c for c in rep["candidates"] if c["name"].startswith("aten::linear(98304x647, 30x647"))
    assert c["verdict"] == "use-builtin" and c["builtin"] == "pad K=647 → 648, N=30 → 32"
    assert c["recipe"]["id"] == "gemm-pad" and c["recipe"]["apply"] is None
    assert "x = torch.nn.functional.pad(x, (0, 1))  # K 647 → 648" in c["fix"]
    assert c["expected_saving_share"] > 0
    # A DLRM compiled on an A100: 8% of the step in CUTLASS's align1 TF32 GEMMs that CUDA graphs
    # replay (no op, no shape, no counters). The note says why the kernels are the unaligned
    # ones and what padding measured in TF32 (1.31×, below the rules' 2×): about 1.9% of the
    # step, by hand (Inductor's force_shape_pad measured no better than its default).
    (dlrm,) = _reports(_trace("hta-dlrm-compiled-a100-80g"))
    c = next(c for c in dlrm["candidates"] if "align1" in c["name"])
    assert c["headroom"] is None and c["attrs"]["compiled"] and not c["ops"]
    assert c["verdict"] == "skip"
    assert "100% of its time runs CUTLASS's unaligned (align1/align2) kernels" in c["note"]
    assert "padding measured 1.31× faster at K=2798" in c["note"]
    saving = c["time_share"] * (1 - 2.220 / 2.919)
    assert f"about {saving:.1%} of the step" in c["note"] and 0.015 < saving < 0.025
    assert "pad the layer itself" in c["note"]


def test_a_batch_norm_in_training_is_ceilinged_with_its_statistics_pass():
    """ResNet's batch norms (MI300X, training, `training=True` recorded): the fused ceiling of
    a BatchNorm + ReLU region moves x twice forward (statistics, then normalize) besides y, and
    dy and x twice backward besides dx: 3 tensors of x's size forward where one pass moved 2,
    5 backward where it moved 3. (This run checkpoints activations: the trace links a backward
    to a few instances only, so an instance moves 3 to 8.)"""
    path = CORPUS / "tracelens-resnet-ckpt-8rank-mi300x" / "resnet_act_checkpoint.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout's corpus")
    (rep,) = _reports(path)[:1]
    norms = [
        c
        for c in rep["candidates"]
        if c["ops"] == ["aten::add_", "aten::batch_norm", "aten::relu_"]
        and c["roofline"]["source"] == "fused estimate"
    ]
    assert norms
    for c in norms:
        assert c["attrs"]["batch_statistics"] is True
        # What a compile takes: the ReLU's own passes (2 x-sizes forward, 3 backward) over the
        # norm's 3 and 5 that stay: 13/8 with a backward, 5/3 without.
        assert 13 / 8 - 0.01 <= c["attrs"]["fusion_headroom"] <= 5 / 3 + 0.01
        bn = next(op for op in c["example"] if op["name"] == "aten::batch_norm")
        x = math.prod(bn["dims"][0]) * 2  # bf16 activations
        per_instance = c["roofline"]["bytes"] / c["instances_per_step"]
        assert 3 * x * 0.99 <= per_instance <= 8 * x * 1.01


def test_a_batch_norm_alone_leaves_a_compile_nothing_to_fuse():
    path = CORPUS / "tracelens-resnet-ckpt-8rank-mi300x" / "resnet_act_checkpoint.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout's corpus")
    (rep,) = _reports(path)[:1]
    alone = [c for c in rep["candidates"] if c["ops"] == ["aten::add_", "aten::batch_norm"]]
    assert alone and all(c["attrs"]["fusion_headroom"] == 1.0 for c in alone)
