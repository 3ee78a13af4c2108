"""GPU resolution (calibration > --gpu > name > deviceProperties > none) on the real
deviceProperties of every third-party trace, achievable ceilings, calibration overrides, the
launch floor, and the attention-rate lookup."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from kerneltriage.analysis.gpus import (
    TENSOR_PRECISIONS,
    VECTOR_PRECISIONS,
    attention_perf,
    device_facts,
    gpu_table,
    infer_gpu,
    known_gpus,
    match_gpu,
    resolve_gpu,
    unresolved_reason,
)
from kerneltriage.errors import UnknownGPUError
from kerneltriage.ingest.kineto import read_trace
from kerneltriage.resources import data_path
from tests.helpers import EXTERNAL, corpus

ROOT = Path(__file__).resolve().parents[2]
TABLE = yaml.safe_load(data_path("gpus.yaml").read_text())

# Every trace of ../shared/external-traces: (folder, file) → (row, how it was found).
# None: the trace names no GPU and has no deviceProperties.
EXPECTED = {
    ("hta-alexnet-a100", "benchmark_result_2869224_1695835535_trace.json.gz"): ("A100-40GB", "name"),
    ("hta-cnn-ddp-a100", "nccl_data.json.gz"): ("A100-40GB", "name"),
    ("hta-cnn-v100", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"): ("V100-SXM2", "name"),
    ("hta-compiled-2rank-v100", "df_index_resolver.json.gz"): ("V100-SXM2", "name"),
    ("hta-dlrm-2rank-a100", "sampled_rank-0.json.gz"): None,
    ("hta-dlrm-2rank-a100", "sampled_rank-1.json.gz"): None,
    ("hta-dlrm-compiled-a100-80g", "rank0.json.gz"): ("A100-80GB", "name"),
    ("hta-minitoy-mi250-rocm62", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"): ("MI250", "deviceProperties"),
    ("hta-recsys-8rank-a100", "control.json.gz"): ("A100-40GB", "name"),
    ("kineto-resnet50-v100-pt19", "worker0.1623143089861.pt.trace.json.gz"): ("V100-DGXS", "name"),
    ("kineto-resnet50-v100-pt19", "worker0.1623212756351.pt.trace.json.gz"): ("V100-DGXS", "name"),
    ("tracelens-compile-mi300x", "trace.json.gz"): ("MI300X", "name"),
    ("tracelens-gpu-only-mi210", "gpu_only_trace.json.gz"): ("MI210", "name"),
    ("tracelens-moe-8rank-b200", "eager_trace.json.gz"): ("B200", "name"),
    ("tracelens-qwen05b-h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"): ("H100-SXM", "name"),
    ("tracelens-qwen05b-mi300x", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"): (
        "MI300X",
        "name",
    ),  # "MI300X VF"
    ("tracelens-resnet-ckpt-8rank-mi300x", "resnet_act_checkpoint.json.gz"): ("MI300X", "name"),
    ("tracelens-sglang-qwen3-8b-mi300x", "sglang_Qwen3-8B_prefilldecode.json.gz"): ("MI300X", "name"),
    ("tracelens-timesformer-h100", "facebook_timesformer-base-finetuned-k400__1016002.json.gz"): (
        "H100-SXM",
        "name",
    ),
    ("tracelens-vllm-graph-capture-mi300x", "graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"): (
        "MI300X",
        "deviceProperties",
    ),
}
TRACES = sorted(EXPECTED)
H200_CALIBRATION = {
    "gpu": "NVIDIA H200",
    "date": "2026-11-21",
    "hbm_gbs": 4221.2,
    "peak_tflops": {"bf16": 678.8, "fp16_tensor": 670.0, "tf32": 352.4, "fp32": 65.7},
}


def _timeline(folder: str, name: str):
    path = EXTERNAL / folder / name
    assert path.is_file(), f"{path} missing"
    return read_trace(path)


def _fractions(key: str) -> dict[str, float]:
    """The achievable fractions of a row, read from the table here: its own, else its vendor's."""
    row = TABLE["gpus"][key]
    vendor = TABLE["achievable"][row["vendor"]]
    own = row.get("achievable") or {}
    return {f: own.get(f, vendor[f]) for f in ("bandwidth", "tensor", "vector")}


# --- the table ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ],
)
def test_device_names_resolve(name, key):
    spec = resolve_gpu(name)
    assert spec is not None and spec.key == key and spec.resolved_by == "name"


