"""What the profiled process writes (``hooks.py``): its traces, Kineto's JSON gzipped at a fast
level, written atomically, nothing left behind when the export fails; its GPU memory peak."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kerneltriage.profile import hooks

TRACE = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0}] * 50}


class _Profiler:
    """What ``_write_trace`` calls of a torch profiler: Kineto's JSON export to a path."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.paths: list[str] = []

    def export_chrome_trace(self, path: str) -> None:
        self.paths.append(path)
        Path(path).write_text(json.dumps(TRACE, indent=1))
        if self.fail:
            raise OSError("disk full")


def test_a_trace_is_kinetos_json_gzipped_at_the_fast_level(tmp_path):
    prof = _Profiler()
    path = hooks._write_trace(prof, tmp_path / "trace.json.gz")
    assert path == tmp_path / "trace.json.gz"
    # Kineto writes plain JSON (its C++ writer), not torch's level-9 ``.gz`` export.
    assert [Path(p).name for p in prof.paths] == ["trace.tmp.json"]
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[8] == 4  # gzip's XFL byte: 4 = the fastest level
    assert json.loads(gzip.decompress(raw)) == TRACE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.gz"]


def test_a_failed_export_leaves_no_partial_file(tmp_path):
    (tmp_path / "trace.json.gz").write_bytes(b"earlier")
    with pytest.raises(OSError, match="disk full"):
        hooks._write_trace(_Profiler(fail=True), tmp_path / "trace.json.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.gz"]
    assert (tmp_path / "trace.json.gz").read_bytes() == b"earlier"


def test_the_gpu_peak_is_the_fullest_gpus_and_none_without_cuda():
    # Phase 2 overlaps one pass's exit with the next one's first steps only where two processes
    # at this peak fit on a GPU: a process spread over GPUs counts its fullest one.
    from types import SimpleNamespace

    from kerneltriage.profile.hooks import gpu_peak_mb

    reserved = {0: 2**30, 1: 3 * 2**30}
    cuda = SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: 2, max_memory_reserved=lambda d: reserved[d]
    )
    assert gpu_peak_mb(SimpleNamespace(cuda=cuda)) == 3072.0
    assert gpu_peak_mb(SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: False))) is None
    assert gpu_peak_mb(None) is None

    def broken(device: int) -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda.max_memory_reserved = broken
    assert gpu_peak_mb(SimpleNamespace(cuda=cuda)) is None


def test_an_ncu_process_waits_at_its_measure_gate_before_its_profiled_step(tmp_path):
    # Started with another pass's process, it finishes its warm-up's work, hands its cached
    # blocks back, and opens ncu's range only once the parent opens its measure gate.
    import os
    import threading
    import time
    from types import SimpleNamespace

    from kerneltriage.profile import gate as gates

    calls: list[str] = []
    nvtx = SimpleNamespace(
        range_start=lambda name: calls.append(f"range {name}") or 1, range_end=lambda r: None
    )
    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        synchronize=lambda: calls.append("synchronize"),
        empty_cache=lambda: calls.append("empty_cache"),
        nvtx=nvtx,
    )
    measure = tmp_path / "measure.ncu"
    config = {
        "mode": "ncu",
        "out": str(tmp_path),
        "warmup": 2,
        "steps": 1,
        "measure_gate": str(measure),
        "parent_pid": os.getpid(),
    }
    process = hooks.ProfiledProcess(config)
    process.torch = SimpleNamespace(cuda=cuda)
    opened = threading.Thread(target=process._open_ncu_range)
    opened.start()
    deadline = time.monotonic() + 30
    while not gates.at_gate(measure) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    assert gates.at_gate(measure) and calls == ["synchronize", "empty_cache"]
    gates.open_gate(measure)
    opened.join(timeout=30)
    assert not opened.is_alive() and calls[-1].startswith("range ")
    assert process.wall["at_measure"] <= process.wall["measure_open"] <= process.wall["ncu_start"]
