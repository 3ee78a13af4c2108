"""Nsight Systems SQLite exports: the real 2-GPU captures in tests/data/nsys, and small
synthetic or damaged exports for the schema and error paths."""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute, find_steps
from kerneltriage.cli import main
from kerneltriage.errors import InputError, ToolError, TraceFormatError
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.nsys import read_nsys, read_nsys_all
from kerneltriage.ingest.source import load_profile
from kerneltriage.ingest.tables import CPU_COLUMNS, KERNEL_COLUMNS, RUNTIME_COLUMNS

NSYS = Path(__file__).resolve().parents[1] / "data" / "nsys"
INFERENCE = NSYS / "h100_2gpu_1s.sqlite"
BEFORE = NSYS / "mfu_2gpu_before.sqlite"
AFTER = NSYS / "mfu_2gpu_after.sqlite"
FIXTURES = [INFERENCE, BEFORE, AFTER]
PID = "((globalPid >> 24) & 16777215)"
TID_PID = "((globalTid >> 24) & 16777215)"


@functools.cache
def timelines(path: Path):
    return read_nsys_all(path)


def sql(path: Path, query: str, *params):
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
        return db.execute(query, params).fetchall()


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


# --- the real exports -------------------------------------------------------------------------


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_timeline_per_device_with_the_exports_counts(path):
    tls = timelines(path)
    assert sorted(tls) == [0, 1]
    assert [tls[r].meta["device"] for r in (0, 1)] == [0, 1]
    for rank, tl in tls.items():
        assert tl.rank == rank and tl.format == "nsys"
        assert list(tl.kernels.columns) == list(KERNEL_COLUMNS)
        assert list(tl.runtime.columns) == list(RUNTIME_COLUMNS)
        assert list(tl.cpu.columns) == list(CPU_COLUMNS)
        device, pid = tl.meta["device"], tl.meta["pid"]
        ((expected_pid,),) = sql(
            path, f"SELECT DISTINCT {PID} FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?", device
        )
        assert pid == expected_pid
        counts = tl.kernels["kind"].value_counts().to_dict()
        for table, kind in (("KERNEL", "kernel"), ("MEMCPY", "memcpy"), ("MEMSET", "memset")):
            ((n,),) = sql(
                path,
                f"SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_{table} WHERE deviceId = ? AND {PID} = ?",
                device,
                pid,
            )
            assert counts.get(kind, 0) == n, (table, device)
        assert (tl.kernels["device"] == device).all() and (tl.kernels["pid"] == pid).all()
        ((runtime,),) = sql(
            path, f"SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE {TID_PID} = ?", pid
        )
        assert len(tl.runtime) == runtime
        ((ranges,),) = sql(
            path, f"SELECT COUNT(*) FROM NVTX_EVENTS WHERE end IS NOT NULL AND {TID_PID} = ?", pid
        )
        assert len(tl.cpu) == ranges
        assert tl.kernels["start"].is_monotonic_increasing


