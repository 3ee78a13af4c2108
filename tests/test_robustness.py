"""Bad input never crashes or lies, and no input or result is lost (issue 18).

Each case mutates a copy of a shipped run (``examples/runs/gpt-naive-h200``) the way a broken
tool, a careless edit or a hostile user would, runs the command line, and checks the exit code
(0: a report, with the warning that names what was skipped; 2: one line naming the problem;
3: a missing tool or package) and that no traceback reached the user.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from tests.helpers import EXAMPLE_RUN

DDP_RUN = EXAMPLE_RUN.parent / "gpt-ddp-2gpu-h200"


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}")
    return result.exit_code, result.output


def copy_run(tmp: Path, source: Path = EXAMPLE_RUN) -> Path:
    run = tmp / "run"
    shutil.copytree(source, run)
    return run


# --- mutations of one file of the run -----------------------------------------------------


def edit_trace(run: Path, change) -> None:
    path = run / "trace.json.gz"
    data = json.loads(gzip.decompress(path.read_bytes()))
    change(data)
    path.write_bytes(gzip.compress(json.dumps(data).encode()))


def kernel_events(data: dict) -> list[dict]:
    return [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("cat") == "kernel"]


def edit_kernels(count: int, change):
    def edit(data):
        for e in kernel_events(data)[:count]:
            change(e)

    return lambda run: edit_trace(run, edit)


def edit_ncu(run: Path, change) -> None:
    path = run / "ncu.csv.gz"
    rows = list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    change(rows)
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    path.write_bytes(gzip.compress(out.getvalue().encode()))


def set_ncu_column(column: str, value: str, row: int = 2):
    def change(rows):
        rows[row][rows[0].index(column)] = value

    return lambda run: edit_ncu(run, change)


def decimal_comma(rows):
    for r in rows[2:]:
        for i, cell in enumerate(r):
            if cell.replace(",", "").replace(".", "").isdigit():
                r[i] = cell.replace(",", "\x00").replace(".", ",").replace("\x00", ".")


def edit_manifest(change):
    def edit(run):
        path = run / "manifest.json"
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return edit


def rules_file(text: str):
    def make(run):
        (run.parent / "rules.yaml").write_text(text)

    return make


def duplicate_every_event(data):
    data["traceEvents"] = [e for e in data["traceEvents"] for _ in (0, 1)]


# (id, mutation of the copied run, extra arguments, exit code, text the output must hold)
CASES = [
    # Kineto events of the wrong type: skipped, counted, never fatal.
    ("args-string", edit_kernels(1, lambda e: e.update(args="x")), [], 0, "skipped 1 malformed kernel event"),
    ("cat-list", edit_kernels(1, lambda e: e.update(cat=["kernel"])), [], 0, "skipped 1 malformed"),
    ("dur-string-nan", edit_kernels(2, lambda e: e.update(dur="nan")), [], 0, "skipped 2 malformed kernel"),
    ("dur-negative", edit_kernels(1, lambda e: e.update(dur=-5e6)), [], 0, "skipped 1 malformed kernel"),
    ("dur-huge", edit_kernels(1, lambda e: e.update(dur=1e300)), [], 0, "skipped 1 malformed kernel"),
    ("ts-string", edit_kernels(1, lambda e: e.update(ts="soon")), [], 0, "skipped 1 malformed kernel"),
    ("grid-int", edit_kernels(1, lambda e: e["args"].update(grid=5)), [], 0, "skipped 1 malformed kernel"),
    (
        "most-kernels-malformed",
        edit_kernels(10**6, lambda e: e.update(args=[1])),
        [],
        2,
        "malformed",
    ),
    (
        "device-properties-int",
        lambda run: edit_trace(run, lambda d: d.update(deviceProperties=1)),
        [],
        0,
        "deviceProperties",
    ),
    (
        "distributed-info-string",
        lambda run: edit_trace(run, lambda d: d.update(distributedInfo="x")),
        [],
        0,
        "distributedInfo",
    ),
    (
        "odd-input-dims",
        lambda run: edit_trace(
            run,
            lambda d: [
                e["args"].update({"Input Dims": 5, "Input type": [[1]], "Concrete Inputs": {"a": 1}})
                for e in d["traceEvents"]
                if e.get("cat") == "cpu_op" and isinstance(e.get("args"), dict)
            ],
        ),
        [],
        0,
        "malformed op argument",
    ),
    (
        "every-event-duplicated",
        lambda run: edit_trace(run, duplicate_every_event),
        [],
        0,
        "duplicated",
    ),
    # Nsight Compute cells.
    ("ncu-id-na", set_ncu_column("ID", "n/a"), [], 0, "skipped 1 malformed row"),
    ("ncu-device-na", set_ncu_column("Device", "n/a"), [], 0, "skipped 1 malformed row"),
    ("ncu-decimal-comma", lambda run: edit_ncu(run, decimal_comma), [], 2, "decimal comma"),
    # The manifest.
    ("manifest-schedule-int", edit_manifest(lambda m: m.update(schedule=5)), [], 2, "schedule"),
    ("manifest-phases-string", edit_manifest(lambda m: m.update(phases="x")), [], 2, "phases"),
    ("manifest-calibration-list", edit_manifest(lambda m: m.update(calibration=[1])), [], 2, "calibration"),
    ("manifest-ranks-string", edit_manifest(lambda m: m.update(ranks="0")), [], 2, "ranks"),
    (
        "manifest-ncu-rank-missing",
        edit_manifest(lambda m: m["schedule"].update(ncu_rank=7)),
        [],
        0,
        "ncu_rank 7",
    ),
    (
        "manifest-is-a-directory",
        lambda run: (run / "manifest.json").unlink() or (run / "manifest.json").mkdir(),
        [],
        2,
        "manifest.json",
    ),
    (
        "regions-binary",
        lambda run: (run / "regions.jsonl").write_bytes(bytes(range(256)) * 4),
        [],
        0,
        "regions.jsonl",
    ),
    (
        "regions-not-objects",
        lambda run: (run / "regions.jsonl").write_text('[1, 2]\n"x"\n{"path": 5}\n'),
        [],
        0,
        "regions.jsonl",
    ),
    # Rules files of the wrong type: one line naming the field, exit 2.
    ("rules-thresholds-list", rules_file("thresholds: [1, 2]"), ["--rules", "RULES"], 2, "thresholds"),
    ("rules-ops-int", rules_file("op_classes: [{kind: gemm, ops: 5}]"), ["--rules", "RULES"], 2, "ops"),
    (
        "rules-max-shapes-inf",
        rules_file("thresholds: {max_shapes: .inf}"),
        ["--rules", "RULES"],
        2,
        "max_shapes",
    ),
    (
        "rules-headroom-nan",
        rules_file("thresholds: {min_headroom: .nan}"),
        ["--rules", "RULES"],
        2,
        "min_headroom",
    ),
    (
        "rules-recommendations-list",
        rules_file("recommendations: [1, 2]"),
        ["--rules", "RULES"],
        2,
        "recommendations",
    ),
    ("rules-op-classes-int", rules_file("op_classes: 5"), ["--rules", "RULES"], 2, "op_classes"),
    ("rules-regions-list", rules_file("regions: [1]"), ["--rules", "RULES"], 2, "regions"),
    ("rules-kernel-kinds-list", rules_file("kernel_kinds: [1]"), ["--rules", "RULES"], 2, "kernel_kinds"),
    ("rules-fixes-mapping", rules_file("fixes: {a: 1}"), ["--rules", "RULES"], 2, "fixes"),
    ("rules-library-ops-int", rules_file("library_ops: 5"), ["--rules", "RULES"], 2, "library_ops"),
    ("rules-norms-int", rules_file("regions: {norms: 5}"), ["--rules", "RULES"], 2, "norms"),
    (
        "rules-max-ops-between",
        rules_file("regions: {attention: {max_ops_between: many}}"),
        ["--rules", "RULES"],
        2,
        "max_ops_between",
    ),
    ("rules-note-list", rules_file("recommendations: {gemm: [1]}"), ["--rules", "RULES"], 2, "gemm"),
    (
        "rules-unknown-kind",
        rules_file("op_classes: [{kind: atention, ops: ['^aten::']}]"),
        ["--rules", "RULES"],
        2,
        "atention",
    ),
    # Command-line values.
    ("flag-headroom-nan", None, ["--min-headroom", "nan"], 2, "--min-headroom"),
    ("flag-headroom-inf", None, ["--min-headroom", "inf"], 2, "--min-headroom"),
    ("flag-share-nan", None, ["--min-share", "nan"], 2, "--min-share"),
    ("flag-gpu-empty", None, ["--gpu", ""], 2, "--gpu"),
]


@pytest.mark.parametrize(
    ("mutate", "args", "code", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(tmp_path, mutate, args, code, text):
    run = copy_run(tmp_path)
    if mutate is not None:
        mutate(run)
    args = [str(tmp_path / "rules.yaml") if a == "RULES" else a for a in args]
    exit_code, output = cli("report", run, "--format", "json", *args)
    assert exit_code == code, output[-2000:]
    if code == 0:
        head, _, _ = output.partition("{")
        data = json.loads(output[len(head) :])
        assert any(text in w for w in data["warnings"]), data["warnings"]
        assert_possible(data)
    else:
        assert text in output, output
        assert len(output.strip().splitlines()) == 1, output


def assert_possible(data: dict) -> None:
    """No impossible number in a report's JSON."""
    reports = list(data["ranks"].values()) if "ranks" in data and isinstance(data["ranks"], dict) else [data]
    for rep in reports:
        assert rep["step_time_ms"] is not None and rep["step_time_ms"] > 0
        assert 0 <= rep["gpu_busy_pct"] <= 100 + 1e-6
        assert 0 <= rep["idle_pct"] <= 100 + 1e-6
        for c in rep["candidates"]:
            for key in ("time_ms_per_step", "fwd_ms_per_step", "bwd_ms_per_step"):
                assert c[key] is not None and c[key] >= 0 and math.isfinite(c[key]), (key, c)
            assert 0 <= c["time_share"] <= 1 and 0 <= c["gpu_share"] <= 1, c
            assert 0 <= c["expected_saving_share"] <= c["time_share"] + 1e-6, c
            for key in ("bytes", "flops", "measured_dram_bytes"):
                value = c["roofline"][key]
                assert value is None or value >= 0, (key, c)


