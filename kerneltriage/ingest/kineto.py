"""Read a PyTorch profiler (Kineto) chrome trace into ``tables.Timeline``.

Traces reach millions of events and a gigabyte of JSON. Parsing the whole document into Python
objects would take several gigabytes, so the reader streams (``json_stream``): it cuts the
``traceEvents`` list into pieces of whole events, in any JSON layout, and worker processes parse
each piece (msgspec straight into the fields used, ``kineto_typed``; else orjson). Each keeps
only typed columns (``_Builder``: integers, and interned strings for names and shapes), and the
pieces are merged in file order. Peak memory is a few pieces of events plus the columns. The
keys around the list (deviceProperties, distributedInfo …) are parsed on their own.
"""

from __future__ import annotations

import functools
import gzip
import io
import os
import sys
import zlib
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import orjson
import pandas as pd

from kerneltriage.errors import TraceFormatError
from kerneltriage.gc_pause import gc_paused
from kerneltriage.ingest.json_stream import read_list
from kerneltriage.ingest.repairs import drop_colliding_correlations, drop_colliding_ids, from_zero
from kerneltriage.ingest.schemas import OP_ARGUMENTS, implausible_dims, validate_trace_meta
from kerneltriage.ingest.tables import (
    CPU_COLUMNS,
    GPU_ANNOTATION_COLUMNS,
    KERNEL_COLUMNS,
    RUNTIME_COLUMNS,
    Timeline,
    frame,
)
from kerneltriage.ingest.tables import int_array as _int_array

try:  # events read straight into structs (about twice as fast); without msgspec, orjson reads all
    from kerneltriage.ingest import kineto_typed as typed
except ImportError:  # pragma: no cover - msgspec is a dependency
    typed = None  # type: ignore[assignment]

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
GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


CHUNK_BYTES = 8 << 20
PARALLEL_BYTES = 64 << 20


def read_trace(
    path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES, workers: int | None = None
) -> Timeline:
    """Read a Kineto trace (``.json`` or ``.json.gz``), in any JSON layout.

    Large traces are parsed by ``workers`` processes (default: one per core, at most 4, for
    files over ``PARALLEL_BYTES``), each turning chunks of events into columns.

    Raises ``TraceFormatError`` for a file that is not a readable Kineto trace; a trace that
    is valid but holds no GPU activity is returned as is (the caller decides what that means).
    """
    path = Path(path)
    try:
        with _open(path) as stream, gc_paused():
            # A plain regular file: workers read their pieces from it by offset.
            plain = None if isinstance(stream, gzip.GzipFile) or not path.is_file() else str(path)
            builder, meta = _read_events(stream, chunk_bytes, _workers(path, workers), path=plain)
    except TraceFormatError as exc:
        exc.path = exc.path or str(path)
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(f"compressed data is truncated or corrupt ({exc})", path=str(path)) from None
    except orjson.JSONDecodeError as exc:
        raise _json_error(exc, str(path)) from None
    except OSError as exc:
        from kerneltriage.inputs import os_reason

        raise TraceFormatError(f"cannot read file ({os_reason(exc)})", path=str(path)) from None
    with gc_paused():
        return builder.build(str(path), meta)


def read_trace_bytes(data: bytes, name: str = "<bytes>") -> Timeline:
    """Read a trace held in memory (tests, and traces handed over by other tools)."""
    try:
        builder, meta = _read_events(io.BytesIO(data), CHUNK_BYTES, 0)
    except TraceFormatError as exc:
        exc.path = exc.path or name
        raise
    except orjson.JSONDecodeError as exc:
        raise _json_error(exc, name) from None
    return builder.build(name, meta)


def _json_error(exc: orjson.JSONDecodeError, path: str) -> TraceFormatError:
    """The parser's error in words: a parse that ran out of memory is not invalid JSON."""
    if "memory" in str(exc).lower():
        return TraceFormatError(
            "out of memory while parsing (the JSON may be valid; a part of it, such as a long "
            "run of padding, is larger than the memory this process may use)",
            path=path,
            hint="strip the padding, or run with more memory",
        )
    return TraceFormatError(f"not valid JSON ({exc})", path=path)