def test_kernel_names_come_from_string_ids():
    tl = timelines(BEFORE)[1]
    expected = {
        name
        for (name,) in sql(
            BEFORE,
            f"SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
            f"WHERE k.deviceId = 1 AND {PID.replace('globalPid', 'k.globalPid')} = 145",
        )
    }
    kernels = tl.kernels[tl.kernels["kind"] == "kernel"]
    assert set(kernels["name"]) == expected
    assert "ncclDevKernel_SendRecv" in {base_name(n) for n in expected}
    copies = set(tl.kernels.loc[tl.kernels["kind"] == "memcpy", "name"])
    assert copies == {"Memcpy DtoD (Device -> Device)", "Memcpy HtoD (Pageable -> Device)"}
    row = kernels.iloc[0]
    assert row["grid_x"] > 0 and row["block_x"] > 0 and row["registers"] > 0
    assert (tl.kernels.loc[tl.kernels["kind"] != "kernel", "bytes"] > 0).all()
    assert set(tl.runtime["name"]) >= {"cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_runtime_calls_join_kernels_on_correlation(path):
    for tl in timelines(path).values():
        ((joined,),) = sql(
            path,
            "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            f"ON r.correlationId = k.correlationId AND {TID_PID.replace('globalTid', 'r.globalTid')} = "
            f"{PID.replace('globalPid', 'k.globalPid')} WHERE k.deviceId = ?",
            tl.meta["device"],
        )
        kernels = tl.kernels[tl.kernels["kind"] == "kernel"]
        ours = int(kernels["correlation"].isin(tl.runtime["correlation"]).sum())
        assert ours == joined
        assert joined > 0.4 * len(kernels)


def test_op_ranges_become_clean_cpu_ops_with_sequence_numbers():
    tl = timelines(BEFORE)[0]
    ops = tl.cpu[tl.cpu["cat"] == "cpu_op"]
    names = set(ops["name"])
    assert {"aten::linear", "aten::addmm", "c10d::alltoall_base_", "FlashAttnFunc"} <= names
    assert not any(", op_id" in n or ", seq" in n for n in tl.cpu["name"])
    ((with_seq,),) = sql(
        BEFORE, f"SELECT COUNT(*) FROM NVTX_EVENTS WHERE text LIKE '%, seq = %' AND {TID_PID} = 144"
    )
    assert (ops["seq"] >= 0).sum() == with_seq > 0
    ann = set(tl.cpu.loc[tl.cpu["cat"] == "user_annotation", "name"])
    assert {"ncclSend", "ncclGroupEnd", "nccl:all_to_all"} <= ann
    assert any(n.startswith("FSDP::pre_forward (") for n in ann)
    assert (tl.cpu["dims"] == -1).all()
    assert any("no input shapes" in w for w in tl.warnings)


@pytest.mark.parametrize(("path", "aten_share"), [(INFERENCE, 0.95), (BEFORE, 0.38), (AFTER, 0.38)])
def test_kernel_time_is_attributed_to_pytorch_ops(path, aten_share):
    """Measured on these files: every launched kernel lies in an op range; aten:: top-level ops
    hold ~0.96 (inference) and 0.39-0.43 (training: FlashAttnFunc holds ~0.48) of the time."""
    for tl in timelines(path).values():
        attr = attribute(tl)
        k = attr.in_steps()
        assert len(k) > 500
        total = k["dur"].sum()
        assert k.loc[k["op"] >= 0, "dur"].sum() / total > 0.99
        names = tl.cpu["name"].to_numpy()
        root = k["root"].to_numpy()
        is_aten = np.array([r >= 0 and names[r].startswith("aten::") for r in root])
        assert k.loc[is_aten, "dur"].sum() / total > aten_share
        assert attr.step_source == "whole trace"
        assert any("whole trace is one step" in w for w in attr.warnings)


def test_inference_window_kernels_launched_before_it_are_left_out():
    tl = timelines(INFERENCE)[0]
    attr = attribute(tl)
    outside = attr.kernels[attr.kernels["launch_start"] < 0]
    assert len(outside) == 1138
    assert any("launched before the profiled window" in w for w in attr.warnings)


@pytest.mark.parametrize("path", [BEFORE, AFTER], ids=lambda p: p.stem)
def test_nccl_kernels_are_communication_launched_inside_comm_ops(path):
    rules = load_rules()
    for tl in timelines(path).values():
        attr = attribute(tl)
        k = attr.kernels
        nccl = k[k["name"].map(base_name).str.startswith("nccl")]
        assert len(nccl) >= 30
        assert {rules.classify(None, n, "kernel") for n in nccl["name"]} == {"communication"}
        names = tl.cpu["name"].to_numpy()
        launched = nccl[nccl["op"] >= 0]
        assert len(launched) >= len(nccl) - 2  # the window cut the launches of the first ones
        # The innermost op range around each NCCL launch is a communication op (record_param_comms
        # inside c10d::alltoall_base_), and NCCL's own ncclGroupEnd range holds the launch.
        assert {rules.classify_op(names[o]) for o in launched["op"]} == {"communication"}
        ends = tl.cpu[tl.cpu["name"] == "ncclGroupEnd"]
        starts, stops = ends["start"].to_numpy(), (ends["start"] + ends["dur"]).to_numpy()
        for t in launched["launch_start"]:
            assert ((starts <= t) & (t <= stops)).any()


def test_read_nsys_is_the_first_device():
    tl = read_nsys(BEFORE)
    assert tl.rank == 0 and tl.meta["device"] == 0 and tl.meta["pid"] == 144
    assert tl.gpu_name is None  # these exports have no TARGET_INFO_GPU rows
    assert tl.meta["nsys"]["EXPORT_SCHEMA_VERSION"] == "3.25.0"


def test_load_profile_reads_every_device_as_a_rank():
    profile = load_profile(AFTER)
    assert sorted(profile.timelines) == [0, 1]
    assert profile.timelines[1].meta["pid"] == 149
    only = load_profile(AFTER, ranks=[1])
    assert list(only.timelines) == [1]
    with pytest.raises(InputError, match=r"rank\(s\) 5 not in the export"):
        load_profile(AFTER, ranks=[5])


# --- the command line -------------------------------------------------------------------------


def test_report_json_per_device():
    result = run("report", BEFORE, "--gpu", "H100-SXM", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "kerneltriage.report-ranks/1"
    assert sorted(data["ranks"]) == ["0", "1"]
    for rep in data["ranks"].values():
        assert rep["schema"] == "kerneltriage.report/1"
        assert rep["step_source"] == "whole trace"
        # Kernels whose launch the export holds all have an op; the few launched before the
        # capture began have none, and are counted as unattributed.
        own = rep["unattributed_ms_per_step"] - rep["unattributed_before_window_ms"]
        assert own / rep["gpu_busy_ms"] < 0.01
        assert rep["unattributed_share"] < 0.05
        assert rep["candidates"] and all(c["verdict"] == "skip" for c in rep["candidates"])
        kinds = {c["kind"] for c in rep["candidates"]}
        assert {"attention", "gemm", "norm"} <= kinds


def test_report_one_rank():
    result = run("report", INFERENCE, "--gpu", "H100-SXM", "--format", "json", "--rank", "1")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "kerneltriage.report/1"
    assert any("launched before the profiled window" in w for w in data["warnings"])


def test_report_without_a_gpu_name_still_reports_and_asks_for_gpu():
    """An export that names no GPU is never refused: shares, kinds and ranking come out, the
    header says there are no ceilings and how to give them."""
    result = run("report", AFTER, "--rank", "0")
    assert result.exit_code == 0, result.output
    assert "GPU: unknown" in result.output and "--gpu" in result.output
    assert "Traceback" not in result.output
    data = json.loads(run("report", AFTER, "--rank", "0", "--format", "json").stdout)
    assert data["gpu"] is None and data["candidates"]
    assert all(c["headroom"] is None for c in data["candidates"])


def test_report_separates_communication():
    result = run("report", BEFORE, "--gpu", "H100-SXM", "--format", "json", "--rank", "0")
    data = json.loads(result.stdout)
    comm = [c for c in data["candidates"] if c["kind"] == "communication"]
    assert comm and any("nccl" in k["name"] for c in comm for k in c["kernels"])


# --- damaged, foreign and synthetic files ------------------------------------------------------


def damaged(tmp_path: Path, *statements: str, source: Path = AFTER) -> Path:
    path = tmp_path / "capture.sqlite"
    shutil.copyfile(source, path)
    with closing(sqlite3.connect(path)) as db:
        for s in statements:
            db.execute(s)
        db.commit()
    return path


def test_not_sqlite(tmp_path):
    path = tmp_path / "capture.sqlite"
    path.write_text("this is not a database\n")
    with pytest.raises(TraceFormatError, match="not an SQLite database"):
        read_nsys(path)
    result = run("report", path, "--gpu", "H100-SXM")
    assert result.exit_code == 2
    assert "not an SQLite database" in result.output and "Traceback" not in result.output


def test_sqlite_that_is_not_an_export(tmp_path):
    path = tmp_path / "other.sqlite"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        db.commit()
    with pytest.raises(TraceFormatError, match=r"not an Nsight Systems export .*its tables: users"):
        read_nsys_all(path)
    result = run("report", path, "--gpu", "H100-SXM")
    assert result.exit_code == 2 and "not an Nsight Systems export" in result.output


def test_truncated_export(tmp_path):
    path = tmp_path / "capture.sqlite"
    path.write_bytes(AFTER.read_bytes()[:8192])
    with pytest.raises(TraceFormatError, match="SQLite"):
        read_nsys(path)


def test_export_without_the_kernel_table(tmp_path):
    path = damaged(tmp_path, "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(TraceFormatError, match=r"schema 3\.25\.0.*no CUPTI_ACTIVITY_KIND_KERNEL table"):
        read_nsys(path)
    result = run("report", path, "--gpu", "H100-SXM")
    assert result.exit_code == 2 and "CUPTI_ACTIVITY_KIND_KERNEL" in result.output


def test_export_without_string_ids(tmp_path):
    path = damaged(tmp_path, "DROP TABLE StringIds")
    with pytest.raises(TraceFormatError, match="no StringIds table"):
        read_nsys(path)


@pytest.mark.parametrize(
    ("table", "warning"),
    [("NVTX_EVENTS", "no NVTX ranges"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "no CUPTI_ACTIVITY_KIND_RUNTIME")],
)
def test_export_missing_an_optional_table_warns_and_continues(tmp_path, table, warning):
    path = damaged(tmp_path, f"DROP TABLE {table}")
    tls = read_nsys_all(path)
    assert sorted(tls) == [0, 1]
    for tl in tls.values():
        assert (tl.kernels["kind"] == "kernel").sum() in (1793, 1794)
        assert any(warning in w for w in tl.warnings), tl.warnings


def test_report_on_export_without_cuda_api_table_is_a_clear_error(tmp_path):
    """Steps hold the kernels launched in them; without CUDA calls no launch is known, so the
    report stops with a one-line error (the reader itself only warns)."""
    path = damaged(tmp_path, "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    result = run("report", path, "--gpu", "H100-SXM")
    assert result.exit_code == 2
    assert "no GPU kernel was launched inside the active steps" in result.output
    assert "Traceback" not in result.output


def test_report_on_export_without_nvtx(tmp_path):
    from kerneltriage.api import build_reports

    path = damaged(tmp_path, "DROP TABLE NVTX_EVENTS")
    reports = build_reports(path, gpu="H100-SXM", ranks=[0])
    assert reports[0].unattributed_share > 0.99
    assert any("no NVTX ranges" in w for w in reports[0].warnings)


def test_export_missing_memset_table_and_launch_columns(tmp_path):
    path = damaged(
        tmp_path,
        "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET",
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN gridX",
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN registersPerThread",
    )
    tl = read_nsys(path)
    assert "memset" not in set(tl.kernels["kind"])  # nsys creates tables lazily: no memsets
    kernels = tl.kernels[tl.kernels["kind"] == "kernel"]
    assert (kernels["grid_x"] == -1).all() and (kernels["registers"] == -1).all()
    assert (kernels["block_x"] > 0).all()
    assert any("gridX, registersPerThread" in w for w in tl.warnings)


def test_nsys_report_needs_nsys_on_path(tmp_path, monkeypatch):
    report = tmp_path / "capture.nsys-rep"
    report.write_bytes(b"\x00binary report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolError, match=r"nsys is not on PATH.*nsys export --type sqlite"):
        read_nsys(report)
    result = run("report", report, "--gpu", "H100-SXM")
    assert result.exit_code == 3 and "nsys export --type sqlite" in result.output


def fake_nsys(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir()
    script = bin_dir / "nsys"
    script.write_text(f"#!{sys.executable}\nimport shutil, sys\nargs = sys.argv[1:]\n{body}\n")
    script.chmod(0o755)


def test_nsys_report_is_exported_through_nsys(tmp_path, monkeypatch):
    fake_nsys(
        tmp_path / "bin",
        "assert args[:3] == ['export', '--type', 'sqlite'], args\n"
        f"shutil.copyfile({str(BEFORE)!r}, args[args.index('--output') + 1])",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    report = tmp_path / "capture.nsys-rep"
    report.write_bytes(b"\x00binary report")
    tls = read_nsys_all(report)
    assert sorted(tls) == [0, 1] and tls[0].source == str(report)
    assert len(tls[1].kernels) == len(timelines(BEFORE)[1].kernels)


def test_failed_nsys_export_is_a_tool_error(tmp_path, monkeypatch):
    fake_nsys(tmp_path / "bin", "print('ERROR: report is corrupt', file=sys.stderr)\nsys.exit(1)")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    report = tmp_path / "capture.nsys-rep"
    report.write_bytes(b"\x00")
    with pytest.raises(ToolError, match=r"nsys export failed \(exit 1\): ERROR: report is corrupt"):
        read_nsys(report)


SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT, smCount INTEGER, totalMemory INTEGER);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, gridX INTEGER, gridY INTEGER,
    gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER, registersPerThread INTEGER,
    staticSharedMemory INTEGER, dynamicSharedMemory INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    text TEXT, globalTid INTEGER, textId INTEGER, domainId INTEGER);
"""


def gid(pid: int, tid: int = 0) -> int:
    return (1 << 48) | (pid << 24) | tid


def synthetic(path: Path) -> Path:
    """One process (pid 7) on one GPU: two kerneltriage.step ranges, each pushed as NVTX and
    again emitted by emit_nvtx(record_shapes=True) from its record_function, holding an
    aten::mm range with shapes that launches one kernel, its backward on the autograd thread
    (tid 10, same sequence number) launching another; an NVTX mark and a range with no end."""
    pid, tid, bwd_tid = 7, 9, 10
    with closing(sqlite3.connect(path)) as db:
        db.executescript(SCHEMA)
        db.executemany(
            "INSERT INTO StringIds VALUES (?, ?)",
            [(1, "cudaLaunchKernel_v7000"), (2, "void gemm_kernel<128>(float*)"), (3, "gemm_kernel")],
        )
        db.executemany(
            "INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
            [("EXPORT_SCHEMA_VERSION", "3.99.0"), ("EXPORT_PRODUCT_VERSION", "2099.1")],
        )
        db.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100 80GB HBM3', 132, 85899345920)")
        db.executemany(
            "INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
            [(34, "NvtxMark", "NvtxMark"), (59, "NvtxPushPopRange", "NvtxPushPopRange")],
        )
        nvtx, kernels, runtime = [], [], []
        for step in range(2):
            t = 1_000_000 * (step + 1)
            nvtx.append((t, t + 900_000, 59, "kerneltriage.step", gid(pid, tid), None, 0))
            nvtx.append(
                (t + 10, t + 899_000, 59, f"kerneltriage.step, op_id = {100 + step}", gid(pid, tid), None, 0)
            )
            text = (
                f"aten::mm, seq = {40 + step}, op_id = {200 + step}, sizes = [[64, {128 * (step + 1)}], "
                f"[{128 * (step + 1)}, 256]], input_op_ids = [(199, 0), (198, 0)]"
            )
            nvtx.append((t + 100, t + 50_000, 59, text, gid(pid, tid), None, 0))
            nvtx.append((t + 60_000, None, 34, "a mark", gid(pid, tid), None, 0))
            nvtx.append((t + 61_000, None, 59, "a range never closed", gid(pid, tid), None, 0))
            runtime.append((t + 200, t + 5_000, gid(pid, tid), 500 + step, 1))
            kernels.append(
                (t + 10_000, t + 40_000, 0, 7, 500 + step, gid(pid), 2, 3, 4, 2, 1, 128, 1, 1, 96, 0, 4096)
            )
            bwd = f"autograd::engine::evaluate_function: MmBackward0, seq = {40 + step}, op_id = {300 + step}"
            nvtx.append((t + 500_000, t + 600_000, 59, bwd, gid(pid, bwd_tid), None, 0))
            nvtx.append(
                (t + 510_000, t + 590_000, 59, f"aten::mm, op_id = {310 + step}", gid(pid, bwd_tid), None, 0)
            )
            runtime.append((t + 520_000, t + 525_000, gid(pid, bwd_tid), 600 + step, 1))
            kernels.append(
                (t + 530_000, t + 580_000, 0, 7, 600 + step, gid(pid), 2, 3, 8, 2, 1, 128, 1, 1, 96, 0, 4096)
            )
        db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)", nvtx)
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)", runtime)
        db.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            kernels,
        )
        db.commit()
    return path


def test_synthetic_export_shapes_steps_and_gpu_name(tmp_path):
    tl = read_nsys(synthetic(tmp_path / "capture.sqlite"))
    assert tl.gpu_name == "NVIDIA H100 80GB HBM3"
    assert tl.device_properties[0]["numSms"] == 132
    assert tl.meta["nsys"]["EXPORT_SCHEMA_VERSION"] == "3.99.0"
    k = tl.kernels
    assert list(k["name"]) == ["void gemm_kernel<128>(float*)"] * 4
    assert list(k["shared_mem"]) == [4096] * 4 and list(k["grid_x"]) == [4, 8, 4, 8]
    assert list(tl.runtime["name"]) == ["cudaLaunchKernel"] * 4
    fwd = tl.cpu[(tl.cpu["cat"] == "cpu_op") & (tl.cpu["tid"] == 9)]
    assert list(fwd["name"]) == ["aten::mm", "aten::mm"]
    assert list(fwd["seq"]) == [40, 41]
    assert [tl.arg(int(d)) for d in fwd["dims"]] == [[[64, 128], [128, 256]], [[64, 256], [256, 256]]]
    bwd = tl.cpu[(tl.cpu["cat"] == "cpu_op") & (tl.cpu["tid"] == 10)]
    assert list(bwd["name"]) == ["autograd::engine::evaluate_function: MmBackward0", "aten::mm"] * 2
    assert list(bwd["seq"]) == [40, -1, 41, -1]
    assert not any("no input shapes" in w for w in tl.warnings)
    # The emitted copy of each kerneltriage.step range is dropped; the mark and the range that
    # never closed (no end) are skipped.
    ann = tl.cpu[tl.cpu["cat"] == "user_annotation"]
    assert list(ann["name"]) == ["kerneltriage.step", "kerneltriage.step"]
    assert len(tl.cpu) == 8
    steps, source, _ = find_steps(tl)
    assert source == "kerneltriage.step" and len(steps) == 2
    attr = attribute(tl)
    k = attr.kernels
    names = tl.cpu["name"].to_numpy()
    assert [names[o] for o in k["op"]] == ["aten::mm"] * 4
    assert list(k["step"]) == [0, 0, 1, 1]
    assert list(k["phase"]) == ["fwd", "bwd"] * 2
    # Backward kernels reach their forward op through the autograd sequence number.
    assert list(k["fwd_root"]) == [k["root"][0], k["root"][0], k["root"][2], k["root"][2]]
    assert tl.cpu["tid"][k["fwd_root"][1]] == 9


def test_synthetic_export_reports_without_gpu_flag(tmp_path):
    path = synthetic(tmp_path / "capture.sqlite")
    result = run("report", path, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "kerneltriage.report/1"
    assert data["gpu"]["key"] == "H100-SXM"
    assert data["steps"] == 2 and data["step_source"] == "kerneltriage.step"


def test_export_with_no_gpu_activity_at_all(tmp_path):
    path = synthetic(tmp_path / "capture.sqlite")
    with closing(sqlite3.connect(path)) as db:
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
        db.commit()
    with pytest.raises(TraceFormatError, match="holds no GPU kernels"):
        read_nsys(path)
