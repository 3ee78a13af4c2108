"""The command line through click's CliRunner: the shipped example and user mistakes."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from tests.helpers import EXAMPLE_RUN, NCU_ALL, TRACE


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def test_report_on_the_shipped_example():
    result = run("report", EXAMPLE_RUN)
    assert result.exit_code == 0, result.output
    assert "attention (naive, causal)" in result.output
    assert "use-builtin" in result.output
    # profile's acceptance: the kernels phase 2 targeted are (nearly) all joined to counters.
    assert "hot kernels: 15/15 with counters" in result.output
    data = json.loads(run("report", EXAMPLE_RUN, "--format", "json").output)
    assert data["join"]["hot_time_joined_share"] >= 0.95


def test_report_on_a_trace_with_counters_as_json(tmp_path):
    out = tmp_path / "r.json"
    result = run("report", TRACE, "--ncu", NCU_ALL, "--format", "json", "-o", out, "--top", "4")
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert len(data["candidates"]) == 4
    assert data["join"]["rows_joined"] == 348


def test_thresholds_from_flags():
    result = run("report", EXAMPLE_RUN, "--format", "json", "--min-headroom", "1000")
    assert result.exit_code == 0
    assert all(c["verdict"] == "skip" for c in json.loads(result.output)["candidates"])


def test_help_teaches():
    result = run("report", "--help")
    assert result.exit_code == 0
    assert "--ncu" in result.output and "Examples:" in result.output
    top = run("--help")
    assert "HEADROOM" in top.output and "HOTNESS" in top.output


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "no such file or directory"),
        (
            lambda p: (p / "t.json.gz").write_bytes(TRACE.read_bytes()[:9000]) and p / "t.json.gz",
            "truncated or corrupt",
        ),
        (lambda p: (p / "t.json").write_text('{"a": 1}') and p / "t.json", "not a PyTorch profiler"),
        (lambda p: (p / "t.txt").write_text("x") and p / "t.txt", "unrecognised file type"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "neither a run directory (no manifest.json) nor a folder of traces"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, make, message):
    path = make(tmp_path)
    result = run("report", path)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cpu_only_trace(tmp_path):
    data = json.loads(gzip.decompress(TRACE.read_bytes()))
    data["traceEvents"] = [
        e for e in data["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    f = tmp_path / "cpu.json.gz"
    f.write_bytes(gzip.compress(json.dumps(data).encode()))
    result = run("report", f)
    assert result.exit_code == 2 and "CPU-only" in result.output


def test_foreign_counters_and_unknown_gpu(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("name,value\nfoo,1\n")
    result = run("report", TRACE, "--ncu", csv)
    assert result.exit_code == 2 and "not an Nsight Compute raw CSV" in result.output
    result = run("report", TRACE, "--gpu", "Voodoo5")
    assert result.exit_code == 2 and "not in the GPU table" in result.output and "H100-SXM" in result.output


def test_bad_run_directory_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text('{"schema": "kerneltriage.run/99"}')
    result = run("report", tmp_path)
    assert result.exit_code == 2 and "not supported" in result.output
    (tmp_path / "manifest.json").write_text('{"schema": "kerneltriage.run/1"}')
    result = run("report", tmp_path)
    assert result.exit_code == 2 and "no trace.json.gz" in result.output


def test_help_shows_the_rules_files_defaults():
    import yaml

    from kerneltriage.analysis.rules import default_rules_path

    shipped = yaml.safe_load(default_rules_path().read_text())["thresholds"]
    text = " ".join(run("report", "--help").output.split())
    for flag, name in (("--min-headroom", "min_headroom"), ("--min-share", "min_share")):
        after = text[text.index(flag) :]
        assert f"Default: {shipped[name]} (from kerneltriage/data/rules/default.yaml)" in after


def test_a_bad_threshold_flag_is_one_line_exit_2():
    result = run("report", EXAMPLE_RUN, "--min-headroom", "0.5")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "kerneltriage: error: --min-headroom: min_headroom is a ratio of times and must be at least 1"
    )


def test_profile_refuses_a_bad_rules_file_before_running(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    result = run(
        "profile", "--rules", tmp_path / "none.yaml", "--out", tmp_path / "run", "--", "python", script
    )
    assert result.exit_code == 2
    assert "no such rules file" in result.output
    assert not (tmp_path / "train.py.ran").exists() and not (tmp_path / "run").exists()
