"""Read an Nsight Systems export (``nsys export --type sqlite``) into ``tables.Timeline``.

The export is a SQLite database with one table per kind of event. This reader maps it onto
the tables the Kineto reader produces, so one analysis path serves both:

- GPU activity: ``CUPTI_ACTIVITY_KIND_KERNEL`` (names through ``StringIds``), ``…_MEMCPY`` and
  ``…_MEMSET``; ``correlationId`` links each one to the CUDA call that launched it;
- CUDA calls: ``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime and driver API);
- CPU ranges: ``NVTX_EVENTS``, PyTorch's op ranges among them (``nvtx.py``).

Nsight Systems has no external ids linking a CUDA call to its op: the analysis takes the
innermost op range on the calling thread that holds the call, as it does for Kineto traces
without them. Serialized ids (``globalPid``/``globalTid``) carry the process id in bits 24-47
and the thread id in bits 0-23. Each (process, device) pair with GPU work is one Timeline.

Tables are created lazily by nsys (a capture without memsets has no memset table) and their
columns change between versions, so only the kernel table and ``StringIds`` are required;
anything else missing is a warning. Rows are read with SQL, in chunks, never as Python objects
per event beyond what one chunk needs.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.errors import ToolError, TraceFormatError
from kerneltriage.ingest.nvtx import NVTX, PROFILE_HINT, cpu_rows, read_ranges
from kerneltriage.ingest.tables import (
    GPU_ANNOTATION_COLUMNS,
    KERNEL_COLUMNS,
    RUNTIME_COLUMNS,
    Timeline,
    frame,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
EXPORT_TIMEOUT_S = 3600
CHUNK_ROWS = 200_000

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
STRINGS = "StringIds"

# Serialized GlobalId: hardware/VM ids above bit 48, process id in bits 24-47, thread id below.
_PID_SQL = "(({col} >> 24) & 16777215)"
_TID_SQL = "({col} & 16777215)"

_API_VERSION = re.compile(r"_v\d+$")

# CUPTI memcpy kinds, for exports without ENUM_CUDA_MEMCPY_OPER.
_COPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}

# TARGET_INFO_GPU columns → Kineto deviceProperties keys (where they have one).
_GPU_FIELDS = (
    ("name", "name"),
    ("chipName", "chipName"),
    ("busLocation", "busLocation"),
    ("uuid", "uuid"),
    ("smCount", "numSms"),
    ("totalMemory", "totalGlobalMem"),
    ("memoryBandwidth", "memoryBandwidth"),
    ("l2CacheSize", "l2CacheSize"),
    ("clockRate", "clockRate"),
    ("computeMajor", "computeMajor"),
    ("computeMinor", "computeMinor"),
)


def read_nsys(path: str | os.PathLike[str]) -> Timeline:
    """The Timeline of the first (device, process) pair with GPU work in an Nsight Systems
    export (``.sqlite``) or report (``.nsys-rep``/``.qdrep``, exported through ``nsys``)."""
    return _read(Path(path), first_only=True)[0]


def read_nsys_all(path: str | os.PathLike[str]) -> dict[int, Timeline]:
    """One Timeline per (process, device) pair with GPU work, keyed 0..n-1 in device order
    (then process id); each has ``rank`` set and ``meta["device"]``, ``meta["pid"]``."""
    return _read(Path(path), first_only=False)


# --- opening ---------------------------------------------------------------------------------


def _read(path: Path, first_only: bool) -> dict[int, Timeline]:
    if not path.exists():
        raise TraceFormatError("no such file", path=str(path))
    if path.is_dir():
        raise TraceFormatError("is a directory, expected an Nsight Systems export", path=str(path))
    if path.suffix in REPORT_SUFFIXES:
        with tempfile.TemporaryDirectory(prefix="kerneltriage-nsys-") as tmp:
            db = _export(path, Path(tmp))
            return _read_sqlite(db, str(path), first_only)
    return _read_sqlite(path, str(path), first_only)


def _export(report: Path, tmp: Path) -> Path:
    """Export an .nsys-rep to SQLite in ``tmp`` with the ``nsys`` on PATH."""
    out = tmp / (report.stem + ".sqlite")
    manual = f"nsys export --type sqlite --output {out.name} {report.name}"
    nsys = shutil.which("nsys")
    if nsys is None:
        raise ToolError(
            "is an Nsight Systems report and nsys is not on PATH to export it",
            path=str(report),
            hint=f"export it where nsys is installed: `{manual}`, then run kerneltriage on the .sqlite",
        )
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(out), str(report)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ToolError(f"nsys export did not finish in {EXPORT_TIMEOUT_S} s", path=str(report)) from None
    except OSError as exc:
        raise ToolError(f"cannot run nsys ({exc})", path=str(report)) from None
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise ToolError(
            f"nsys export failed (exit {done.returncode}): {' | '.join(tail) or 'no output'}",
            path=str(report),
            hint=f"try `{manual}` by hand",
        )
    return out


def _connect(path: Path) -> sqlite3.Connection:
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise TraceFormatError(f"cannot read file ({exc.strerror or exc})", path=str(path)) from None
    if head != SQLITE_MAGIC:
        raise TraceFormatError(
            "not an SQLite database: expected an Nsight Systems export (`nsys export --type sqlite`)",
            path=str(path),
        )
    try:
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceFormatError(f"cannot open the SQLite database ({exc})", path=str(path)) from None


def _read_sqlite(db: Path, source: str, first_only: bool) -> dict[int, Timeline]:
    conn = _connect(db)
    try:
        return _Reader(conn, source).read(first_only)
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(f"unreadable SQLite database ({exc})", path=source) from None
    finally:
        conn.close()


# --- reading ---------------------------------------------------------------------------------


class _Reader:
    def __init__(self, conn: sqlite3.Connection, source: str):
        self.conn = conn
        self.source = source
        self.warnings: list[str] = []
        self.tables: dict[str, set[str]] = {}
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cols = {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')}
            self.tables[name] = cols
        self.export_meta: dict[str, str] = {}
        self.strings: dict[int, str] = {}
        self.interned: dict[str, str] = {}

    # helpers

    def fail(self, message: str) -> TraceFormatError:
        return TraceFormatError(message, path=self.source)

    @property
    def schema(self) -> str:
        version = self.export_meta.get("EXPORT_SCHEMA_VERSION")
        product = self.export_meta.get("EXPORT_PRODUCT_VERSION")
        parts = [f"schema {version}" if version else None, f"nsys {product}" if product else None]
        return ", ".join(p for p in parts if p) or "unknown schema version"

    def cols(self, table: str) -> set[str]:
        return self.tables.get(table, set())

    def col(self, table: str, name: str, default: str = "-1") -> str:
        """``t.name`` with NULLs as ``default``, or ``default`` when the column is missing."""
        return f'COALESCE(t."{name}", {default})' if name in self.cols(table) else default

    @staticmethod
    def thread_sql(col: str) -> tuple[str, str]:
        """SQL of the process and thread ids in a serialized GlobalId column."""
        return _PID_SQL.format(col=col), _TID_SQL.format(col=col)

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        return self.conn.execute(sql, tuple(params)).fetchall()

    def columns(self, sql: str, spec: dict[str, str]) -> dict[str, np.ndarray]:
        """Run ``sql`` and return its result column-wise as arrays of ``spec``'s dtypes
        ("int64", "bool" or "object"). Rows are fetched in chunks and turned into arrays chunk
        by chunk, so Python objects exist for one chunk at a time; equal strings share one
        object."""
        parts: dict[str, list[np.ndarray]] = {n: [] for n in spec}
        cur = self.conn.execute(sql)
        while True:
            rows = cur.fetchmany(CHUNK_ROWS)
            if not rows:
                break
            for (name, dtype), values in zip(spec.items(), zip(*rows)):
                if dtype == "object":
                    parts[name].append(self.intern(values))
                else:
                    parts[name].append(np.array(values, dtype=dtype))
            del rows
        return {
            n: np.concatenate(v) if v else np.empty(0, dtype=spec[n] if spec[n] != "object" else object)
            for n, v in parts.items()
        }

    def intern(self, values: tuple) -> np.ndarray:
        codes, uniques = pd.factorize(np.array(values, dtype=object), use_na_sentinel=True)
        shared = np.array([self.interned.setdefault(u, u) for u in uniques] + [None], dtype=object)
        return shared[codes]  # code -1 (NULL) picks the trailing None

    def string_ids(self, ids: np.ndarray, unknown: str) -> np.ndarray:
        """StringIds values for an array of ids (``unknown`` where an id has no string)."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        want = [int(i) for i in uniq.tolist() if int(i) not in self.strings]
        for start in range(0, len(want), 900):
            part = want[start : start + 900]
            marks = ",".join("?" * len(part))
            for i, value in self.query(f"SELECT id, value FROM {STRINGS} WHERE id IN ({marks})", part):
                self.strings[int(i)] = str(value)
        values = np.array(
            [self.strings.get(int(i), unknown) for i in uniq.tolist()] + [unknown], dtype=object
        )
        return values[inverse.reshape(-1)] if len(ids) else np.empty(0, dtype=object)

    # schema

    def check_schema(self) -> None:
        if "META_DATA_EXPORT" in self.tables:
            for name, value in self.query("SELECT name, value FROM META_DATA_EXPORT"):
                self.export_meta.setdefault(str(name), "" if value is None else str(value))
        nsys_like = (
            STRINGS in self.tables
            or "META_DATA_EXPORT" in self.tables
            or NVTX in self.tables
            or any(t.startswith(("CUPTI_ACTIVITY_KIND_", "TARGET_INFO_", "ENUM_NSYS_")) for t in self.tables)
        )
        if not nsys_like:
            shown = ", ".join(sorted(self.tables)[:5]) or "none"
            raise self.fail(
                f"SQLite database is not an Nsight Systems export (no StringIds, META_DATA_EXPORT or "
                f"CUPTI_ACTIVITY_KIND_* tables; its tables: {shown}); export a report with "
                "`nsys export --type sqlite`"
            )
        if KERNEL not in self.tables:
            raise self.fail(
                f"Nsight Systems export ({self.schema}) has no {KERNEL} table: the capture recorded "
                f"no CUDA kernels ({PROFILE_HINT}), or its export schema is one kerneltriage does not know"
            )
        missing = [c for c in ("start", "end", "deviceId") if c not in self.cols(KERNEL)]
        if not {"shortName", "demangledName"} & self.cols(KERNEL):
            missing.append("shortName/demangledName")
        if missing:
            raise self.fail(
                f"{KERNEL} lacks column(s) {', '.join(missing)}: export {self.schema} is not supported"
            )
        if STRINGS not in self.tables:
            raise self.fail(
                f"Nsight Systems export ({self.schema}) has no {STRINGS} table: kernel names cannot be resolved"
            )
        optional = ["streamId", "correlationId", "gridX", "blockX", "registersPerThread"]
        absent = [c for c in optional if c not in self.cols(KERNEL)]
        if absent:
            self.warnings.append(
                f"{KERNEL} has no column(s) {', '.join(absent)} (export {self.schema}): "
                "those kernel fields are left unknown"
            )
        if "globalPid" not in self.cols(KERNEL):
            self.warnings.append(
                f"{KERNEL} has no globalPid column: GPU work cannot be split by process; "
                "every process's CUDA calls and NVTX ranges are read together"
            )

    # GPU activity

    def kernels(self) -> dict[str, np.ndarray]:
        t = KERNEL
        cols = self.cols(t)
        pid = _PID_SQL.format(col='t."globalPid"') if "globalPid" in cols else "-1"
        shared = (
            f"{self.col(t, 'staticSharedMemory', '0')} + {self.col(t, 'dynamicSharedMemory', '0')}"
            if {"staticSharedMemory", "dynamicSharedMemory"} & cols
            else "-1"
        )
        sql = f"""
            SELECT t."start", t."end" - t."start", t."deviceId", {self.col(t, "streamId")},
                   {self.col(t, "correlationId")}, {self.col(t, "demangledName")}, {self.col(t, "shortName")},
                   {self.col(t, "gridX")}, {self.col(t, "gridY")}, {self.col(t, "gridZ")},
                   {self.col(t, "blockX")}, {self.col(t, "blockY")}, {self.col(t, "blockZ")},
                   {self.col(t, "registersPerThread")}, {shared}, COALESCE({pid}, -1)
            FROM {t} AS t WHERE t."start" IS NOT NULL AND t."end" IS NOT NULL
        """
        ints = [
            "start",
            "dur",
            "device",
            "stream",
            "correlation",
            "name_id",
            "short_id",
            "grid_x",
            "grid_y",
            "grid_z",
            "block_x",
            "block_y",
            "block_z",
            "registers",
            "shared_mem",
            "pid",
        ]
        k = self.columns(sql, dict.fromkeys(ints, "int64"))
        # Kineto names kernels by their demangled name; the short name stands in where absent.
        full = self.string_ids(k.pop("name_id"), "")
        short = self.string_ids(k.pop("short_id"), "<unknown kernel>")
        k["name"] = np.where(full != "", full, short)
        n = len(k["start"])
        k["kind"] = np.full(n, "kernel", dtype=object)
        k["bytes"] = np.full(n, -1, dtype=np.int64)
        return k

    def copies(self, table: str, kind: str) -> dict[str, np.ndarray] | None:
        if table not in self.tables:
            return None  # nsys creates tables lazily: no such activity in the capture
        cols = self.cols(table)
        if not {"start", "end", "deviceId"} <= cols:
            self.warnings.append(f"{table} lacks start/end/deviceId (export {self.schema}); {kind}s left out")
            return None
        pid = _PID_SQL.format(col='t."globalPid"') if "globalPid" in cols else "-1"
        if kind == "memcpy":
            extra = ", ".join(self.col(table, c) for c in ("copyKind", "srcKind", "dstKind"))
        else:
            extra = f"{self.col(table, 'memKind')}, -1, -1"
        sql = f"""
            SELECT t."start", t."end" - t."start", t."deviceId", {self.col(table, "streamId")},
                   {self.col(table, "correlationId")}, {self.col(table, "bytes")}, COALESCE({pid}, -1),
                   {extra}
            FROM {table} AS t WHERE t."start" IS NOT NULL AND t."end" IS NOT NULL
        """
        names = ["start", "dur", "device", "stream", "correlation", "bytes", "pid", "a", "b", "c"]
        rows = self.columns(sql, dict.fromkeys(names, "int64"))
        keys = np.stack([rows.pop("a"), rows.pop("b"), rows.pop("c")], axis=1)
        labels = self._copy_labels(kind)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        texts = np.array([_copy_name(kind, tuple(u), labels) for u in uniq.tolist()] + [""], dtype=object)
        rows["name"] = texts[inverse.reshape(-1)] if len(keys) else np.empty(0, dtype=object)
        rows["kind"] = np.full(len(rows["start"]), kind, dtype=object)
        return rows

    def _copy_labels(self, kind: str) -> dict[str, dict[int, str]]:
        labels: dict[str, dict[int, str]] = {"copy": dict(_COPY_KINDS), "mem": {}}
        if kind == "memcpy" and {"id", "name"} <= self.cols("ENUM_CUDA_MEMCPY_OPER"):
            for i, name in self.query("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"):
                short = str(name or "").replace("CUDA_MEMCPY_KIND_", "")
                if short and short != "UNKNOWN":
                    labels["copy"][int(i)] = short.replace("UVM_", "UVM ").replace("TO", "to")
        if {"id", "label"} <= self.cols("ENUM_CUDA_MEM_KIND"):
            for i, label in self.query("SELECT id, label FROM ENUM_CUDA_MEM_KIND"):
                if label:
                    labels["mem"][int(i)] = str(label)
        return labels

    # CUDA calls

    def runtime(self, pids: set[int] | None) -> dict[str, np.ndarray] | None:
        t = RUNTIME
        if t not in self.tables:
            self.warnings.append(
                f"the export has no {t} table (CUDA API calls): kernels cannot be linked to the ops "
                f"that launched them, nor placed in steps; {PROFILE_HINT}"
            )
            return None
        cols = self.cols(t)
        if not {"start", "end", "correlationId"} <= cols:
            self.warnings.append(
                f"{t} lacks start/end/correlationId (export {self.schema}): kernels cannot be linked to ops"
            )
            return None
        if "globalTid" in cols:
            pid, tid = self.thread_sql('t."globalTid"')
        else:
            self.warnings.append(f"{t} has no globalTid column: launching threads are unknown")
            pid = tid = "-1"
        where = ""
        if pids is not None and pid != "-1":
            where = f"AND {pid} IN ({','.join(str(int(p)) for p in sorted(pids))})"
        sql = f"""
            SELECT t."start", t."end" - t."start", COALESCE({pid}, -1), COALESCE({tid}, -1),
                   COALESCE(t."correlationId", -1), {self.col(t, "nameId")}
            FROM {t} AS t WHERE t."start" IS NOT NULL AND t."end" IS NOT NULL {where}
        """
        names = ["start", "dur", "pid", "tid", "correlation", "name_id"]
        rows = self.columns(sql, dict.fromkeys(names, "int64"))
        ids = rows.pop("name_id")
        uniq, inverse = np.unique(ids, return_inverse=True)
        raw = self.string_ids(uniq, "<unknown CUDA call>")
        # cudaLaunchKernel_v7000 -> cudaLaunchKernel, as Kineto names it
        clean = np.array([_API_VERSION.sub("", r) for r in raw.tolist()] + [""], dtype=object)
        rows["name"] = clean[inverse.reshape(-1)] if len(ids) else np.empty(0, dtype=object)
        return rows

    # devices

    def gpu_props(self) -> tuple[dict[int, dict[str, Any]], dict[tuple[int, int], int]]:
        """TARGET_INFO_GPU rows by GPU id, and (pid, CUDA device) → GPU id where recorded."""
        gpus: dict[int, dict[str, Any]] = {}
        cols = self.cols("TARGET_INFO_GPU")
        if "id" in cols:
            names = sorted(cols)
            quoted = ", ".join('"' + c + '"' for c in names)
            for row in self.query(f"SELECT {quoted} FROM TARGET_INFO_GPU"):
                rec = dict(zip(names, row))
                if rec.get("id") is None:
                    continue
                props: dict[str, Any] = {"id": int(rec["id"])}
                for src, dst in _GPU_FIELDS:
                    if rec.get(src) not in (None, ""):
                        props[dst] = rec[src]
                gpus[props["id"]] = props
        mapping: dict[tuple[int, int], int] = {}
        if {"gpuId", "cudaId", "pid"} <= self.cols("TARGET_INFO_CUDA_DEVICE"):
            for gpu, cuda, pid in self.query("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE"):
                if None not in (gpu, cuda, pid):
                    mapping[(int(pid), int(cuda))] = int(gpu)
        return gpus, mapping

    def process_names(self) -> dict[int, str]:
        if not {"pid", "name"} <= self.cols("PROCESSES"):
            return {}
        rows = self.query("SELECT pid, name FROM PROCESSES")
        return {int(p): str(n) for p, n in rows if p is not None and n}

    # assembly

    def read(self, first_only: bool) -> dict[int, Timeline]:
        self.check_schema()
        parts = [self.kernels()]
        for table, kind in ((MEMCPY, "memcpy"), (MEMSET, "memset")):
            rows = self.copies(table, kind)
            if rows is not None:
                parts.append(rows)
        gpu = pd.concat([frame(p, KERNEL_COLUMNS) for p in parts], ignore_index=True)
        is_kernel = (gpu["kind"] == "kernel").to_numpy()
        if not is_kernel.any():
            raise self.fail(
                f"Nsight Systems export ({self.schema}) holds no GPU kernels: nothing to analyse ({PROFILE_HINT})"
            )
        found = gpu.loc[is_kernel, ["device", "pid"]].drop_duplicates().sort_values(["device", "pid"])
        pairs = [(int(d), int(p)) for d, p in found.itertuples(index=False)]
        if first_only:
            pairs = pairs[:1]
        pids = {p for _, p in pairs}
        wanted = None if -1 in pids else pids
        runtime = self.runtime(wanted)
        runtime_df = frame(runtime or {}, RUNTIME_COLUMNS)
        nvtx = read_ranges(self, wanted)
        gpus, device_map = self.gpu_props()
        processes = self.process_names()
        common = {
            "nsys": {
                k: v
                for k, v in self.export_meta.items()
                if k.startswith(("EXPORT_PRODUCT", "EXPORT_SCHEMA_VERSION", "DERIVED_"))
            },
            "tables": sorted(t for t in (KERNEL, RUNTIME, MEMCPY, MEMSET, NVTX) if t in self.tables),
        }
        out: dict[int, Timeline] = {}
        for rank, (device, pid) in enumerate(pairs):
            mine = (gpu["device"] == device).to_numpy()
            rt, ranges = runtime_df, nvtx
            if pid != -1:
                mine = mine & (gpu["pid"] == pid).to_numpy()
                rt = rt[rt["pid"] == pid]
                ranges = ranges[ranges["pid"] == pid] if ranges is not None else None
            warnings = list(self.warnings)
            cpu, args = cpu_rows(ranges, warnings)
            props = _device_props(device, pid, gpus, device_map)
            meta = {**common, "device": device, "pid": pid, "process": processes.get(pid)}
            out[rank] = Timeline(
                source=self.source,
                format="nsys",
                kernels=gpu[mine].sort_values("start", kind="stable").reset_index(drop=True),
                runtime=rt.sort_values("start", kind="stable").reset_index(drop=True),
                cpu=cpu,
                gpu_annotations=frame({}, GPU_ANNOTATION_COLUMNS),
                device_properties=[props] if props else [],
                meta=meta,
                args=args,
                warnings=warnings,
                rank=rank,
            )
        return out


