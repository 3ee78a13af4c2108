"""GPU data: the ceilings of the roofline (``kerneltriage/data/gpus.yaml``) and the measured
attention rates (``kerneltriage/data/attention_perf.yaml``), behind one GPU-name matcher.

The row of the GPU table comes from, in order: the run's calibration (the GPU it measured),
``--gpu`` (a table key such as ``H100-SXM``, or a device name), the trace's device name, or the
trace's ``deviceProperties`` (vendor, compute capability, SMs, memory: the nearest row). With
none of them there is no GPU (``resolve_gpu`` returns None) and the report has no ceilings.

A datasheet peak is never a ceiling as is: ``GPUSpec`` keeps the datasheet figures and the
achievable fractions of the table (the row's own, else its vendor's), and its ceilings are
datasheet × fraction, except the quantities ``kerneltriage calibrate`` measured, which replace
the product. ``GPUSpec`` travels from here to every renderer; only ``to_json`` makes it a dict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kerneltriage.errors import RulesError, UnknownGPUError
from kerneltriage.resources import load_yaml

PRECISIONS = ("fp64", "fp32", "fp16", "tf32", "bf16", "fp16_tensor", "fp8")
TENSOR_PRECISIONS = ("tf32", "bf16", "fp16_tensor", "fp8")  # tensor / matrix cores
VECTOR_PRECISIONS = ("fp64", "fp32", "fp16")  # CUDA cores / SIMD units
RESOLVED_BY = ("calibration", "--gpu", "name", "deviceProperties")
_GIB = float(1 << 30)


@dataclass(frozen=True)
class Achievable:
    """Shares of the datasheet figures a real kernel reaches, with where they come from."""

    bandwidth: float
    tensor: float
    vector: float
    source: str  # the full provenance
    label: str = ""  # a short one, for headers
    # Fractions measured on another GPU family than this one's (H100's applied to a V100):
    # an estimate here, and the header and JSON say so.
    estimate: bool = False

    def fraction(self, precision: str) -> float:
        return self.tensor if precision in TENSOR_PRECISIONS else self.vector

    def to_json(self) -> dict[str, Any]:
        return {
            "bandwidth": self.bandwidth,
            "tensor": self.tensor,
            "vector": self.vector,
            "source": self.source,
            "label": self.label,
            "estimate": self.estimate,
        }


@dataclass
class GPUSpec:
    key: str  # the GPU table's key, e.g. "H200"
    name: str
    sms: int
    l2_mb: float
    peak_bandwidth_gbs: float  # datasheet, GB/s (1e9 B/s)
    peak_tflops: dict[str, float]  # datasheet, per precision
    source: str  # where the ceilings come from, one line
    achievable: Achievable
    launch_floor_us: float
    launch_floor_source: str
    resolved_by: str  # calibration | --gpu | name | deviceProperties
    resolution: str = ""  # how the row was chosen, e.g. "name 'NVIDIA H200' → H200 row"
    vendor: str = "nvidia"
    compute: tuple[int, int] | None = None
    memory_gb: float | None = None
    datasheet: str = ""  # the datasheet the row's figures come from
    measured_bandwidth_gbs: float | None = None  # from calibration; replaces the product
    measured_tflops: dict[str, float] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # the calibration that was applied
    emulated: tuple[str, ...] = ()  # tensor precisions without units of their own (V100's bf16)

    # --- ceilings ---------------------------------------------------------------------------

    @property
    def ceiling_bandwidth_gbs(self) -> float:
        """GB/s a real kernel reaches: measured, else datasheet × achievable."""
        if self.measured_bandwidth_gbs is not None:
            return self.measured_bandwidth_gbs
        return self.peak_bandwidth_gbs * self.achievable.bandwidth

    @property
    def bandwidth(self) -> float:
        """The memory ceiling in bytes per second."""
        return self.ceiling_bandwidth_gbs * 1e9

    def unit(self, precision: str | None) -> str:
        """The precision whose figure ``peak`` uses: ``precision`` itself, else the nearest
        slower unit the GPU has (no fp8 units: bf16; no tf32: fp32)."""
        wanted = precision or "fp32"
        for p in _FALLBACK.get(wanted, (wanted,)):
            if p in self.peak_tflops or p in self.measured_tflops:
                return p
        return "fp32"

    def ceiling_tflop(self, precision: str) -> float:
        """TFLOP/s ceiling of exactly ``precision`` (no fallback): measured, else datasheet ×
        achievable (tensor or vector fraction)."""
        if precision in self.measured_tflops:
            return self.measured_tflops[precision]
        return self.peak_tflops[precision] * self.fraction(precision)

    def fraction(self, precision: str) -> float:
        """The achievable fraction of a precision's datasheet rate: tensor for the tensor
        precisions the GPU has units for, vector for the rest."""
        if precision in self.emulated:
            return self.achievable.vector
        return self.achievable.fraction(precision)

    def peak(self, precision: str) -> float:
        """The compute ceiling in FLOP/s for a precision (see ``unit`` for the fallback)."""
        return self.ceiling_tflop(self.unit(precision)) * 1e12

    @property
    def ceiling_tflops(self) -> dict[str, float]:
        """TFLOP/s ceiling of every precision the GPU has, in the table's order."""
        names = list(self.peak_tflops) + [p for p in self.measured_tflops if p not in self.peak_tflops]
        return {p: self.ceiling_tflop(p) for p in names}

    def ridge(self, precision: str) -> float:
        """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.peak(precision) / self.bandwidth

    @property
    def is_measured(self) -> bool:
        return self.measured_bandwidth_gbs is not None or bool(self.measured_tflops)

    def to_json(self) -> dict[str, Any]:
        """The report's ``gpu`` object (schema ``kerneltriage.report/1``): ``peak_*`` are the
        datasheet's, ``ceiling_*`` the ones the report used."""
        return {
            "name": self.name,
            "key": self.key,
            "peak_bandwidth_gbs": self.peak_bandwidth_gbs,
            "peak_tflops": dict(self.peak_tflops),
            "ceiling_bandwidth_gbs": self.ceiling_bandwidth_gbs,
            "ceiling_tflops": self.ceiling_tflops,
            "achievable": self.achievable.to_json(),
            "measured_ceilings": sorted(
                (["bandwidth"] if self.measured_bandwidth_gbs is not None else [])
                + list(self.measured_tflops)
            ),
            "launch_floor_us": self.launch_floor_us,
            "launch_floor_source": self.launch_floor_source,
            "resolved_by": self.resolved_by,
            "resolution": self.resolution,
            "vendor": self.vendor,
            "compute": list(self.compute) if self.compute else None,
            "memory_gb": self.memory_gb,
            "sms": self.sms,
            "l2_mb": self.l2_mb,
            "source": self.source,
        }


