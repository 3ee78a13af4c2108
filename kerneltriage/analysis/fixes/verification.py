"""What ``kerneltriage verify`` measured, put on the report's candidates (pure).

Each entry of ``RUN/verify.json`` goes to the candidate with its id (and name: a report made
with other rules numbers its candidates otherwise, and an entry is then left out with a
warning), when it measured the fix the report offers now (a newer version or other rules may
offer another; that entry is left out with a warning too). The ranking then uses the realized saving where a fix was verified; a fix refuted or
one that changes the model's results goes after every actionable candidate, like a skip.
"""

from __future__ import annotations

from typing import Any

from kerneltriage.analysis.model import Report

_KEYS = (
    "status",
    "why",
    "how",
    "recipe_id",
    "predicted_saving_share",
    "realized_saving_share",
    "realized_low",
    "realized_high",
    "baseline",
    "fixed",
    "loss_check",
    "partial",
    "run_as",
    "shared_with",
)


def attach(report: Report, data: dict[str, Any]) -> Report:
    """Put ``data`` (a ``verify.json`` object) on ``report``'s candidates and re-rank them."""
    by_id = {c.id.lower(): c for c in report.candidates}
    step = ((report.source.get("timing") or {}).get("host") or {}).get("fix")
    counts: dict[str, int] = {}
    for entry in data.get("candidates") or []:
        if step and str(entry.get("id", "")).lower() == str(step["id"]).lower():
            # The step-level fix of a step the host paces (not a row of the table).
            step["verification"] = {k: entry.get(k) for k in _KEYS}
            counts[entry.get("status", "not verified")] = (
                counts.get(entry.get("status", "not verified"), 0) + 1
            )
            continue
        c = by_id.get(str(entry.get("id", "")).lower())
        if c is None or (entry.get("name") and entry["name"] != c.name):
            report.warnings.append(
                f"verify.json has {entry.get('id')} ({entry.get('name')}), which is not this report's candidate "
                "of that id (made with other rules or thresholds?): its result is left out"
            )
            continue
        offered = (c.recipe or {}).get("id")
        if entry.get("recipe_id") and offered and entry["recipe_id"] != offered:
            report.warnings.append(
                f"verify.json measured {c.id} with the fix {entry['recipe_id']}, but the report now offers "
                f"{offered}: that result is left out; run `kerneltriage verify` again for the fix offered"
            )
            continue
        c.verification = {k: entry.get(k) for k in _KEYS}
        counts[entry.get("status", "not verified")] = counts.get(entry.get("status", "not verified"), 0) + 1
    if counts:
        said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        partial = "" if data.get("complete", True) else " (partial: verify was interrupted)"
        report.notes.append(
            f"verify.json: {said}{partial}; savings ranked by what was realized where measured"
        )
        report.source["verification"] = {
            "device": data.get("device"),
            "created": data.get("created"),
            "settings": data.get("settings"),
            "complete": data.get("complete", True),
        }
        report.step_processes = _baseline_processes(data)
    report.candidates.sort(key=_rank_key, reverse=True)
    for i, c in enumerate(report.candidates, 1):
        c.rank = i
    return report


def _baseline_processes(data: dict[str, Any]) -> dict[str, Any] | None:
    """The script's step time over verify's baseline processes (no profiler, several fresh
    processes): what a second run of the script may give, beside the one profiled process.
    The entry with the most baseline runs; None when no entry has two."""
    sides = [
        e["baseline"]
        for e in data.get("candidates") or []
        if isinstance(e.get("baseline"), dict) and (e["baseline"].get("runs") or 0) >= 2
    ]
    if not sides:
        return None
    best = max(sides, key=lambda b: b.get("runs") or 0)
    return {
        "runs": best.get("runs"),
        "median_ms": best.get("median_ms"),
        "low_ms": best.get("low_ms"),
        "high_ms": best.get("high_ms"),
        "run_medians_ms": best.get("run_medians_ms") or [],
    }


def saving(c) -> float:
    """The saving a candidate is ranked by: realized when its fix was verified, else predicted.
    A fix several candidates share is counted once, on the row it ran under: the others rank by
    their own predicted slice."""
    v = c.verification or {}
    if v.get("run_as"):
        return c.expected_saving_share
    if v.get("status") == "verified" and v.get("realized_saving_share") is not None:
        return float(v["realized_saving_share"])
    if v.get("shared_with") and v.get("predicted_saving_share") is not None:
        return max(c.expected_saving_share, float(v["predicted_saving_share"]))
    return c.expected_saving_share


def _rank_key(c) -> tuple:
    return (c.acted_on, saving(c) if c.acted_on else c.expected_saving_share, c.time_share)