def _copy_name(kind: str, key: tuple[int, int, int], labels: dict[str, dict[int, str]]) -> str:
    mem = labels["mem"]
    if kind == "memset":
        where = mem.get(key[0])
        return f"Memset ({where})" if where else "Memset"
    copy = labels["copy"].get(key[0], "")
    src, dst = mem.get(key[1]), mem.get(key[2])
    head = f"Memcpy {copy}".strip()
    return f"{head} ({src} -> {dst})" if src and dst else head


def _device_props(
    device: int, pid: int, gpus: dict[int, dict[str, Any]], device_map: dict[tuple[int, int], int]
) -> dict[str, Any] | None:
    """The GPU a process's CUDA device ran on: through TARGET_INFO_CUDA_DEVICE when the export
    has it, else the GPU with the same id, else the host's GPU when all its GPUs are alike."""
    gpu_id = device_map.get((pid, device))
    if gpu_id is not None and gpu_id in gpus:
        return dict(gpus[gpu_id], device=device)
    if not device_map and device in gpus:
        return dict(gpus[device], device=device)
    names = {g.get("name") for g in gpus.values()}
    if len(names) == 1 and None not in names:
        props = dict(next(iter(gpus.values())), device=device)
        props.pop("uuid", None)
        props.pop("busLocation", None)
        return props
    return None