def test_every_row_has_what_inference_and_ceilings_need():
    assert {
        "H100-SXM",
        "H100-PCIe",
        "H200",
        "A100-40GB",
        "A100-80GB",
        "L4",
        "L40S",
        "A10G",
        "RTX-4090",
        "B200",
    } <= set(known_gpus())
    for key, row in TABLE["gpus"].items():
        assert row["vendor"] in TABLE["achievable"], key
        assert len(row["compute"]) == 2 and row["memory_gb"] > 0 and row["sms"] > 0, key
        spec = resolve_gpu(key)
        assert spec is not None and spec.key == key
        assert spec.peak_bandwidth_gbs > 0 and spec.l2_mb > 0 and "fp32" in spec.peak_tflops
        assert spec.launch_floor_us > 0 and spec.launch_floor_source
        assert 0 < spec.achievable.bandwidth <= 1 and 0 < spec.achievable.tensor <= 1
        assert 0 < spec.achievable.vector <= 1 and spec.achievable.source


# --- achievable ceilings --------------------------------------------------------------------


@pytest.mark.parametrize("key", list(TABLE["gpus"]))
def test_ceilings_are_datasheet_times_achievable(key):
    spec = resolve_gpu(key)
    row, fractions = TABLE["gpus"][key], _fractions(key)
    # The JSON keeps the datasheet; the ceilings are datasheet × fraction.
    assert spec.peak_bandwidth_gbs == row["hbm_gbs"]
    assert spec.ceiling_bandwidth_gbs == pytest.approx(row["hbm_gbs"] * fractions["bandwidth"])
    assert spec.bandwidth == pytest.approx(row["hbm_gbs"] * fractions["bandwidth"] * 1e9)
    for precision, datasheet in row["peak_tflops"].items():
        tensor = precision in TENSOR_PRECISIONS and precision not in row.get("emulated", [])
        kind = "tensor" if tensor else "vector"
        assert precision in TENSOR_PRECISIONS + VECTOR_PRECISIONS
        assert spec.peak_tflops[precision] == datasheet
        assert spec.ceiling_tflops[precision] == pytest.approx(datasheet * fractions[kind])
        assert spec.peak(precision) == pytest.approx(datasheet * fractions[kind] * 1e12)
        assert spec.ceiling_tflops[precision] < datasheet  # never the datasheet as is
    data = spec.to_json()
    assert data["peak_bandwidth_gbs"] == row["hbm_gbs"] and data["peak_tflops"] == row["peak_tflops"]
    assert data["ceiling_tflops"] == spec.ceiling_tflops
    # Fractions measured on another family (H100's on a V100, MI300X's on an MI250) are an
    # estimate there, and the JSON, its label and its source say so.
    vendor = TABLE["achievable"][row["vendor"]]
    own = set(row.get("achievable") or {}) & {"bandwidth", "tensor", "vector"}
    estimate = list(row["compute"]) not in vendor["measured_compute"] and len(own) < 3
    assert data["achievable"] == {
        **fractions,
        "source": spec.achievable.source,
        "label": spec.achievable.label,
        "estimate": estimate,
    }
    assert ("estimate" in spec.achievable.label) == estimate
    assert ("not measured on" in spec.achievable.source) == estimate


def test_row_fractions_win_field_by_field():
    h100 = resolve_gpu("H100-SXM")
    # The H100 row's own measurement: copy 3003 of 3350 GB/s, bf16 matmul 737 of 989 TFLOP/s.
    assert h100.ceiling_bandwidth_gbs == pytest.approx(3350 * 0.90)
    assert h100.ceiling_tflops["bf16"] == pytest.approx(989.4 * 0.745)
    # No vector measurement in the row: the NVIDIA default's.
    assert h100.achievable.vector == TABLE["achievable"]["nvidia"]["vector"]
    assert "vector" in h100.achievable.source and "2026-11-22" in h100.achievable.source
    a100 = resolve_gpu("A100-80GB")
    # The vendor's source, said to be an estimate on the A100 (measured on compute 9.0 only).
    assert a100.achievable.source.endswith(TABLE["achievable"]["nvidia"]["source"])
    assert a100.achievable.source.startswith("estimate, not measured on compute 8.0")
    assert resolve_gpu("MI300X").achievable.source == TABLE["achievable"]["amd"]["source"]


