"""`profile --timeline nsys` against a stand-in `nsys`: a report exported to SQLite becomes the
run's timeline; recording without a report (the importer missing) falls back, and says so."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from kerneltriage import rundir
from kerneltriage.api import build_reports
from kerneltriage.profile import phase_timeline_nsys
from kerneltriage.profile.command import parse_command
from kerneltriage.profile.context import Options, ProfileSession
from tests.helpers import DATA

FAKE_NSYS = r"""#!{python}
import os, shutil, sys
args = sys.argv[1:]
open(os.environ["FAKE_NSYS_LOG"], "a").write(" ".join(args) + "\n")
if args[0] == "profile":
    out = args[args.index("-o") + 1]
    if os.environ.get("FAKE_NSYS_MODE") == "no-report":
        open(out + ".qdstrm", "wb").write(b"raw")
        print("Importer error: could not find the QdstrmImporter", file=sys.stderr)
    else:
        open(out + ".nsys-rep", "wb").write(b"report")
elif args[0] == "export":
    shutil.copy(os.environ["FAKE_NSYS_SQLITE"], args[args.index("-o") + 1])
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(FAKE_NSYS.replace("{python}", sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "calls.txt"))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(DATA / "nsys" / "mfu_2gpu_after.sqlite"))
    return tmp_path / "calls.txt"


def _run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    out = tmp_path / "run"
    (out / rundir.LOGS).mkdir(parents=True)
    manifest = rundir.Manifest(command=["python", "train.py"])
    session = ProfileSession(parse_command(["python", "train.py"]), Options(), out, manifest)
    ok = phase_timeline_nsys.run_timeline_nsys(session)
    return ok, out, manifest, session.warnings


def test_an_nsys_export_is_the_timeline(tmp_path, monkeypatch, fake_nsys):
    ok, out, manifest, warnings = _run(tmp_path, monkeypatch)
    assert ok and not warnings
    assert (out / rundir.TRACE_NSYS).is_file()
    profile_call = fake_nsys.read_text().splitlines()[0]
    assert "--capture-range=nvtx --nvtx-capture=kerneltriage.capture" in profile_call
    assert (
        "--pytorch=autograd-nvtx" in profile_call
        and "-m kerneltriage.profile.runner train.py" in profile_call
    )
    assert manifest.phases.timeline.tool == "nsys"
    (out / rundir.MANIFEST).write_text(json.dumps(manifest.to_json()))
    reports = build_reports(out, gpu="H100-SXM")
    assert sorted(reports) == [0, 1]  # every device of the export is a rank
    assert any(c.kind == "communication" for c in reports[0].candidates)


def test_recording_without_a_report_falls_back(tmp_path, monkeypatch, fake_nsys):
    monkeypatch.setenv("FAKE_NSYS_MODE", "no-report")
    ok, out, _, warnings = _run(tmp_path, monkeypatch)
    assert not ok
    assert any("nsys produced no report" in w and "PyTorch profiler" in w for w in warnings)
    assert not (out / rundir.TRACE_NSYS).exists()


def test_without_nsys_the_pytorch_profiler_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(phase_timeline_nsys, "find_nsys", lambda: None)
    ok, _, _, warnings = _run(tmp_path, monkeypatch)
    assert not ok and any("nsys not found" in w for w in warnings)
