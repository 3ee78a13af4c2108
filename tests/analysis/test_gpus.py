"""GPU table lookups and calibration overrides."""

from __future__ import annotations

import pytest

from kerneltriage.analysis.gpus import attention_perf, known_gpus, match_gpu, resolve_gpu
from kerneltriage.errors import UnknownGPUError


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
    ],
)
def test_device_names_resolve(name, key):
    assert resolve_gpu(name).key == key


def test_table_covers_the_required_gpus():
    required = {
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
    }
    assert required <= set(known_gpus())
    for key in required:
        spec = resolve_gpu(key)
        assert spec.peak_bandwidth_gbs > 0 and spec.sms > 0 and spec.l2_mb > 0
        assert {"fp32", "tf32", "bf16"} <= set(spec.peak_tflops)


def test_override_wins_and_ridge_is_consistent():
    spec = resolve_gpu("NVIDIA H200", override="H100-SXM")
    assert spec.key == "H100-SXM"
    assert spec.ridge("bf16") == pytest.approx(989.4e12 / 3350e9)
    assert spec.peak("fp8") == 1978.9e12
    assert resolve_gpu("A100").peak("fp8") == resolve_gpu("A100").peak("bf16")  # no fp8 units: falls back


def test_unknown_gpu_lists_the_table():
    with pytest.raises(UnknownGPUError, match="not in the GPU table") as err:
        resolve_gpu("Voodoo 5 6000")
    assert "H100-SXM" in str(err.value)
    with pytest.raises(UnknownGPUError, match="does not name its GPU"):
        resolve_gpu(None)


def test_calibration_replaces_measured_ceilings_only():
    spec = resolve_gpu(
        "H200", calibration={"hbm_gbs": 4166, "peak_tflops": {"bf16": 680, "bogus": 1}, "date": "2026-11-21"}
    )
    assert spec.peak_bandwidth_gbs == 4166 and spec.peak_tflops["bf16"] == 680
    assert spec.peak_tflops["fp32"] == 66.9
    assert "measured" in spec.source and "bandwidth" in spec.source and "bogus" not in spec.source


def test_attention_rates_use_the_gpu_matcher():
    import yaml

    from kerneltriage.resources import data_path

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
    unmeasured = next(k for k in known_gpus() if all(match_gpu(d) != k for d in table))
    assert attention_perf(resolve_gpu(unmeasured), entry["head_dim"], entry["causal"]) is None
