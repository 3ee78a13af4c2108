"""`kerneltriage profile` on the CPU: the runner inside a real training script, step
detection, module ranges, regions.jsonl, the manifest, and the failure paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage import rundir
from kerneltriage.cli import main
from kerneltriage.ingest.kineto import read_trace

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "examples" / "train_gpt.py"


def profile(*args):
    return CliRunner().invoke(main, ["profile", "-q", *map(str, args)], catch_exceptions=False)


def _annotations(run: Path) -> list[str]:
    tl = read_trace(run / rundir.TRACE)
    return list(tl.cpu.loc[tl.cpu["cat"] == "user_annotation", "name"])


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "gpt"
    result = profile(
        "--cpu",
        "--out",
        out,
        "--warmup",
        "1",
        "--steps",
        "2",
        "--",
        sys.executable,
        GPT,
        "--tiny",
        "--device",
        "cpu",
        "--steps",
        "50",
    )
    assert result.exit_code == 0, result.output
    (out.parent / "profile.out").write_text(result.output)
    return out


def test_a_dry_run_does_not_send_the_user_to_report(gpt_run):
    """A --cpu run holds no GPU kernels, so `report` on it would fail: the last lines say what
    the dry run showed, and no phase but the ones that ran."""
    lines = (gpt_run.parent / "profile.out").read_text().splitlines()
    assert lines[-2].startswith(f"wrote {gpt_run} (timeline ") and "__pydantic_extra__" not in lines[-2]
    assert (
        lines[-1].startswith("next: a --cpu dry run records no GPU kernels")
        and "kerneltriage report" not in lines[-1]
    )


def test_no_torch_in_the_scripts_python_is_one_line(tmp_path, monkeypatch):
    """The script's Python lacks torch: one line naming that Python, exit 3, no traceback."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n'
    )
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    script = _script(tmp_path, "print('never runs')\n")
    result = CliRunner().invoke(
        main, ["profile", "-q", "--cpu", "--out", str(tmp_path / "r"), "--", sys.executable, str(script)]
    )
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and "never runs" not in result.output
    phase, line = result.output.splitlines()  # the phase that started, then why it stopped
    assert phase.startswith("kerneltriage timeline:")
    assert line.startswith(f"kerneltriage: error: no torch in the script's Python ({sys.executable})")


def test_steps_are_recorded_and_the_script_stops_early(gpt_run):
    names = _annotations(gpt_run)
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#1", "ProfilerStep#2"]
    m = json.loads((gpt_run / rundir.MANIFEST).read_text())
    assert m["schema"] == "kerneltriage.run/1" and m["status"] == "ok"
    t = m["phases"]["timeline"]
    assert t["step_source"] == "optimizer"
    # 1 warm-up, 5 plain, the clean profiler's warm-up, 5 clean, the shapes step, the recorded
    # profiler's warm-up and 2 recorded, of the script's 50.
    assert t["steps_seen"] == 16
    assert t["module_calls_per_step"] == 20.0  # hooked: the two recorded steps
    times = t["step_time"]
    assert len(times["recorded_ms"]) == 2 and len(times["clean_ms"]) == 5 and len(times["plain_ms"]) == 5
    assert m["versions"]["torch"].startswith("2.")
    assert m["schedule"] == {"warmup": 1, "steps": 2, "step_marker": None, "run_to_end": False, "ncu_rank": 0}


def test_modules_are_named_in_the_trace_and_in_regions_jsonl(gpt_run):
    names = set(_annotations(gpt_run))
    assert "kerneltriage.module:blocks.0.attn:Attention" in names
    assert "kerneltriage.module:blocks.1.n2:RMSNorm" in names
    regions = [json.loads(line) for line in (gpt_run / rundir.REGIONS).read_text().splitlines()]
    attn = next(r for r in regions if r["path"] == "blocks.0.attn")
    assert attn["class"] == "Attention"
    assert attn["inputs"][0]["shape"] == [2, 64, 64] and attn["inputs"][0]["dtype"] == "float32"
    qkv = next(r for r in regions if r["path"] == "blocks.0.attn.qkv")
    assert qkv["param_bytes"] == 64 * 192 * 4
    assert len({(r["path"], json.dumps(r["inputs"])) for r in regions}) == len(regions)  # once per signature