def test_duplicated_events_are_dropped(tmp_path):
    run = copy_run(tmp_path)
    _, clean = cli("report", run, "--format", "json")
    edit_trace(run, duplicate_every_event)
    _, doubled = cli("report", run, "--format", "json")
    a, b = json.loads(clean), json.loads(doubled)
    assert [c["time_share"] for c in a["candidates"]] == [c["time_share"] for c in b["candidates"]]
    assert any("duplicated" in w for w in b["warnings"])


def test_the_ncu_rank_warning_names_the_cause(tmp_path):
    run = copy_run(tmp_path)
    edit_manifest(lambda m: m["schedule"].update(ncu_rank=7))(run)
    code, output = cli("report", run, "--format", "json")
    assert code == 0
    warnings = json.loads(output)["warnings"]
    assert any("ncu_rank 7" in w and "rank 0" in w for w in warnings), warnings


# --- outputs --------------------------------------------------------------------------------


def test_output_checks_come_before_the_analysis(tmp_path, monkeypatch):
    import kerneltriage.api as api

    def never(*a, **k):
        raise AssertionError("the analysis started before the output was checked")

    monkeypatch.setattr(api, "load", never)
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    for args, text in [
        (["-o", tmp_path / "missing" / "r.json"], "no such directory"),
        (["-o", tmp_path / "dir"], "is a directory"),
        (["-o", tmp_path / "file" / "r.json"], "not a directory"),
        (["--plot", tmp_path / "missing" / "r.png"], "no such directory"),
        (["--export", tmp_path / "file" / "tables"], "not a directory"),
        (["-o", EXAMPLE_RUN / "trace.json.gz"], "input"),
        (["-o", EXAMPLE_RUN / "manifest.json"], "input"),
        (["-o", tmp_path / "same", "--plot", tmp_path / "same"], "twice"),
    ]:
        code, output = cli("report", EXAMPLE_RUN, *args)
        assert code == 2, (args, output)
        assert text in output, (args, output)
        assert len(output.strip().splitlines()) == 1, output


