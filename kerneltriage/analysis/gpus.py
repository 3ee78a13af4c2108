"""GPU data: the ceilings of the roofline (``kerneltriage/data/gpus.yaml``) and the measured
attention rates (``kerneltriage/data/attention_perf.yaml``), behind one GPU-name matcher.

The GPU is chosen from the trace's ``deviceProperties`` name, or by ``--gpu`` (a table key such
as ``H100-SXM``, or a device name). Measured ceilings (``kerneltriage calibrate``, recorded in a
run's manifest) replace the datasheet's where present, and the report says which it used.
``GPUSpec`` travels from here to every renderer; only ``Report.to_json`` turns it into a dict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kerneltriage.errors import RulesError, UnknownGPUError
from kerneltriage.resources import load_yaml

PRECISIONS = ("fp64", "fp32", "fp16", "tf32", "bf16", "fp16_tensor", "fp8")


@dataclass
class GPUSpec:
    key: str  # the GPU table's key, e.g. "H200"
    name: str
    sms: int
    l2_mb: float
    peak_bandwidth_gbs: float  # GB/s (1e9 B/s)
    peak_tflops: dict[str, float]
    source: str  # where the figures come from: the datasheet, or calibrate's measurement
    measured: dict[str, Any] = field(default_factory=dict)  # the calibration that was applied

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.peak_bandwidth_gbs * 1e9

    def peak(self, precision: str) -> float:
        """FLOP/s for a precision; falls back to the nearest slower unit the table has."""
        for p in _FALLBACK.get(precision, (precision,)):
            if p in self.peak_tflops:
                return self.peak_tflops[p] * 1e12
        return self.peak_tflops["fp32"] * 1e12

    def ridge(self, precision: str) -> float:
        """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.peak(precision) / self.bandwidth

    def to_json(self) -> dict[str, Any]:
        """The report's ``gpu`` object (schema ``kerneltriage.report/1``)."""
        return {
            "name": self.name,
            "key": self.key,
            "peak_bandwidth_gbs": self.peak_bandwidth_gbs,
            "peak_tflops": dict(self.peak_tflops),
            "sms": self.sms,
            "l2_mb": self.l2_mb,
            "source": self.source,
        }


_FALLBACK = {
    "fp8": ("fp8", "bf16"),
    "bf16": ("bf16", "fp16_tensor"),
    "fp16_tensor": ("fp16_tensor", "bf16"),
    "tf32": ("tf32", "fp32"),
    "fp16": ("fp16", "fp32"),
    "fp64": ("fp64", "fp32"),
    "fp32": ("fp32",),
}


def gpu_table() -> dict[str, dict[str, Any]]:
    """The GPU table's rows by key (parsed once per process)."""
    data = load_yaml("gpus.yaml")
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise RulesError("the GPU table has no 'gpus' mapping", path="gpus.yaml")
    return data["gpus"]


def known_gpus() -> list[str]:
    return list(gpu_table())


def match_gpu(wanted: str) -> str | None:
    """The GPU table key for a key or a device name: a key (any case) first, then the rows'
    ``match`` regexes in table order. The one matcher for every GPU lookup."""
    table = gpu_table()
    for key in table:
        if key.lower() == wanted.lower():
            return key
    for key, entry in table.items():
        if any(re.search(p, wanted, re.IGNORECASE) for p in entry.get("match", [])):
            return key
    return None


def resolve_gpu(
    device_name: str | None,
    override: str | None = None,
    calibration: dict[str, Any] | None = None,
) -> GPUSpec:
    """The GPU spec for a trace: ``override`` (``--gpu``) wins over the trace's device name."""
    table = gpu_table()
    wanted = override or device_name
    if not wanted:
        raise UnknownGPUError(
            "the trace does not name its GPU",
            hint=f"pass --gpu with one of: {', '.join(table)}",
        )
    key = match_gpu(wanted)
    if key is None:
        raise UnknownGPUError(
            f"GPU {wanted!r} is not in the GPU table",
            hint=f"pass --gpu with one of: {', '.join(table)}",
        )
    entry = table[key]
    spec = GPUSpec(
        key=key,
        name=entry["name"],
        sms=int(entry["sms"]),
        l2_mb=float(entry["l2_mb"]),
        peak_bandwidth_gbs=float(entry["hbm_gbs"]),
        peak_tflops={k: float(v) for k, v in entry["peak_tflops"].items()},
        source=f"datasheet: {entry.get('source', 'vendor figures')}",
    )
    if calibration:
        _apply_calibration(spec, calibration)
    return spec


def _apply_calibration(spec: GPUSpec, calibration: dict[str, Any]) -> None:
    """Measured ceilings replace datasheet ones, precision by precision."""
    used = []
    bw = calibration.get("hbm_gbs")
    if isinstance(bw, (int, float)) and bw > 0:
        spec.peak_bandwidth_gbs = float(bw)
        used.append("bandwidth")
    for precision, value in (calibration.get("peak_tflops") or {}).items():
        if precision in PRECISIONS and isinstance(value, (int, float)) and value > 0:
            spec.peak_tflops[precision] = float(value)
            used.append(precision)
    if used:
        when = calibration.get("date", "")
        spec.source = (
            f"measured by kerneltriage calibrate {when}: {', '.join(used)}; other peaks from the datasheet"
        )
        spec.measured = dict(calibration)


def attention_perf(gpu: GPUSpec, head_dim: int | None, causal: bool) -> tuple[float, float] | None:
    """(SDPA, built-in) forward + backward TFLOP/s of plain attention on ``gpu``, from the
    shipped benchmark table; None where it has no such measurement."""
    if head_dim is None:
        return None
    table = load_yaml("attention_perf.yaml") or {}
    for device, entries in (table.get("gpus") or {}).items():
        if match_gpu(str(device)) != gpu.key:
            continue
        for e in entries or []:
            if (
                int(e.get("head_dim", -1)) == int(head_dim)
                and bool(e.get("causal")) == causal
                and e.get("variant", "plain") == "plain"
            ):
                try:
                    return float(e["sdpa_tflops"]), float(e["builtin_tflops"])
                except (KeyError, TypeError, ValueError):
                    return None
    return None
