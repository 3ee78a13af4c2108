"""Read a PyTorch profiler (Kineto) chrome trace into ``tables.Timeline``.

Traces reach millions of events and a gigabyte of JSON. Parsing the whole document into Python
objects would take several gigabytes, so the reader streams: it decompresses in chunks, cuts
each chunk at an event boundary, parses the events of that chunk with orjson and keeps only
typed columns (integers, and interned strings for names and shapes). Peak memory is one chunk
of events plus the columns.

Kineto writes one event per JSON object, each starting on its own line, so an event boundary
is ``}`` ``,`` newline ``{`` — a newline cannot occur inside a JSON string, so such a cut never
splits a string. Every cut is validated by parsing; a trace written differently (re-serialized
on one line, say) falls back to parsing the whole document at once.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pandas as pd

from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.tables import (
    CPU_COLUMNS,
    GPU_ANNOTATION_COLUMNS,
    KERNEL_COLUMNS,
    RUNTIME_COLUMNS,
    Timeline,
    frame,
)

CHUNK_BYTES = 32 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\n\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')

# Old Kineto versions used capitalized categories; map them to today's names.
_CATEGORY_ALIASES = {
    "operator": "cpu_op",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "cuda_driver": "cuda_driver",
    "cuda_runtime": "cuda_runtime",
    "gpu_memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "cpu_op": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
}
_GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def read_trace(
    path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES, workers: int | None = None
) -> Timeline:
    """Read a Kineto trace (``.json`` or ``.json.gz``).

    Large traces are parsed by ``workers`` processes (default: one per core, at most 4, for
    files over ``PARALLEL_BYTES``), each turning chunks of events into columns.

    Raises ``TraceFormatError`` for a file that is not a readable Kineto trace; a trace that
    is valid but holds no GPU activity is returned as is (the caller decides what that means).
    """
    path = Path(path)
    try:
        try:
            with _open(path) as stream:
                builder, meta = _read_chunked(stream, chunk_bytes, _workers(path, workers))
        except _NotKinetoLayout:
            # Written by another tool (one line, other key order …): parse the whole document.
            builder = _Builder()
            with _open(path) as stream:
                meta = _parse_whole(stream.read(), builder)
    except TraceFormatError as exc:
        exc.path = exc.path or str(path)
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(f"compressed data is truncated or corrupt ({exc})", path=str(path)) from None
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"not valid JSON ({exc})", path=str(path)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read file ({exc.strerror or exc})", path=str(path)) from None
    return builder.build(str(path), meta)


PARALLEL_BYTES = 64 << 20


class _NotKinetoLayout(Exception):
    """The cheap event-boundary cut does not apply to this file."""


def _workers(path: Path, requested: int | None) -> int:
    if requested is not None:
        return max(0, requested)
    if path.stat().st_size < PARALLEL_BYTES // (8 if path.suffix == ".gz" else 1):
        return 0
    return min(4, os.cpu_count() or 1)


def _open(path: Path) -> BinaryIO:
    if not path.exists():
        raise TraceFormatError("no such file", path=str(path))
    if path.is_dir():
        raise TraceFormatError("is a directory, expected a trace file", path=str(path))
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _pieces(stream: BinaryIO, chunk_bytes: int) -> Iterator[tuple[str, bytes]]:
    """Yield ("header", bytes), then ("events", bytes) pieces, then ("rest", bytes): the last
    events, the array's closing bracket and the document's tail."""
    head = stream.read(chunk_bytes)
    match = _EVENTS_KEY.search(head)
    if match is None:
        raise _NotKinetoLayout
    yield "header", head[: match.end() - 1]  # up to, not including, the '['
    buf = head[match.end() :]
    while True:
        chunk = stream.read(chunk_bytes)
        if not chunk:
            break
        buf += chunk
        cut = _last_boundary(buf)
        if cut is None:
            continue
        # The boundary is "}" "," newline "{": the next event starts at the first "{" after cut.
        piece, buf = buf[: cut + 1], buf[buf.index(b"{", cut + 1) :]
        yield "events", piece
    yield "rest", buf


def _read_chunked(stream: BinaryIO, chunk_bytes: int, workers: int) -> tuple[_Builder, dict[str, Any]]:
    builder = _Builder()
    pool = None
    if workers > 1:
        import concurrent.futures
        import multiprocessing

        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
    pending: list[Any] = []

    def collect(block: bool) -> None:
        while pending and (block or pending[0].done() or len(pending) > 2 * workers):
            builder.merge(*pending.pop(0).result())

    try:
        header = b""
        for kind, data in _pieces(stream, chunk_bytes):
            if kind == "header":
                header = data
            elif kind == "events":
                if pool is None:
                    builder.merge(*_parse_piece(data))
                else:
                    pending.append(pool.submit(_parse_piece, data))
                    collect(block=False)
            else:
                collect(block=True)
                return builder, _finish(header, data, builder)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    raise _NotKinetoLayout  # pragma: no cover - _pieces always ends with "rest"


def _parse_piece(piece: bytes) -> tuple[dict[str, list[dict[str, Any]]], list[Any], int, int]:
    """Worker: one chunk of events → columns (with chunk-local interned arguments)."""
    try:
        events = orjson.loads(b"[" + piece + b"]")
    except orjson.JSONDecodeError:
        raise _NotKinetoLayout from None
    local = _Builder()
    local.add(events)
    return local.parts, local.args, local.events, local.skipped


def _finish(header: bytes, rest: bytes, builder: _Builder) -> dict[str, Any]:
    """Parse the last events and the top-level keys around the event array."""
    for end in _candidate_array_ends(rest):
        try:
            meta = orjson.loads(header + b"[]" + rest[end + 1 :])
        except orjson.JSONDecodeError:
            continue
        piece = rest[:end].strip()
        if piece:
            try:
                builder.merge(*_parse_piece(piece))
            except _NotKinetoLayout:
                continue
        if not isinstance(meta, dict):
            raise _NotKinetoLayout
        return meta
    raise _NotKinetoLayout


def _last_boundary(buf: bytes) -> int | None:
    """Index of the closing brace of the last complete event in ``buf``, or None."""
    # Search the last MiB first (one event is far smaller), then the whole buffer.
    for window in (max(0, len(buf) - (1 << 20)), 0):
        matches = list(_BOUNDARY.finditer(buf, window))
        if matches:
            return matches[-1].start()
    return None


def _candidate_array_ends(buf: bytes, tries: int = 64) -> Iterator[int]:
    pos = len(buf)
    for _ in range(tries):
        pos = buf.rfind(b"]", 0, pos)
        if pos < 0:
            return
        yield pos


def _parse_whole(doc: bytes, builder: _Builder) -> dict[str, Any]:
    data = orjson.loads(doc)
    if not isinstance(data, dict):
        raise TraceFormatError("JSON is not an object with a traceEvents list")
    events = data.pop("traceEvents", None)
    if events is None:
        raise TraceFormatError("JSON has no 'traceEvents': not a PyTorch profiler / Kineto trace")
    if not isinstance(events, list):
        raise TraceFormatError("'traceEvents' is not a list")
    builder.add(events)
    return data


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class _Builder:
    """Accumulates typed columns from batches of raw events.

    Each batch is bucketed by category, then every column is pulled out with one list
    comprehension and turned into a numpy array at once: per-event Python work stays small
    and a column costs 8 bytes a value, not a Python object.
    """

    def __init__(self) -> None:
        self.events = 0
        self.parts: dict[str, list[dict[str, Any]]] = {"kernels": [], "runtime": [], "cpu": [], "gpu_ann": []}
        self.arg_index: dict[bytes, int] = {}
        self.args: list[Any] = []
        self.skipped = 0

    def merge(
        self, parts: dict[str, list[dict[str, Any]]], args: list[Any], events: int, skipped: int
    ) -> None:
        """Take over another builder's columns, re-numbering its interned arguments."""
        self.events += events
        self.skipped += skipped
        remap = self._arg_ids(args)
        for table, chunks in parts.items():
            for cols in chunks:
                for column in _INTERNED:
                    if column in cols and len(remap):
                        ids = cols[column]
                        cols[column] = np.where(ids >= 0, remap[np.maximum(ids, 0)], -1)
                self.parts[table].append(cols)

    def _arg_ids(self, values: list[Any]) -> np.ndarray:
        index, args, dumps = self.arg_index, self.args, orjson.dumps
        out = np.empty(len(values), dtype=np.int64)
        for i, value in enumerate(values):
            if value is None:
                out[i] = -1
                continue
            key = dumps(value)
            j = index.get(key)
            if j is None:
                j = index[key] = len(args)
                args.append(value)
            out[i] = j
        return out

    def add(self, events: list[Any]) -> None:
        self.events += len(events)
        # One bucket per output table, events kept in file order (whatever the chunking).
        gpu: list[tuple[dict[str, Any], str]] = []
        cpu: list[tuple[dict[str, Any], str]] = []
        runtime: list[dict[str, Any]] = []
        gpu_ann: list[dict[str, Any]] = []
        for e in events:
            if type(e) is not dict or e.get("ph") != "X":
                continue
            cat = e.get("cat")
            cat = _CATEGORY_ALIASES.get(cat) or _CATEGORY_ALIASES.get(str(cat).lower())
            if cat is None:
                continue
            if "ts" not in e or "name" not in e:
                self.skipped += 1
            elif cat in _GPU_KINDS:
                gpu.append((e, _GPU_KINDS[cat]))
            elif cat == "cpu_op" or cat == "user_annotation":
                cpu.append((e, cat))
            elif cat == "cuda_runtime" or cat == "cuda_driver":
                runtime.append(e)
            elif cat == "gpu_user_annotation":
                gpu_ann.append(e)
        for table, rows, make in (
            ("kernels", gpu, self._gpu),
            ("cpu", cpu, self._cpu),
            ("runtime", runtime, self._runtime),
            ("gpu_ann", gpu_ann, self._gpu_annotation),
        ):
            if not rows:
                continue
            try:
                self.parts[table].append(make(rows))
            except (TypeError, ValueError):
                self.skipped += len(rows)

    @staticmethod
    def _common(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        args = [e.get("args") or {} for e in rows]
        return args, {
            "name": [sys.intern(str(e["name"])) for e in rows],
            "start": _ns_array([e["ts"] for e in rows]),
            "dur": _ns_array([e.get("dur", 0) for e in rows]),
        }

    def _gpu(self, tagged: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
        rows = [e for e, _ in tagged]
        args, cols = self._common(rows)
        grids = [a.get("grid") or _NO_DIM for a in args]
        blocks = [a.get("block") or _NO_DIM for a in args]
        cols.update(
            kind=[kind for _, kind in tagged],
            device=_int_array([a.get("device", e.get("pid")) for a, e in zip(args, rows)], 0),
            stream=_int_array([a.get("stream", e.get("tid")) for a, e in zip(args, rows)]),
            correlation=_int_array([a.get("correlation") for a in args]),
            registers=_int_array([a.get("registers per thread") for a in args]),
            shared_mem=_int_array([a.get("shared memory") for a in args]),
            bytes=_int_array([a.get("bytes") for a in args]),
            pid=_int_array([e.get("pid") for e in rows]),
        )
        for i, axis in enumerate("xyz"):
            cols[f"grid_{axis}"] = _int_array([g[i] if len(g) > i else -1 for g in grids])
            cols[f"block_{axis}"] = _int_array([b[i] if len(b) > i else -1 for b in blocks])
        return cols

    def _cpu(self, tagged: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
        rows = [e for e, _ in tagged]
        args, cols = self._common(rows)
        cols.update(
            cat=[cat for _, cat in tagged],
            pid=_int_array([e.get("pid") for e in rows]),
            tid=_int_array([e.get("tid") for e in rows]),
            ext_id=_int_array([a.get("External id") for a in args]),
            seq=_int_array([a.get("Sequence number") for a in args]),
            dims=self._arg_ids([a.get("Input Dims") for a in args]),
            types=self._arg_ids([a.get("Input type") for a in args]),
            strides=self._arg_ids([a.get("Input Strides") for a in args]),
            concrete=self._arg_ids([a.get("Concrete Inputs") for a in args]),
            # Kineto marks a range still open when the profiler stopped; its duration is not real.
            finished=np.array([a.get("finished", True) is not False for a in args], dtype=bool),
        )
        return cols

    def _runtime(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        args, cols = self._common(rows)
        cols.update(
            pid=_int_array([e.get("pid") for e in rows]),
            tid=_int_array([e.get("tid") for e in rows]),
            correlation=_int_array([a.get("correlation") for a in args]),
            ext_id=_int_array([a.get("External id") for a in args]),
        )
        return cols

    def _gpu_annotation(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        args, cols = self._common(rows)
        cols.update(
            device=_int_array([a.get("device", e.get("pid")) for a, e in zip(args, rows)], 0),
            ext_id=_int_array([a.get("External id") for a in args]),
        )
        return cols

    def build(self, source: str, meta: dict[str, Any]) -> Timeline:
        meta = {k: v for k, v in meta.items() if k != "traceEvents"}
        props = meta.get("deviceProperties") or []
        warnings = []
        if self.skipped:
            warnings.append(f"{self.skipped} malformed trace events were skipped")
        timeline = Timeline(
            source=source,
            format="kineto",
            kernels=_concat(self.parts["kernels"], KERNEL_COLUMNS),
            runtime=_concat(self.parts["runtime"], RUNTIME_COLUMNS),
            cpu=_concat(self.parts["cpu"], CPU_COLUMNS),
            gpu_annotations=_concat(self.parts["gpu_ann"], GPU_ANNOTATION_COLUMNS),
            device_properties=[p for p in props if isinstance(p, dict)],
            meta=meta,
            args=self.args,
            warnings=warnings,
        )
        rank = (meta.get("distributedInfo") or {}).get("rank")
        timeline.rank = _int(rank) if rank is not None else None
        return timeline


_NO_DIM = (-1, -1, -1)
_INTERNED = ("dims", "types", "strides", "concrete")


def _ns_array(values: list[Any]) -> np.ndarray:
    """Microseconds (Kineto's unit) to integer nanoseconds."""
    return np.rint(np.asarray(values, dtype=np.float64) * 1000.0).astype(np.int64)


def _int_array(values: list[Any], default: int = -1) -> np.ndarray:
    try:
        return np.array([default if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_int(v, default) for v in values], dtype=np.int64)


def _concat(parts: list[dict[str, Any]], spec: dict[str, str]) -> pd.DataFrame:
    if not parts:
        return frame({}, spec)
    columns = {}
    for name in spec:
        chunks = [p[name] for p in parts if name in p]
        if not chunks:
            continue
        if isinstance(chunks[0], np.ndarray):
            columns[name] = np.concatenate(chunks)
        else:
            columns[name] = [v for chunk in chunks for v in chunk]
    return frame(columns, spec)


def read_trace_bytes(data: bytes, name: str = "<bytes>") -> Timeline:
    """Read a trace held in memory (tests, and traces handed over by other tools)."""
    try:
        builder, meta = _read_chunked(io.BytesIO(data), CHUNK_BYTES, 0)
    except _NotKinetoLayout:
        builder = _Builder()
        meta = _parse_whole(data, builder)
    return builder.build(name, meta)
