"""The reports of the shipped runs (examples/runs/) say what they said: step time, and per
candidate its kind, verdict, reason, fix recipe and expected saving, in the report's order,
as ``tests/data/shipped_verdicts.json`` records them (``scripts/shipped_verdicts.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("shipped_verdicts", ROOT / "scripts" / "shipped_verdicts.py")
assert _spec is not None and _spec.loader is not None
shipped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shipped)


@pytest.fixture(scope="module")
def found() -> dict:
    return shipped.current()


def test_every_shipped_run_reports_the_recorded_verdicts(found):
    changes = shipped.differences(shipped.load(), found)
    assert not changes, (
        "the shipped runs' reports changed:\n" + "\n".join(changes) + "\n" + shipped.REGENERATE
    )


def test_the_file_covers_every_shipped_run_and_rank(found):
    runs = sorted(p.name for p in shipped.RUNS.iterdir() if p.is_dir())
    recorded = shipped.load()
    assert {name.split(" rank ")[0] for name in recorded} == set(runs)
    assert "gpt-ddp-2gpu-h200 rank 1" in recorded  # a run of two ranks: each rank's report
    # the file is the script's own text of what it holds: regenerated, it reads the same
    assert shipped.EXPECTED.read_text() == shipped.dumps(recorded)


def test_a_change_is_named_by_run_and_candidate(found):
    run = "gpt-naive-h200"
    changed = json.loads(json.dumps(found))
    rows = changed[run]["candidates"]
    first, was = rows[0], dict(rows[0])
    first["verdict"] = "write" if was["verdict"] != "write" else "skip"
    rows.append({**rows[-1], "id": "C99"})
    changed[run]["step_ms"] += 1.0
    lines = shipped.differences(found, changed)
    assert lines == [
        f"{run}: step time {found[run]['step_ms']} → {changed[run]['step_ms']} ms",
        f"{run} {first['id']}: verdict {was['verdict']} → {first['verdict']}",
        f"{run} C99: new ({shipped._brief(rows[-1])})",
    ]


def test_reason_codes_drop_the_figures_a_sentence_names():
    from kerneltriage.analysis.vocabulary import Reason

    assert shipped.reason_code(Reason.COLD) == "cold"
    sentence = Reason.SDPA_FASTER.text(sdpa=407, built=340)
    assert shipped.reason_code(sentence) == "sdpa-faster"
    assert shipped.reason_code(Reason.SDPA_FASTER.text(sdpa=500, built=300)) == "sdpa-faster"
    assert shipped.reason_code("a reason of a user's rules file") == "a reason of a user's rules file"
