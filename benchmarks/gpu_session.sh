#!/usr/bin/env bash
# One GPU session (device tool, single GPU): profile the examples with kerneltriage itself
# (naive attention, SDPA, built-in kernels), time their steps, train 200 steps with SDPA and
# with the built-in attention for the loss curves, and run the scaffolds' benchmarks.
#   carry: .whl (orjson, ijson[, liger] wheels for the image's Python 3.12)
# Everything lands in $OUT: runs.tgz (run directories without the large .ncu-rep files),
# extras.tgz (loss logs, scaffold benchmark JSON), summary.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/extras
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
KT="python3 -m kerneltriage"
LOG="$OUT/summary.txt"
say() { echo "$*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
$KT calibrate --json > /tmp/extras/calibration.json 2>>"$LOG" && say "calibrated: $(tr -d '\n ' < /tmp/extras/calibration.json)"

# name | flags
VARIANTS=${VARIANTS:-"naive:--attn naive|sdpa:--attn sdpa|builtin:--attn builtin --norm builtin"}
IFS='|' read -ra items <<< "$VARIANTS"
for item in "${items[@]}"; do
  name=${item%%:*}; flags=${item#*:}
  say "== $name ($flags)"
  t0=$(now); python3 examples/train_gpt.py --steps 6 $flags > /tmp/plain.log 2>&1; say "plain 6 steps: $(since $t0) s (rc $?)"
  python3 examples/train_gpt.py --steps 30 --time $flags 2>&1 | grep step_ms | tee -a "$LOG"
  t0=$(now)
  $KT profile -q --out runs/gpt-$name --force -- python3 examples/train_gpt.py --steps 12 $flags 2>&1 | tail -n 4 | tee -a "$LOG"
  say "profile wall: $(since $t0) s"
  python3 -c "import json; m=json.load(open('runs/gpt-$name/manifest.json')); print(json.dumps({'status': m['status'], 'phases': {k: {kk: vv for kk, vv in v.items() if kk not in ('metrics',)} for k, v in m['phases'].items()}}))" | tee -a "$LOG"
  $KT report runs/gpt-$name --top 8 --format markdown >> "$LOG" 2>&1
done
for attn in ${LOSS_RUNS-sdpa builtin}; do  # LOSS_RUNS="" skips the 200-step runs
  say "== 200 steps, $attn attention"
  python3 examples/train_gpt.py --steps 200 --attn $attn --loss-log /tmp/extras/loss_$attn.json --time 2>&1 | tail -n 2 | tee -a "$LOG"
done
if [ -n "${SCAFFOLDS:-}" ]; then
  for spec in $SCAFFOLDS; do  # e.g. "gpt-naive:C1 gpt-naive:C3"
    run=${spec%%:*}; cand=${spec#*:}
    say "== scaffold $run $cand"
    $KT scaffold runs/$run $cand --out /tmp/scaffold_${run}_$cand --force >> "$LOG" 2>&1
    (cd /tmp/scaffold_${run}_$cand && timeout 150 python3 bench.py --json /tmp/extras/bench_${run}_$cand.json 2>&1 | tail -n 25) | tee -a "$LOG"
  done
fi
tar czf "$OUT/runs.tgz" --exclude='*.ncu-rep' runs
tar czf "$OUT/extras.tgz" -C /tmp extras
say "== done $(date -u +%FT%TZ)"
