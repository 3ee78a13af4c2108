"""GPU ceilings for the roofline, from the GPU table (``kerneltriage/data/gpus.yaml``).

The GPU is chosen from the trace's ``deviceProperties`` name, or by ``--gpu`` (a table key such
as ``H100-SXM``, or a device name). Measured ceilings (``kerneltriage calibrate``, recorded in a
run's manifest) replace the datasheet's where present, and the report says which it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import yaml

from kerneltriage.errors import RulesError, UnknownGPUError
from kerneltriage.resources import data_path

GPU_TABLE = data_path("gpus.yaml")
PRECISIONS = ("fp64", "fp32", "fp16", "tf32", "bf16", "fp16_tensor", "fp8")


@dataclass
class GPUSpec:
    key: str
    name: str
    sms: int
    l2_mb: float
    hbm_gbs: float
    peak_tflops: dict[str, float]
    source: str
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.hbm_gbs * 1e9

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
        return {
            "name": self.name,
            "key": self.key,
            "peak_bandwidth_gbs": self.hbm_gbs,
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


@cache
def gpu_table() -> dict[str, dict[str, Any]]:
    try:
        data = yaml.safe_load(GPU_TABLE.read_text())
    except (OSError, yaml.YAMLError) as exc:  # a broken install, not a user mistake
        raise RulesError(f"cannot read the GPU table ({exc})", path=str(GPU_TABLE)) from None
    return data["gpus"]


def known_gpus() -> list[str]:
    return list(gpu_table())


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
    key = _lookup(wanted, table)
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
        hbm_gbs=float(entry["hbm_gbs"]),
        peak_tflops={k: float(v) for k, v in entry["peak_tflops"].items()},
        source=f"datasheet: {entry.get('source', 'vendor figures')}",
    )
    if calibration:
        _apply_calibration(spec, calibration)
    return spec


def _lookup(wanted: str, table: dict[str, dict[str, Any]]) -> str | None:
    for key in table:
        if key.lower() == wanted.lower():
            return key
    for key, entry in table.items():
        if any(re.search(p, wanted, re.IGNORECASE) for p in entry.get("match", [])):
            return key
    return None


def _apply_calibration(spec: GPUSpec, calibration: dict[str, Any]) -> None:
    """Measured ceilings replace datasheet ones, precision by precision."""
    used = []
    bw = calibration.get("hbm_gbs")
    if isinstance(bw, (int, float)) and bw > 0:
        spec.hbm_gbs = float(bw)
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
