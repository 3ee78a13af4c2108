#!/usr/bin/env bash
# A training script's step times beside the GPU's clocks, power and throttle reasons: does a
# step-time shift inside one process follow the SM clock (power or thermal capping) or not?
#
#   bash benchmarks/gpu_clocks.sh OUT_DIR -- python examples/train_vit.py --model convnext_tiny --steps 300
#
# Needs: a CUDA GPU, nvidia-smi, torch; the example scripts' KT_EXAMPLE_STATS hook
# (examples/stepstats.py) for per-step times and host timestamps. Reads the card's state only:
# it never changes clocks or power limits. OUT_DIR gets clocks.csv (nvidia-smi every 100 ms),
# alone.jsonl (step times) and summary.txt (steps in windows of 10 beside the mean SM clock,
# power and the throttle reasons seen in that window).
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
FIELDS=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active
nvidia-smi -i "${CUDA_VISIBLE_DEVICES:-0}" --query-gpu=$FIELDS --format=csv,noheader,nounits -lms 100 >"$OUT/clocks.csv" 2>"$OUT/nvidia-smi.err" &
SAMPLER=$!
sleep 1
KT_EXAMPLE_STATS="$OUT/alone.jsonl" "$@" >"$OUT/alone.log" 2>&1 || echo "the script failed (alone.log)" | tee -a "$OUT/summary.txt"
sleep 1
kill "$SAMPLER" 2>/dev/null
wait "$SAMPLER" 2>/dev/null
python3 - "$OUT" "$*" <<'PY' | tee -a "$OUT/summary.txt"
import datetime as dt, json, os, statistics, sys

out, cmd = sys.argv[1], sys.argv[2]
samples = []
for line in open(os.path.join(out, "clocks.csv")):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 7:
        continue
    try:
        t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc).timestamp()
        samples.append((t, float(parts[1]), float(parts[3]), float(parts[4]), float(parts[5]), parts[6]))
    except ValueError:
        continue
print(f"== {cmd}")
if not samples:
    print("no clock samples (nvidia-smi.err)")
    sys.exit()
# nvidia-smi stamps local time; shift onto time.time() by the first sample's offset from UTC.
offset = 0.0
stats = [json.loads(l) for l in open(os.path.join(out, "alone.jsonl"))] if os.path.exists(os.path.join(out, "alone.jsonl")) else []
for st in stats:
    ms, wall = st.get("step_ms", []), st.get("step_wall", [])
    if not ms or not wall:
        print("no step timestamps")
        continue
    if abs(wall[0] - samples[0][0]) > 3600:
        offset = round((wall[0] - samples[0][0]) / 1800) * 1800
    print(f"power limit {samples[0][3]:.0f} W; steps {len(ms)}; median {statistics.median(ms):.2f} ms")
    print("steps       ms(median)  SM MHz  W      °C  throttle reasons")
    for i in range(0, len(ms), 10):
        chunk, t0, t1 = ms[i:i + 10], wall[i] - ms[i] / 1000, wall[min(i + 9, len(wall) - 1)]
        win = [s for s in samples if t0 <= s[0] + offset <= t1] or [min(samples, key=lambda s: abs(s[0] + offset - t1))]
        reasons = sorted({s[5] for s in win})
        print(f"{i + 1:4d}-{i + len(chunk):<4d}  {statistics.median(chunk):9.2f}  {statistics.mean(s[1] for s in win):6.0f}  "
              f"{statistics.mean(s[2] for s in win):5.0f}  {statistics.mean(s[4] for s in win):3.0f}  {' '.join(reasons)}")
PY
