#!/usr/bin/env bash
# The built-in kernels on one H200 (issue 20's GPU kind), the issue's scripts as they are:
#
#   PHASE=attention  bench_attention.py: the D64/D128 table (S 1024-16384, causal or not) against
#                    SDPA and naive, and the variants against FlexAttention; plus a probe of the
#                    C++ build environment (compiler, ninja, stream handle) for the native node
#   PHASE=native     the C++ bound calls (kernels/native.py): build, tests/kernels/test_native.py,
#                    the fast-launch and norm tests, then the launch-overhead probe (Python pass,
#                    C++ pass)
#   PHASE=norms      the native and fast-launch tests, then bench_norms.py ($SHAPES, default
#                    4096x1024 and 16384x4096) against F.*, eager, torch.compile and Liger-Kernel
#
#   run: kind nvidia-h200, command "PHASE=attention bash benchmarks/gpu_kernels_h200.sh",
#        carry [".whl"], timeout_s 600
#
# .whl/ (git-ignored) carries orjson, pydantic, liger-kernel and ninja for the GPU image.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
PHASE=${PHASE:-attention}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
START=$SECONDS
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((${BUDGET_S:-580} - (SECONDS - START))); }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  >"$OUT/pip.log" 2>&1 || say "pip install of .whl failed"
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
say "== phase $PHASE $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
say "$(python3 -c 'import importlib.metadata as m; print("liger-kernel", m.version("liger-kernel"))' 2>&1 | tail -1)"

if [ "$PHASE" = attention ]; then
  b=$(($(left) - 10))
  timeout "$b" python3 benchmarks/bench_attention.py --out "$OUT/attention.json" \
    --parts "${PARTS:-table,variants}" --table-d "${TABLE_D:-64,128}" \
    --table-s "${TABLE_S:-1024,2048,4096,8192,16384}" --budget-s $((b - 15)) \
    >"$OUT/attention.log" 2>&1
  say "bench_attention: rc $?"
  sed -n '/^# /,$p' "$OUT/attention.log" >>"$SUMMARY"
elif [ "$PHASE" = native ]; then
  timeout 120 python3 benchmarks/probes/native_throw.py >"$OUT/native_throw.log" 2>&1
  say "native_throw probe: rc $?"; cat "$OUT/native_throw.log" >>"$SUMMARY"
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_native.py \
    tests/kernels/test_fast_launch.py tests/kernels/norms/test_norms.py --durations=5 >"$OUT/pytest.log" 2>&1
  rc=$?
  say "pytest (native, fast launch, norms): rc $rc — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
  [ $rc = 0 ] || grep -E "Error|error:|FAILED|assert" "$OUT/pytest.log" | head -40 >>"$SUMMARY"
  timeout 150 python3 benchmarks/probes/launch_overhead.py --out "$OUT/launch_overhead.json" \
    >"$OUT/launch_overhead.log" 2>&1
  say "launch_overhead probe: rc $?"
  sed -n '1,80p' "$OUT/launch_overhead.log" >>"$SUMMARY"
else
  timeout "${TEST_S:-300}" python3 -m pytest -q -p no:cacheprovider tests/kernels/test_native.py \
    tests/kernels/test_fast_launch.py >"$OUT/pytest.log" 2>&1
  rc=$?
  say "pytest (native, fast launch): rc $rc — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
  [ $rc = 0 ] || grep -E "^E |FAILED" "$OUT/pytest.log" | head -20 >>"$SUMMARY"
  b=$(($(left) - 10))
  timeout "$b" python3 benchmarks/bench_norms.py --out "$OUT/norms.json" \
    --shapes "${SHAPES:-4096x1024,16384x4096}" --methods "${METHODS:-ours,torch,eager,liger}" \
    --checks shapes --deadline-s $((b - 20)) >"$OUT/norms.log" 2>&1
  say "bench_norms: rc $?"
  sed -n '/GPU µs (kernels only/,$p' "$OUT/norms.log" >>"$SUMMARY"
fi
say "== done in $((SECONDS - START)) s"
