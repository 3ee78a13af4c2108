"""Where a profile's process starts go: the script alone, and under Nsight Compute in the ways
phase 2 could run it.

Takes a run directory made by ``kerneltriage profile`` (with counters) and runs its script
again, one process per variant, each timed from spawn to exit with the runner's milestones
(``wall`` in the status file: torch imported, script started, first step, warm-up done, ncu
range, finished):

- ``alone``: a timing process (warm-up, plain steps, host steps), no ncu;
- ``ncu``: phase 2's per-configuration pass as ``profile`` runs it;
- ``ncu-off``: the same with ``--profile-from-start off``, profiling switched on by the runner
  at the profiled step only;
- ``ncu-off-w1``: that with one warm-up step instead of the run's;
- ``timing-under-ncu``: a timing process under ncu with profiling never switched on: are the
  plain steps under ncu's injection the script's own?

    python benchmarks/probes/ncu_start_cost.py RUN_DIR OUT_DIR [--variants alone,ncu-off]

Needs: a CUDA GPU, Nsight Compute's ncu on PATH, the run's script and its dependencies, run
from the directory the run was profiled in. OUT_DIR gets ``ncu_start_cost.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.command import parse_command
from kerneltriage.profile.processes import child_env

VARIANTS = ("alone", "ncu", "ncu-off", "ncu-off-w1", "timing-under-ncu")
PROFILED = re.compile(r"==PROF== Profiling")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    manifest = json.loads((args.run / "manifest.json").read_text())
    ncu_phase = manifest["phases"]["ncu"]
    passes = ncu_phase.get("passes") or []
    config_pass = next((p for p in passes if not p["stem"].startswith("ncu.launches")), passes[-1])
    command = parse_command(manifest["command"])
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    ncu = ncu_tools.find_ncu() or "ncu"
    base = json.loads((args.run / "logs" / "config.ncu.json").read_text())
    timing_config = args.run / "logs" / "config.timing.json"
    timing = json.loads(timing_config.read_text()) if timing_config.is_file() else None
    results = []
    for name in args.variants.split(","):
        if name in ("alone", "timing-under-ncu"):
            if timing is None:
                print(f"{name}: the run timed no extra process (no config.timing.json)", file=sys.stderr)
                continue
            config = dict(timing, out=str(work / name))
        else:
            config = dict(base, out=str(work / name))
            config["profiler_api"] = name.startswith("ncu-off")
            if name == "ncu-off-w1":
                config["warmup"] = 1
        Path(config["out"]).mkdir(parents=True, exist_ok=True)
        config_path = work / f"config.{name}.json"
        config_path.write_text(json.dumps(config))
        app = command.with_runner()
        if name == "alone":
            cmd = app
        elif name == "timing-under-ncu":
            cmd = ncu_tools.ncu_command(
                ncu, work / name / "ncu", config_pass["kernels"], ncu_phase["metrics"], app, from_start=False
            )
        else:
            cmd = ncu_tools.ncu_command(
                ncu,
                work / name / "ncu",
                config_pass["kernels"],
                ncu_phase["metrics"],
                app,
                from_start=name == "ncu",
            )
        results.append(_run(name, cmd, config_path, Path(config["out"])))
        print(_line(results[-1]), flush=True)
    (args.out / "ncu_start_cost.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "ncu_start_cost.txt").write_text("\n".join(_line(r) for r in results) + "\n")
    return 0


def _run(name: str, cmd: list[str], config: Path, out: Path) -> dict:
    started = time.time()
    proc = subprocess.run(cmd, env=child_env(config), capture_output=True, text=True, check=False)
    seconds = time.time() - started
    (out / "stdout.txt").write_text(proc.stdout)
    (out / "stderr.txt").write_text(proc.stderr)
    status_files = sorted((out / "logs").glob("status.*.rank0.json"))
    status = json.loads(status_files[0].read_text()) if status_files else {}
    plain = ((status.get("step_times") or {}).get("plain_ms")) or []
    return {
        "variant": name,
        "seconds": round(seconds, 2),
        "exit_code": proc.returncode,
        "launches_profiled": len(PROFILED.findall(proc.stdout + proc.stderr)),
        "wall": status.get("wall"),
        "plain_median_ms": round(statistics.median(plain), 3) if plain else None,
        "plain_ms": plain,
        "host_issue_ms": status.get("host_issue_ms"),
        "command": " ".join(cmd[:12]) + (" …" if len(cmd) > 12 else ""),
    }


def _line(r: dict) -> str:
    wall = " ".join(f"{k} {v:.1f}" for k, v in (r["wall"] or {}).items())
    plain = f", plain median {r['plain_median_ms']} ms" if r["plain_median_ms"] else ""
    return (
        f"{r['variant']:>17}: {r['seconds']:6.1f} s, exit {r['exit_code']}, "
        f"{r['launches_profiled']} launches profiled{plain}; milestones (s): {wall}"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