_FALLBACK = {
    "fp8": ("fp8", "bf16", "fp16_tensor"),
    "bf16": ("bf16", "fp16_tensor"),
    "fp16_tensor": ("fp16_tensor", "bf16"),
    "tf32": ("tf32", "fp32"),
    "fp16": ("fp16", "fp32"),
    "fp64": ("fp64", "fp32"),
    "fp32": ("fp32",),
}


# --- the table ------------------------------------------------------------------------------


def _table_data() -> dict[str, Any]:
    data = load_yaml("gpus.yaml")
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise RulesError("the GPU table has no 'gpus' mapping", path="gpus.yaml")
    return data


def gpu_table() -> dict[str, dict[str, Any]]:
    """The GPU table's rows by key (parsed once per process)."""
    return _table_data()["gpus"]


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


def achievable_for(key: str) -> tuple[Achievable, float, str]:
    """(achievable fractions, launch floor µs, launch floor source) of a row: the row's own
    entries, field by field, else its vendor's."""
    data = _table_data()
    entry = data["gpus"][key]
    vendor = str(entry.get("vendor", "nvidia"))
    default = (data.get("achievable") or {}).get(vendor)
    if not isinstance(default, dict):
        raise RulesError(f"the GPU table has no 'achievable' entry for vendor {vendor!r}", path="gpus.yaml")
    own = entry.get("achievable") or {}
    values, from_row = {}, []
    for name in ("bandwidth", "tensor", "vector"):
        value = own.get(name, default.get(name))
        if not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise RulesError(f"GPU row {key}: achievable {name} must be in (0, 1]", path="gpus.yaml")
        values[name] = float(value)
        if name in own:
            from_row.append(name)
    vendor_label = str(default.get("label") or f"{vendor} default")
    measured_on = [tuple(c) for c in default.get("measured_compute") or []]
    compute = tuple(entry.get("compute") or ())
    estimate = bool(measured_on) and compute not in measured_on and len(from_row) < 3
    if measured_on and compute not in measured_on:
        # Fractions measured on another GPU family: an estimate here, and said so.
        family = ".".join(str(x) for x in compute) if compute else "?"
        vendor_label = f"estimate for compute {family}: {vendor_label}, not measured on this family"
    vendor_source = str(default.get("source", ""))
    if measured_on and compute not in measured_on:
        vendor_source = f"estimate, not measured on compute {family}: {vendor_source}"
    if not from_row:
        source, label = vendor_source, vendor_label
    else:
        rest = [n for n in ("bandwidth", "tensor", "vector") if n not in from_row]
        source = f"{', '.join(from_row)}: {own.get('source', key)}"
        label = str(own.get("label") or own.get("source", key))
        if rest:
            source += f"; {', '.join(rest)}: {vendor_source or vendor_label}"
            label += f"; {', '.join(rest)}: {vendor_label}"
    floor = entry.get("launch_floor_us", default.get("launch_floor_us"))
    if not isinstance(floor, (int, float)) or floor <= 0:
        raise RulesError(f"GPU row {key}: no launch_floor_us (row or vendor)", path="gpus.yaml")
    if "launch_floor_us" in entry:
        floor_source = str(entry.get("launch_floor_source") or own.get("source") or key)
    else:
        floor_source = f"{vendor} default: {default.get('launch_floor_source', '')}"
        if measured_on and compute not in measured_on:
            floor_source += f" (an estimate on compute {family}: not measured on this family)"
    return Achievable(source=source, label=label, estimate=estimate, **values), float(floor), floor_source


