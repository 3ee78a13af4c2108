"""Where a ``kerneltriage profile`` run's wall time went: by phase, by process, by milestone.

Reads run directories (no GPU needed; the runs come from ``kerneltriage profile`` on a GPU,
e.g. ``STAGES=profile bash benchmarks/gpu_ladder.sh OUT -- CMD``) and prints, as Markdown:

- each phase's seconds (timeline: phase 1 and the timing processes; ncu: its passes, launches);
- the parent's own work on the path between them: phase 1's traces finished and its step time
  recorded (before the timing processes start), phase 2's plan;
- each process of the script with its milestones, in seconds since its runner started: torch
  imported, at its gate (started with others, held at its first CUDA use), gate opened, first
  step ended, warm-up done, at its measure gate and that gate opened (an ncu process started
  beside another pass's, held before its profiled step), the ncu range, finished. "start-up" is what ran before the GPU
  was its own (the part that overlaps other processes when it was started with them).

    python benchmarks/profile_phases.py RUN [RUN ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MILESTONES = (
    "torch",
    "script",
    "at_gate",
    "gate_open",
    "step1",
    "warmup",
    "at_measure",
    "measure_open",
    "ncu_start",
    "ncu_end",
    "finished",
)


def describe(run: Path) -> list[str]:
    manifest = json.loads((run / "manifest.json").read_text())
    phases = manifest.get("phases") or {}
    timeline = phases.get("timeline") or {}
    ncu = phases.get("ncu") or {}
    gpu = (manifest.get("gpu") or {}).get("name", "?")
    lines = [f"### {run.name}: `{' '.join(manifest.get('command') or [])}` ({gpu})", ""]
    total = float(timeline.get("seconds") or 0) + float(ncu.get("seconds") or 0)
    lines.append(
        f"timeline {timeline.get('seconds', '—')} s, ncu {ncu.get('seconds', '—')} s "
        f"(sum {total:.1f} s; the profile's wall adds the hot-kernel choice and the exports)"
        + (f"; phase 2's plan {ncu['plan_seconds']} s" if ncu.get("plan_seconds") is not None else "")
    )
    if timeline.get("finish_seconds") is not None:
        fixups = ", ".join(
            f"{name} {stats['seconds']} s"
            for name, stats in (timeline.get("trace_fixup") or {}).items()
            if "seconds" in stats
        )
        lines.append(
            f"- after phase 1, before the later processes: {timeline['finish_seconds']} s in the parent"
            + (f" (traces finished: {fixups})" if fixups else "")
        )
    for p in ncu.get("passes") or []:
        between = p.get("profiling_s")
        per_launch = (
            f"; first to last profiled launch {between} s, {between / (p['launches'] - 1):.3f} s a launch"
            if between is not None and (p.get("launches") or 0) > 1
            else ""
        )
        lines.append(
            f"- ncu pass `{p['stem']}`: {p.get('launches')} launches in {p.get('seconds')} s "
            f"(from {p.get('start_s')} s into the phase{per_launch})"
        )
    lines += [
        "",
        "| process | " + " | ".join(MILESTONES) + " | start-up (s) |",
        "|---" * (len(MILESTONES) + 2) + "|",
    ]
    for status in sorted((run / "logs").glob("status.*.rank*.json")):
        wall = json.loads(status.read_text()).get("wall") or {}
        if not wall:
            continue
        start_up = wall.get("at_gate", wall.get("step1"))
        cells = [f"{wall[m]:.1f}" if m in wall else "" for m in MILESTONES]
        name = status.name[len("status.") : -len(".json")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {start_up if start_up is not None else ''} |")
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write the Markdown here too")
    args = parser.parse_args()
    missing = [r for r in args.runs if not (r / "manifest.json").is_file()]
    if missing:
        print(f"not a run directory (no manifest.json): {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    text = "\n".join(line for run in args.runs for line in describe(run))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
