#!/usr/bin/env bash
# kerneltriage on examples/train_gpt.py, one GPU: the ceilings, the profile of each attention
# variant against the script alone, step times and losses, the scaffolds' benchmarks, and the
# built-in norms end to end. BENCHMARKS.md's "Ceilings", "kerneltriage profile on
# examples/train_gpt.py", "Step time and loss", "Scaffolds on the GPU" and "End to end"
# tables come from these parts.
#
#   bash benchmarks/gpu_train_gpt.sh OUT_DIR [PART ...]     # default parts: calibrate profile loss
#
# Parts, run in the order given:
#   calibrate  kerneltriage calibrate --json (calibration.json)
#   profile    for each of $VARIANTS (default naive, sdpa, builtin): 6 plain steps of the script
#              (wall time, start-up included), its median step time over 30 steps (--time), then
#              kerneltriage profile -- python3 examples/train_gpt.py --steps 12 into
#              OUT_DIR/runs/gpt-NAME, and its report (Markdown, in summary.txt)
#   loss       200 steps with SDPA and with the built-in attention, same seed (loss_sdpa.json,
#              loss_builtin.json, median step times)
#   scaffold   kerneltriage scaffold OUT_DIR/runs/gpt-naive C1 and C3, then each package's
#              bench.py (bench_gpt-naive_C1.json, bench_gpt-naive_C3.json); needs the profile part
#   norms      examples/train_gpt.py --attn sdpa, 40 steps, twice each: eager norms, the built-in
#              norms through the Python host path (KERNELTRIAGE_NATIVE=0) and through the C++ path
#
# Needs: a CUDA GPU with bf16 (sizes: 4 layers, d 1024, seq 2048, batch 4; about 20 GB);
# torch with CUDA and triton; Nsight Compute's ncu on PATH (the profile part's phase 2);
# kerneltriage's dependencies (pip install -e .). The norms part's C++ path needs ninja and a
# C++ compiler. VARIANTS="name:flags|…" picks the variants, e.g. VARIANTS="naive:--attn naive".
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(calibrate profile loss)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
KT="python3 -m kerneltriage"
LOG="$OUT/summary.txt"
say() { echo "$*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
say "$(ncu --version 2>&1 | tail -1)"

for part in "${PARTS[@]}"; do
  case "$part" in
    calibrate)
      $KT calibrate --json >"$OUT/calibration.json" 2>>"$LOG" && say "calibrated: $(tr -d '\n ' <"$OUT/calibration.json")"
      ;;
    profile)
      IFS='|' read -ra items <<<"${VARIANTS:-naive:--attn naive|sdpa:--attn sdpa|builtin:--attn builtin --norm builtin}"
      for item in "${items[@]}"; do
        name=${item%%:*}
        flags=${item#*:}
        say "== $name ($flags)"
        t0=$(now)
        # shellcheck disable=SC2086  # $flags is a word list on purpose
        python3 examples/train_gpt.py --steps 6 $flags >"$OUT/plain_$name.log" 2>&1
        say "plain 6 steps: $(since "$t0") s (rc $?)"
        # shellcheck disable=SC2086
        python3 examples/train_gpt.py --steps 30 --time $flags 2>&1 | grep step_ms | tee -a "$LOG"
        t0=$(now)
        # shellcheck disable=SC2086
        $KT profile -q --out "$OUT/runs/gpt-$name" --force -- python3 examples/train_gpt.py --steps 12 $flags 2>&1 |
          tail -n 4 | tee -a "$LOG"
        say "profile wall: $(since "$t0") s"
        python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(json.dumps({'status': m['status'], 'phases': {k: {kk: vv for kk, vv in v.items() if kk != 'metrics'} for k, v in m['phases'].items()}}))" \
          "$OUT/runs/gpt-$name/manifest.json" | tee -a "$LOG"
        $KT report "$OUT/runs/gpt-$name" --top 8 --format markdown >>"$LOG" 2>&1
      done
      ;;
    loss)
      for attn in sdpa builtin; do
        say "== 200 steps, $attn attention"
        python3 examples/train_gpt.py --steps 200 --attn "$attn" --loss-log "$OUT/loss_$attn.json" --time 2>&1 |
          tail -n 2 | tee -a "$LOG"
      done
      ;;
    scaffold)
      for cand in C1 C3; do
        say "== scaffold gpt-naive $cand"
        $KT scaffold "$OUT/runs/gpt-naive" "$cand" --out "$OUT/scaffold_gpt-naive_$cand" --force >>"$LOG" 2>&1
        (cd "$OUT/scaffold_gpt-naive_$cand" && python3 bench.py --json "$OUT/bench_gpt-naive_$cand.json" 2>&1 | tail -n 25) |
          tee -a "$LOG"
      done
      ;;
    norms)
      # The C++ bound calls are built once per machine; build them before timing.
      python3 -c "from kerneltriage.kernels import native; native.build(); print('C++ bound calls:', native.status())" 2>&1 |
        tail -n 1 | tee -a "$LOG"
      for run in 1 2; do
        for mode in eager python cpp; do
          case $mode in
            eager) env=() flags="--norm eager" ;;
            python) env=(KERNELTRIAGE_NATIVE=0) flags="--norm builtin" ;;
            cpp) env=() flags="--norm builtin" ;;
          esac
          say "== norms $mode, run $run"
          # shellcheck disable=SC2086
          env "${env[@]}" python3 examples/train_gpt.py --attn sdpa $flags --steps 40 --time \
            --loss-log "$OUT/loss_norms_${mode}_$run.json" 2>&1 | tail -n 2 | tee -a "$LOG"
        done
      done
      ;;
    *)
      say "unknown part: $part (calibrate, profile, loss, scaffold, norms)"
      exit 2
      ;;
  esac
done
say "== done $(date -u +%FT%TZ)"