def _workers(path: Path, requested: int | None) -> int:
    if requested is not None:
        return max(0, requested)
    if path.stat().st_size < PARALLEL_BYTES // (8 if path.suffix == ".gz" else 1):
        return 0
    return min(4, os.cpu_count() or 1)


def _open(path: Path) -> BinaryIO:
    from kerneltriage.inputs import check_file

    check_file(path, "trace file", TraceFormatError)  # a named pipe would block the read
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _read_events(
    stream: BinaryIO, chunk_bytes: int, workers: int, *, path: str | None = None
) -> tuple[_Builder, dict[str, Any]]:
    """The events into a builder's columns (``json_stream`` cuts the list and has the pieces
    parsed), and the trace's other keys. ``path``: the stream is this plain file."""
    builder = _Builder()
    doc, read = read_list(
        stream,
        "traceEvents",
        _Builder,
        lambda parsed: builder.merge(*parsed),
        chunk_bytes=chunk_bytes,
        workers=workers,
        path=path,
    )
    if not read:
        return builder, _parse_whole(doc, builder)
    meta = orjson.loads(doc)
    if not isinstance(meta, dict):  # pragma: no cover - the header starts with "{"
        raise TraceFormatError("JSON is not an object with a traceEvents list")
    return builder, meta


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


class _Builder:
    """Accumulates typed columns from batches of raw events.

    Each batch is bucketed by category, then every column is pulled out with one list
    comprehension and turned into a numpy array at once: per-event Python work stays small
    and a column costs 8 bytes a value, not a Python object.
    """

    def __init__(self) -> None:
        self.events = 0
        self.parts: dict[str, list[dict[str, Any]]] = {"kernels": [], "runtime": [], "cpu": [], "gpu_ann": []}
        self.arg_index: dict[str, dict[bytes, int]] = {}  # column -> JSON -> id, -1: malformed
        # add_json: an op's arguments as written -> a column of raw_table, their ids
        self.raw_ids: dict[bytes, int] = {}
        self.raw_table = np.empty((len(_INTERNED), 0), dtype=np.int64)
        self.args: list[Any] = []
        self.text: dict[str, int] = {}  # the text columns' values (names, categories) -> id
        self.skipped: dict[str, int] = dict.fromkeys(SKIPPED_KINDS, 0)

    def merge(
        self, parts: dict[str, list[dict[str, Any]]], args: list[Any], events: int, skipped: dict[str, int]
    ) -> None:
        """Take over another builder's columns, re-numbering its interned arguments."""
        self.events += events
        for kind, count in skipped.items():
            self.skipped[kind] = self.skipped.get(kind, 0) + count
        remap = self._arg_ids(args, "")  # validated by the worker
        for table, chunks in parts.items():
            for cols in chunks:
                for column in _INTERNED:
                    if column in cols and len(remap):
                        ids = cols[column]
                        cols[column] = np.where(ids >= 0, remap[np.maximum(ids, 0)], -1)
                for name, values in cols.items():
                    if isinstance(values, _Text):  # the piece's text ids -> the trace's
                        ids = np.array([self.text.setdefault(v, len(self.text)) for v in values.values])
                        cols[name] = _Text(ids[values.codes], [])
                self.parts[table].append(cols)

    def _arg_ids(self, values: list[Any], column: str) -> np.ndarray:
        """Interned ids of an argument column; each distinct value is checked against its
        schema once (``schemas.OP_ARGUMENTS``), and one of the wrong shape counts as not
        recorded (-1)."""
        index = self.arg_index.get(column)
        if index is None:
            index = self.arg_index[column] = {b"null": -1}  # not recorded
        keys = list(map(orjson.dumps, values))
        out = list(map(index.get, keys))
        if None in out:  # values not seen before: checked and numbered in order
            args, valid = self.args, OP_ARGUMENTS[column]
            for i, j in enumerate(out):
                if j is not None:
                    continue
                key, value = keys[i], values[i]
                j = index.get(key)
                if j is None:
                    if valid(value) and column == "dims" and implausible_dims(value) is not None:
                        j = index[key] = -1
                        self.skipped["shapes"] += 1
                    elif valid(value):
                        j = index[key] = len(args)
                        args.append(value)
                    else:
                        j = index[key] = -1
                        self.skipped["arguments"] += 1
                out[i] = j
        return np.array(out, dtype=np.int64)

    def result(self) -> tuple[Any, ...]:
        """What a worker sends back (``json_stream.Sink``): compacted columns (text as ids),
        chunk-local interned arguments, events read, skipped counts; ``merge`` takes it."""
        self.compact()
        for chunks in self.parts.values():
            for cols in chunks:
                for name, values in cols.items():
                    if isinstance(values, list):
                        ids: dict[str, int] = {}
                        codes = np.fromiter(
                            (ids.setdefault(v, len(ids)) for v in values), np.int64, len(values)
                        )
                        cols[name] = _Text(codes, list(ids))
        return self.parts, self.args, self.events, self.skipped

    def compact(self) -> None:
        """One block of columns per table (fewer, larger objects to send between processes)."""
        for table, chunks in self.parts.items():
            if len(chunks) > 1:
                self.parts[table] = [{name: _join([c[name] for c in chunks]) for name in chunks[0]}]

    def add(self, events: list[Any]) -> None:
        self.events += len(events)
        (gpu, cpu, runtime, gpu_ann), into = _buckets()
        skipped = self.skipped
        aliases, numbers, args_types = _CATEGORY_ALIASES, _NUMBER, _ARGS
        for e in events:
            if type(e) is not dict:
                continue
            get = e.get
            if get("ph") != "X":
                continue
            cat = get("cat")
            if type(cat) is not str:  # a list, a number: not a category anyone wrote
                if cat is not None:
                    skipped["other"] += 1
                continue
            if cat == "Operator":  # Kineto's categories before PyTorch 1.10
                skipped["legacy"] = skipped.get("legacy", 0) + 1
            cat = aliases.get(cat) or aliases.get(cat.lower())
            if cat is None:
                continue
            bucket, tag, table = into[cat]
            # The schema of the fields read (types only; values are checked per column):
            # ts and dur numbers, name a string, args a mapping when present.
            if (
                type(get("ts")) not in numbers
                or type(get("dur", 0)) not in numbers
                or type(get("name")) is not str
                or type(get("args")) not in args_types
            ):
                skipped[table] += 1
            else:
                bucket.append(e if tag is None else (e, tag))
        self._add_tables(
            (gpu, cpu, runtime, gpu_ann), (self._gpu, self._cpu, self._runtime, self._gpu_annotation)
        )

    def add_json(self, doc: bytes) -> int:
        """``add`` for the JSON of a list of events, which msgspec reads into structs
        (``kineto_typed``): the same columns in half the time. Returns the number of events, or
        -1 when it declines (no msgspec; JSON that msgspec might read otherwise than orjson, or
        of types it does not take): nothing is added then, the caller parses it for ``add``.

        Keep in step with ``add``: each step below is one of it, on struct fields, and the
        columns are made by the twins of ``_gpu`` … in ``kineto_typed``."""
        events = typed.decode(doc) if typed is not None else None
        if events is None:
            return -1
        (gpu, cpu, runtime, gpu_ann), into = _buckets()
        skipped = dict(self.skipped)  # the builder's own once the batch is taken
        aliases = _CATEGORY_ALIASES
        for e in events:
            if e.ph != "X":
                continue
            cat = e.cat
            if type(cat) is not str:
                if cat is not None:
                    skipped["other"] += 1
                continue
            if cat == "Operator":
                skipped["legacy"] = skipped.get("legacy", 0) + 1
            cat = aliases.get(cat) or aliases.get(cat.lower())
            if cat is None:
                continue
            bucket, tag, table = into[cat]
            # The struct's types hold the rest of the schema: ts and dur numbers, args an object.
            if e.ts is None or e.dur is None or type(e.name) is not str:
                skipped[table] += 1
            else:
                bucket.append(e if tag is None else (e, tag))
        # Args that hold none of the keys read are {} (an op without args, counted) or other
        # keys only (not counted): only the JSON tells.
        if typed.NO_ARGS in [e.args for e, tag in cpu if tag == "cpu_op"]:
            return -1
        self.events += len(events)
        self.skipped = skipped
        makes = tuple(functools.partial(make, self) for make in typed.COLUMNS)
        self._add_tables((gpu, cpu, runtime, gpu_ann), makes, structs=True)
        return len(events)

    def _add_tables(
        self, buckets: tuple[list[Any], ...], makes: tuple[Any, ...], structs: bool = False
    ) -> None:
        for table, rows, make in zip(("kernels", "cpu", "runtime", "gpu_ann"), buckets, makes):
            if not rows:
                continue
            rows, times = self._plausible(table, rows, structs)
            if rows:
                self.parts[table].extend(self._make(table, make, rows, times))

    def _plausible(self, table: str, rows: list[Any], structs: bool = False) -> tuple[list[Any], np.ndarray]:
        """The rows whose ts and dur are finite, in range, and dur >= 0 (one vector test), and
        their ts and dur (µs, rows of a 2-column array). ``structs``: events from ``add_json``."""
        events = [r[0] for r in rows] if type(rows[0]) is tuple else rows
        if structs:  # floats already: two columns at C speed
            times = np.empty((len(events), 2))
            times[:, 0] = np.fromiter(map(typed.TS, events), np.float64, len(events))
            times[:, 1] = np.fromiter(map(typed.DUR, events), np.float64, len(events))
        else:
            times = np.array([(e["ts"], e.get("dur", 0)) for e in events], dtype=np.float64)
        ts, dur = times[:, 0], times[:, 1]
        ok = (np.abs(ts) < MAX_TS_US) & (dur >= 0) & (dur <= MAX_DUR_US)  # NaN fails both
        if ok.all():
            return rows, times
        self.skipped[table] += int(len(ok) - ok.sum())
        return [r for r, good in zip(rows, ok) if good], times[ok]

    def _make(self, table: str, make: Any, rows: list[Any], times: np.ndarray) -> list[dict[str, Any]]:
        """Columns of ``rows``; a batch holding an argument of the wrong type (a grid that is
        a number, an id that is a list) is halved until the bad events are found and skipped."""
        try:
            return [make(rows, times)]
        except _ROW_ERRORS:
            if len(rows) == 1:
                self.skipped[table] += 1
                return []
            mid = len(rows) // 2
            return self._make(table, make, rows[:mid], times[:mid]) + self._make(
                table, make, rows[mid:], times[mid:]
            )

    @staticmethod
    def _common(rows: list[dict[str, Any]], times: np.ndarray) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        args = [e.get("args") or {} for e in rows]
        ns = np.rint(times * 1000.0).astype(np.int64)  # µs (Kineto's unit) to integer ns
        return args, {
            "name": [sys.intern(e["name"]) for e in rows],  # a str: checked by ``add``
            "start": np.ascontiguousarray(ns[:, 0]),
            "dur": np.ascontiguousarray(ns[:, 1]),
        }

    def _gpu(self, tagged: list[tuple[dict[str, Any], str]], times: np.ndarray) -> dict[str, Any]:
        rows = [e for e, _ in tagged]
        args, cols = self._common(rows, times)
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

    def _cpu(self, tagged: list[tuple[dict[str, Any], str]], times: np.ndarray) -> dict[str, Any]:
        rows = [e for e, _ in tagged]
        args, cols = self._common(rows, times)
        # Kineto gives every op its args (its External id at least): none at all is a trace
        # rewritten without them, not an op that recorded nothing.
        self.skipped["no_args"] += sum(1 for e, cat in tagged if cat == "cpu_op" and not e.get("args"))
        cols.update(
            cat=[cat for _, cat in tagged],
            pid=_int_array([e.get("pid") for e in rows]),
            tid=_int_array([e.get("tid") for e in rows]),
            ext_id=_int_array([a.get("External id") for a in args]),
            seq=_int_array([a.get("Sequence number") for a in args]),
            dims=self._arg_ids([a.get("Input Dims") for a in args], "dims"),
            types=self._arg_ids([a.get("Input type") for a in args], "types"),
            strides=self._arg_ids([a.get("Input Strides") for a in args], "strides"),
            concrete=self._arg_ids([a.get("Concrete Inputs") for a in args], "concrete"),
            # Kineto marks a range still open when the profiler stopped; its duration is not real.
            finished=np.array([a.get("finished", True) is not False for a in args], dtype=bool),
        )
        return cols

    def _runtime(self, rows: list[dict[str, Any]], times: np.ndarray) -> dict[str, Any]:
        args, cols = self._common(rows, times)
        cols.update(
            pid=_int_array([e.get("pid") for e in rows]),
            tid=_int_array([e.get("tid") for e in rows]),
            correlation=_int_array([a.get("correlation") for a in args]),
            ext_id=_int_array([a.get("External id") for a in args]),
        )
        return cols

    def _gpu_annotation(self, rows: list[dict[str, Any]], times: np.ndarray) -> dict[str, Any]:
        args, cols = self._common(rows, times)
        cols.update(
            device=_int_array([a.get("device", e.get("pid")) for a, e in zip(args, rows)], 0),
            ext_id=_int_array([a.get("External id") for a in args]),
        )
        return cols

    def build(self, source: str, meta: dict[str, Any]) -> Timeline:
        meta = {k: v for k, v in meta.items() if k != "traceEvents"}
        meta, warnings = validate_trace_meta(meta)
        props = meta.get("deviceProperties") or []
        kept = {table: sum(len(c["start"]) for c in chunks) for table, chunks in self.parts.items()}
        for table in ("kernels", "cpu"):
            bad = self.skipped[table]
            total = bad + kept[table]
            if total and bad > MAX_MALFORMED_SHARE * total:
                raise TraceFormatError(
                    f"{bad} of {total} {_SKIPPED_TEXT[table].replace('(s)', 's')} "
                    f"({bad / total:.0%}, more than {MAX_MALFORMED_SHARE:.0%}): a report without "
                    "them would mislead",
                    path=source,
                )
        if self.skipped.pop("legacy", 0):
            meta["kineto_legacy_categories"] = True  # the PyTorch version is below 1.10
        no_args = self.skipped.pop("no_args", 0)
        warnings += [f"skipped {n} {_SKIPPED_TEXT[kind]}" for kind, n in self.skipped.items() if n]
        if no_args:
            warnings.append(
                f"{no_args} CPU op event(s) have no args (null or missing: no External id, Input "
                "Dims or sequence number): their shapes are unknown, their kernels are placed by "
                "time and their backward work cannot be traced to its forward op"
            )
        # The pieces' columns are let go table by table, column by column, as the tables are
        # built, so they and the tables are never all in memory at once.
        parts, self.parts = self.parts, {}
        text = np.array(list(self.text), dtype=object)
        timeline = Timeline(
            source=source,
            format="kineto",
            kernels=_concat(parts.pop("kernels"), KERNEL_COLUMNS, text),
            runtime=_concat(parts.pop("runtime"), RUNTIME_COLUMNS, text),
            cpu=_concat(parts.pop("cpu"), CPU_COLUMNS, text),
            gpu_annotations=_concat(parts.pop("gpu_ann"), GPU_ANNOTATION_COLUMNS, text),
            device_properties=[p for p in props if isinstance(p, dict)],
            meta=meta,
            args=self.args,
            warnings=warnings,
        )
        rank = (meta.get("distributedInfo") or {}).get("rank")
        timeline.rank = rank
        from_zero(timeline)
        drop_colliding_ids(timeline)
        drop_colliding_correlations(timeline)
        return timeline