def test_an_input_is_never_overwritten(tmp_path):
    run = copy_run(tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for name in ("trace.json.gz", "manifest.json", "ncu.csv.gz"):
        code, output = cli("report", run, "--format", "json", "-o", run / name)
        assert code == 2 and "input" in output, output
    rules = tmp_path / "rules.yaml"
    rules.write_text("thresholds: {min_share: 0.05}\n")
    code, output = cli("report", run, "--rules", rules, "-o", rules)
    assert code == 2 and "input" in output
    assert rules.read_text() == "thresholds: {min_share: 0.05}\n"
    code, output = cli("diff", run, EXAMPLE_RUN, "-o", run / "trace.json.gz")
    assert code == 2 and "input" in output
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_outputs_are_written_whole(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    code, _ = cli("report", EXAMPLE_RUN, "--format", "json", "-o", out)
    assert code == 0
    assert json.loads(out.read_text())["schema"] == "kerneltriage.report/1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary file left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_line():
    code, output = cli("report", EXAMPLE_RUN, "-o", "/dev/full")
    assert code == 2, output
    assert "/dev/full" in output and len(output.strip().splitlines()) == 1


def test_help_says_that_o_overwrites():
    _, output = cli("report", "--help")
    assert "overwrit" in output


# --- tools and optional packages ----------------------------------------------------------


def test_calibrate_without_triton_is_one_line_exit_3(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    code, output = cli("calibrate", "--quick")
    assert code == 3, output
    assert "triton" in output and len(output.strip().splitlines()) == 1


def test_ncu_report_without_ncu_is_one_line_exit_3(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"\0")
    code, output = cli("report", EXAMPLE_RUN / "trace.json.gz", "--ncu", rep)
    assert code == 3, output
    assert "ncu" in output and len(output.strip().splitlines()) == 1


# --- Ctrl-C ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_exits_130_at_once_without_a_traceback_or_output(tmp_path):
    """A trace large enough for the reader's worker processes, interrupted while it is read."""
    import os
    import signal
    import subprocess
    import time

    data = json.loads(gzip.decompress((EXAMPLE_RUN / "trace.json.gz").read_bytes()))
    events = data.pop("traceEvents")
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(e.get("ts", 0) for e in events)
    big = tmp_path / "big.json"
    with open(big, "w") as f:
        f.write(json.dumps(data)[:-1] + ', "traceEvents": [')
        for copy in range(16):  # ~90 MB: over the reader's parallel threshold
            shifted = [{**e, "ts": e["ts"] + copy * span} if "ts" in e else e for e in events]
            f.write(("," if copy else "") + json.dumps(shifted)[1:-1])
        f.write("]}")
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerneltriage", "report", str(big), "--format", "json", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # Interrupt once the reader's worker processes exist (reading), whatever the machine's speed.
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if children.exists() and children.read_text().split():
            break
        time.sleep(0.02)
    time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert stdout == ""  # nothing half-written to standard output either
    took = time.monotonic() - sent
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip() == "kerneltriage: error: interrupted", stderr
    assert took < 1.0, took
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["big.json"]


@pytest.mark.slow
def test_profile_calibrate_without_a_gpu_is_exit_3_without_a_traceback(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: calibrate would measure it")
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    code, output = cli(
        "profile", "--calibrate", "--no-ncu", "--out", tmp_path / "run", "--", sys.executable, script
    )
    assert code == 3, output
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1].startswith("kerneltriage: error: no CUDA GPU")