def test_override_wins_and_ridge_is_consistent():
    spec = resolve_gpu("NVIDIA H200", override="H100-SXM")
    assert spec.key == "H100-SXM" and spec.resolved_by == "--gpu" and "NVIDIA H200" in spec.resolution
    assert spec.ridge("bf16") == pytest.approx(989.4e12 * 0.745 / (3350e9 * 0.90))
    assert spec.peak("fp8") == pytest.approx(1978.9e12 * 0.745)
    a100 = resolve_gpu("A100")
    assert a100.unit("fp8") == "bf16" and a100.peak("fp8") == a100.peak("bf16")  # no fp8 units: falls back
    mi250 = resolve_gpu("MI250")
    assert mi250.unit("tf32") == "fp32"  # CDNA2 has no tf32
    v100 = resolve_gpu("V100-SXM2")  # no bf16 units: bf16 runs on the FP32 units, at their fraction
    assert v100.ceiling_tflops["bf16"] == pytest.approx(v100.ceiling_tflops["fp32"])
    assert v100.ceiling_tflops["fp16_tensor"] == pytest.approx(125.0 * v100.achievable.tensor)


def test_an_unknown_override_is_a_user_mistake_an_unknown_trace_is_not():
    with pytest.raises(UnknownGPUError, match="not in the GPU table") as err:
        resolve_gpu("NVIDIA H200", override="Voodoo 5 6000")
    assert "H100-SXM" in str(err.value) and "MI300X" in str(err.value)
    assert resolve_gpu(None) is None
    assert resolve_gpu("Voodoo 5 6000") is None  # a trace's unknown name: no ceilings, no error
    assert unresolved_reason(None, None) == "no name, no deviceProperties"
    assert "'Voodoo 5 6000' is not in the GPU table" in unresolved_reason("Voodoo 5 6000", None)


# --- calibration ----------------------------------------------------------------------------


def test_calibration_replaces_measured_ceilings_only():
    spec = resolve_gpu(
        "H200", calibration={"hbm_gbs": 4166, "peak_tflops": {"bf16": 680, "bogus": 1}, "date": "2026-11-21"}
    )
    assert spec.resolved_by == "calibration"
    # Measured: the measurement itself (fraction 1); the datasheet stays in peak_*.
    assert spec.ceiling_bandwidth_gbs == 4166 and spec.ceiling_tflops["bf16"] == 680
    assert spec.peak_bandwidth_gbs == 4800 and spec.peak_tflops["bf16"] == 989.4
    # Not measured: datasheet × the H200 row's (tensor) or NVIDIA's (vector) fraction.
    assert spec.ceiling_tflops["fp32"] == pytest.approx(66.9 * TABLE["achievable"]["nvidia"]["vector"])
    assert spec.ceiling_tflops["fp8"] == pytest.approx(1978.9 * TABLE["gpus"]["H200"]["achievable"]["tensor"])
    assert spec.to_json()["measured_ceilings"] == ["bandwidth", "bf16"]
    assert "measured" in spec.source and "bandwidth" in spec.source and "bogus" not in spec.source


def test_the_calibrated_example_keeps_its_ceilings():
    manifest = json.loads((ROOT / "examples" / "runs" / "gpt-naive-h200" / "manifest.json").read_text())
    calibration = manifest["calibration"]
    spec = resolve_gpu("NVIDIA H200", calibration=calibration)
    assert spec.ceiling_bandwidth_gbs == calibration["hbm_gbs"]
    for precision, value in calibration["peak_tflops"].items():
        assert spec.ceiling_tflops[precision] == value
    assert spec.peak("bf16") == calibration["peak_tflops"]["bf16"] * 1e12


