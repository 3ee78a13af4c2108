"""Kineto events decoded by msgspec straight into the fields the reader uses (``Event``).

Reading a trace went to orjson building a dict per event (and per args), and to pulling the
columns back out of them one key at a time. msgspec fills a small struct per event instead,
skips the keys nobody reads, and the columns come out of the structs at C speed
(``kineto._Builder.add_json``): a run of events is read in about half the time, with the same
result as orjson and ``_Builder.add``.

The same result holds only where both parsers agree, so ``decode`` declines (None: the caller
parses with orjson) where they may not:

- a value of another type than Kineto writes where the struct expects one (ts or dur not a
  number, args not an object, an element that is not an object): msgspec refuses it;
- what msgspec does not check in the keys it skips but orjson refuses: invalid UTF-8, a number
  past a double's range (``_vouched``), nesting past orjson's limit of 1024 (msgspec's limit
  is Python's recursion limit, lower where it is the default: Python 3.11 and before);
- integers past 64 bits, which orjson reads as floats: ``int_column`` reads them so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import numpy as np
import orjson

from kerneltriage.ingest.tables import int_array

UNSET = msgspec.UNSET
_NULL = msgspec.Raw(b"null")


class Args(msgspec.Struct, gc=False):
    """The keys of an event's args that the columns read. An absent key reads as what
    ``_Builder.add`` makes of it: -1 for the integer columns (their default), UNSET where
    another value stands in (the event's pid for the device, its tid for the stream). The op
    arguments stay JSON text (``msgspec.Raw``): they are interned, each distinct text parsed
    once."""

    ext_id: Any = msgspec.field(name="External id", default=-1)  # first: it tells most apart
    seq: Any = msgspec.field(name="Sequence number", default=-1)
    correlation: Any = -1
    device: Any = UNSET
    stream: Any = UNSET
    registers: Any = msgspec.field(name="registers per thread", default=-1)
    shared_mem: Any = msgspec.field(name="shared memory", default=-1)
    bytes: Any = -1
    grid: Any = None
    block: Any = None
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_NULL)
    types: msgspec.Raw = msgspec.field(name="Input type", default=_NULL)
    strides: msgspec.Raw = msgspec.field(name="Input Strides", default=_NULL)
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=_NULL)
    finished: Any = True


class Event(msgspec.Struct, gc=False):
    """An event's keys that the reader uses; ts and dur are numbers (or null), args an object."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: float | None = None
    dur: float | None = 0.0  # absent: 0, as _Builder.add reads it
    pid: Any = None
    tid: Any = None
    args: Args | None = None


#: Args holding none of the keys read: ``{}`` or only other keys, which ``_Builder.add`` tells
#: apart (an op without args is counted) and the struct does not.
NO_ARGS = Args()

_EVENTS = msgspec.json.Decoder(list[Event])

# Where msgspec's nesting limit is Python's recursion limit (up to 3.11), and that is at most
# orjson's (1024), msgspec refuses whatever is nested too deep for orjson. From 3.12 on its
# limit is the interpreter's C recursion limit, above orjson's.
_DEPTH_CHECKED = sys.version_info < (3, 12)
_ORJSON_DEPTH = 1024

# For ``_vouched``: e and E -> 1, digits and "+" -> 2, anything else -> 0.
_NUMBER_BYTES = bytes(1 if b in b"eE" else 2 if b in b"+0123456789" else 0 for b in range(256))
_E_DIGIT = 1 | 2 << 8  # an e then a digit (or "+"), as a little-endian pair of bytes


def decode(doc: bytes) -> list[Event] | None:
    """The events of a JSON list, or None where the result may differ from orjson's."""
    if not (_DEPTH_CHECKED and sys.getrecursionlimit() <= _ORJSON_DEPTH and _vouched(doc)):
        return None
    try:
        return _EVENTS.decode(doc)
    except (ValueError, RecursionError):  # msgspec's errors are ValueErrors (so is bad UTF-8)
        return None


def _vouched(doc: bytes) -> bool:
    """No bytes in ``doc`` that orjson refuses and msgspec may skip unchecked: invalid UTF-8,
    and numbers past a double's range. Such a number has 210 digits or more before its
    exponent, or an exponent of three digits or more (``_exponents_fit``)."""
    if not doc.isascii():
        try:
            doc.decode()
        except UnicodeDecodeError:
            return False
    kinds = doc.translate(_NUMBER_BYTES)
    if b"\2" * 200 in kinds:
        return False
    for offset in (0, 1)[: len(kinds) - 1]:  # the pairs of bytes at even offsets, then at odd ones
        pairs = np.frombuffer(kinds, "<u2", count=(len(kinds) - offset) // 2, offset=offset) == _E_DIGIT
        if pairs.any() and not _exponents_fit(doc, 2 * np.flatnonzero(pairs) + offset):
            return False
    return True


def _exponents_fit(doc: bytes, es: np.ndarray) -> bool:
    """Whether none of the e (or E) at ``es``, each before a digit or "+", is the exponent of a
    number with three digits or more: in traces they are mostly in words and hex addresses."""
    x = np.frombuffer(doc, np.uint8)
    at = es + 1 + (x[es + 1] == ord("+"))
    keep = (es > 0) & (at + 2 < len(x))
    es, at = es[keep], at[keep]
    digit = [(x[i] - ord("0")) < 10 for i in (es - 1, at, at + 1, at + 2)]  # (wraps below "0")
    for e in es[digit[0] & digit[1] & digit[2] & digit[3]].tolist():
        start = e  # the mantissa, back from the e: a number's if a delimiter is before it
        while start > 0 and doc[start - 1] in b"0123456789.-":
            start -= 1
        if start == 0 or doc[start - 1] in b" \t\r\n:,[":
            return False
    return True


# Column getters: one C call per event, not a Python expression.
FIRST, SECOND = itemgetter(0), itemgetter(1)
TS, DUR = attrgetter("ts"), attrgetter("dur")
NAME, PID, TID, ARGS = attrgetter("name"), attrgetter("pid"), attrgetter("tid"), attrgetter("args")
EXT_ID, SEQ, CORRELATION = attrgetter("ext_id"), attrgetter("seq"), attrgetter("correlation")
DEVICE, STREAM, GRID, BLOCK = (
    attrgetter("device"),
    attrgetter("stream"),
    attrgetter("grid"),
    attrgetter("block"),
)
REGISTERS, SHARED_MEM, BYTES = attrgetter("registers"), attrgetter("shared_mem"), attrgetter("bytes")
FINISHED = attrgetter("finished")
OP_ARGUMENTS = attrgetter("dims", "types", "strides", "concrete")
OP_ARGUMENT_COLUMNS = ("dims", "types", "strides", "concrete")  # kineto._INTERNED
NO_DIM = (-1, -1, -1)  # a grid or block not recorded, as kineto's _NO_DIM


# --- Columns, as ``kineto._Builder``'s of dicts: keep each in step with its twin there -------
#
# ``builder`` is the ``_Builder`` whose batch they are (its skip counts, its interned
# arguments); ``rows`` the events (for GPU activity and CPU ops: (event, tag) pairs) that
# passed ``_Builder._plausible``, ``times`` their ts and dur.


def _common(rows: list[Event], times: np.ndarray) -> tuple[list[Args], dict[str, Any]]:
    args = [NO_ARGS if a is None else a for a in map(ARGS, rows)]
    ns = np.rint(times * 1000.0).astype(np.int64)  # µs (Kineto's unit) to integer ns
    return args, {
        "name": list(map(sys.intern, map(NAME, rows))),  # a str: checked by add_json
        "start": np.ascontiguousarray(ns[:, 0]),
        "dur": np.ascontiguousarray(ns[:, 1]),
    }


def gpu_columns(builder: Any, tagged: list[tuple[Event, str]], times: np.ndarray) -> dict[str, Any]:
    rows = list(map(FIRST, tagged))
    args, cols = _common(rows, times)
    grids = [g or NO_DIM for g in map(GRID, args)]
    blocks = [b or NO_DIM for b in map(BLOCK, args)]
    cols.update(
        kind=list(map(SECOND, tagged)),
        device=int_column(list(map(DEVICE, args)), 0, lambda: list(map(PID, rows))),
        stream=int_column(list(map(STREAM, args)), -1, lambda: list(map(TID, rows))),
        correlation=int_column(list(map(CORRELATION, args))),
        registers=int_column(list(map(REGISTERS, args))),
        shared_mem=int_column(list(map(SHARED_MEM, args))),
        bytes=int_column(list(map(BYTES, args))),
        pid=int_column(list(map(PID, rows))),
    )
    grid, block = _dim_table(grids), _dim_table(blocks)
    for i, axis in enumerate("xyz"):
        cols[f"grid_{axis}"] = grid[i] if grid else int_column([g[i] if len(g) > i else -1 for g in grids])
        cols[f"block_{axis}"] = (
            block[i] if block else int_column([b[i] if len(b) > i else -1 for b in blocks])
        )
    return cols


def cpu_columns(builder: Any, tagged: list[tuple[Event, str]], times: np.ndarray) -> dict[str, Any]:
    rows = list(map(FIRST, tagged))
    args, cols = _common(rows, times)
    # Args null or absent (add_json declines {}).
    builder.skipped["no_args"] += sum(1 for e, cat in tagged if cat == "cpu_op" and e.args is None)
    cols.update(
        cat=list(map(SECOND, tagged)),
        pid=int_column(list(map(PID, rows))),
        tid=int_column(list(map(TID, rows))),
        ext_id=int_column(list(map(EXT_ID, args))),
        seq=int_column(list(map(SEQ, args))),
        **_op_argument_ids(builder, args),
        finished=np.array([f is not False for f in map(FINISHED, args)], dtype=bool),
    )
    return cols


def runtime_columns(builder: Any, rows: list[Event], times: np.ndarray) -> dict[str, Any]:
    args, cols = _common(rows, times)
    cols.update(
        pid=int_column(list(map(PID, rows))),
        tid=int_column(list(map(TID, rows))),
        correlation=int_column(list(map(CORRELATION, args))),
        ext_id=int_column(list(map(EXT_ID, args))),
    )
    return cols


def gpu_annotation_columns(builder: Any, rows: list[Event], times: np.ndarray) -> dict[str, Any]:
    args, cols = _common(rows, times)
    cols.update(
        device=int_column(list(map(DEVICE, args)), 0, lambda: list(map(PID, rows))),
        ext_id=int_column(list(map(EXT_ID, args))),
    )
    return cols


#: The tables' column makers, in ``kineto._Builder``'s order (kernels, cpu, runtime, gpu_ann).
COLUMNS = (gpu_columns, cpu_columns, runtime_columns, gpu_annotation_columns)
_NUL_JOIN = b"\0".join


def _op_argument_ids(builder: Any, args: list[Args]) -> dict[str, np.ndarray]:
    """The interned op-argument columns as ``_Builder._arg_ids`` gives them, from their JSON
    text (no NUL in it): each distinct text of an op's four is parsed once, and new values are
    numbered column by column, each in order, as ``_arg_ids`` numbers them."""
    known = builder.raw_ids
    texts = list(map(_NUL_JOIN, map(OP_ARGUMENTS, args)))
    where = list(map(known.get, texts))
    if None in where:
        new = list(dict.fromkeys(t for t, w in zip(texts, where) if w is None))  # in order
        values = [list(map(orjson.loads, t.split(b"\0"))) for t in new]
        ids = [builder._arg_ids([v[i] for v in values], c) for i, c in enumerate(OP_ARGUMENT_COLUMNS)]
        known.update(zip(new, range(len(known), len(known) + len(new))))
        builder.raw_table = np.concatenate([builder.raw_table, np.stack(ids)], axis=1)
        where = list(map(known.get, texts))
    return dict(zip(OP_ARGUMENT_COLUMNS, builder.raw_table[:, np.array(where, dtype=np.intp)]))


def int_column(
    values: list[Any], default: int = -1, absent: Callable[[], list[Any]] | None = None
) -> np.ndarray:
    """``tables.int_array`` of struct fields: one conversion when all are integers, else that
    of the values orjson's dicts would give (``absent()``: what UNSET stands for)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    if absent is not None:
        values = [a if v is UNSET else v for v, a in zip(values, absent())]
    return int_array([_as_orjson(v) for v in values], default)


def _dim_table(dims: list[Any]) -> list[np.ndarray]:
    """The x, y, z columns of grids or blocks that all are three integers (or ``NO_DIM``), in
    one conversion; else none (the caller reads them one axis at a time)."""
    try:
        table = np.array(dims, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return []
    return list(np.ascontiguousarray(table.T)) if table.shape == (len(dims), 3) else []


def _as_orjson(value: Any, depth: int = 0) -> Any:
    """A value as orjson reads it: integers past 64 bits are floats (msgspec keeps them
    whole). Below numpy's 64 dimensions nothing is read."""
    if type(value) is int and not -(1 << 63) <= value < (1 << 64):
        return float(value)
    if type(value) is list and depth < 64:
        return [_as_orjson(v, depth + 1) for v in value]
    return value
