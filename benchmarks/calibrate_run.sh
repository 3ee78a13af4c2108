#!/usr/bin/env bash
# Does `kerneltriage calibrate --run RUN` find the matmul peak the run's own GEMMs reach? One
# GPU call (torch with CUDA, under 2 minutes): calibrate with examples/runs/gpt2-eager-h100's
# GEMM shapes on a copy of that run (so the manifest it records into is a scratch one), then
# `kerneltriage report` of the copy, whose ceilings are then the calibration's.
#
#   run: command "bash benchmarks/calibrate_run.sh", kind nvidia-h100-x1, carry [".whl"]
#        (an orjson wheel for the image's Python), timeout_s 150
#
# $OUT gets calibration.json (the measurement: every shape's TFLOP/s), calibrate.txt (the
# command's own lines), report.json and summary.txt.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
RUN=${RUN:-examples/runs/gpt2-eager-h100}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    >"$OUT/pip.log" 2>&1 || echo "pip install of .whl failed (see pip.log)"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export XDG_CACHE_HOME=/tmp/kt-cache
rm -rf /tmp/kt-run && cp -r "$RUN" /tmp/kt-run
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >"$OUT/gpu.txt" 2>&1
python3 -m kerneltriage.cli calibrate --run /tmp/kt-run --json >"$OUT/calibration.json" 2>"$OUT/calibrate.txt"
echo "calibrate exit $?" >>"$OUT/calibrate.txt"
python3 -m kerneltriage.cli report /tmp/kt-run --format json -o "$OUT/report.json" 2>"$OUT/report.txt"
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
