"""Kineto trace reader on the real H200 capture, and on broken or foreign files."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.kineto import read_trace
from tests.helpers import TRACE, raw_trace, timeline, write_trace


def _expected_counts(data: dict) -> dict[str, int]:
    counts = {"kernel": 0, "gpu_memcpy": 0, "gpu_memset": 0, "cpu": 0, "runtime": 0}
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            counts[cat] += 1
        elif cat in ("cpu_op", "user_annotation"):
            counts["cpu"] += 1
        elif cat in ("cuda_runtime", "cuda_driver"):
            counts["runtime"] += 1
    return counts


def test_reads_every_event_of_the_real_trace():
    tl = timeline()
    expected = _expected_counts(raw_trace())
    assert (tl.kernels["kind"] == "kernel").sum() == expected["kernel"] == 1257
    assert (tl.kernels["kind"] == "memcpy").sum() == expected["gpu_memcpy"]
    assert (tl.kernels["kind"] == "memset").sum() == expected["gpu_memset"]
    assert len(tl.cpu) == expected["cpu"]
    assert len(tl.runtime) == expected["runtime"]
    assert tl.gpu_name == "NVIDIA H200"
    assert tl.device_properties[0]["numSms"] == 132


def test_times_are_integer_nanoseconds_and_fields_typed():
    tl = timeline()
    first = next(e for e in raw_trace()["traceEvents"] if e.get("cat") == "kernel")
    row = tl.kernels[tl.kernels["correlation"] == first["args"]["correlation"]].iloc[0]
    assert row["start"] == round(first["ts"] * 1000)
    assert row["dur"] == round(first["dur"] * 1000)
    assert (row["grid_x"], row["grid_y"], row["grid_z"]) == tuple(first["args"]["grid"])
    assert row["registers"] == first["args"]["registers per thread"]
    assert tl.kernels["start"].dtype == "int64"


def test_shapes_are_interned_and_recoverable():
    tl = timeline()
    mm = tl.cpu[tl.cpu["name"] == "aten::bmm"].iloc[0]
    dims = tl.arg(int(mm["dims"]))
    assert dims == [[64, 2048, 2048], [64, 2048, 64]] or dims == [[64, 2048, 64], [64, 64, 2048]]
    assert tl.arg(int(mm["types"])) == ["c10::BFloat16", "c10::BFloat16"]
    # 4818 cpu ops share far fewer distinct shape lists.
    assert len(tl.args) < len(tl.cpu) / 4


def test_unfinished_annotation_is_flagged():
    tl = timeline()
    opt = tl.cpu[tl.cpu["name"] == "Optimizer.step#AdamW.step"]
    assert list(opt["finished"]) == [True, False]


@pytest.mark.parametrize(("chunk", "workers"), [(4096, 0), (65536, 0), (200_000, 2)])
def test_chunked_reading_matches_whole_reading(chunk, workers):
    small = read_trace(TRACE, chunk_bytes=chunk, workers=workers)
    whole = timeline()
    for table in ("kernels", "runtime"):
        pd.testing.assert_frame_equal(getattr(small, table), getattr(whole, table))
    interned = ["dims", "types", "strides", "concrete"]
    pd.testing.assert_frame_equal(small.cpu.drop(columns=interned), whole.cpu.drop(columns=interned))
    # Interned ids depend on reading order; the values behind them must not.
    for column in interned:
        assert [small.arg(i) for i in small.cpu[column]] == [whole.arg(i) for i in whole.cpu[column]]


def test_other_json_layouts_read_the_same(tmp_path):
    data = raw_trace()
    one_line = read_trace(write_trace(tmp_path / "one.json", data, compress=False), chunk_bytes=4096)
    indented = read_trace(write_trace(tmp_path / "ind.json.gz", data, indent=2), chunk_bytes=4096)
    for tl in (one_line, indented):
        assert len(tl.kernels) == len(timeline().kernels)
        assert len(tl.cpu) == len(timeline().cpu)
        assert tl.gpu_name == "NVIDIA H200"


def test_old_capitalised_categories_are_understood(tmp_path):
    data = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "Operator",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 1.0,
                "dur": 5.0,
                "args": {"External id": 7},
            },
            {
                "ph": "X",
                "cat": "Runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 2.0,
                "dur": 1.0,
                "args": {"correlation": 3, "External id": 7},
            },
            {
                "ph": "X",
                "cat": "Kernel",
                "name": "gemm",
                "pid": 0,
                "tid": 7,
                "ts": 4.0,
                "dur": 2.0,
                "args": {"correlation": 3, "device": 0, "stream": 7},
            },
        ]
    }
    tl = read_trace(write_trace(tmp_path / "old.json", data, compress=False))
    assert list(tl.cpu["cat"]) == ["cpu_op"]
    assert list(tl.kernels["name"]) == ["gemm"]
    assert list(tl.runtime["ext_id"]) == [7]


def test_truncated_gzip_is_a_clear_error(tmp_path):
    raw = TRACE.read_bytes()
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceFormatError, match="truncated or corrupt") as err:
        read_trace(bad)
    assert str(bad) in str(err.value)


def test_truncated_plain_json_is_a_clear_error(tmp_path):
    text = gzip.decompress(TRACE.read_bytes())
    bad = tmp_path / "cut.json"
    bad.write_bytes(text[: len(text) // 3])
    with pytest.raises(TraceFormatError):
        read_trace(bad)


def test_not_json_is_a_clear_error(tmp_path):
    bad = tmp_path / "t.json.gz"
    bad.write_bytes(gzip.compress(b"this is not json"))
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        read_trace(bad)


def test_json_that_is_not_a_trace(tmp_path):
    bad = write_trace(tmp_path / "x.json", {"hello": [1, 2, 3]}, compress=False)
    with pytest.raises(TraceFormatError, match="no 'traceEvents'"):
        read_trace(bad)
    worse = tmp_path / "list.json"
    worse.write_text(json.dumps([1, 2]))
    with pytest.raises(TraceFormatError):
        read_trace(worse)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        read_trace(tmp_path / "nope.json")
    with pytest.raises(TraceFormatError, match="directory"):
        read_trace(tmp_path)
