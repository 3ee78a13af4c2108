#!/usr/bin/env bash
# Do the numbers hold up to a second run? One workload on one GPU: the script alone (its own
# step times), `kerneltriage profile` (phase 1 only: step, busy and idle time do not depend on
# the counters pass), `kerneltriage report RUN --format json`, then `kerneltriage verify RUN`
# VERIFY_CALLS times, each a fresh set of processes. summary.txt compares the script's steady
# median with the report's step time and interval, and each candidate's status across the
# verify calls (verified in one call and refuted in another is a failure; inconclusive beside a
# conclusive status is not).
#
#   bash benchmarks/gpu_steady.sh OUT_DIR -- python examples/train_hf_qwen2.py
#   VERIFY_CALLS=2 VERIFY_BUDGET_MIN=3.5 VERIFY_ARGS="--steps 15" bash benchmarks/gpu_steady.sh OUT -- CMD…
#   RUN=OUT_DIR/run VERIFY_CALLS=1 bash benchmarks/gpu_steady.sh OUT2      # verify an earlier run again
#
# Needs: a CUDA GPU (measured on an 80 GB H100), torch with CUDA, transformers for the HF
# examples, liger-kernel for Liger fixes; kerneltriage's dependencies. OUT_DIR gets
# summary.txt, alone.jsonl, report.json, verify.K.json and run.tgz (the run directory, to
# verify it again elsewhere with RUN=).
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
export PYTHONUNBUFFERED=1
KT="python3 -m kerneltriage"
VERIFY_CALLS=${VERIFY_CALLS:-3}
VERIFY_BUDGET_MIN=${VERIFY_BUDGET_MIN:-5}
VERIFY_ARGS=${VERIFY_ARGS:-}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)" | tee "$OUT/summary.txt"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee -a "$OUT/summary.txt"

if [ -z "${RUN:-}" ]; then
  RUN=$(mktemp -d)/run
  echo "-- the script alone: $*" | tee -a "$OUT/summary.txt"
  KT_EXAMPLE_STATS="$OUT/alone.jsonl" "$@" >"$OUT/alone.log" 2>&1 || echo "the script alone failed" | tee -a "$OUT/summary.txt"
  echo "-- kerneltriage profile --no-ncu" | tee -a "$OUT/summary.txt"
  /usr/bin/time -f "profile wall %e s" $KT profile --no-ncu --out "$RUN" -- "$@" >"$OUT/profile.log" 2>&1
  tail -1 "$OUT/profile.log" | tee -a "$OUT/summary.txt"
  $KT report "$RUN" --format json -o "$OUT/report.json" 2>>"$OUT/profile.log"
  $KT report "$RUN" 2>/dev/null | head -12 >"$OUT/report.txt"
  tar czf "$OUT/run.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
else
  RUN=$(cd "$RUN" && pwd)
fi
for k in $(seq 1 "$VERIFY_CALLS"); do
  rm -f "$RUN/verify.json"
  echo "-- kerneltriage verify $k" | tee -a "$OUT/summary.txt"
  # shellcheck disable=SC2086
  $KT verify "$RUN" --budget "$VERIFY_BUDGET_MIN" $VERIFY_ARGS >"$OUT/verify.$k.txt" 2>"$OUT/verify.$k.log"
  cp "$RUN/verify.json" "$OUT/verify.$k.json" 2>/dev/null
done
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, os, statistics, sys
from kerneltriage.analysis.timeline import steady
out = sys.argv[1]
alone = os.path.join(out, "alone.jsonl")
if os.path.exists(alone):
    steps = json.loads(open(alone).read().splitlines()[-1]).get("step_ms") or []
    s = steady.steady(steps[3:])
    rep = json.load(open(os.path.join(out, "report.json")))
    r = rep["ranks"][0] if "ranks" in rep else rep
    low, high = r.get("step_interval_ms") or (None, None)
    print(f"script alone: steady median {s.median:.2f} ms ({len(s.values)} steps, {s.skipped} cut) · "
          f"report: {r['step_time_ms']:.2f} ms, interval {low}–{high}, transient {r.get('step_transient')}, "
          f"ratio {r['step_time_ms'] / s.median:.3f}, covers: {low is not None and low <= s.median <= high}")
calls = sorted(glob.glob(os.path.join(out, "verify.*.json")))
table = {}
for path in calls:
    data = json.load(open(path))
    for c in data["candidates"]:
        table.setdefault(c["id"], []).append(
            f"{c['status']} {100 * (c.get('realized_saving_share') or 0):.1f}% "
            f"[{100 * (c.get('realized_low') or 0):.1f}, {100 * (c.get('realized_high') or 0):.1f}] "
            f"of {100 * (c.get('predicted_saving_share') or 0):.1f}%"
        )
    print(f"{os.path.basename(path)}: {data.get('seconds')} s, complete {data.get('complete')}")
for cid, row in table.items():
    flip = any(x.startswith("verified") for x in row) and any(x.startswith("refuted") for x in row)
    print(f"{cid}: " + " | ".join(row) + ("   ← FLIP" if flip else ""))
PY
