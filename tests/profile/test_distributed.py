"""torchrun jobs on the CPU (gloo): one trace per rank, and a rank that dies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage import rundir
from kerneltriage.cli import main
from kerneltriage.ingest.kineto import read_trace
from kerneltriage.profile.command import parse_command
from tests.helpers import ncu_runner_config, nvtx_shim

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))


def profile(*args):
    return CliRunner().invoke(main, ["profile", "-q", "--cpu", *map(str, args)], catch_exceptions=False)


def test_world_size_from_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert parse_command(["torchrun", "--nproc-per-node", "2", "t.py"]).world_size == 2
    assert parse_command(["torchrun", "--nnodes=1", "--nproc_per_node=4", "t.py"]).world_size == 4
    assert parse_command(["python", "t.py"]).world_size is None


def test_every_rank_writes_its_trace(tmp_path):
    out = tmp_path / "run"
    result = profile(
        "--out",
        out,
        "--warmup",
        "1",
        "--steps",
        "2",
        "--",
        TORCHRUN,
        "--nproc-per-node",
        "2",
        ROOT / "examples" / "train_gpt.py",
        "--tiny",
        "--device",
        "cpu",
        "--ddp",
        "--steps",
        "20",
    )
    assert result.exit_code == 0, result.output
    m = json.loads((out / rundir.MANIFEST).read_text())
    assert m["ranks"] == [0, 1] and m["status"] == "ok"
    for rank in (0, 1):
        tl = read_trace(out / f"trace.rank{rank}.json.gz")
        names = set(tl.cpu["name"])
        assert {"ProfilerStep#1", "ProfilerStep#2"} <= names
        # DDP's gradient all-reduce is in each rank's trace.
        assert any("allreduce" in n for n in names), sorted(n for n in names if "c10d" in n)[:5]
        status = json.loads((out / "logs" / f"status.timeline.rank{rank}.json").read_text())
        # 1 warm-up, 5 plain, the clean profiler's warm-up, 5 clean, the shapes step, the
        # recorded profiler's warm-up and 2 recorded, of the script's 20; then every rank stops.
        assert status["rank"] == rank and status["steps_seen"] == 16
        assert [p["phase"] for p in status["phases"]] == [
            "warmup",
            *["plain"] * 5,
            "clean-warmup",
            *["clean"] * 5,
            "shapes",
            "recorded-warmup",
            "recorded",
            "recorded",
        ]
    assert not (out / rundir.TRACE).exists()


def test_a_rank_that_dies_is_named(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            if dist.get_rank() == 1 and step == 2:
                raise RuntimeError("rank 1 ran out of luck")
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
        """)
    )
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "-q",
            "--cpu",
            "--out",
            str(out),
            "--warmup",
            "1",
            "--steps",
            "4",
            "--",
            TORCHRUN,
            "--nproc-per-node",
            "2",
            str(script),
        ],
    )
    assert result.exit_code == 3, result.output
    assert "rank 1" in result.output and "ran out of luck" in result.output
    m = json.loads((out / rundir.MANIFEST).read_text())
    assert m["status"] == "failed"
    assert any("rank 1 failed" in n for n in m["notes"])


def test_under_ncu_every_rank_stops_after_the_profiled_step(tmp_path):
    # Phase 2 marks the step on one rank (--ncu-rank) only; the others must stop at the same
    # step, or they wait forever in an all-reduce that rank never joins (seen on 2× H200).
    # NVTX is recorded by a shim here: the CPU build of torch has none.
    shim = nvtx_shim(
        tmp_path / "shim.py", f'os.path.join({str(tmp_path)!r}, "nvtx.rank" + os.environ["RANK"])'
    )
    out = tmp_path / "run"
    config = ncu_runner_config(out, distributed=True)
    env = dict(os.environ, KERNELTRIAGE_PROFILE=str(config), PYTHONPATH=str(ROOT))
    cmd = [TORCHRUN, "--nproc-per-node", "2", "-m", "kerneltriage.profile.runner", str(shim)]
    args = ["--tiny", "--device", "cpu", "--ddp", "--steps", "8"]
    proc = subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):
        status = json.loads((out / rundir.LOGS / f"status.ncu.rank{rank}.json").read_text())
        assert (status["status"], status["steps_seen"]) == ("ok", 3)
    assert (tmp_path / "nvtx.rank0").read_text().split("\n")[:2] == ["start kerneltriage.ncu", "end"]
    assert not (tmp_path / "nvtx.rank1").exists()


@pytest.fixture(autouse=True)
def _needs_torchrun():
    assert Path(TORCHRUN).exists(), "torchrun is installed with torch"
