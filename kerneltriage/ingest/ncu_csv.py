"""Read Nsight Compute raw CSV exports (``ncu --csv --page raw``) into ``Counters``.

The raw page has a header row, a units row, then one row per profiled kernel launch. Units
differ per column and can change scale between captures (``Mbyte`` in one, ``Gbyte`` in the
next), numbers carry thousands separators, and cells can be ``n/a`` or empty. Each metric is
scaled to base units (bytes, nanoseconds, instructions, FLOPs) here, so nothing downstream
sees a unit.

Different metric sets give the same quantities different ways; ``_derive`` takes the most
direct one present:

- DRAM bytes: ``dram__bytes_read.sum + dram__bytes_write.sum``, else ``dram__bytes.sum``, else
  ``dram__bytes.sum.per_second × duration`` (the SpeedOfLight/roofline sections).
- FP32/FP64/FP16 FLOPs: ``add + mul + 2·fma`` thread-instruction counts (``*.sum``), else the
  roofline sections' ``*.sum.per_cycle_elapsed × smsp__cycles_elapsed.avg.per_second × duration``.
- Tensor-core FLOPs: the ``sm__ops_path_tensor_*`` op counters, summed (they count FLOPs).
  ``sm__inst_executed_pipe_tensor`` counts instructions of varying shape and cannot be turned
  into FLOPs, so without op counters tensor FLOPs are left unknown (NaN).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
import re
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from kerneltriage.errors import CountersFormatError, ToolError
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.schemas import NcuRow
from kerneltriage.inputs import check_file, read_bytes

_NAME_COLUMNS = ("Kernel Name", "Function Name", "Name")

# Unit prefix scaling to base units. ncu writes SI prefixes (Kbyte = 1000 bytes).
_PREFIX = {
    "": 1.0,
    "K": 1e3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}
_TIME = {
    "ns": 1.0,
    "nsecond": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "s": 1e9,
    "second": 1e9,
}
_UNIT = re.compile(
    r"^([KkMGTPmun]?)(byte|inst|hz|Hz|cycle|warp|thread|block|register|sector|request|pass|SM|B)(/.*)?$"
)

# Output columns of Counters.rows, all numbers in base units (NaN: not measured).
ROW_COLUMNS = [
    "id",
    "kernel_name",
    "base_name",
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "device",
    "stream",
    "process",
    "nvtx",
    "duration_ns",
    "dram_bytes",
    "dram_read_bytes",
    "dram_write_bytes",
    "l2_bytes",
    "flops_fp32",
    "flops_fp64",
    "flops_fp16",
    "flops_tensor",
    "sm_pct",
    "memory_pct",
    "dram_pct",
]


@dataclass
class Counters:
    """Per-launch counters from one ncu export. ``metrics`` lists what the export measured."""

    source: str
    rows: pd.DataFrame
    metrics: list[str]
    warnings: list[str] = field(default_factory=list)
    # The captures (``capture`` numbers; 0 for a single export) that hold the first launch of
    # each problem size of their kernels only, in launch order (``analysis/timeline/sizes.py``).
    first_of_size: frozenset[int] = frozenset()
    # Hot kernels (base names) of which ``profile`` took only some instantiations -> those
    # (full names): the join measures the hot kernels' coverage on those only.
    hot_instances: dict[str, list[str]] = field(default_factory=dict)
    # Elementwise instantiations (as the trace spells them) profiled at one configuration per
    # L2 regime: the join scales those counters to their other configurations.
    scaled_kernels: frozenset[str] = frozenset()

    @property
    def has_tensor_flops(self) -> bool:
        return bool(self.rows["flops_tensor"].notna().any())

    @property
    def has_bytes(self) -> bool:
        return bool(self.rows["dram_bytes"].notna().any())


def merge_counters(parts: list[Counters]) -> Counters:
    """One table from several captures of the same run; ``capture`` numbers them in order
    (the join tries them in that order)."""
    if len(parts) == 1:
        return parts[0]
    rows = pd.concat([p.rows.assign(capture=i) for i, p in enumerate(parts)], ignore_index=True)
    metrics = sorted({m for p in parts for m in p.metrics})
    return Counters(
        " + ".join(p.source for p in parts),
        rows,
        metrics,
        [w for p in parts for w in p.warnings],
        frozenset(i for i, p in enumerate(parts) if p.first_of_size),
    )


def read_counters(path: str | os.PathLike[str]) -> Counters:
    """Read ``.csv``/``.csv.gz`` raw-page exports, or export a ``.ncu-rep`` through ``ncu``."""
    path = check_file(path, "Nsight Compute file", CountersFormatError)
    text = _export_report(path) if path.suffix == ".ncu-rep" else _read_text(path)
    return parse_counters(text, source=str(path))


def _read_text(path: Path) -> str:
    try:
        raw = read_bytes(path, "Nsight Compute file", CountersFormatError)
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8-sig")
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise CountersFormatError(
            f"compressed data is truncated or corrupt ({exc})", path=str(path)
        ) from None
    except UnicodeDecodeError:
        raise CountersFormatError("not a text CSV file", path=str(path)) from None


def _export_report(path: Path) -> str:
    try:
        proc = subprocess.run(
            ["ncu", "--import", str(path), "--csv", "--page", "raw"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise ToolError(
            "reading a .ncu-rep needs Nsight Compute's 'ncu' on PATH",
            path=str(path),
            hint="or export it yourself: ncu --import FILE --csv --page raw > counters.csv",
        ) from None
    if proc.returncode != 0:
        raise ToolError(f"ncu could not export the report: {proc.stderr.strip()[-300:]}", path=str(path))
    return proc.stdout


def parse_counters(text: str, source: str = "<csv>") -> Counters:
    lines = text.splitlines()
    # Captured stdout may begin with ncu's own ==PROF== / ==WARNING== lines.
    while lines and (lines[0].startswith("==") or not lines[0].strip()):
        lines.pop(0)
    try:
        table = list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as exc:
        raise CountersFormatError(f"not a CSV file ({exc})", path=source) from None
    if not table or not table[0]:
        raise CountersFormatError("empty file", path=source)
    header = table[0]
    if "Metric Name" in header and "Metric Value" in header:
        raise CountersFormatError(
            "this is ncu's details page; kerneltriage reads the raw page",
            path=source,
            hint="export with: ncu --import REPORT --csv --page raw",
        )
    name_col = next((c for c in _NAME_COLUMNS if c in header), None)
    if name_col is None or "ID" not in header:
        raise CountersFormatError(
            "not an Nsight Compute raw CSV (no 'ID' and 'Kernel Name' columns)", path=source
        )
    if len(table) < 2 or table[1][header.index("ID")].strip() != "":
        raise CountersFormatError(
            "no units row after the header: not an 'ncu --csv --page raw' export", path=source
        )
    units = table[1]
    body = [r for r in table[2:] if any(cell.strip() for cell in r)]
    if not body:
        raise CountersFormatError("the export holds no profiled kernels", path=source)
    index = {name: i for i, name in enumerate(header)}
    bad = [i for i, r in enumerate(body) if len(r) != len(header)]
    if bad:
        raise CountersFormatError(
            f"row {bad[0] + 3} has {len(body[bad[0]])} cells, the header has {len(header)}",
            path=source,
        )
    warnings: list[str] = []
    _refuse_decimal_commas(body, header, source)
    body = _valid_rows(body, index, name_col, source, warnings)
    unknown: set[str] = set()
    impossible: list[str] = []
    raw = {
        name: _column(body, index[name], units[index[name]], name, unknown, impossible)
        for name in header
        if _is_metric(name)
    }
    if impossible:
        warnings.append(
            f"{source}: {len(impossible)} counter value(s) negative or infinite, left unmeasured "
            f"(first: {impossible[0]})"
        )
    rows = _derive(body, index, name_col, raw, unknown, warnings)
    _drop_impossible_rates(rows, source, warnings)
    if rows["duration_ns"].isna().all():
        raise CountersFormatError(
            "the export lacks gpu__time_duration: cannot place kernels on a roofline", path=source
        )
    if rows["dram_bytes"].isna().all():
        warnings.append(
            f"{source}: no DRAM byte counters (dram__bytes_read/write); memory-bound headroom "
            "will come from shape estimates"
        )
    metrics = sorted(
        {m.rsplit(".", 1)[0] if m.endswith((".sum", ".avg", ".min", ".max")) else m for m in raw}
    )
    return Counters(source=source, rows=rows, metrics=metrics, warnings=warnings)


def _is_metric(name: str) -> bool:
    return "__" in name and not name.startswith(("device__attribute", "nvlink__", "numa__"))


def unit_scale(unit: str) -> float | None:
    """Factor from ``unit`` (as an export's unit row spells it) to base units, or None for
    units that are not a plain quantity (%, rates)."""
    unit = unit.strip()
    if unit in _TIME:
        return _TIME[unit]
    if unit in ("", "%"):
        return 1.0
    match = _UNIT.match(unit)
    if match is None:
        if unit.endswith(("/s", "/second")):
            return _rate_scale(unit)
        return None
    prefix, _, per = match.groups()
    factor = _PREFIX[prefix]
    if per:
        rest = per[1:]
        if rest in ("s", "second"):
            return factor
        if rest in _TIME:
            return factor / (_TIME[rest] / 1e9)
    return factor


def _rate_scale(unit: str) -> float | None:
    num, _, den = unit.partition("/")
    num_scale = unit_scale(num)
    if num_scale is None:
        return None
    return num_scale / (_TIME.get(den, 1e9) / 1e9)


def _parse_number(cell: str) -> float:
    cell = cell.strip().replace(",", "")
    if cell in ("", "n/a", "N/A", "nan"):
        return math.nan
    try:
        return float(cell)
    except ValueError:
        return math.nan


#: Rates no GPU reaches (fifty to a hundred times the fastest of 2026): bytes a second of any memory level,
#: FLOPs a second of any unit. A counter that implies more, over its own kernel's duration, is
#: corrupt (an overflowed or mistyped value), whatever the GPU.
MAX_BYTES_PER_S = 1e15
MAX_FLOPS_PER_S = 1e18
_RATE_COLUMNS = {
    "dram_bytes": ("dram__bytes_read/write", MAX_BYTES_PER_S, "GB/s", 1e9),
    "l2_bytes": ("lts__t_bytes", MAX_BYTES_PER_S, "GB/s", 1e9),
    "flops_fp32": ("fp32 FLOPs", MAX_FLOPS_PER_S, "TFLOP/s", 1e12),
    "flops_fp64": ("fp64 FLOPs", MAX_FLOPS_PER_S, "TFLOP/s", 1e12),
    "flops_fp16": ("fp16 FLOPs", MAX_FLOPS_PER_S, "TFLOP/s", 1e12),
    "flops_tensor": ("tensor FLOPs", MAX_FLOPS_PER_S, "TFLOP/s", 1e12),
}


def _drop_impossible_rates(rows: pd.DataFrame, source: str, warnings: list[str]) -> None:
    """Counters that imply a rate no GPU reaches over their kernel's own duration are left
    unmeasured (NaN), with one warning naming the first: counter, value, duration and rate."""
    seconds = rows["duration_ns"].to_numpy(dtype=float) * 1e-9
    first: str | None = None
    count = 0
    for column, (what, limit, unit, scale) in _RATE_COLUMNS.items():
        values = rows[column].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = values / seconds
        bad = np.isfinite(values) & (seconds > 0) & (rate > limit)
        if not bad.any():
            continue
        count += int(bad.sum())
        if first is None:
            i = int(np.flatnonzero(bad)[0])
            first = (
                f"{what} = {values[i]:.3g} in {seconds[i] * 1e3:.3g} ms of {str(rows['base_name'].iloc[i])[:60]!r} "
                f"is {rate[i] / scale:.3g} {unit}, above the {limit / scale:.3g} {unit} no GPU reaches"
            )
        rows.loc[bad, column] = math.nan
        if column == "dram_bytes":
            rows.loc[bad, ["dram_read_bytes", "dram_write_bytes"]] = math.nan
    if count:
        warnings.append(
            f"{source}: {count} counter value(s) imply impossible rates, left unmeasured (first: {first})"
        )


def _column(
    body: list[list[str]], i: int, unit: str, name: str, unknown: set[str], impossible: list[str]
) -> list[float]:
    factor = unit_scale(unit)
    if factor is None:  # a unit we do not know: keep the printed values, warn if it is used
        factor = 1.0
        unknown.add(f"{name} [{unit}]")
    values = [_parse_number(r[i]) * factor for r in body]
    # Every ncu metric is a count, a time, a rate or a percentage: never negative or infinite.
    for j, v in enumerate(values):
        if v < 0 or v == math.inf:
            impossible.append(f"{name} = {body[j][i].strip()!r}")
            values[j] = math.nan
    return values


#: Above this share of malformed rows the counters would mislead: refused.
MAX_MALFORMED_ROWS = 0.10
# A number only a decimal-comma locale writes: "0,52", "12,3456", "1.980.000", "1.234,5".
_DECIMAL_COMMA = re.compile(
    r"^-?\d+,(\d{1,2}|\d{4,})$|^-?\d{1,3}(\.\d{3}){2,}(,\d+)?$|^-?\d{1,3}(\.\d{3})+,\d+$"
)


def _refuse_decimal_commas(body: list[list[str]], header: list[str], source: str) -> None:
    """ncu run under a locale with decimal commas writes "0,52" for 0.52; read as thousands
    separators those would be a hundred times off, so such an export is refused by name."""
    for i, name in enumerate(header):
        if not _is_metric(name):
            continue
        for r in body:
            cell = r[i].strip()
            if _DECIMAL_COMMA.match(cell):
                raise CountersFormatError(
                    f"numbers are written with a decimal comma ({name} = {cell!r}): the export was "
                    "made under a locale that writes 0,5 for 0.5",
                    path=source,
                    hint="export again with LC_ALL=C: LC_ALL=C ncu --import REPORT --csv --page raw",
                )


def _valid_rows(
    body: list[list[str]], index: dict[str, int], name_col: str, source: str, warnings: list[str]
) -> list[list[str]]:
    """The rows whose ID, Device, Stream and kernel name follow ``NcuRow``; the others are
    skipped and counted (their cells are rewritten as plain integers for ``_derive``)."""
    columns = {"id": "ID", "device": "Device", "stream": "Stream", "kernel_name": name_col}
    defaults = {"device": "0"}
    kept, bad = [], []
    for n, r in enumerate(body):
        cells = {key: r[index[col]] if col in index else defaults.get(key) for key, col in columns.items()}
        try:
            row = NcuRow.model_validate({k: v for k, v in cells.items() if v is not None})
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            column = columns.get(str(first["loc"][0]), str(first["loc"][0]))
            bad.append(f"row {n + 3}: {column} = {cells.get(str(first['loc'][0]))!r}")
            continue
        r = list(r)
        for key in ("id", "device", "stream"):
            if columns[key] in index:
                value = getattr(row, key)
                r[index[columns[key]]] = "" if value is None else str(value)
        kept.append(r)
    if bad:
        share = len(bad) / len(body)
        if share > MAX_MALFORMED_ROWS:
            raise CountersFormatError(
                f"{len(bad)} of {len(body)} rows ({share:.0%}, more than {MAX_MALFORMED_ROWS:.0%}) lack "
                f"a launch ID, device or kernel name ({bad[0]}): counters joined from the rest would mislead",
                path=source,
            )
        warnings.append(f"{source}: skipped {len(bad)} malformed row(s) ({bad[0]})")
    return kept


class _Metrics:
    """The metric columns of an export by name. A column whose unit was not recognized is
    used as printed, with a warning the first time it is used."""

    def __init__(self, raw: dict[str, list[float]], unknown: set[str], warnings: list[str], n: int):
        self.raw, self.unknown, self.warnings, self.n = raw, unknown, warnings, n

    def get(self, *names: str) -> list[float] | None:
        """The first of ``names`` the export has, or None."""
        for name in names:
            if name in self.raw:
                flagged = [u for u in self.unknown if u.startswith(name + " [")]
                if flagged:
                    self.warnings.append(f"unknown unit for {flagged[0]}; values used as printed")
                    self.unknown.difference_update(flagged)
                return self.raw[name]
        return None

    def flops(
        self, prefix: str, cycles_per_s: list[float] | None, duration: list[float]
    ) -> list[float] | None:
        """FLOPs of one precision (``f``, ``d``, ``h``): add + mul + 2 × fma instructions, from
        their counts or from their rates per elapsed cycle."""
        ops = ("add", "mul", "fma")
        counts = [self.get(f"smsp__sass_thread_inst_executed_op_{prefix}{op}_pred_on.sum") for op in ops]
        if all(c is None for c in counts):
            per_cycle = [
                self.get(f"smsp__sass_thread_inst_executed_op_{prefix}{op}_pred_on.sum.per_cycle_elapsed")
                for op in ops
            ]
            if all(c is None for c in per_cycle) or cycles_per_s is None:
                return None
            counts = [
                None if c is None else [v * f * d * 1e-9 for v, f, d in zip(c, cycles_per_s, duration)]
                for c in per_cycle
            ]
        a, m, f = (c if c is not None else [0.0] * self.n for c in counts)
        return [x + y + 2.0 * z for x, y, z in zip(a, m, f)]

    def tensor_columns(self, prefix: str) -> list[str]:
        """Tensor-core op counters under ``prefix``; sparsity splits repeat their parent
        counter and are left out."""
        return [n for n in self.raw if n.startswith(prefix) and n.endswith(".sum") and "sparsity" not in n]


def _sum_columns(*columns: list[float] | None) -> list[float] | None:
    """Row-wise sums of the columns present, NaN ignored (NaN where every value is NaN)."""
    present = [c for c in columns if c is not None]
    if not present:
        return None
    return [
        sum(v for v in values if not math.isnan(v)) if not all(math.isnan(v) for v in values) else math.nan
        for values in zip(*present)
    ]


def _derive(body, index, name_col, raw, unknown, warnings) -> pd.DataFrame:
    """One row per kernel launch: its identity and launch configuration, and the counters
    derived from the metric columns (durations, DRAM bytes, FLOPs by precision, throughputs)."""
    n = len(body)
    nan = [math.nan] * n
    metrics = _Metrics(raw, unknown, warnings, n)
    duration = metrics.get("gpu__time_duration.sum", "gpu__time_duration.avg") or nan
    read = metrics.get("dram__bytes_read.sum")
    write = metrics.get("dram__bytes_write.sum")
    dram = _sum_columns(read, write) if (read or write) else metrics.get("dram__bytes.sum")
    if dram is None:
        rate = metrics.get("dram__bytes.sum.per_second")
        if rate is not None:
            dram = [r * d * 1e-9 for r, d in zip(rate, duration)]
    cycles_per_s = metrics.get("smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second")
    # Tensor-core FLOPs: the per-source-type totals (sm__ops_path_tensor_src_*) when present,
    # else the per-instruction-path counters (hgmma, hmma …), which are disjoint.
    tensor_cols = metrics.tensor_columns("sm__ops_path_tensor_src_") or metrics.tensor_columns(
        "sm__ops_path_tensor_op_"
    )
    tensor = _sum_columns(*(raw[c] for c in tensor_cols)) if tensor_cols else None
    tensor_precision = _tensor_precisions(raw, tensor_cols, n)

    rows = _launch_columns(body, index, name_col)
    rows["duration_ns"] = duration
    rows["dram_bytes"] = dram if dram is not None else nan
    rows["dram_read_bytes"] = read if read is not None else nan
    rows["dram_write_bytes"] = write if write is not None else nan
    rows["l2_bytes"] = metrics.get("lts__t_bytes.sum") or nan
    rows["flops_fp32"] = metrics.flops("f", cycles_per_s, duration) or nan
    rows["flops_fp64"] = metrics.flops("d", cycles_per_s, duration) or nan
    rows["flops_fp16"] = metrics.flops("h", cycles_per_s, duration) or nan
    rows["flops_tensor"] = tensor if tensor is not None else nan
    rows["tensor_precision"] = tensor_precision
    rows["sm_pct"] = metrics.get("sm__throughput.avg.pct_of_peak_sustained_elapsed") or nan
    rows["memory_pct"] = (
        metrics.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed") or nan
    )
    rows["dram_pct"] = (
        metrics.get(
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        )
        or nan
    )
    if (rows["grid_x"] < 0).all():
        warnings.append("export has no Grid Size/Block Size columns: joins by name and order only")
    return rows


def _launch_columns(body: list[list[str]], index: dict[str, int], name_col: str) -> pd.DataFrame:
    """Each row's identity: ID, kernel name and base name, grid, block, device, stream,
    process and NVTX stack (``ROW_COLUMNS[:13]``)."""

    def cell(row, name, default=""):
        i = index.get(name)
        return row[i] if i is not None else default

    records: dict[str, list[Any]] = {c: [] for c in ROW_COLUMNS}
    for r in body:
        grid = _triple(cell(r, "Grid Size"))
        block = _triple(cell(r, "Block Size"))
        name = cell(r, name_col)
        records["id"].append(int(_parse_number(cell(r, "ID", "-1")) if cell(r, "ID") else -1))
        records["kernel_name"].append(name)
        records["base_name"].append(base_name(name))
        for axis, value in zip("xyz", grid):
            records[f"grid_{axis}"].append(value)
        for axis, value in zip("xyz", block):
            records[f"block_{axis}"].append(value)
        records["device"].append(int(_parse_number(cell(r, "Device", "0")) or 0))
        records["stream"].append(int(_parse_number(cell(r, "Stream", "-1")) if cell(r, "Stream") else -1))
        records["process"].append(cell(r, "Process ID"))
        records["nvtx"].append(_nvtx(r, index))
    rows = pd.DataFrame(records["id"], columns=["id"])
    for c in ROW_COLUMNS[1:13]:
        rows[c] = records[c]
    return rows


_TENSOR_SOURCES = (
    ("bf16", "bf16"),
    ("fp16", "fp16_tensor"),
    ("tf32", "tf32"),
    ("fp8", "fp8"),
    ("fp64", "fp64"),
)


def _tensor_precisions(raw: dict[str, list[float]], columns: list[str], n: int) -> list[str | None]:
    """Per row, the GPU-table precision whose tensor counter counted the most FLOPs."""
    out: list[str | None] = [None] * n
    best = [0.0] * n
    for column in columns:
        precision = next((p for key, p in _TENSOR_SOURCES if f"src_{key}" in column), None)
        if precision is None:
            continue
        for i, value in enumerate(raw[column]):
            if value == value and value > best[i]:  # not NaN, larger
                best[i], out[i] = value, precision
    return out


def _triple(text: str) -> tuple[int, int, int]:
    parts = [p for p in re.split(r"[(),\s]+", text) if p]
    try:
        values = [int(p) for p in parts][:3]
    except ValueError:
        return (-1, -1, -1)
    while len(values) < 3:
        values.append(1 if values else -1)
    return tuple(values)  # type: ignore[return-value]


def _nvtx(row: list[str], index: dict[str, int]) -> str:
    for name, i in index.items():
        if name.startswith("thread Domain:Push/Pop_Range") and row[i].strip():
            # e.g. '557  "<default domain>:step:none:…"': keep the range names.
            text = row[i].strip()
            quoted = re.findall(r'"([^"]*)"', text)
            ranges = [q.split(":")[1] for q in quoted if q.count(":") >= 1]
            return "/".join(ranges)
    return ""
