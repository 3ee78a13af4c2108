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
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

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


def read_trace(path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES) -> Timeline:
    """Read a Kineto trace (``.json`` or ``.json.gz``).

    Raises ``TraceFormatError`` for a file that is not a readable Kineto trace; a trace that
    is valid but holds no GPU activity is returned as is (the caller decides what that means).
    """
    path = Path(path)
    builder = _Builder()
    try:
        with _open(path) as stream:
            meta = _stream_events(stream, builder, chunk_bytes)
    except TraceFormatError:
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(f"compressed data is truncated or corrupt ({exc})", path=str(path)) from None
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"not valid JSON ({exc})", path=str(path)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read file ({exc.strerror or exc})", path=str(path)) from None
    if not isinstance(meta, dict):
        raise TraceFormatError("JSON is not an object with a traceEvents list", path=str(path))
    if builder.events == 0 and "traceEvents" not in meta:
        raise TraceFormatError(
            "JSON has no 'traceEvents': not a PyTorch profiler / Kineto trace", path=str(path)
        )
    return builder.build(str(path), meta)


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


def _stream_events(stream: BinaryIO, builder: _Builder, chunk_bytes: int) -> dict[str, Any]:
    """Feed every event of the traceEvents array to ``builder``; return the other top-level keys."""
    head = stream.read(chunk_bytes)
    match = _EVENTS_KEY.search(head)
    if match is None:
        # Not Kineto's layout (or no events at all): parse the whole document.
        return _parse_whole(head + stream.read(), builder)
    header = head[: match.end() - 1]  # up to, not including, the '['
    buf = head[match.end() :]
    fed_any = False
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
        if not _feed(piece, builder):
            return _reparse(header, piece, buf, stream, builder, fed_any)
        fed_any = True
    # The rest holds the last events, the array's ']' and the document's tail.
    for end in _candidate_array_ends(buf):
        tail = buf[end + 1 :]
        try:
            meta = orjson.loads(header + b"[]" + tail)
        except orjson.JSONDecodeError:
            continue
        piece = buf[:end].strip()
        if piece and not _feed(piece, builder):
            continue
        return meta
    return _reparse(header, b"", buf, stream, builder, fed_any)


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


def _feed(piece: bytes, builder: _Builder) -> bool:
    try:
        events = orjson.loads(b"[" + piece + b"]")
    except orjson.JSONDecodeError:
        return False
    builder.add(events)
    return True


def _reparse(
    header: bytes, piece: bytes, buf: bytes, stream: BinaryIO, builder: _Builder, fed_any: bool
) -> dict[str, Any]:
    """A cut failed validation: the layout is not Kineto's. Start over on the whole document."""
    if fed_any:
        raise TraceFormatError("event list is malformed part-way through (truncated or corrupt trace?)")
    rest = stream.read()
    return _parse_whole(header + b"[" + piece + (b"," if piece and buf else b"") + buf + rest, builder)


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
    data["traceEvents"] = None
    return data