_NO_DIM = (-1, -1, -1)
_INTERNED = ("dims", "types", "strides", "concrete")
_NUMBER = frozenset({int, float})
_ARGS = frozenset({dict, type(None)})
_ROW_ERRORS = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError)
_TABLE_OF = {
    **dict.fromkeys(GPU_KINDS, "kernels"),
    "cpu_op": "cpu",
    "user_annotation": "cpu",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "gpu_user_annotation": "gpu_ann",
}
#: What a skipped event was (the warning names it): a table, an event of no known category,
#: or a distinct op argument (Input Dims, Input type …) of the wrong shape.
SKIPPED_KINDS = ("kernels", "cpu", "runtime", "gpu_ann", "other", "arguments", "shapes", "no_args")
_SKIPPED_TEXT = {
    "kernels": "malformed kernel event(s)",
    "cpu": "malformed CPU op event(s)",
    "runtime": "malformed CUDA runtime event(s)",
    "gpu_ann": "malformed GPU annotation event(s)",
    "other": "malformed event(s) of no known category",
    "arguments": "malformed op argument(s) (Input Dims, Input type … of the wrong shape; those ops count as unrecorded)",
    "shapes": (
        "distinct Input Dims naming a tensor no GPU could hold (a negative size, or more than 2^44 "
        "elements): implausible shapes, whose FLOPs and bytes would be invented; those ops count as unrecorded"
    ),
}
# Timestamps past this (µs) overflow nanoseconds in int64; a duration past a day is no kernel's.
MAX_TS_US = 9.0e15
MAX_DUR_US = 86_400e6
#: Above this share of malformed kernel (or CPU op) events the report would mislead: refused.
MAX_MALFORMED_SHARE = 0.10


