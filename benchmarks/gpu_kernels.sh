#!/usr/bin/env bash
# The built-in kernels on one GPU (issue 20): correctness first, then host and GPU time of the
# norms and the attention sweeps. Three calls of at most 5 minutes each:
#
#   PHASE=1  pytest tests/kernels on the GPU (fast launch path included); bench_norms.py at
#            4096x1024 and 16384x4096 (ours, ours through Triton's own launch path, F.*, Liger;
#            host µs beside GPU µs); bench_attention.py sweep at D128 (configs, TMA, WS)
#   PHASE=2  benchmarks/probes/launch_overhead.py (where a norm call's host time goes), the fast
#            launch, host overhead and compile tests, bench_norms.py again
#   PHASE=3  the probe, tests and norms again (after the bound per-signature path), then
#            bench_attention.py: causal and window variants against SDPA and FlexAttention, the
#            D128 table at S 2048-8192
#   PHASE=4  a short re-check: the probe and tests/kernels/test_fast_launch.py
#
#   run: command "PHASE=1 bash benchmarks/gpu_kernels.sh", carry [".whl"], timeout_s 300
#
# $OUT gets the JSON of each benchmark, their logs, and summary.txt.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
PHASE=${PHASE:-1}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
START=$SECONDS
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((${BUDGET_S:-285} - (SECONDS - START))); }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    >"$OUT/pip.log" 2>&1 || say "pip install of .whl failed"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
say "== phase $PHASE $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
say "$(python3 -c 'import importlib.metadata as m; print("liger-kernel", m.version("liger-kernel"))' 2>&1 | tail -1)"

if [ "$PHASE" = 1 ]; then
  timeout "${TEST_S:-110}" python3 -m pytest -q -x -p no:cacheprovider tests/kernels --durations=5 \
    >"$OUT/pytest.log" 2>&1
  say "pytest tests/kernels: rc $? — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
  timeout "${NORMS_S:-80}" python3 benchmarks/bench_norms.py --out "$OUT/norms.json" \
    --shapes 4096x1024,16384x4096 --methods ours,ours-triton,torch,liger --checks shapes --no-compile \
    --deadline-s $((${NORMS_S:-80} - 15)) >"$OUT/norms.log" 2>&1
  say "bench_norms: rc $?"
  sed -n '/GPU µs (kernels only/,$p' "$OUT/norms.log" >>"$SUMMARY"
  b=$(($(left) - 10))
  timeout "$b" python3 benchmarks/bench_attention.py --out "$OUT/attention_sweep.json" --parts sweep \
    --sweep-groups "${SWEEP_GROUPS:-128:0,128:1}" --budget-s $((b - 20)) >"$OUT/attention_sweep.log" 2>&1
  say "bench_attention sweep: rc $?"
  sed -n '/^# /,$p' "$OUT/attention_sweep.log" >>"$SUMMARY"
elif [ "$PHASE" = 4 ]; then  # a short re-check: the probe and the fast-path tests
  timeout 40 python3 benchmarks/probes/launch_overhead.py --out "$OUT/launch_overhead.json" \
    >"$OUT/launch_overhead.log" 2>&1
  say "launch_overhead probe: rc $?"
  sed -n '1,60p' "$OUT/launch_overhead.log" >>"$SUMMARY"
  timeout 45 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fast_launch.py >"$OUT/pytest.log" 2>&1
  say "pytest (fast launch): rc $? — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
elif [ "$PHASE" = 2 ]; then
  timeout 60 python3 benchmarks/probes/launch_overhead.py --out "$OUT/launch_overhead.json" \
    >"$OUT/launch_overhead.log" 2>&1
  say "launch_overhead probe: rc $?"
  sed -n '1,40p' "$OUT/launch_overhead.log" >>"$SUMMARY"
  timeout "${TEST_S:-90}" python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_fast_launch.py \
    tests/kernels/norms/test_host_overhead.py tests/kernels/test_compile.py >"$OUT/pytest.log" 2>&1
  say "pytest (fast launch, host overhead, compile): rc $? — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
  timeout "${NORMS_S:-100}" python3 benchmarks/bench_norms.py --out "$OUT/norms.json" \
    --shapes 4096x1024,16384x4096 --methods ours,ours-triton,torch --checks shapes --no-compile \
    --deadline-s $((${NORMS_S:-100} - 15)) >"$OUT/norms.log" 2>&1
  say "bench_norms: rc $?"
  sed -n '/GPU µs (kernels only/,$p' "$OUT/norms.log" >>"$SUMMARY"
else
  timeout 40 python3 benchmarks/probes/launch_overhead.py --out "$OUT/launch_overhead.json" \
    >"$OUT/launch_overhead.log" 2>&1
  say "launch_overhead probe: rc $?"
  sed -n '1,36p' "$OUT/launch_overhead.log" >>"$SUMMARY"
  timeout 45 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fast_launch.py \
    tests/kernels/norms/test_host_overhead.py >"$OUT/pytest.log" 2>&1
  say "pytest (fast launch, host overhead): rc $? — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
  timeout 50 python3 benchmarks/bench_norms.py --out "$OUT/norms.json" \
    --shapes 4096x1024,16384x4096 --methods ours,torch --checks shapes --no-compile \
    --deadline-s 35 >"$OUT/norms.log" 2>&1
  say "bench_norms: rc $?"
  sed -n '/GPU µs (kernels only/,$p' "$OUT/norms.log" >>"$SUMMARY"
  b=$(($(left) - 8))
  timeout "$b" python3 benchmarks/bench_attention.py --out "$OUT/attention.json" \
    --parts "${PARTS:-variants,table}" --table-d "${TABLE_D:-128}" --table-s "${TABLE_S:-2048,4096,8192}" \
    --variants "${VARIANTS:-causal,causal+window1024}" --budget-s $((b - 15)) \
    >"$OUT/attention.log" 2>&1
  say "bench_attention: rc $?"
  sed -n '/^# /,$p' "$OUT/attention.log" >>"$SUMMARY"
fi
say "== done in $((SECONDS - START)) s"
