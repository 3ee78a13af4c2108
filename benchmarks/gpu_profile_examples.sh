#!/usr/bin/env bash
# On a GPU machine (the device tool): calibrate, time plain runs, profile the examples with
# `kerneltriage profile`, report on them. Writes tarballs of the run directories and a
# summary to $OUT (at most 8 files come back).
#   carry: .whl (orjson, ijson wheels for the image's Python 3.12)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
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
timeit() { local t0=$(date +%s.%N); "$@" > /tmp/timeit.log 2>&1; local rc=$?; local t1=$(date +%s.%N); echo "$(awk "BEGIN{print $t1-$t0}") rc=$rc"; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
say "== calibrate"; $KT calibrate --json > "$OUT/calibration.json" 2>>"$LOG"; cat "$OUT/calibration.json" | tee -a "$LOG"

for attn in ${ATTNS:-naive sdpa}; do
  say "== plain run, $attn attention, 6 steps (= warmup 3 + steps 3): wall s"
  say "$(timeit python3 examples/train_gpt.py --steps 6 --attn $attn)"
  say "== profile $attn"
  t0=$(date +%s.%N)
  $KT profile -q --out runs/gpt-$attn --force -- python3 examples/train_gpt.py --steps 12 --attn $attn 2>&1 | tail -n 5 | tee -a "$LOG"
  t1=$(date +%s.%N); say "profile total wall: $(awk "BEGIN{print $t1-$t0}") s"
  python3 -c "import json; m=json.load(open('runs/gpt-$attn/manifest.json')); print(json.dumps({'status': m['status'], 'phases': m['phases'], 'gpu': m['gpu'], 'versions': m['versions']}, indent=1))" | tee -a "$LOG"
  $KT report runs/gpt-$attn --top 8 --no-color --format markdown >> "$LOG" 2>&1
  tar czf "$OUT/gpt-$attn.tgz" -C runs gpt-$attn
done
say "== done $(date -u +%FT%TZ)"
