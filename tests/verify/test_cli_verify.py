"""``kerneltriage verify`` through click: --plan on a shipped run (no GPU, nothing run), and
one line with an exit code for what the user got wrong."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from kerneltriage import api
from kerneltriage.cli import main

ROOT = Path(__file__).resolve().parents[2]
NAIVE = ROOT / "examples" / "runs" / "gpt-naive-h200"


def test_plan_on_a_shipped_run_runs_nothing(tmp_path):
    report = api.report(NAIVE)
    norm = next(c.id for c in report.candidates if c.name.startswith("residual add + RMSNorm"))
    before = sorted(p.name for p in NAIVE.iterdir())
    result = CliRunner().invoke(main, ["verify", str(NAIVE), "--plan", "--candidates", f"C1,{norm}"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"verify plan for {NAIVE}"
    assert any(line.startswith("C1  attention (naive, causal)") for line in lines)
    assert any(line.startswith(f"{norm}  residual add + RMSNorm") for line in lines)
    assert "is_causal=True" in result.output  # the fix text the report prints
    # the hint names the candidate, which --by-hand takes (not the recipe)
    assert f"`kerneltriage verify {NAIVE} --by-hand C1 -- <fixed command>`" in result.output
    # the report's own recipe swaps the norm's class, not the Block that holds the residual add
    assert "applied  by the runner: norm-swap (classes=['RMSNorm'])" in result.output
    assert sorted(p.name for p in NAIVE.iterdir()) == before  # no verify.json, no logs


def test_bad_run_directory_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "nope"), "--plan"])
    assert result.exit_code == 2
    assert result.output == f"kerneltriage: error: {tmp_path / 'nope'}: no such file or directory\n"
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "not a kerneltriage run directory" in result.output
    assert len(result.output.splitlines()) == 1
    # A trace given where a run goes: what a run is, in the same line.
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "trace.json")])
    assert result.exit_code == 2 and result.output == (
        f"kerneltriage: error: {tmp_path / 'trace.json'}: not a directory: a run is the folder "
        "`kerneltriage profile --out` wrote\n"
    )


def test_by_hand_needs_a_command_and_a_command_needs_by_hand():
    result = CliRunner().invoke(main, ["verify", str(NAIVE), "--by-hand", "C1"])
    assert result.exit_code == 2 and "--by-hand needs your fixed command after --" in result.output
    result = CliRunner().invoke(main, ["verify", str(NAIVE), "--", "python", "x.py"])
    assert result.exit_code == 2 and "a command goes with --by-hand ID" in result.output
    result = CliRunner().invoke(main, ["verify", str(NAIVE), "--plan", "--candidates", "C42"])
    assert result.exit_code == 2 and "no candidate C42" in result.output