def spec_for(key: str, resolved_by: str, resolution: str) -> GPUSpec:
    """The GPUSpec of a table row (no calibration applied)."""
    entry = gpu_table()[key]
    achievable, floor, floor_source = achievable_for(key)
    compute = entry.get("compute")
    spec = GPUSpec(
        key=key,
        name=entry["name"],
        sms=int(entry["sms"]),
        l2_mb=float(entry["l2_mb"]),
        peak_bandwidth_gbs=float(entry["hbm_gbs"]),
        peak_tflops={k: float(v) for k, v in entry["peak_tflops"].items()},
        source="",
        achievable=achievable,
        launch_floor_us=floor,
        launch_floor_source=floor_source,
        resolved_by=resolved_by,
        resolution=resolution,
        vendor=str(entry.get("vendor", "nvidia")),
        compute=(int(compute[0]), int(compute[1])) if compute else None,
        memory_gb=float(entry["memory_gb"]) if entry.get("memory_gb") is not None else None,
        datasheet=str(entry.get("source", "vendor figures")),
        emulated=tuple(str(p) for p in entry.get("emulated") or ()),
    )
    spec.source = f"datasheet ({spec.datasheet}) × achievable ({achievable.label})"
    return spec


# --- deviceProperties -----------------------------------------------------------------------

