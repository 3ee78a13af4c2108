#!/usr/bin/env bash
# The ladder on one workload, end to end: the script alone (its own step times), `kerneltriage
# profile` with counters (the wall time of each phase), `report`, `verify` (within a budget),
# `profile --apply` (the verified fixes installed: the second rung), its `report`, and `diff`
# of the two runs. Every stage's output is written to OUT_DIR as soon as it exists, so a stage
# cut off by a time limit loses only itself.
#
#   bash benchmarks/gpu_ladder.sh OUT_DIR -- python examples/train_hf_mixtral.py
#   VERIFY_BUDGET_MIN=3 PROFILE_ARGS="--timing-processes 2" bash benchmarks/gpu_ladder.sh OUT -- CMD…
#   STAGES="profile report verify" bash benchmarks/gpu_ladder.sh OUT -- CMD…   # some stages only
#   RUN=old/run STAGES="verify apply" bash benchmarks/gpu_ladder.sh OUT -- CMD… # an earlier run
#   APPLY_IDS=C1,C5 bash benchmarks/gpu_ladder.sh OUT -- CMD…   # apply these fixes, verified or not
#
# Needs: a CUDA GPU (measured on an 80 GB H100), Nsight Compute (ncu) on PATH for the counters,
# torch with CUDA, transformers / timm for the HF and timm examples, liger-kernel for Liger
# fixes; kerneltriage's dependencies. OUT_DIR gets summary.txt (phase wall times, the step time
# against the script alone, the statuses), alone.jsonl, report{,2}.{json,txt}, verify.{txt,json},
# diff.txt and runs.tgz (both run directories).
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
export PYTHONUNBUFFERED=1
KT="python3 -m kerneltriage"
STAGES=${STAGES:-"alone profile report verify apply"}
VERIFY_BUDGET_MIN=${VERIFY_BUDGET_MIN:-4}
PROFILE_ARGS=${PROFILE_ARGS:-}
VERIFY_ARGS=${VERIFY_ARGS:-}
RUNS=${RUNS_DIR:-$(mktemp -d)}
RUN=${RUN:-$RUNS/first}
SECOND=$RUNS/second
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
pack() { tar czf "$OUT/runs.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")" $( [ -d "$SECOND" ] && echo "-C $RUNS second" ) 2>/dev/null; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1) · $*"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee -a "$OUT/summary.txt"
if has alone; then
  start=$(date +%s.%N)
  KT_EXAMPLE_STATS="$OUT/alone.jsonl" "$@" >"$OUT/alone.log" 2>&1 || say "the script alone failed"
  say "alone: $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
fi
if has profile; then
  # shellcheck disable=SC2086
  /usr/bin/time -f "profile wall %e s" $KT profile --out "$RUN" $PROFILE_ARGS -- "$@" >"$OUT/profile.log" 2>&1
  tail -1 "$OUT/profile.log" | tee -a "$OUT/summary.txt"
  pack
fi
if has report; then
  $KT report "$RUN" --format json -o "$OUT/report.json" 2>>"$OUT/profile.log"
  $KT report "$RUN" --top 12 >"$OUT/report.txt" 2>&1
fi
if has verify; then
  # shellcheck disable=SC2086
  /usr/bin/time -f "verify wall %e s" $KT verify "$RUN" --budget "$VERIFY_BUDGET_MIN" $VERIFY_ARGS >"$OUT/verify.txt" 2>"$OUT/verify.log"
  tail -1 "$OUT/verify.log" | tee -a "$OUT/summary.txt"
  cp "$RUN/verify.json" "$OUT/verify.json" 2>/dev/null
  pack
fi
if has apply; then
  # shellcheck disable=SC2086
  /usr/bin/time -f "profile --apply wall %e s" $KT profile --apply "$RUN${APPLY_IDS:+:$APPLY_IDS}" --out "$SECOND" $PROFILE_ARGS >"$OUT/profile2.log" 2>&1
  tail -1 "$OUT/profile2.log" | tee -a "$OUT/summary.txt"
  $KT report "$SECOND" --format json -o "$OUT/report2.json" 2>>"$OUT/profile2.log"
  $KT report "$SECOND" --top 12 >"$OUT/report2.txt" 2>&1
  $KT diff "$RUN" "$SECOND" >"$OUT/diff.txt" 2>&1
  pack
fi
python3 - "$OUT" "$RUN" "$SECOND" <<'PY' | tee -a "$OUT/summary.txt"
import json, os, statistics, sys
from kerneltriage.analysis.timeline import steady
out, first, second = sys.argv[1:4]
alone = os.path.join(out, "alone.jsonl")
if os.path.isfile(alone):
    for line in open(alone):
        times = json.loads(line).get("step_ms") or []
        if times:
            kept = steady.steady(times)
            print(f"script alone: steady median {kept.median:.2f} ms ({kept.low:.2f}–{kept.high:.2f}), "
                  f"{len(kept.values)} of {len(times)} steps")
for label, run in (("first", first), ("second", second)):
    path = os.path.join(run, "manifest.json")
    if not os.path.isfile(path):
        continue
    m = json.load(open(path))
    phases = m.get("phases") or {}
    walls = {k: (v or {}).get("seconds") for k, v in phases.items() if isinstance(v, dict)}
    print(f"{label} run phases (s): {walls}")
    ncu = phases.get("ncu") or {}
    if ncu:
        print(f"{label} ncu: {ncu.get('profiled_launches')} launches, kernels {len(ncu.get('kernels') or [])}, "
              f"coverage of GPU time {ncu.get('coverage_of_gpu_time')}, without counters {len(ncu.get('hot_without_counters') or {})}")
for name in ("report.json", "report2.json"):
    path = os.path.join(out, name)
    if not os.path.isfile(path):
        continue
    r = json.load(open(path))
    rank = r if "candidates" in r else next(iter(r.get("ranks", {}).values()), r)
    print(f"{name}: step {rank.get('step_time_ms')} ms, interval {rank.get('step_interval_ms')}")
    for c in (rank.get("candidates") or [])[:6]:
        print(f"  {c['id']} {c['name'][:60]} share {c['time_share']:.3f} {c['verdict']} {str(c.get('reason'))[:60]}")
path = os.path.join(out, "verify.json")
if os.path.isfile(path):
    v = json.load(open(path))
    for rec in v.get("candidates") or []:
        print(f"verify {rec['id']} {rec.get('recipe_id')} {rec.get('status')} realized {rec.get('realized_saving_share')} "
              f"[{rec.get('realized_low')}, {rec.get('realized_high')}] predicted {rec.get('predicted_saving_share')}")
PY
