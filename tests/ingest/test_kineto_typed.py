"""Events read by msgspec into structs (``_Builder.add_json``) give what orjson's dicts give
(``_Builder.add``), whatever the events hold; where the two parsers could differ, msgspec
declines and orjson reads (so its error messages stay).
"""

from __future__ import annotations

import copy
import json
import pickle
import random

import orjson
import pytest

from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest import kineto
from kerneltriage.ingest.kineto import read_trace_bytes
from tests.helpers import raw_trace

pytestmark = pytest.mark.skipif(kineto.typed is None, reason="needs msgspec")

# Values of every JSON type, and the integers orjson reads otherwise than msgspec (past 64
# bits: floats), for the fields the reader uses.
JUNK = [
    None, True, False, 0, -1, 7, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -(2**63), -(2**63) - 1,
    -(2**63) - 5000, -(2**70), 1.5, -0.0, 1e300, 2.5e-300, "", "7", " 12 ", "x", "1e3", [], [1],
    [1, 2, 3], [2**70, 1, 1], [-(2**63) - 1], [[1], [2], [3]], ["1", "2", "3"], [1.5, True, None],
    "abc", {}, {"0": 1}, {"a": [1]},
]  # fmt: skip
EVENT_KEYS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args")
ARG_KEYS = (
    "External id", "Sequence number", "correlation", "device", "stream", "registers per thread",
    "shared memory", "bytes", "grid", "block", "Input Dims", "Input type", "Input Strides",
    "Concrete Inputs", "finished",
)  # fmt: skip
CATEGORIES = ["Kernel", "Operator", "CPU_OP", "Runtime", "gpu_user_annotation", "Trace", "cuda_driver"]


def _mutated(event: dict, rng: random.Random) -> object:
    e = copy.deepcopy(event)
    action = rng.random()
    if action < 0.3:
        e[rng.choice(EVENT_KEYS)] = rng.choice(JUNK)
    elif action < 0.4:
        e.pop(rng.choice(EVENT_KEYS), None)
    elif action < 0.75 and isinstance(e.get("args"), dict):
        if rng.random() < 0.8:
            e["args"][rng.choice(ARG_KEYS)] = rng.choice(JUNK)
        else:
            e["args"].pop(rng.choice(ARG_KEYS), None)
    elif action < 0.85:
        e["args"] = rng.choice([{}, {"Fwd thread id": 1}, None, {"External id": -1}, {"finished": False}])
    elif action < 0.95:
        e["cat"] = rng.choice(CATEGORIES)
    else:
        return rng.choice([7, "x", None, [], [{"ph": "X"}]])  # not an event: msgspec declines
    return e


def _both(doc: bytes) -> tuple[kineto._Builder, kineto._Builder, bool]:
    """The events of ``doc`` through ``add`` and through ``add_json`` (``add`` where it
    declines); whether it took them."""
    plain, typed = kineto._Builder(), kineto._Builder()
    plain.add(orjson.loads(doc))
    taken = typed.add_json(doc) >= 0
    if not taken:
        typed.add(orjson.loads(doc))
    return plain, typed, taken


def _assert_same(plain: kineto._Builder, typed: kineto._Builder) -> None:
    assert typed.skipped == plain.skipped
    assert pickle.dumps(typed.result()) == pickle.dumps(plain.result())


@pytest.fixture(scope="module")
def events() -> list:
    return raw_trace()["traceEvents"]


def test_the_real_trace_reads_the_same(events):
    doc = orjson.dumps(events)
    plain, typed, taken = _both(doc)
    assert taken and len(plain.parts["kernels"]) and len(plain.parts["cpu"])
    _assert_same(plain, typed)


def test_mutated_events_read_the_same(events):
    rng = random.Random(7)
    taken = 0
    for i in range(200):
        batch = [_mutated(e, rng) if rng.random() < 0.01 else e for e in rng.sample(events, 300)]
        indent = 2 if i % 3 == 0 else None  # pretty and one-line JSON
        doc = json.dumps(batch, indent=indent).encode()
        plain, typed, took = _both(doc)
        taken += took
        try:
            _assert_same(plain, typed)
        except AssertionError:
            raise AssertionError(f"batch {i} (taken: {took}) reads otherwise") from None
    assert 50 < taken < 150, taken  # both paths ran


@pytest.mark.parametrize(
    "args",
    [
        {"device": [-(2**63) - 1]},  # orjson: a float numpy takes as -2**63, in every row
        {"device": -(2**63) - 1, "stream": 2**64},
        {"grid": [2**64, 1, 1], "block": [1, -(2**63) - 1, 1]},
        {"grid": "123", "block": [[1], [2], [3]]},
        {"correlation": 2**70},
    ],
)
def test_integers_past_64_bits_read_as_orjson_reads_them(events, args):
    kernels = [e for e in events if e.get("cat") == "kernel"][:5]
    doc = json.dumps([{**e, "args": {**e["args"], **args}} for e in kernels]).encode()
    plain, typed, taken = _both(doc)
    assert taken
    _assert_same(plain, typed)


EVENT = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"device": 0, %s}}'


@pytest.mark.parametrize(
    "extra",
    [
        '"x": "\xff"',  # invalid UTF-8 in a key nobody reads (msgspec does not check it)
        '"x": 1e400',  # past a double's range
        '"x": 1E+0309',
        '"x": ' + "9" * 400,
        '"Input Dims": [1e999]',
        '"x": ' + "[" * 1030 + "]" * 1030,  # deeper than orjson takes
    ],
)
def test_json_orjson_refuses_is_declined(extra):
    doc = ("[" + EVENT % extra + "]").encode("latin-1")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(doc)
    assert kineto.typed.decode(doc) is None
    assert kineto._Builder().add_json(doc) == -1


def test_errors_are_orjson_s(monkeypatch):
    doc = ('{"traceEvents": [' + EVENT % '"x": 1e400' + "]}").encode()
    with pytest.raises(TraceFormatError) as typed:
        read_trace_bytes(doc)
    monkeypatch.setattr(kineto, "typed", None)  # as without msgspec
    with pytest.raises(TraceFormatError) as plain:
        read_trace_bytes(doc)
    assert str(typed.value) == str(plain.value) and "infinity" in str(plain.value)


def test_lookalikes_are_read(events):
    """Exponents of two digits, and exponent-like text in names and addresses: nothing orjson
    refuses, so msgspec reads it."""
    odd = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "<built-in method append of list object at 0x7f61e5026e80> tilesize128x128",
        "ts": 1e15,
        "dur": 2.5e-05,
        "args": {"External id": 1, "x": [1e99, -1.5e-300, 12345678901234567890123]},
    }
    doc = json.dumps([*events[:50], odd]).encode()
    plain, typed, taken = _both(doc)
    assert taken
    _assert_same(plain, typed)
