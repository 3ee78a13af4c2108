"""The run directory's manifest: one typed model, read and written in the format on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerneltriage import rundir
from kerneltriage.errors import RunDirError

RUNS = sorted(p for p in (Path(__file__).parents[1] / "examples" / "runs").iterdir() if rundir.is_run_dir(p))


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_a_shipped_manifest_reads_typed_and_writes_back_what_it_read(run, tmp_path):
    manifest = rundir.read_manifest(run)
    on_disk = json.loads((run / rundir.MANIFEST).read_text())
    assert isinstance(manifest.phases.timeline, rundir.TimelinePhase)
    assert manifest.phases.timeline.seconds == on_disk["phases"]["timeline"]["seconds"]
    ncu = manifest.phases.ncu
    if "ncu" in on_disk["phases"]:
        assert ncu is not None and ncu.kernels == on_disk["phases"]["ncu"]["kernels"]
        assert ncu.ncu_exit_code == on_disk["phases"]["ncu"]["ncu_exit_code"]
        assert ncu.launches_exit_code == on_disk["phases"]["ncu"]["ncu.launches_exit_code"]
    else:  # profiled with --no-ncu: the timeline only
        assert ncu is None
    assert manifest.schedule.ncu_rank == on_disk["schedule"]["ncu_rank"]
    rundir.write_manifest(tmp_path, manifest)
    written = json.loads((tmp_path / rundir.MANIFEST).read_text())
    # Every key as it was (an older manifest gains only the empty ``warnings``).
    assert {k: v for k, v in written.items() if k in on_disk} == on_disk
    assert set(written) - set(on_disk) <= {"warnings"}
    assert rundir.read_manifest(tmp_path).to_json() == written


def test_a_pass_records_under_its_file_stem():
    ncu = rundir.NcuPhase()
    ncu.record_pass("ncu.launches", seconds=1.5, exit_code="timeout")
    ncu.record_pass("ncu", exit_code=0)
    assert ncu.to_json() == {
        "ncu.launches_seconds": 1.5,
        "ncu.launches_exit_code": "timeout",
        "ncu_exit_code": 0,
    }


def test_a_field_of_the_wrong_type_is_one_line_naming_it(tmp_path):
    run = RUNS[0]
    data = json.loads((run / rundir.MANIFEST).read_text())
    data["phases"]["timeline"]["step_time"] = {"plain_median_ms": -5}
    (tmp_path / rundir.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(
        RunDirError, match=r"manifest\.json\.phases\.timeline\.step_time\.plain_median_ms"
    ) as err:
        rundir.read_manifest(tmp_path)
    assert len(str(err.value).splitlines()) == 1


def test_phases_set_one_by_one_hold_only_phases():
    """``profile`` sets each phase as it ends (validated assignment): the manifest and the
    closing "wrote …" line name those phases and nothing else."""
    manifest = rundir.Manifest()
    manifest.phases.timeline = rundir.TimelinePhase(seconds=10.8)
    manifest.phases.ncu = rundir.NcuPhase(ncu_seconds=2.0)
    assert list(manifest.to_json()["phases"]) == ["timeline", "ncu"]
    assert list(manifest.phases.seconds()) == ["timeline", "ncu"]
    # an unknown phase read from a manifest is kept, typed as a mapping
    read = rundir.Phases.model_validate({"timeline": {"seconds": 1.0}, "warmup": {"seconds": 2}})
    read.calibrate = rundir.CalibratePhase(seconds=0.5)
    assert read.to_json() == {
        "timeline": {"seconds": 1.0},
        "warmup": {"seconds": 2},
        "calibrate": {"seconds": 0.5},
    }
    with pytest.raises(ValueError):
        rundir.Phases.model_validate({"warmup": 3})
