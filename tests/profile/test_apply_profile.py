"""`kerneltriage profile --apply RUN[:C1,C3]` on the CPU: the recorded command profiled again
with the fixes installed by verify's runner before the script runs, into a run directory whose
manifest records them; a fix that cannot be applied stops it with one line naming the fix."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage import rundir
from kerneltriage import verify_record as record
from kerneltriage.cli import main

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # each profile runs the script in a fresh Python (about 15 s)

SCRIPT = """
import json, sys, torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
seen = {}
for step in range(40):
    loss = model(torch.randn(16, 32)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    seen["fused"] = bool(opt.defaults.get("fused"))
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
"""


def profile(*args):
    return CliRunner().invoke(main, ["profile", "-q", *map(str, args)], catch_exceptions=False)


def _entry(cid: str, status: str, apply: dict | None, predicted: float, realized: float | None) -> dict:
    return {
        "id": cid,
        "name": f"candidate {cid}",
        "recipe_id": {"fused-optimizer": "fused-optimizer", "channels-last": None}.get(
            (apply or {}).get("kind")
        ),
        "how": f"runner: {(apply or {}).get('kind')}" if apply else "not applied",
        "apply": apply,
        "predicted_saving_share": predicted,
        "realized_saving_share": realized,
        "status": status,
    }


def write_verify(run: Path, entries: list[dict]) -> None:
    data = record.VerifyFile.model_validate(
        {
            "schema": record.SCHEMA,
            "run": str(run),
            "settings": {
                "repeats": 1,
                "warmup": 1,
                "steps": 3,
                "loss_steps": 2,
                "loss_rtol": 0.005,
                "seed": 0,
            },
            "candidates": entries,
        }
    )
    record.write(run, data)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A CPU run of the tiny script, and its verify.json: two fixes verified, one refuted."""
    where = tmp_path_factory.mktemp("ladder")
    script = where / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run = where / "first"
    result = profile(
        "--cpu", "--out", run, "--warmup", "1", "--steps", "2", "--timing-steps", "2",
        "--", sys.executable, script, where / "seen.first.json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    write_verify(
        run,
        [
            _entry("C1", "verified", {"kind": "fused-optimizer"}, 0.10, 0.08),
            _entry("C2", "verified", {"kind": "channels-last"}, 0.05, 0.04),
            _entry("C3", "refuted", {"kind": "tf32"}, 0.03, -0.01),
        ],
    )
    return run


def test_profile_apply_installs_the_verified_fixes_and_records_them(first, tmp_path):
    out = tmp_path / "second"
    result = profile(
        "--cpu", "--apply", first, "--out", out, "--warmup", "1", "--steps", "2", "--timing-steps", "2"
    )
    assert result.exit_code == 0, result.output
    manifest = rundir.read_manifest(out)
    assert [f.id for f in manifest.applied_fixes] == ["C1", "C2"]  # the refuted C3 left out
    fused = manifest.applied_fixes[0]
    assert fused.apply == {"kind": "fused-optimizer"} and fused.recipe_id == "fused-optimizer"
    assert (fused.predicted_saving_share, fused.realized_saving_share, fused.status) == (
        0.10,
        0.08,
        "verified",
    )
    assert manifest.parent_run == str(first.resolve())
    assert manifest.command == rundir.read_manifest(first).command
    assert manifest.status == "ok"
    # The fix acted in the script's process: its Adam was built fused.
    seen = json.loads((first.parent / "seen.first.json").read_text())
    assert seen == {"fused": True}
    # The written manifest says so too, and the first run's does not.
    on_disk = json.loads((out / rundir.MANIFEST).read_text())
    assert [f["id"] for f in on_disk["applied_fixes"]] == ["C1", "C2"]
    assert "applied_fixes" not in json.loads((first / rundir.MANIFEST).read_text())
    assert "kerneltriage diff" in result.output


def test_profile_apply_of_named_candidates_defaults_its_out_beside_the_run(first):
    result = profile(
        "--cpu", "--apply", f"{first}:C2", "--warmup", "1", "--steps", "2", "--timing-steps", "2"
    )
    assert result.exit_code == 0, result.output
    out = first.parent / "first-applied"
    assert [f.id for f in rundir.read_manifest(out).applied_fixes] == ["C2"]
    seen = json.loads((first.parent / "seen.first.json").read_text())
    assert seen == {"fused": False}  # C1 not applied this time


def test_a_fix_that_fails_to_apply_stops_profile_with_one_line_naming_it(first, tmp_path):
    bad = tmp_path / "bad"
    for f in ("manifest.json",):
        bad.mkdir(exist_ok=True)
        (bad / f).write_text((first / f).read_text())
    write_verify(
        bad, [_entry("C4", "verified", {"kind": "norm-swap", "classes": ["GemmaRMSNorm"]}, 0.1, 0.1)]
    )
    out = tmp_path / "bad-out"
    result = CliRunner().invoke(
        main,
        ["profile", "-q", "--cpu", "--apply", str(bad), "--out", str(out), "--warmup", "1", "--steps", "2"],
    )
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert len(errors) == 1, result.output
    assert "fix C4 (norm-swap) could not be applied" in errors[0] and "GemmaRMSNorm" in errors[0]
    assert "Traceback" not in result.output


def test_apply_without_verified_fixes_or_ids_is_refused(first, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / rundir.MANIFEST).write_text((first / rundir.MANIFEST).read_text())
    result = CliRunner().invoke(main, ["profile", "--cpu", "--apply", str(bare)])
    assert result.exit_code != 0
    assert "kerneltriage verify" in result.output and "C1,C3" in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_apply_and_a_command_together_are_a_usage_error(first):
    result = CliRunner().invoke(main, ["profile", "--apply", str(first), "--", sys.executable, "x.py"])
    assert result.exit_code == 2 and "give no COMMAND" in result.output


def test_a_fix_that_never_takes_effect_stops_profile_naming_it(first, tmp_path):
    run = tmp_path / "nocompile"
    run.mkdir()
    (run / rundir.MANIFEST).write_text((first / rundir.MANIFEST).read_text())
    write_verify(run, [_entry("C7", "verified", {"kind": "compile-mode", "mode": "max-autotune"}, 0.1, 0.1)])
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "-q",
            "--cpu",
            "--apply",
            str(run),
            "--out",
            str(tmp_path / "o"),
            "--warmup",
            "1",
            "--steps",
            "2",
        ],
    )
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert len(errors) == 1, result.output
    assert "fix C7 (compile-mode) did not take effect: the script never called torch.compile" in errors[0]
