#!/usr/bin/env bash
# Does `kerneltriage calibrate --run RUN` find the matmul peak the run's own GEMMs reach?
# Calibrates with the GEMM shapes of RUN (default examples/runs/gpt2-eager-h100) on a copy of
# that run (so the manifest it records into is a scratch one), then runs `kerneltriage report`
# of the copy, whose ceilings are then the calibration's. BENCHMARKS.md's "calibrate --run"
# table comes from it (under 2 minutes on an H100).
#
#   bash benchmarks/calibrate_run.sh OUT_DIR [RUN]
#
# Needs: a CUDA GPU; torch with CUDA and triton; kerneltriage's dependencies (pip install -e .).
#
# OUT_DIR gets calibration.json (every shape's TFLOP/s), calibrate.txt (the command's own
# lines), gpu.txt (name, max SM clock, power limit), report.json and summary.txt.
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
RUN=$(cd "${2:-$(dirname "$0")/../examples/runs/gpt2-eager-h100}" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SCRATCH=$(mktemp -d)
cp -r "$RUN" "$SCRATCH/run"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >"$OUT/gpu.txt" 2>&1
python3 -m kerneltriage calibrate --run "$SCRATCH/run" --json >"$OUT/calibration.json" 2>"$OUT/calibrate.txt"
echo "calibrate exit $?" >>"$OUT/calibrate.txt"
python3 -m kerneltriage report "$SCRATCH/run" --format json -o "$OUT/report.json" 2>"$OUT/report.txt"
echo "report exit $?" >>"$OUT/report.txt"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
cal = json.load(open(f"{out}/calibration.json"))
print(cal["gpu"], "copy", cal["hbm_gbs"], "GB/s; peaks", cal["peak_tflops"])
for m in cal["matmul"]:
    print(f"  {m['precision']:12s} {m['shape']:>20s} {m['tflops']:7.1f} TFLOP/s ({m['from']})")
rep = json.load(open(f"{out}/report.json"))
rep = rep[0] if isinstance(rep, list) else rep
print("report ceilings:", rep["gpu"]["ceiling_tflops"].get("bf16"), "bf16;", rep["gpu"]["source"])
print("raised:", [w for w in rep.get("warnings", []) if "raises it" in w])
for c in rep["candidates"]:
    if c["kind"] == "gemm":
        print(f"  {c['id']:4s} headroom {c['headroom']:.3f} {c['verdict']} ({c['reason']})")
PY
