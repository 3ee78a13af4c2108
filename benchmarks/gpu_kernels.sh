#!/usr/bin/env bash
# The built-in kernels on one GPU: correctness first, then the norms' and attention's speed
# and host time per call. BENCHMARKS.md's "Built-in norm kernels" and "Built-in flash attention"
# sections and its built-in kernel sections of 2026-11-22 (H100) and 2026-11-23 (H200) come
# from these parts.
#
#   bash benchmarks/gpu_kernels.sh OUT_DIR [PART ...]        # default parts: tests launch norms attention
#
# Parts, run in the order given:
#   tests      pytest tests/kernels on the GPU (outputs and gradients against float64 references,
#              the fast launch path and the C++ bound calls bit for bit against Triton's own launch)
#   launch     benchmarks/probes/launch_overhead.py: host µs per norm call, F.* against ours
#              through the Python path and the C++ bound calls (launch_overhead.json)
#   norms      benchmarks/bench_norms.py at $SHAPES against $METHODS and torch.compile
#              (norms.json); NO_COMPILE=1 leaves torch.compile out
#   attention  benchmarks/bench_attention.py --parts $ATTN_PARTS (default table,variants): the
#              D $TABLE_D × S $TABLE_S table against SDPA and naive, and $VARIANTS against
#              FlexAttention (attention.json)
#   sweep      benchmarks/bench_attention.py --parts sweep: explicit tile configurations with and
#              without TMA and warp specialization for $SWEEP_GROUPS (attention_sweep.json)
#   tiles      benchmarks/probes/norm_fwd_tiles.py: RMSNorm forward tiles at 32768x8192 against
#              torch.compile's kernel (norm_fwd_tiles.txt, Inductor's code in inductor.log)
#   native     benchmarks/probes/native_large.py: the C++ bound call against the Python path at
#              large shapes (native_large.txt)
#   throw      benchmarks/probes/native_throw.py: which errors cross from the C++ extension into
#              Python cleanly (native_throw.txt)
#
# Needs: a CUDA GPU; torch with CUDA and triton; kerneltriage's dependencies (pip install -e .)
# and pytest. Optional: liger-kernel (a baseline of `norms`; left out when it does not import),
# ninja and a C++ compiler (the C++ bound calls; without them the Python path is timed).
# Settings (environment): SHAPES (default 4096x1024,16384x4096,32768x8192), METHODS (default
# ours,torch,eager,liger), TABLE_D (64,128), TABLE_S (1024,2048,4096,8192,16384), VARIANTS
# (all of bench_attention.py's), SWEEP_GROUPS (128:0,128:1).
#
# OUT_DIR gets summary.txt (versions, the GPU, each part's exit status and tables) and each
# part's JSON and log.
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(tests launch norms attention)
cd "$(dirname "$0")/.."
SUMMARY="$OUT/summary.txt"
START=$SECONDS
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
say() { echo "$*" | tee -a "$SUMMARY"; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
say "$(python3 -c 'import importlib.metadata as m; print("liger-kernel", m.version("liger-kernel"))' 2>&1 | tail -1)"

for part in "${PARTS[@]}"; do
  case "$part" in
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/kernels --durations=5 >"$OUT/pytest.log" 2>&1
      say "pytest tests/kernels: rc $? — $(grep -E 'passed|failed|error' "$OUT/pytest.log" | tail -1)"
      ;;
    launch)
      python3 benchmarks/probes/launch_overhead.py --out "$OUT/launch_overhead.json" >"$OUT/launch_overhead.log" 2>&1
      say "launch_overhead: rc $?"
      sed -n '1,80p' "$OUT/launch_overhead.log" >>"$SUMMARY"
      ;;
    norms)
      # shellcheck disable=SC2046  # an empty word list when NO_COMPILE is unset
      python3 benchmarks/bench_norms.py --out "$OUT/norms.json" \
        --shapes "${SHAPES:-4096x1024,16384x4096,32768x8192}" --methods "${METHODS:-ours,torch,eager,liger}" \
        --checks shapes --deadline-s 3600 $([ -n "${NO_COMPILE:-}" ] && echo --no-compile) >"$OUT/norms.log" 2>&1
      say "bench_norms: rc $?"
      sed -n '/GPU µs (kernels only/,$p' "$OUT/norms.log" >>"$SUMMARY"
      ;;
    attention)
      python3 benchmarks/bench_attention.py --out "$OUT/attention.json" --parts "${ATTN_PARTS:-table,variants}" \
        --table-d "${TABLE_D:-64,128}" --table-s "${TABLE_S:-1024,2048,4096,8192,16384}" \
        ${VARIANTS:+--variants "$VARIANTS"} --budget-s 3600 >"$OUT/attention.log" 2>&1
      say "bench_attention: rc $?"
      sed -n '/^# /,$p' "$OUT/attention.log" >>"$SUMMARY"
      ;;
    sweep)
      python3 benchmarks/bench_attention.py --out "$OUT/attention_sweep.json" --parts sweep \
        --sweep-groups "${SWEEP_GROUPS:-128:0,128:1}" --budget-s 3600 >"$OUT/attention_sweep.log" 2>&1
      say "bench_attention sweep: rc $?"
      sed -n '/^# /,$p' "$OUT/attention_sweep.log" >>"$SUMMARY"
      ;;
    tiles)
      TORCH_LOGS=output_code python3 benchmarks/probes/norm_fwd_tiles.py >"$OUT/norm_fwd_tiles.txt" 2>"$OUT/inductor.log"
      say "norm_fwd_tiles: rc $?"
      cat "$OUT/norm_fwd_tiles.txt" >>"$SUMMARY"
      ;;
    native)
      python3 benchmarks/probes/native_large.py >"$OUT/native_large.txt" 2>&1
      say "native_large: rc $?"
      cat "$OUT/native_large.txt" >>"$SUMMARY"
      ;;
    throw)
      python3 benchmarks/probes/native_throw.py >"$OUT/native_throw.txt" 2>&1
      say "native_throw: rc $?"
      cat "$OUT/native_throw.txt" >>"$SUMMARY"
      ;;
    *)
      say "unknown part: $part (tests, launch, norms, attention, sweep, tiles, native, throw)"
      exit 2
      ;;
  esac
done
say "== done in $((SECONDS - START)) s"