def _ns(us: Any) -> int:
    return round(float(us) * 1000.0)


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class _Builder:
    """Accumulates typed columns from batches of raw events."""

    def __init__(self) -> None:
        self.events = 0
        self.kernels: dict[str, list[Any]] = {k: [] for k in KERNEL_COLUMNS}
        self.runtime: dict[str, list[Any]] = {k: [] for k in RUNTIME_COLUMNS}
        self.cpu: dict[str, list[Any]] = {k: [] for k in CPU_COLUMNS}
        self.gpu_ann: dict[str, list[Any]] = {k: [] for k in GPU_ANNOTATION_COLUMNS}
        self.names: dict[str, str] = {}
        self.arg_index: dict[bytes, int] = {}
        self.args: list[Any] = []
        self.skipped = 0

    def _name(self, name: Any) -> str:
        name = str(name)
        return self.names.setdefault(name, name)

    def _arg(self, value: Any) -> int:
        if value is None:
            return -1
        key = orjson.dumps(value)
        index = self.arg_index.get(key)
        if index is None:
            index = self.arg_index[key] = len(self.args)
            self.args.append(value)
        return index

    def add(self, events: list[Any]) -> None:
        self.events += len(events)
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            cat = _CATEGORY_ALIASES.get(str(e.get("cat", "")).lower())
            if cat is None:
                continue
            try:
                if cat in _GPU_KINDS:
                    self._add_gpu(e, _GPU_KINDS[cat])
                elif cat == "cpu_op" or cat == "user_annotation":
                    self._add_cpu(e, cat)
                elif cat == "cuda_runtime" or cat == "cuda_driver":
                    self._add_runtime(e)
                elif cat == "gpu_user_annotation":
                    self._add_gpu_annotation(e)
            except (KeyError, TypeError, ValueError):
                self.skipped += 1

    def _add_gpu(self, e: dict[str, Any], kind: str) -> None:
        args = e.get("args") or {}
        grid = args.get("grid") or (-1, -1, -1)
        block = args.get("block") or (-1, -1, -1)
        k = self.kernels
        k["name"].append(self._name(e["name"]))
        k["kind"].append(kind)
        k["device"].append(_int(args.get("device", e.get("pid")), 0))
        k["stream"].append(_int(args.get("stream", e.get("tid"))))
        k["start"].append(_ns(e["ts"]))
        k["dur"].append(_ns(e.get("dur", 0)))
        k["correlation"].append(_int(args.get("correlation")))
        k["grid_x"].append(_int(grid[0]))
        k["grid_y"].append(_int(grid[1]))
        k["grid_z"].append(_int(grid[2]))
        k["block_x"].append(_int(block[0]))
        k["block_y"].append(_int(block[1]))
        k["block_z"].append(_int(block[2]))
        k["registers"].append(_int(args.get("registers per thread")))
        k["shared_mem"].append(_int(args.get("shared memory")))
        k["bytes"].append(_int(args.get("bytes")))
        k["pid"].append(_int(e.get("pid")))

    def _add_cpu(self, e: dict[str, Any], cat: str) -> None:
        args = e.get("args") or {}
        c = self.cpu
        c["name"].append(self._name(e["name"]))
        c["cat"].append(cat)
        c["start"].append(_ns(e["ts"]))
        c["dur"].append(_ns(e.get("dur", 0)))
        c["pid"].append(_int(e.get("pid")))
        c["tid"].append(_int(e.get("tid")))
        c["ext_id"].append(_int(args.get("External id")))
        c["seq"].append(_int(args.get("Sequence number")))
        c["dims"].append(self._arg(args.get("Input Dims")))
        c["types"].append(self._arg(args.get("Input type")))
        c["strides"].append(self._arg(args.get("Input Strides")))
        c["concrete"].append(self._arg(args.get("Concrete Inputs")))
        # Kineto marks a range still open when the profiler stopped; its duration is not real.
        c["finished"].append(args.get("finished", True) is not False)

    def _add_runtime(self, e: dict[str, Any]) -> None:
        args = e.get("args") or {}
        r = self.runtime
        r["name"].append(self._name(e["name"]))
        r["start"].append(_ns(e["ts"]))
        r["dur"].append(_ns(e.get("dur", 0)))
        r["pid"].append(_int(e.get("pid")))
        r["tid"].append(_int(e.get("tid")))
        r["correlation"].append(_int(args.get("correlation")))
        r["ext_id"].append(_int(args.get("External id")))

    def _add_gpu_annotation(self, e: dict[str, Any]) -> None:
        args = e.get("args") or {}
        g = self.gpu_ann
        g["name"].append(self._name(e["name"]))
        g["start"].append(_ns(e["ts"]))
        g["dur"].append(_ns(e.get("dur", 0)))
        g["device"].append(_int(args.get("device", e.get("pid")), 0))
        g["ext_id"].append(_int(args.get("External id")))

    def build(self, source: str, meta: dict[str, Any]) -> Timeline:
        meta = {k: v for k, v in meta.items() if k != "traceEvents"}
        props = meta.get("deviceProperties") or []
        warnings = []
        if self.skipped:
            warnings.append(f"{self.skipped} malformed trace events were skipped")
        timeline = Timeline(
            source=source,
            format="kineto",
            kernels=frame(self.kernels, KERNEL_COLUMNS),
            runtime=frame(self.runtime, RUNTIME_COLUMNS),
            cpu=frame(self.cpu, CPU_COLUMNS),
            gpu_annotations=frame(self.gpu_ann, GPU_ANNOTATION_COLUMNS),
            device_properties=[p for p in props if isinstance(p, dict)],
            meta=meta,
            args=self.args,
            warnings=warnings,
        )
        rank = (meta.get("distributedInfo") or {}).get("rank")
        timeline.rank = _int(rank) if rank is not None else None
        return timeline


def read_trace_bytes(data: bytes, name: str = "<bytes>") -> Timeline:
    """Read a trace held in memory (tests, and traces handed over by other tools)."""
    builder = _Builder()
    meta = _stream_events(io.BytesIO(data), builder, CHUNK_BYTES)
    return builder.build(name, meta)
