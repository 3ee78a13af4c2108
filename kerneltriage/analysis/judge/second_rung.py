"""The ladder's second rung: a run profiled with fixes applied (``profile --apply``). A `write`
verdict there stands after those fixes, which this very run measured: its note says which
cheaper options are ruled out and by what, as the method asks before a kernel is written."""

from __future__ import annotations

from typing import Any

from kerneltriage.analysis.judge.verdict_data import verdicts
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.vocabulary import Verdict


def rule_out_applied(candidates: list[Candidate], applied: list[dict[str, Any]] | None) -> None:
    """Add to the note of every `write` candidate with a headroom the fixes ``applied`` (the
    manifest's ``applied_fixes``) this run was profiled with: they did not bring it to its roof."""
    if not applied:
        return
    words = verdicts().second_rung
    fixes = []
    for f in applied:
        recipe = f.get("recipe_id") or (f.get("apply") or {}).get("kind")
        if f.get("status") == "verified" and f.get("realized_saving_share") is not None:
            fixes.append(
                words.verified.format(id=f["id"], recipe=recipe, realized=float(f["realized_saving_share"]))
            )
        else:
            fixes.append(words.fix.format(id=f["id"], recipe=recipe))
    for c in candidates:
        if c.verdict == Verdict.WRITE and c.headroom:
            line = words.ruled_out.format(fixes=", ".join(fixes), headroom=c.headroom)
            c.note = f"{c.note}; {line}" if c.note else line