@corpus
def test_resolution_order_on_real_device_properties():
    """calibration > --gpu > name > deviceProperties > none, on the H100 trace's own entry."""
    tl = _timeline("tracelens-qwen05b-h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    props, name = tl.gpu_properties, tl.gpu_name
    assert name == "NVIDIA H100 80GB HBM3"
    h100_calibration = dict(H200_CALIBRATION, gpu=name, hbm_gbs=3003.2)
    # A calibration of the GPU --gpu names: its measurements beat the row's products.
    both = resolve_gpu(name, "H100-SXM", h100_calibration, props)
    assert (both.key, both.resolved_by) == ("H100-SXM", "calibration")
    assert both.ceiling_bandwidth_gbs == 3003.2 and both.ceiling_tflops["bf16"] == 678.8
    # Without --gpu the calibration's GPU picks the row, over the trace's name.
    calibrated = resolve_gpu(name, None, H200_CALIBRATION, props)
    assert (calibrated.key, calibrated.resolved_by) == ("H200", "calibration")
    assert (
        calibrated.resolution
        == "calibration of 'NVIDIA H200' → H200 row (the trace names 'NVIDIA H100 80GB HBM3')"
    )
    # --gpu naming another GPU than the calibration's: the measurements are of another GPU.
    chosen = resolve_gpu(name, "A100-80GB", H200_CALIBRATION, props)
    assert (chosen.key, chosen.resolved_by) == ("A100-80GB", "--gpu") and not chosen.is_measured
    assert "calibration of 'NVIDIA H200' not applied" in chosen.resolution
    assert chosen.ceiling_bandwidth_gbs == pytest.approx(2039 * _fractions("A100-80GB")["bandwidth"])
    assert resolve_gpu(name, "A100-80GB", None, props).resolved_by == "--gpu"
    named = resolve_gpu(name, None, None, props)
    assert (named.key, named.resolved_by) == ("H100-SXM", "name")
    nameless = dict(props, name="")
    inferred = resolve_gpu("", None, None, nameless)
    assert (inferred.key, inferred.resolved_by) == ("H100-SXM", "deviceProperties")
    assert inferred.resolution == "inferred from deviceProperties: compute 9.0, 132 SMs, 79 GB → H100-SXM row"
    assert resolve_gpu(None, None, None, None) is None
    # A calibration that names no GPU measures the row found: here the inferred one.
    anonymous = resolve_gpu("", None, {k: v for k, v in h100_calibration.items() if k != "gpu"}, nameless)
    assert (anonymous.key, anonymous.resolved_by) == ("H100-SXM", "calibration")
    assert (
        anonymous.ceiling_bandwidth_gbs == 3003.2 and "inferred from deviceProperties" in anonymous.resolution
    )


@pytest.mark.parametrize(("folder", "name"), TRACES)
@corpus
def test_every_external_trace_resolves_to_its_row(folder, name):
    tl = _timeline(folder, name)
    spec = resolve_gpu(tl.gpu_name, None, None, tl.gpu_properties)
    expected = EXPECTED[(folder, name)]
    if expected is None:
        assert spec is None and tl.gpu_properties is None and tl.gpu_name is None
        assert unresolved_reason(tl.gpu_name, tl.gpu_properties) == "no name, no deviceProperties"
        return
    assert (spec.key, spec.resolved_by) == expected
    facts = device_facts(tl.gpu_properties)
    assert facts.vendor == spec.vendor and facts.compute == spec.compute and facts.sms == spec.sms
    assert facts.memory_gb == pytest.approx(spec.memory_gb, rel=0.03)


@corpus
def test_nameless_mi300x_and_the_unnamed_mi250_gcd():
    vllm = _timeline(
        "tracelens-vllm-graph-capture-mi300x", "graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"
    )
    assert vllm.gpu_name is None and vllm.gpu_properties["name"] == ""  # vendor from warpSize 64
    spec = resolve_gpu(vllm.gpu_name, None, None, vllm.gpu_properties)
    assert spec.resolution == "inferred from deviceProperties: compute 9.4, 304 CUs, 192 GB → MI300X row"
    assert spec.launch_floor_us == TABLE["achievable"]["amd"]["launch_floor_us"]
    mi250 = _timeline("hta-minitoy-mi250-rocm62", "mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert mi250.gpu_name == "AMD Radeon Graphics"
    spec = resolve_gpu(mi250.gpu_name, None, None, mi250.gpu_properties)
    assert spec.resolution.startswith(
        "inferred from deviceProperties: compute 9.0, 104 CUs, 64 GB → MI250 row"
    )
    # MI210 has the same compute, CUs and memory: the source says so, and how close they are.
    assert "MI210 has the same compute, CUs and memory, with ceilings within 0.2%" in spec.resolution


@pytest.mark.parametrize(("folder", "name"), [t for t in TRACES if EXPECTED[t] and EXPECTED[t][1] == "name"])
@corpus
def test_inference_without_the_name_agrees_with_the_name(folder, name):
    """Blank the name of every named trace: its deviceProperties alone find the same row, or a
    row tied with it whose ceilings are the same within 1% (V100 SXM2/DGXS, MI250/MI210)."""
    tl = _timeline(folder, name)
    key, why = infer_gpu(dict(tl.gpu_properties, name=""))
    expected = EXPECTED[(folder, name)][0]
    if key != expected:
        table = gpu_table()
        assert expected in why  # named as tied
        a, b = table[key], table[expected]
        assert (a["vendor"], a["compute"], a["sms"], a["memory_gb"]) == (
            b["vendor"],
            b["compute"],
            b["sms"],
            b["memory_gb"],
        )
        assert a["hbm_gbs"] == pytest.approx(b["hbm_gbs"], rel=0.01)
        for p in set(a["peak_tflops"]) & set(b["peak_tflops"]):
            assert a["peak_tflops"][p] == pytest.approx(b["peak_tflops"][p], rel=0.01), p


@corpus
def test_device_properties_entry_is_the_kernels_device():
    # Kernels on device 1 of a two-GPU host: its entry, not the first.
    tl = _timeline("hta-compiled-2rank-v100", "df_index_resolver.json.gz")
    assert set(tl.kernels["device"]) == {1} and tl.gpu_properties["id"] == 1
    # ROCm numbers kernel devices apart from the properties' ids (kernels on 9, one entry 0).
    tl = _timeline("tracelens-sglang-qwen3-8b-mi300x", "sglang_Qwen3-8B_prefilldecode.json.gz")
    assert set(tl.kernels["device"]) == {9} and tl.gpu_properties["id"] == 0
    assert tl.gpu_properties["numSms"] == 304 and tl.gpu_properties["warpSize"] == 64


def test_inference_needs_vendor_compute_and_a_row():
    assert infer_gpu({"numSms": 132, "totalGlobalMem": 85e9}) is None  # no vendor, no compute
    far = {"name": "NVIDIA RTX PRO 6000", "computeMajor": 12, "computeMinor": 0, "numSms": 188}
    assert infer_gpu(far) is None  # no row of compute 12.0
    assert resolve_gpu(far["name"], None, None, far) is None
    assert "match no row" in unresolved_reason(far["name"], far)


# --- launch floor ---------------------------------------------------------------------------


def test_launch_floor_row_then_vendor():
    h100 = resolve_gpu("H100-SXM")
    assert h100.launch_floor_us == TABLE["gpus"]["H100-SXM"]["launch_floor_us"]
    assert "h100_sxm_2026-11-22" in h100.launch_floor_source
    a100 = resolve_gpu("A100-40GB")
    assert a100.launch_floor_us == TABLE["achievable"]["nvidia"]["launch_floor_us"]
    assert a100.launch_floor_source.startswith("nvidia default: measured by kerneltriage on an H100")
    assert a100.launch_floor_source.endswith("(an estimate on compute 8.0: not measured on this family)")
    mi300x = resolve_gpu("MI300X")
    assert mi300x.launch_floor_us == TABLE["achievable"]["amd"]["launch_floor_us"]
    assert mi300x.launch_floor_source.startswith("amd default: 1st percentile")
    assert "not measured on" not in mi300x.launch_floor_source  # measured on the MI300X traces


@corpus
def test_amd_launch_floor_is_the_first_percentile_of_the_mi300x_traces():
    """The AMD default: the 1st percentile of every kernel duration (ph X, cat kernel) of the
    MI300X traces, pooled; recomputed here from the traces themselves."""
    durations = []
    folders = sorted(p for p in EXTERNAL.iterdir() if p.is_dir() and p.name.endswith("mi300x"))
    assert len(folders) == 5
    for folder in folders:
        for path in folder.glob("*.json.gz"):
            events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
            durations += [e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(durations) == 5149
    floor = TABLE["achievable"]["amd"]["launch_floor_us"]
    assert floor == pytest.approx(np.percentile(durations, 1), abs=0.005)


# --- attention rates ------------------------------------------------------------------------


def test_attention_rates_use_the_gpu_matcher():
    table = yaml.safe_load(data_path("attention_perf.yaml").read_text())["gpus"]
    device, entries = next(iter(table.items()))
    key = match_gpu(device)
    assert key is not None and key == resolve_gpu(device).key
    entry = next(e for e in entries if e.get("variant", "plain") == "plain")
    spec = resolve_gpu(key)
    assert attention_perf(spec, entry["head_dim"], entry["causal"]) == (
        entry["sdpa_tflops"],
        entry["builtin_tflops"],
    )
    assert attention_perf(spec, None, True) is None
    assert attention_perf(None, entry["head_dim"], entry["causal"]) is None  # no GPU: no rates
    unmeasured = next(k for k in known_gpus() if all(match_gpu(d) != k for d in table))
    assert attention_perf(resolve_gpu(unmeasured), entry["head_dim"], entry["causal"]) is None
