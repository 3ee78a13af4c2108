"""What a user acts on in the report of every shipped run, checked against
``tests/data/shipped_verdicts.json``:

    python scripts/shipped_verdicts.py            # compare: the differences, exit 1 on any
    python scripts/shipped_verdicts.py --write    # a deliberate change: write the file anew

Per run (per rank for a run of several): the step time to 0.1 ms, and per candidate in the
report's order its id, kind, verdict, reason code, fix recipe and expected saving to 0.1
percentage point. Every report is built in this one process through the Python API
(``kerneltriage.reports``, as ``kerneltriage report`` builds them); ``tests/test_shipped_verdicts.py``
runs the same comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "examples" / "runs"
EXPECTED = ROOT / "tests" / "data" / "shipped_verdicts.json"
SCHEMA = "kerneltriage.shipped-verdicts/1"
#: Said where the reports changed; the test says it too.
REGENERATE = "if the change is deliberate, rerun: python scripts/shipped_verdicts.py --write"


def reason_code(reason: str) -> str:
    """The reason's code: the code itself (``cold``), else the name of the sentence it fills
    (``sdpa-faster`` for "… SDPA measured faster … (407 vs 340 TFLOP/s)"): the figures a
    sentence names are left to the report. A reason no vocabulary word gives stays as it is."""
    from kerneltriage.analysis.vocabulary import Reason

    member = Reason.of(str(reason))
    if member is None:
        return str(reason)
    value = str(member.value)
    return value if " " not in value else member.name.lower().replace("_", "-")


def candidate_row(c: Any) -> dict[str, Any]:
    return {
        "id": c.id,
        "kind": c.kind,
        "verdict": str(c.verdict),
        "reason": reason_code(c.reason),
        "recipe": (c.recipe or {}).get("id"),
        "saving_pp": round(100 * c.expected_saving_share, 1),
    }


def current(runs: Path = RUNS) -> dict[str, Any]:
    """Every shipped run's verdicts, by run (and by rank where a run has several)."""
    import kerneltriage
    from kerneltriage.api import load_rules

    rules = load_rules()  # the shipped rules, read once for every run
    out: dict[str, Any] = {}
    for run in sorted(p for p in runs.iterdir() if p.is_dir()):
        by_rank = kerneltriage.reports(run, rules=rules, workers=1)  # this process: no worker start-up
        for rank, rep in by_rank.items():
            key = run.name if len(by_rank) == 1 else f"{run.name} rank {rank}"
            out[key] = {
                "step_ms": round(rep.step_time_ms, 1),
                "candidates": [candidate_row(c) for c in rep.candidates],
            }
    return out


def dumps(runs: dict[str, Any]) -> str:
    """The file's text: one line per candidate, so a change reads as a one-line diff."""
    lines = ["{", f'  "schema": {json.dumps(SCHEMA)},', '  "runs": {']
    for i, (name, run) in enumerate(runs.items()):
        lines.append(f"    {json.dumps(name)}: {{")
        lines.append(f'      "step_ms": {json.dumps(run["step_ms"])},')
        lines.append('      "candidates": [')
        rows = [f"        {json.dumps(c, ensure_ascii=False)}" for c in run["candidates"]]
        lines.append(",\n".join(rows))
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(runs) - 1 else ""))
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def differences(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """What changed, a line each: runs added or gone, step times, and per candidate (by id)
    the fields that changed, candidates added or gone, and the order where only it changed."""
    out: list[str] = []
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            out.append(f"{name}: run gone")
            continue
        if name not in expected:
            out.append(f"{name}: new run ({len(found[name]['candidates'])} candidates)")
            continue
        old, new = expected[name], found[name]
        if old["step_ms"] != new["step_ms"]:
            out.append(f"{name}: step time {old['step_ms']} → {new['step_ms']} ms")
        before = {c["id"]: c for c in old["candidates"]}
        after = {c["id"]: c for c in new["candidates"]}
        for cid in sorted(set(before) | set(after), key=_id_order):
            if cid not in after:
                out.append(f"{name} {cid}: gone (was {_brief(before[cid])})")
            elif cid not in before:
                out.append(f"{name} {cid}: new ({_brief(after[cid])})")
            else:
                changed = [
                    f"{k} {before[cid][k]} → {after[cid][k]}"
                    for k in before[cid]
                    if before[cid][k] != after[cid].get(k)
                ]
                if changed:
                    out.append(f"{name} {cid}: " + "; ".join(changed))
        order = ([c["id"] for c in old["candidates"]], [c["id"] for c in new["candidates"]])
        if order[0] != order[1] and set(order[0]) == set(order[1]):
            out.append(f"{name}: order {' '.join(order[0])} → {' '.join(order[1])}")
    return out


def _id_order(cid: str) -> tuple[int, str]:
    return (int(cid[1:]), cid) if cid[1:].isdigit() else (10**9, cid)


def _brief(c: dict[str, Any]) -> str:
    recipe = f" [{c['recipe']}]" if c["recipe"] else ""
    return f"{c['kind']}, {c['verdict']} ({c['reason']}){recipe}, saving {c['saving_pp']}%"


def load(path: Path = EXPECTED) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise SystemExit(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return data["runs"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {EXPECTED.relative_to(ROOT)} anew")
    args = parser.parse_args()
    start = time.perf_counter()
    found = current()
    took = time.perf_counter() - start
    count = sum(len(r["candidates"]) for r in found.values())
    if args.write:
        EXPECTED.write_text(dumps(found))
        print(f"wrote {EXPECTED.relative_to(ROOT)}: {len(found)} reports, {count} candidates ({took:.1f} s)")
        return 0
    changes = differences(load(), found)
    if not changes:
        print(f"unchanged: {len(found)} reports, {count} candidates ({took:.1f} s)")
        return 0
    print(f"{len(changes)} difference(s) from {EXPECTED.relative_to(ROOT)}:", *changes, REGENERATE, sep="\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