def _script(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "train.py"
    f.write_text(textwrap.dedent(body))
    return f


def test_kerneltriage_step_marks_steps_without_an_optimizer(tmp_path):
    script = _script(
        tmp_path,
        """
        import torch, kerneltriage
        w = torch.randn(32, 32, requires_grad=True)
        for i in range(10):
            with kerneltriage.step():
                loss = (torch.randn(8, 32) @ w).square().mean()
                loss.backward()
                with torch.no_grad():
                    w -= 0.1 * w.grad
                    w.grad = None
        """,
    )
    out = tmp_path / "run"
    result = profile("--cpu", "--out", out, "--warmup", "2", "--steps", "2", "--", sys.executable, script)
    assert result.exit_code == 0, result.output
    m = json.loads((out / rundir.MANIFEST).read_text())
    assert m["phases"]["timeline"]["step_source"] == "kerneltriage.step"
    assert sum(n == "kerneltriage.step" for n in _annotations(out)) >= 2


def test_without_steps_the_whole_run_is_profiled(tmp_path):
    script = _script(
        tmp_path,
        """
        import torch
        x = torch.randn(64, 64)
        for _ in range(3):
            x = (x @ x).tanh()
        print("done")
        """,
    )
    out = tmp_path / "run"
    result = profile("--cpu", "--out", out, "--", sys.executable, script)
    assert result.exit_code == 0, result.output
    assert "profiling the whole run" in result.output or "whole run" in result.output
    m = json.loads((out / rundir.MANIFEST).read_text())
    assert m["schedule"]["whole_run"] is True
    assert any("whole run" in n for n in m["notes"])
    tl = read_trace(out / rundir.TRACE)
    assert (tl.cpu["name"] == "aten::mm").sum() >= 3


def test_a_failing_script_keeps_the_run_directory(tmp_path):
    script = _script(
        tmp_path,
        """
        import sys
        print("about to fail", file=sys.stderr)
        raise ValueError("boom in the user's script")
        """,
    )
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["profile", "-q", "--cpu", "--out", str(out), "--", sys.executable, str(script)]
    )
    assert result.exit_code == 3
    assert "ValueError: boom in the user's script" in result.output
    assert "Traceback" in result.output  # the script's own traceback, quoted from its stderr
    m = json.loads((out / rundir.MANIFEST).read_text())
    assert m["status"] == "failed" and m["exit_code"] == 1
    assert (out / "logs" / "phase1.stderr").read_text().count("ValueError: boom") == 1


def test_no_gpu_is_explained(tmp_path):
    script = _script(tmp_path, "print('never runs')\n")
    result = CliRunner().invoke(
        main, ["profile", "-q", "--out", str(tmp_path / "r"), "--", sys.executable, str(script)]
    )
    assert result.exit_code == 3
    assert "no CUDA GPU" in result.output and "--cpu" in result.output


def test_existing_output_directory(tmp_path, gpt_run):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(
        main, ["profile", "--cpu", "--out", str(other), "--", sys.executable, str(GPT)]
    )
    assert result.exit_code == 2 and "exists and is not empty" in result.output and "--force" in result.output
    result = CliRunner().invoke(
        main, ["profile", "--cpu", "--force", "--out", str(other), "--", sys.executable, str(GPT)]
    )
    assert result.exit_code == 2 and "no manifest.json" in result.output
    assert (other / "notes.txt").read_text() == "keep me"


def test_not_python_is_refused():
    result = CliRunner().invoke(main, ["profile", "--", "bash", "train.sh"])
    assert result.exit_code == 2 and "not a Python interpreter" in result.output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_leaves_a_consistent_run_directory(tmp_path, sig):
    # SIGTERM is what `timeout` and batch schedulers send the whole process group.
    script = _script(
        tmp_path,
        """
        import time, torch
        print("started", flush=True)
        for i in range(600):
            time.sleep(0.1)
        """,
    )
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "kerneltriage",
        "profile",
        "--cpu",
        "--out",
        str(out),
        "--",
        sys.executable,
        str(script),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "logs" / "phase1.stdout").is_file():
        time.sleep(0.2)
    while time.time() < deadline and "started" not in (out / "logs" / "phase1.stdout").read_text():
        time.sleep(0.2)
    os.killpg(proc.pid, sig)  # SIGINT: what the terminal does on Ctrl-C
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output
    m = json.loads((out / rundir.MANIFEST).read_text())
    assert m["status"] == "interrupted"
    how = "stopped by SIGTERM" if sig == signal.SIGTERM else "interrupted by the user (Ctrl-C)"
    assert any(n.startswith(how) for n in m["notes"])


def test_timing_steps_and_the_every_launch_budget_are_cli_flags(tmp_path, monkeypatch):
    from kerneltriage.profile import session

    seen = {}

    def fake_run_profile(argv, options, reporter):
        seen["options"] = options
        raise SystemExit(0)

    monkeypatch.setattr(session, "run_profile", fake_run_profile)
    args = ["--timing-steps", "2", "--max-variable-launches", "40", "--", "python", "t.py"]
    CliRunner().invoke(main, ["profile", *args])
    assert seen["options"].timing_steps == 2 and seen["options"].max_variable_launches == 40
    CliRunner().invoke(main, ["profile", "--", "python", "t.py"])
    assert seen["options"].timing_steps == 5 and seen["options"].max_variable_launches == 256


def test_timing_steps_0_stops_after_the_recorded_steps(tmp_path):
    out = tmp_path / "run"
    result = profile(
        "--cpu", "--out", out, "--warmup", "1", "--steps", "2", "--timing-steps", "0", "--",
        sys.executable, GPT, "--tiny", "--device", "cpu", "--steps", "20",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    m = json.loads((out / rundir.MANIFEST).read_text())
    t = m["phases"]["timeline"]
    # 1 warm-up, the shapes step, the recorded profiler's warm-up and 2 recorded
    assert t["steps_seen"] == 5 and t["step_time"]["plain_ms"] == [] and t["step_time"]["clean_ms"] == []
    status = json.loads((out / "logs" / "status.timeline.rank0.json").read_text())
    assert [p["phase"] for p in status["phases"]] == [
        "warmup",
        "shapes",
        "recorded-warmup",
        "recorded",
        "recorded",
    ]
    assert not any("not measured" in n for n in m["notes"])
    assert json.loads((out / "logs" / "config.timeline.json").read_text())["timing_steps"] == 0
