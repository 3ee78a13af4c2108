#!/usr/bin/env bash
# How much does the step time move between processes of the same script? N runs of the script
# alone (its own step times, steady state cut by kerneltriage's rule) and N `kerneltriage
# profile --no-ncu` runs of it (the report's step time and interval). A report's interval
# comes from one process; this shows how far a second process may land from it.
#
#   bash benchmarks/gpu_processes.sh OUT_DIR -- python examples/train_hf_qwen2.py --steps 100
#   N=3 bash benchmarks/gpu_processes.sh OUT_DIR -- CMD…
#
# Needs: a CUDA GPU (measured on an 80 GB H100), torch with CUDA, what the script needs;
# kerneltriage's dependencies. OUT_DIR gets processes.txt (one line per process) and
# processes.json.
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
[ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
N=${N:-2}
WORK=$(mktemp -d)
for i in $(seq 1 "$N"); do
  KT_EXAMPLE_STATS="$WORK/alone.$i.jsonl" "$@" >"$WORK/alone.$i.log" 2>&1
  python3 -m kerneltriage profile --no-ncu --out "$WORK/run$i" -- "$@" >"$WORK/profile.$i.log" 2>&1
  python3 -m kerneltriage report "$WORK/run$i" --format json -o "$WORK/report.$i.json" 2>/dev/null
done
python3 - "$WORK" "$N" "$OUT" <<'PY' | tee "$OUT/processes.txt"
import json, os, sys
from kerneltriage.analysis.timeline import steady
work, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for i in range(1, n + 1):
    steps = json.loads(open(f"{work}/alone.{i}.jsonl").read().splitlines()[-1])["step_ms"]
    s = steady.steady(steps[3:])
    rep = json.load(open(f"{work}/report.{i}.json"))
    status = json.load(open(f"{work}/run{i}/logs/status.timeline.rank0.json"))
    row = {
        "alone_median_ms": round(s.median, 2), "alone_interval_ms": [round(s.low, 2), round(s.high, 2)],
        "alone_steps": len(s.values), "alone_cut": s.skipped,
        "report_step_ms": round(rep["step_time_ms"], 2), "report_interval_ms": rep.get("step_interval_ms"),
        "report_cut": rep.get("step_transient"), "plain_steps": status.get("plain_steps"),
        "plain_extended": status.get("plain_extended"),
    }
    rows.append(row)
    print(f"process pair {i}: alone {row['alone_median_ms']} ms {row['alone_interval_ms']} ({row['alone_steps']} steady, "
          f"{row['alone_cut']} cut) · report {row['report_step_ms']} ms {row['report_interval_ms']} "
          f"({row['plain_steps']} plain, {row['plain_extended']} added, {row['report_cut']} cut)")
json.dump(rows, open(f"{out}/processes.json", "w"), indent=2)
PY
