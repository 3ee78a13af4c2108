#!/usr/bin/env bash
# Does each fix the report gives realize the saving it predicts, without changing the model's
# results? For each workload: `kerneltriage profile` (the timeline; NCU=1 adds Nsight Compute
# counters), `kerneltriage report --format json`, then `kerneltriage verify`: the runner applies
# every actionable fix to the unchanged script, baseline and fixed runs interleaved, the first
# steps' losses compared. gpt-naive also verifies SDPA applied by hand (--by-hand, the script's
# own --attn sdpa), gpt-compile Liger's cross-entropy by hand (--loss liger). BENCHMARKS.md's "Fixes verified" table comes from it.
#
#   bash benchmarks/gpu_verify.sh OUT_DIR [WORKLOAD ...]
#
# Workloads (default: all, in this order; about 4 minutes each on an H100):
#   gemma2       examples/train_hf_gemma2.py: Gemma2-class, eager softcap attention, sliding window
#   llama        examples/train_hf_llama.py: HF Llama, SDPA, bf16 weights
#   gpt-naive    examples/train_gpt.py: 4-layer GPT, naive attention, eager RMSNorm, bf16 autocast
#   bert         examples/train_bert_mlm.py: HF BERT-base MLM, bf16 autocast
#   gpt-compile  examples/train_gpt.py at GPT-2 124M size under torch.compile
# VERIFY_FLAGS (default "--repeats 2 --steps 12") goes to `kerneltriage verify`. KEEP_RUNS=1 keeps
# each run directory whole in verify.tgz (traces included: a run to ship under examples/runs).
#
# Needs: a CUDA GPU with bf16; torch with CUDA, triton, transformers; kerneltriage's
# dependencies (pip install -e .); liger-kernel for the Liger fixes (without it they are
# reported as not verified); Nsight Compute's ncu on PATH only with NCU=1.
#
# OUT_DIR gets summary.txt (each workload's verify table and report header) and verify.tgz
# (each run directory's manifest, report.json, verify.json and the verify logs).
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
WORKLOADS=${*:-"gemma2 llama gpt-naive bert gpt-compile"}
WORK=$(mktemp -d)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
KT="python3 -m kerneltriage"
FLAGS=${VERIFY_FLAGS:-"--repeats 2 --steps 12"}
PROFILE_FLAGS="--no-ncu"
if [ "${NCU:-0}" = 1 ]; then PROFILE_FLAGS=""; fi
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)"
say "$(python3 -c 'import liger_kernel, importlib.metadata as m; print("liger-kernel", m.version("liger-kernel"))' 2>&1 | tail -1)"

GPT2="examples/train_gpt.py --d 768 --layers 12 --heads 12 --seq 1024 --batch 8 --vocab 50304 --attn sdpa"
for w in $WORKLOADS; do
  case "$w" in
    gemma2) args="examples/train_hf_gemma2.py" ;;
    llama) args="examples/train_hf_llama.py" ;;
    gpt-naive) args="examples/train_gpt.py" ;;
    bert) args="examples/train_bert_mlm.py" ;;
    gpt-compile) args="$GPT2 --compile" ;;
    *) say "unknown workload $w"; continue ;;
  esac
  run="$WORK/runs/$w"
  say ""
  say "== $w: python3 $args --steps 40"
  t0=$SECONDS
  # shellcheck disable=SC2086
  if ! $KT profile -q --force --out "$run" $PROFILE_FLAGS -- python3 $args --steps 40 >"$WORK/$w.profile.log" 2>&1; then
    say "profile FAILED: $(tail -n 3 "$WORK/$w.profile.log")"
    continue
  fi
  $KT report "$run" --format json -o "$run/report.json" >/dev/null 2>"$WORK/$w.report.err" || say "report FAILED: $(tail -n 1 "$WORK/$w.report.err")"
  say "profile + report: $((SECONDS - t0)) s"
  t0=$SECONDS
  if [ "$w" = gpt-naive ]; then
    # The script's own attention code: SDPA applied by hand (its --attn sdpa), first.
    attn=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(next(c['id'] for c in r['candidates'] if c['kind']=='attention'))" "$run/report.json")
    # shellcheck disable=SC2086
    $KT verify "$run" $FLAGS --by-hand "$attn" -- python3 $args --attn sdpa --steps 40 2>&1 | grep --line-buffered -v "^USDT" | tee -a "$SUMMARY" | tail -n 2
  fi
  if [ "$w" = gpt-compile ]; then
    # The loss outside the compiled model: Liger's cross-entropy applied by hand (--loss liger).
    ce=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(next(c['id'] for c in r['candidates'] if c['kind']=='cross-entropy'))" "$run/report.json")
    # shellcheck disable=SC2086
    $KT verify "$run" $FLAGS --by-hand "$ce" -- python3 $args --loss liger --steps 40 2>&1 | grep --line-buffered -v "^USDT" | tee -a "$SUMMARY" | tail -n 2
  fi
  # shellcheck disable=SC2086
  $KT verify "$run" $FLAGS 2>&1 | grep --line-buffered -v "^USDT" | tee -a "$SUMMARY" | tail -n 2
  say "verify: $((SECONDS - t0)) s"
  $KT report "$run" 2>/dev/null | sed -n '1,40p' >>"$SUMMARY"
done
if [ "${KEEP_RUNS:-0}" = 1 ]; then
  tar czf "$OUT/verify.tgz" -C "$WORK" --exclude='*.ncu-rep' --exclude='inductor-cache' runs
else
  tar czf "$OUT/verify.tgz" -C "$WORK" --exclude='*.json.gz' --exclude='*.ncu-rep' --exclude='inductor-cache' runs
fi
rm -rf "$WORK"
say "== done, $(date -u +%FT%TZ)"
