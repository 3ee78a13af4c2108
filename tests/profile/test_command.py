"""Parsing the user's command and putting the runner in front of the script."""

from __future__ import annotations

import pytest

from kerneltriage.errors import InputError
from kerneltriage.profile.command import RUNNER, parse_command


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return "train.py"


def test_python_script(script):
    c = parse_command(["python", "-X", "dev", "-u", script, "--lr", "3e-4"])
    assert c.launcher == "python" and not c.distributed
    assert c.with_runner() == ["python", "-X", "dev", "-u", "-m", RUNNER, script, "--lr", "3e-4"]
    assert c.script == script


def test_python_module():
    c = parse_command(["python3.12", "-m", "mypkg.train", "--steps", "3"])
    assert c.with_runner() == ["python3.12", "-m", RUNNER, "-m", "mypkg.train", "--steps", "3"]
    assert c.script == "mypkg.train"


def test_torchrun_options_with_and_without_values(script):
    c = parse_command(
        ["torchrun", "--nproc-per-node", "2", "--standalone", "--master_port=29501", script, "--ddp"]
    )
    assert c.distributed
    assert c.with_runner() == [
        "torchrun",
        "--nproc-per-node",
        "2",
        "--standalone",
        "--master_port=29501",
        "-m",
        RUNNER,
        script,
        "--ddp",
    ]
    m = parse_command(["torchrun", "--nnodes", "1", "-m", "pkg.train", "--x"])
    assert m.with_runner() == ["torchrun", "--nnodes", "1", "-m", RUNNER, "-m", "pkg.train", "--x"]
    d = parse_command(["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", script, "--ddp"])
    assert d.distributed and d.world_size == 2
    assert d.with_runner() == [
        "python3",
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        RUNNER,
        script,
        "--ddp",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no command given"),
        (["bash", "run.sh"], "not a Python interpreter"),
        (["./train.py"], "write it as: python ./train.py"),
        (["python", "-c", "print(1)"], "save the code to a file"),
        (["python"], "names no script"),
        (["python", "missing.py"], "does not exist"),
        (["torchrun", "--no-python", "app"], "non-Python binary"),
        (["torchrun", "--nproc-per-node", "2"], "names no training script"),
    ],
)
def test_bad_commands(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=message):
        parse_command(argv)