_AMD_NAME = re.compile(r"\b(AMD|Radeon|Instinct)\b|\bMI\d{3}", re.IGNORECASE)
_NVIDIA_NAME = re.compile(r"NVIDIA|Tesla|GeForce|Quadro|\bRTX\b", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceFacts:
    """What a trace's deviceProperties entry says about its GPU."""

    name: str
    vendor: str | None
    compute: tuple[int, int] | None
    sms: int | None
    memory_gb: float | None  # GiB, as totalGlobalMem reports it

    def text(self) -> str:
        parts = [f"compute {self.compute[0]}.{self.compute[1]}" if self.compute else "no compute capability"]
        unit = "CUs" if self.vendor == "amd" else "SMs"
        parts.append(f"{self.sms} {unit}" if self.sms else f"no {unit}")
        parts.append(f"{self.memory_gb:.0f} GB" if self.memory_gb else "no memory size")
        return ", ".join(parts)


def device_facts(properties: dict[str, Any]) -> DeviceFacts:
    """Vendor (from the name, else warpSize 64 → AMD, 32 → NVIDIA), compute capability (HIP
    reports gfx942 as 9.4), SMs (CUs on AMD) and memory of a deviceProperties entry."""

    def num(name: str) -> int | None:
        value = properties.get(name)
        try:
            return int(value) if value is not None and value != "" else None
        except (TypeError, ValueError):
            return None

    name = str(properties.get("name") or "").strip()
    if _AMD_NAME.search(name):
        vendor: str | None = "amd"
    elif _NVIDIA_NAME.search(name):
        vendor = "nvidia"
    else:
        vendor = {64: "amd", 32: "nvidia"}.get(num("warpSize") or 0)
    major, minor = num("computeMajor"), num("computeMinor")
    memory = num("totalGlobalMem")
    return DeviceFacts(
        name=name,
        vendor=vendor,
        compute=(major, minor) if major is not None and minor is not None else None,
        sms=num("numSms") or None,
        memory_gb=memory / _GIB if memory else None,
    )


def infer_gpu(properties: dict[str, Any]) -> tuple[str, str] | None:
    """(row key, why) of the row nearest to a deviceProperties entry: same vendor and compute
    capability, then the closest SM count, then the closest memory (table order breaks ties,
    and the reason names the rows tied with it). None without a vendor, compute capability and
    SM count, or when no row has that vendor and compute capability."""
    facts = device_facts(properties)
    if facts.vendor is None or facts.compute is None or facts.sms is None:
        return None
    table = gpu_table()
    rows = [
        key
        for key, e in table.items()
        if e.get("vendor") == facts.vendor and tuple(e.get("compute") or ()) == facts.compute
    ]
    if not rows:
        return None

    def distance(key: str) -> tuple[int, float]:
        e = table[key]
        memory = abs(float(e.get("memory_gb") or 0) - facts.memory_gb) if facts.memory_gb else 0.0
        return abs(int(e["sms"]) - (facts.sms or 0)), memory

    rows.sort(key=distance)  # stable: table order among equals
    best = rows[0]
    why = f"inferred from deviceProperties: {facts.text()} → {best} row"
    tied = [k for k in rows[1:] if distance(k) == distance(best)]
    if tied:
        why += (
            f" ({', '.join(tied)} {'has' if len(tied) == 1 else 'have'} the same compute, "
            f"{'CUs' if facts.vendor == 'amd' else 'SMs'} and memory, with ceilings within "
            f"{_spread([best, *tied]):.1%}; the first row in table order is used)"
        )
    else:
        sms_off, memory_off = distance(best)
        if sms_off or memory_off > 0.1 * float(table[best].get("memory_gb") or 0):
            unit = "CUs" if facts.vendor == "amd" else "SMs"
            why += f" (the nearest: {table[best]['sms']} {unit}, {table[best].get('memory_gb')} GB)"
    return best, why


def _spread(keys: list[str]) -> float:
    """The largest relative difference between the rows' datasheet figures."""
    table = gpu_table()
    figures: list[list[float]] = [[float(table[k]["hbm_gbs"])] for k in keys]
    common = set.intersection(*(set(table[k]["peak_tflops"]) for k in keys))
    for figs, k in zip(figures, keys):
        figs += [float(table[k]["peak_tflops"][p]) for p in sorted(common)]
    spread = 0.0
    for column in zip(*figures):
        spread = max(spread, (max(column) - min(column)) / max(column))
    return spread


def unresolved_reason(device_name: str | None, properties: dict[str, Any] | None) -> str:
    """Why no GPU row fits the trace, in a few words (for the report's header and note)."""
    if not properties:
        if device_name:
            return f"{device_name!r} is not in the GPU table, no deviceProperties"
        return "no name, no deviceProperties"
    facts = device_facts(properties)
    name = f"{facts.name!r} is not in the GPU table" if facts.name else "no name"
    if facts.vendor is None:
        return f"{name}; deviceProperties name no vendor"
    return f"{name}; deviceProperties ({facts.vendor}, {facts.text()}) match no row"


# --- resolution -----------------------------------------------------------------------------


def resolve_gpu(
    device_name: str | None,
    override: str | None = None,
    calibration: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
) -> GPUSpec | None:
    """The GPU of a trace, or None when nothing identifies one.

    Ceilings come from, in order: the run's calibration (its measured quantities replace
    datasheet × achievable), ``override`` (``--gpu``: a key or device name; one that matches
    nothing raises ``UnknownGPUError``, a user mistake), the table row ``device_name`` matches,
    and the row inferred from ``properties`` (the trace's deviceProperties entry: the nearest
    row of the same vendor and compute capability).

    The row is ``--gpu``'s, else the calibration's GPU's, else the name's, else the inferred
    one. A calibration of another row than ``--gpu``'s is not applied (its measurements are of
    another GPU); one whose GPU is not in the table applies to whatever row is found.
    """
    table = gpu_table()
    measured = _measurements(calibration)
    named = str((calibration or {}).get("gpu") or "") if measured else ""
    calibrated_key = match_gpu(named) if named else None
    found: tuple[str, str, str] | None = None  # (key, resolved_by, resolution)
    if override:
        key = match_gpu(override)
        if key is None:
            raise UnknownGPUError(
                f"GPU {override!r} is not in the GPU table",
                hint=f"pass --gpu with one of: {', '.join(table)}",
            )
        found = (key, "--gpu", f"--gpu {override}")
        if device_name and match_gpu(device_name) not in (None, key):
            found = (key, "--gpu", f"--gpu {override} (the trace names {device_name!r})")
        if measured and calibrated_key not in (None, key):
            measured = []
            found = (key, "--gpu", f"{found[2]}; the run's calibration of {named!r} not applied: another GPU")
    elif calibrated_key is not None:
        found = (calibrated_key, "calibration", f"calibration of {named!r} → {calibrated_key} row")
        if device_name and match_gpu(device_name) not in (None, calibrated_key):
            found = (calibrated_key, "calibration", f"{found[2]} (the trace names {device_name!r})")
    elif device_name and (key := match_gpu(device_name)) is not None:
        found = (key, "name", f"name {device_name!r} → {key} row")
    elif properties and (inferred := infer_gpu(properties)) is not None:
        found = (inferred[0], "deviceProperties", inferred[1])
    if found is None:
        return None
    if measured and found[1] != "calibration":
        found = (found[0], "calibration", f"{found[2]}; ceilings measured by the run's calibration")
    spec = spec_for(*found)
    if measured:
        _apply_calibration(spec, calibration or {}, measured)
    return spec


#: A calibration is believed within this band around its row's datasheet (measured ÷ datasheet):
#: a copy or matmul measures below the datasheet, never 5× under nor 1.5× above it.
CALIBRATION_BAND = (0.2, 1.5)


def implausible_calibration(calibration: dict[str, Any] | None, device_name: str | None) -> str | None:
    """Why a run's calibration must not be applied to a trace of ``device_name``, or None: it
    was measured on another GPU, or a quantity lies outside ``CALIBRATION_BAND``."""
    measured = _measurements(calibration)
    if not measured or calibration is None:
        return None
    named = str(calibration.get("gpu") or "")
    calibrated_key = match_gpu(named) if named else None
    trace_key = match_gpu(device_name) if device_name else None
    if calibrated_key and trace_key and calibrated_key != trace_key:
        return (
            f"the run's calibration was measured on {named!r}, not on the trace's GPU "
            f"({device_name!r}): not applied, datasheet ceilings used"
        )
    key = calibrated_key or trace_key
    if key is None:
        return None
    row = spec_for(key, "name", "")
    low, high = CALIBRATION_BAND
    for quantity in measured:
        if quantity == "bandwidth":
            value, sheet = float(calibration["hbm_gbs"]), row.peak_bandwidth_gbs
        else:
            value, sheet = float(calibration["peak_tflops"][quantity]), row.peak_tflops.get(quantity, 0.0)
        if sheet > 0 and not low <= value / sheet <= high:
            return (
                f"the run's calibration gives {quantity} {value:g}, {value / sheet:.3g}× the {key} "
                f"datasheet's {sheet:g} (believed within {low}-{high}×): not applied, datasheet ceilings used"
            )
    return None


def _measurements(calibration: dict[str, Any] | None) -> list[str]:
    """The quantities a calibration measured (valid, positive values only)."""
    if not calibration:
        return []
    used = []
    bw = calibration.get("hbm_gbs")
    if isinstance(bw, (int, float)) and not isinstance(bw, bool) and bw > 0:
        used.append("bandwidth")
    for precision, value in (calibration.get("peak_tflops") or {}).items():
        if precision in PRECISIONS and isinstance(value, (int, float)) and value > 0:
            used.append(precision)
    return used


def _apply_calibration(spec: GPUSpec, calibration: dict[str, Any], used: list[str]) -> None:
    """Measured ceilings replace datasheet × achievable, quantity by quantity."""
    if "bandwidth" in used:
        spec.measured_bandwidth_gbs = float(calibration["hbm_gbs"])
    spec.measured_tflops = {
        p: float(v) for p, v in (calibration.get("peak_tflops") or {}).items() if p in used
    }
    when = calibration.get("date", "")
    spec.source = (
        f"measured by kerneltriage calibrate {when}: {', '.join(used)}; "
        f"other ceilings datasheet × achievable ({spec.achievable.label})"
    )
    spec.measured = dict(calibration)


def attention_perf(gpu: GPUSpec | None, head_dim: int | None, causal: bool) -> tuple[float, float] | None:
    """(SDPA, built-in) forward + backward TFLOP/s of plain attention on ``gpu``, from the
    shipped benchmark table; None where it has no such measurement (or no GPU)."""
    if head_dim is None or gpu is None:
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