def _buckets() -> tuple[tuple[list[Any], ...], dict[str, tuple[list[Any], str | None, str]]]:
    """One bucket per output table (gpu, cpu, runtime, gpu_ann), events kept in file order
    (whatever the chunking), and where each category's events go: (bucket, tag; None: the
    event itself, skip counter)."""
    gpu: list[Any] = []
    cpu: list[Any] = []
    runtime: list[Any] = []
    gpu_ann: list[Any] = []
    into: dict[str, tuple[list[Any], str | None, str]] = {
        **{c: (gpu, kind, "kernels") for c, kind in GPU_KINDS.items()},
        "cpu_op": (cpu, "cpu_op", "cpu"),
        "user_annotation": (cpu, "user_annotation", "cpu"),
        "cuda_runtime": (runtime, None, "runtime"),
        "cuda_driver": (runtime, None, "runtime"),
        "gpu_user_annotation": (gpu_ann, None, "gpu_ann"),
    }
    return (gpu, cpu, runtime, gpu_ann), into


class _Text(NamedTuple):
    """A text column as ids: ``values[codes]`` (a worker sends each name once, not per event)."""

    codes: np.ndarray
    values: list[str]


def _join(chunks: list[Any], text: np.ndarray | None = None) -> Any:
    if isinstance(chunks[0], np.ndarray):
        return np.concatenate(chunks)
    if isinstance(chunks[0], _Text):  # ids of the trace's text (``merge``): one string per value
        assert text is not None
        return text[np.concatenate([c.codes for c in chunks])]
    return [v for chunk in chunks for v in chunk]


def _concat(
    parts: list[dict[str, Any]], spec: dict[str, str], text: np.ndarray | None = None
) -> pd.DataFrame:
    """One table from the pieces' columns (taken out of ``parts`` as they are joined)."""
    if not parts:
        return frame({}, spec)
    columns = {}
    for name in spec:
        chunks = [p.pop(name) for p in parts if name in p]
        if not chunks:
            continue
        columns[name] = _join(chunks, text)
    return frame(columns, spec)
