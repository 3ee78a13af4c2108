"""The streaming Kineto reader finds event boundaries in any JSON layout.

The same events, written pretty, minified, with odd whitespace, with the top-level keys in
other orders, plain and gzipped, must give the same tables as parsing the whole document at
once; broken files must raise TraceFormatError; real third-party traces (several written on
one line) must read the same through the chunked path as through a plain ``orjson.loads``.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pandas as pd
import pytest

from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest import json_stream, kineto
from kerneltriage.ingest.kineto import read_trace, read_trace_bytes
from tests.helpers import EXTERNAL, TRACE, corpus, raw_trace

ROOT = Path(__file__).resolve().parents[2]

# Names that break naive cutting: braces, brackets, quotes and commas inside strings, escaped
# quotes after runs of backslashes, unicode (escaped or raw), and the key itself as text.
TRICKY = [
    'void foo<{"a": [1,2]}>(int)',
    '}, {"ph": "X", "cat": "kernel", "name": "fake"}, {',
    "}\n,\n{",
    '], "traceName": "x"}',
    "ends in a backslash \\",
    'backslashes then a quote \\\\" and \\\\\\" more',
    "café 核 \U0001f600 \u2028",
    '"traceEvents": [',
]


def _tricky_events() -> list:
    events: list = []
    for i, name in enumerate(TRICKY):
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": 100.0 + i,
                "dur": 0.5,
                "args": {"correlation": 900_000 + i, "device": 0, "stream": 7, "grid": [1, 2, 3]},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": 90.0 + i,
                "dur": 2.0,
                "args": {
                    "External id": 800_000 + i,
                    "Input Dims": [[i, 2], []],
                    # Nested objects in a list: "}, {" at a depth that is not the event list's.
                    "nested": [{"a": "}, {"}, {"b": [{"c": name}]}],
                },
            }
        )
    # Elements that are not events at all are valid JSON and must not upset the cuts.
    return [*events, 7, "a string, with a comma", None, [], {}, [{"x": [1, {"y": 2}]}]]


@pytest.fixture(scope="module")
def tricky_trace() -> dict:
    data = raw_trace()
    # A third of the real capture (every category kept), to keep the many readings quick.
    keep = ("gpu_user_annotation", "user_annotation")
    events = [e for i, e in enumerate(data["traceEvents"]) if i % 3 == 0 or e.get("cat") in keep]
    extra = _tricky_events()
    step = len(events) // (len(extra) + 1)
    for i, e in enumerate(extra):  # spread them through the list
        events.insert((i + 1) * step + i, e)
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    # A second GPU puts "}, {" after the events when the list is not last.
    meta["deviceProperties"] = [*meta["deviceProperties"], {**meta["deviceProperties"][0], "id": 1}]
    meta["distributedInfo"] = {"rank": 3, "backend": "nccl"}
    meta["traceName"] = "traceEvents"
    meta["metadata"] = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "not an event", "ts": 1}]}
    return {"meta": meta, "events": events, "docs": {}}


def _ordered(trace: dict, where: str) -> dict:
    """The top-level keys with traceEvents first, in the middle, or last."""
    items = list(trace["meta"].items())
    at = {"first": 0, "middle": len(items) // 2, "last": len(items)}[where]
    return dict([*items[:at], ("traceEvents", trace["events"]), *items[at:]])


def _odd(value, rng: random.Random) -> str:
    """JSON with random whitespace (spaces, tabs, CR, LF, runs of them, or none) between all
    tokens, and strings raw or \\u-escaped."""

    def ws() -> str:
        return "".join(rng.choice(" \t\r\n") for _ in range(rng.choice((0, 0, 1, 1, 2, 5))))

    if isinstance(value, dict):
        items = [f"{ws()}{json.dumps(k)}{ws()}:{ws()}{_odd(v, rng)}{ws()}" for k, v in value.items()]
        return "{" + ",".join(items) + ws() + "}"
    if isinstance(value, list):
        return "[" + ",".join(ws() + _odd(v, rng) + ws() for v in value) + ws() + "]"
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


LAYOUTS = {
    "pretty": lambda doc: json.dumps(doc, indent=2),
    "minified": lambda doc: json.dumps(doc, separators=(",", ":"), ensure_ascii=False),
    "one line": lambda doc: json.dumps(doc),
    "odd whitespace": lambda doc: "\r\n \t" + _odd(doc, random.Random(21)) + "\n\n",
}


def _whole(doc: bytes, name: str) -> kineto.Timeline:
    """The reference: the whole document parsed at once by orjson."""
    builder = kineto._Builder()
    meta = kineto._parse_whole(doc, builder)
    return builder.build(name, meta)


def _assert_same(got, want) -> None:
    for table in ("kernels", "runtime", "gpu_annotations"):
        pd.testing.assert_frame_equal(getattr(got, table), getattr(want, table))
    interned = ["dims", "types", "strides", "concrete"]
    pd.testing.assert_frame_equal(got.cpu.drop(columns=interned), want.cpu.drop(columns=interned))
    # Interned ids depend on reading order; the values behind them must not.
    for column in interned:
        assert [got.arg(i) for i in got.cpu[column]] == [want.arg(i) for i in want.cpu[column]]
    assert got.meta == want.meta
    assert got.device_properties == want.device_properties
    assert got.rank == want.rank
    assert got.warnings == want.warnings


def _never(monkeypatch) -> None:
    """No guessed boundaries: every cut comes from the exact scan."""
    monkeypatch.setattr(json_stream, "_CANDIDATE", re.compile(rb"(?!)"))


def _wrong(monkeypatch) -> list[int]:
    """Guesses that are wrong (a comma after a string: inside an event), so pieces fail to
    parse and the reader cuts again from them; returns where that happened."""
    monkeypatch.setattr(json_stream, "_CANDIDATE", re.compile(rb'",'))
    failed: list[int] = []
    collect = json_stream._Pieces._collect

    def spy(self, block: bool) -> int:
        offset = collect(self, block)
        if offset >= 0:
            failed.append(offset)
        return offset

    monkeypatch.setattr(json_stream._Pieces, "_collect", spy)
    return failed


CUTTERS = {"guess": lambda mp: None, "exact": _never, "wrong guesses": _wrong}


def _doc(trace: dict, layout: str, where: str) -> bytes:
    key = (layout, where)
    if key not in trace["docs"]:
        trace["docs"][key] = LAYOUTS[layout](_ordered(trace, where)).encode()
    return trace["docs"][key]


@pytest.mark.parametrize(
    ("layout", "where"),
    [
        ("pretty", "last"),
        ("minified", "first"),
        ("minified", "last"),
        ("one line", "middle"),
        ("odd whitespace", "middle"),
        ("odd whitespace", "first"),
    ],
)
def test_every_layout_and_key_order_reads_the_same(tricky_trace, tmp_path, monkeypatch, layout, where):
    doc = _doc(tricky_trace, layout, where)
    want = _whole(doc, "x")
    gpu = ("kernel", "gpu_memcpy", "gpu_memset")
    kernels = sum(isinstance(e, dict) and e.get("cat") in gpu for e in tricky_trace["events"])
    assert len(want.kernels) == kernels > 400 and want.rank == 3
    assert set(TRICKY) <= set(want.kernels["name"]) and len(want.gpu_annotations) == 3
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(doc)
    packed.write_bytes(gzip.compress(doc, compresslevel=1))
    for cutter, set_up in CUTTERS.items():
        with monkeypatch.context() as mp:
            failed = set_up(mp)
            for path in (plain, packed):
                got = read_trace(path, chunk_bytes=16_000, workers=0)
                try:
                    _assert_same(got, want)
                except AssertionError as exc:
                    raise AssertionError(f"{cutter}, {path.name}: {exc}") from None
                if failed is not None:  # the re-cut path really ran
                    assert failed, path.name
                    failed.clear()


@pytest.mark.parametrize("cutter", list(CUTTERS))
def test_worker_processes_read_the_same(tricky_trace, tmp_path, monkeypatch, cutter):
    doc = _doc(tricky_trace, "minified", "first")
    failed = CUTTERS[cutter](monkeypatch)
    want = _whole(doc, "x")
    plain = tmp_path / "t.json"
    plain.write_bytes(doc)
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(doc, compresslevel=1))
    for path in (plain, packed):  # workers read a plain file themselves; gz pieces are sent
        got = read_trace(path, chunk_bytes=60_000, workers=2)
        _assert_same(got, want)
        if failed is not None:
            assert failed, path.name
            failed.clear()


def test_trace_held_in_memory(tricky_trace):
    doc = _doc(tricky_trace, "odd whitespace", "middle")
    _assert_same(read_trace_bytes(doc, "x"), _whole(doc, "x"))


@pytest.mark.parametrize(
    "events",
    ["[]", " [ \n ] ", '[1, 2.5, "x", null, {}, [], [{}]]', '[{"ph": "X"}]'],
)
def test_unusual_but_valid_event_lists(tmp_path, monkeypatch, events):
    doc = ('{"a": [{"b": 1}, {"c": "}, {"}], "traceEvents": ' + events + ', "z": {"k": [1]}}').encode()
    want = _whole(doc, "x")
    for cutter, set_up in CUTTERS.items():
        with monkeypatch.context() as mp:
            set_up(mp)
            got = read_trace_bytes(doc, "x")
            assert got.meta == {"a": [{"b": 1}, {"c": "}, {"}], "z": {"k": [1]}}, cutter
            _assert_same(got, want)


def _broken(text: str) -> bytes:
    doc = text.encode()
    with pytest.raises(orjson.JSONDecodeError):  # a check on the check: it is really invalid
        orjson.loads(doc)
    return doc


EVENT = '{"ph": "X", "cat": "cpu_op", "name": "n", "ts": 1, "dur": 1, "args": {}}'
INVALID = {
    "trailing comma": '{"traceEvents": [' + EVENT + ", ]}",
    "double comma": '{"traceEvents": [' + EVENT + ",," + EVENT + "]}",
    "leading comma": '{"traceEvents": [, ' + EVENT + "]}",
    "missing comma": '{"traceEvents": [' + EVENT + " " + EVENT + "]}",
    "mismatched bracket": '{"traceEvents": [' + EVENT + "}, 1]}",
    "garbage after": '{"traceEvents": [' + EVENT + "]} x",
    "bad tail": '{"traceEvents": [' + EVENT + '], "a" 1}',
    "unterminated string": '{"traceEvents": [' + EVENT + ', {"name": "abc}]}',
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_json_is_a_one_line_error(monkeypatch, case):
    doc = _broken(INVALID[case])
    for cutter, set_up in CUTTERS.items():
        with monkeypatch.context() as mp:
            set_up(mp)
            with pytest.raises(TraceFormatError, match="not valid JSON") as err:
                read_trace_bytes(doc)
            assert "\n" not in str(err.value), cutter


def test_truncated_files_are_a_one_line_error(tricky_trace, tmp_path, monkeypatch):
    doc = _doc(tricky_trace, "minified", "middle")
    events = LAYOUTS["minified"](tricky_trace["events"]).encode()
    start = doc.index(b'"traceEvents":' + events) + len(b'"traceEvents":[')
    end = start + len(events) - 2  # the list's "]"
    assert doc[end : end + 2] == b"],"
    cuts = {
        "after the list's [": start,
        "inside a tricky string": doc.index(b"backslashes then") + 12,
        "after a comma between events": doc.index(b"},{", len(doc) // 2) + 2,
        "half way": len(doc) // 2,
        "after the list's ]": end + 1,
        "before the last }": len(doc) - 1,
    }
    path = tmp_path / "cut.json"
    for cutter, set_up in CUTTERS.items():
        with monkeypatch.context() as mp:
            set_up(mp)
            for where, at in cuts.items():
                path.write_bytes(doc[:at])
                with pytest.raises(TraceFormatError) as err:
                    read_trace(path, chunk_bytes=16_000, workers=0)
                message = str(err.value)
                assert "\n" not in message and str(path) in message, (cutter, where, message)


# Real traces made by other people; the first two are one-line files.
REAL = [
    "hta-dlrm-2rank-a100/sampled_rank-0.json.gz",
    "tracelens-sglang-qwen3-8b-mi300x/sglang_Qwen3-8B_prefilldecode.json.gz",
    "tracelens-qwen05b-h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",  # "metadata" first
    "hta-cnn-v100/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]


def _counts(doc: dict) -> dict[str, int]:
    """Events per table, counted straight from the parsed JSON."""
    tables = {
        "kernel": "kernels",
        "gpu_memcpy": "kernels",
        "gpu_memset": "kernels",
        "cpu_op": "cpu",
        "user_annotation": "cpu",
        "cuda_runtime": "runtime",
        "cuda_driver": "runtime",
        "gpu_user_annotation": "gpu_annotations",
    }
    counts = dict.fromkeys(set(tables.values()), 0)
    for e in doc["traceEvents"]:
        table = tables.get(str(e.get("cat")).lower())
        if e.get("ph") == "X" and table and "ts" in e and "name" in e:
            counts[table] += 1
    return counts


@pytest.mark.parametrize("name", REAL)
@corpus
def test_real_traces_read_the_same_as_a_whole_parse(tmp_path, name):
    source = EXTERNAL / name
    assert source.exists(), f"{source} missing"
    doc = gzip.decompress(source.read_bytes())
    if name in REAL[:2]:
        assert doc.count(b"\n") <= 1  # really a one-line file
    want = _whole(doc, "x")
    counts = _counts(orjson.loads(doc))
    assert counts["kernels"] > 100
    assert {t: len(getattr(want, t)) for t in counts} == counts
    plain = tmp_path / "trace.json"
    plain.write_bytes(doc)
    for path, workers in ((source, 0), (plain, 0), (plain, 2)):
        got = read_trace(path, chunk_bytes=1 << 20, workers=workers)
        _assert_same(got, want)


CTRL_C = """
import sys
from kerneltriage.ingest.kineto import read_trace
print("ready", flush=True)
try:
    while True:
        read_trace(sys.argv[1], chunk_bytes=1 << 16, workers=2)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs POSIX process groups")
@pytest.mark.parametrize("delay", [0.6, 1.3])
def test_ctrl_c_stops_the_workers_without_tracebacks(tmp_path, delay):
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(TRACE.read_bytes()))
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C, str(plain)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole group gets SIGINT
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in out, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
