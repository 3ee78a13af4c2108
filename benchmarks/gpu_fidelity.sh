#!/usr/bin/env bash
# Does `kerneltriage profile` time the program as the user runs it? Five workloads on one GPU;
# BENCHMARKS.md's "Profile fidelity" tables come from it (about 10 minutes on an H100):
#   gpt          examples/train_gpt.py at GPT-2 124M size (12 layers, 768 wide, batch 8 × 1024,
#                vocab 50304, SDPA, bf16 autocast), eager
#   gpt-compile  the same under torch.compile
#   llama        examples/train_hf_llama.py: transformers' LlamaForCausalLM, 8 layers, hidden 2048,
#                16 / 4 KV heads, batch 4 × 2048, bf16 weights, random init
#   vit          examples/train_vit.py: timm ViT-B/16, batch 64, bf16 autocast (launch-heavy)
#   bert         examples/train_bert_mlm.py: transformers' BertForMaskedLM (base), 32 × 512,
#                bf16 autocast
# For each: the plain median step (the script's own step times, CUDA events, steps 7-15 of 15),
# `kerneltriage profile` with its default options (phase 1 + phase 2), `kerneltriage report
# RUN --format json`; then one table: plain step, the report's step time, ratio, phase 1's
# plain / clean / recorded step medians (the clean steps run under the CUDA-only profiler the
# report's GPU busy time comes from; the recorded steps give ops and modules), torch.compile
# graph breaks / graphs plain vs phase 1 vs phase 2, phase-2 seconds, hot-kernel counter coverage.
#
#   bash benchmarks/gpu_fidelity.sh OUT_DIR
#   WORKLOADS="llama" bash benchmarks/gpu_fidelity.sh OUT_DIR     # a subset
#
# Needs: a CUDA GPU with bf16 (measured on an 80 GB H100); torch with CUDA and
# triton; transformers; timm (vit); Nsight Compute's ncu on PATH unless NCU=0 (then phase 2 is
# skipped: the step, busy and idle times do not depend on it); kerneltriage's dependencies
# (pip install -e .). The goal: report step ≤ 1.03 × the script's own median step, the report's
# idle within 3 points of (script step − GPU busy) / script step, and the report's graph
# breaks equal to Dynamo's in the script alone. BUDGET_S (default 3000) bounds the workloads' total time: one that no longer fits is
# skipped and named.
#
# OUT_DIR gets summary.txt (the table and what failed), results.json, runs.tgz (the run
# directories without .ncu-rep) and logs.tgz (every command's output). A workload that fails
# or runs out of time is reported as such; the others go on.
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
BUDGET_S=${BUDGET_S:-3000}
WORKLOADS=${WORKLOADS:-"gpt vit bert llama gpt-compile"}  # compile last: its first compile takes longest
START=$SECONDS
mkdir -p "$WORK/runs" "$WORK/logs"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }

export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# One Inductor cache for every process: the profiled runs reuse what the plain run compiled.
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
KT="python3 -m kerneltriage"

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
say "$(python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1)"
say "$(ncu --version 2>&1 | tail -1)"
if ! python3 -c "import kerneltriage.cli" 2>/dev/null; then
  say "FATAL: kerneltriage's dependencies are not importable: pip install -e . first"
  exit 1
fi

GPT="examples/train_gpt.py --d 768 --layers 12 --heads 12 --seq 1024 --batch 8 --vocab 50304 --attn sdpa"
LLAMA="examples/train_hf_llama.py"
VIT="examples/train_vit.py"
BERT="examples/train_bert_mlm.py"
PROFILE_FLAGS=""
if [ "${NCU:-1}" = 0 ]; then PROFILE_FLAGS="--no-ncu"; fi
if [ -n "${FIDELITY_CPU:-}" ]; then  # a dry run of this script's plumbing on a machine without a GPU
  GPT="examples/train_gpt.py --tiny --device cpu"
  LLAMA="examples/train_hf_llama.py --tiny --device cpu"
  BERT="examples/train_bert_mlm.py --tiny --device cpu"
  PROFILE_FLAGS="--cpu"
fi
args_of() {
  case "$1" in
    gpt) echo "$GPT" ;;
    gpt-compile) echo "$GPT --compile" ;;
    llama) echo "$LLAMA" ;;
    vit) echo "$VIT" ;;
    bert) echo "$BERT" ;;
    *) return 1 ;;
  esac
}
# Rough seconds each workload needs (plain + profile + report on an H100); one that no longer
# fits the budget is skipped and named.
need_of() {
  case "$1" in
    gpt) echo 150 ;;
    gpt-compile) echo 190 ;;
    llama) echo 150 ;;
    vit) echo 120 ;;
    bert) echo 150 ;;
  esac
}

FAILED=()
for w in $WORKLOADS; do
  if ! args=$(args_of "$w"); then
    FAILED+=("$w: unknown workload")
    continue
  fi
  if [ "$(left)" -lt "$(need_of "$w")" ]; then
    FAILED+=("$w: skipped, $(left) s left of the budget (run it alone: WORKLOADS=$w)")
    say "== $w skipped ($(left) s left)"
    continue
  fi
  stats="$WORK/logs/$w.stats.jsonl"
  say "== $w: $args ($(left) s left)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # $args is a word list on purpose
  if KT_EXAMPLE_STATS=$stats timeout -k 10 $(($(left) - 60)) python3 $args --steps 15 \
    >"$WORK/logs/$w.plain.log" 2>&1; then
    say "plain run: $((SECONDS - t0)) s"
  else
    FAILED+=("$w: plain run failed (exit $?): $(tail -n 1 "$WORK/logs/$w.plain.log")")
    say "plain run FAILED: $(tail -n 3 "$WORK/logs/$w.plain.log")"
  fi
  t0=$SECONDS
  budget=$(($(left) - 45))
  budget=$((budget < 300 ? budget : 300))  # a hung profile must not take the other workloads' time
  ncu_timeout=$((budget / 2 > 60 ? budget / 2 : 60))
  # SIGINT, so that kerneltriage stops its phase cleanly and writes the manifest.
  # shellcheck disable=SC2086
  KT_EXAMPLE_STATS=$stats timeout -s INT -k 20 "$budget" $KT profile -q --force --out "$WORK/runs/$w" \
    --ncu-timeout "$ncu_timeout" $PROFILE_FLAGS -- python3 $args --steps 30 >"$WORK/logs/$w.profile.log" 2>&1
  code=$?
  say "profile: $((SECONDS - t0)) s (exit $code)"
  if [ "$code" -ne 0 ]; then
    FAILED+=("$w: profile exit $code: $(grep -v '^USDT' "$WORK/logs/$w.profile.log" | tail -n 2 | tr '\n' ' ')")
  fi
  if [ -f "$WORK/runs/$w/manifest.json" ]; then
    t0=$SECONDS
    if timeout -k 10 120 $KT report "$WORK/runs/$w" --format json >"$WORK/logs/$w.report.json" \
      2>"$WORK/logs/$w.report.err"; then
      say "report: $((SECONDS - t0)) s"
    else
      FAILED+=("$w: report failed: $(tail -n 1 "$WORK/logs/$w.report.err")")
    fi
  fi
done

python3 - "$WORK" "$WORKLOADS" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, statistics, sys
from pathlib import Path

work, workloads = Path(sys.argv[1]), sys.argv[2].split()
rows, results = [], {}


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def stats_lines(w):
    path = work / "logs" / f"{w}.stats.jsonl"
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def fmt(v, spec=".2f"):
    return "—" if v is None else format(v, spec)


for w in workloads:
    lines = stats_lines(w)
    plain = next((x for x in lines if x.get("kerneltriage_mode") is None), None)
    phase1 = next((x for x in lines if x.get("kerneltriage_mode") == "timeline"), None)
    phase2 = [x for x in lines if x.get("kerneltriage_mode") == "ncu"]
    plain_ms = statistics.median(plain["step_ms"][5:]) if plain and len(plain["step_ms"]) > 5 else None
    m = load(work / "runs" / w / "manifest.json") or {}
    rep = load(work / "logs" / f"{w}.report.json") or {}
    timeline = m.get("phases", {}).get("timeline", {})
    ncu = m.get("phases", {}).get("ncu", {})
    st = timeline.get("step_time") or {}
    recorded = st.get("recorded_median_ms")
    reported = rep.get("step_time_ms")
    join = rep.get("join") or {}
    graphs = lambda x: None if x is None else f"{x['graph_breaks']}/{x['unique_graphs']}"  # noqa: E731
    busy = rep.get("gpu_busy_ms")
    dyn = ((rep.get("compiled") or {}).get("dynamo")) or {}
    r = {
        "plain_ms": plain_ms,
        "plain_spread_ms": (
            statistics.median(abs(x - plain_ms) for x in plain["step_ms"][5:]) * 1.4826 if plain_ms else None
        ),
        "report_busy_ms": busy,
        "idle_pct_script": 100 * (plain_ms - busy) / plain_ms if plain_ms and busy else None,
        "report_dynamo": dyn or None,
        "report_step_ms": reported,
        "ratio": reported / plain_ms if reported and plain_ms else None,
        "phase1_plain_ms": st.get("plain_median_ms"),
        "phase1_clean_ms": st.get("clean_median_ms"),
        "phase1_recorded_ms": recorded,
        "clean_overhead": st.get("overhead"),
        "attribution_overhead": st.get("attribution_overhead"),
        "clean_gpu_busy_ms": st.get("gpu_busy_ms"),
        "clean_kernels_per_step": st.get("clean_kernels_per_step"),
        "report_timing": (rep.get("source") or {}).get("timing"),
        "report_idle_pct": rep.get("idle_pct"),
        "breaks_graphs": {"plain": graphs(plain), "phase1": graphs(phase1), "phase2": [graphs(x) for x in phase2]},
        "phase1_s": timeline.get("seconds"),
        "phase2_s": ncu.get("seconds"),
        "phase2_launches": ncu.get("profiled_launches"),
        "variable_size_kernels": ncu.get("variable_size_kernels"),
        "variable_launches_per_step": ncu.get("variable_launches_per_step"),
        "variable_over_budget": ncu.get("variable_over_budget"),
        "hot_kernels": join.get("hot_kernels"),
        "hot_kernels_joined": join.get("hot_kernels_joined"),
        "hot_time_joined_share": join.get("hot_time_joined_share"),
        "kernel_time_joined_share": join.get("kernel_time_joined_share"),
        "rows": join.get("rows"), "rows_joined": join.get("rows_joined"), "rows_rejected": join.get("rows_rejected"),
        "hot_without_counters_manifest": ncu.get("hot_without_counters"),
        "hot_without_counters_join": join.get("hot_kernels_without_counters"),
        "trace_fixup": timeline.get("trace_fixup"),
        "module_calls_per_step": timeline.get("module_calls_per_step"),
        "status": m.get("status"),
        "warnings": m.get("warnings"),
        "report_warnings": rep.get("warnings"),
    }
    results[w] = r
    hot = (
        f"{r['hot_kernels_joined']}/{r['hot_kernels']}, {r['hot_time_joined_share']:.0%}"
        if r["hot_kernels"] is not None and r["hot_time_joined_share"] is not None
        else "—"
    )
    pct = lambda x: "—" if x is None else f"{x:+.1%}"  # noqa: E731
    rows.append([
        w, fmt(plain_ms), fmt(reported), fmt(r["ratio"], ".3f"), fmt(r["phase1_plain_ms"]),
        f"{fmt(r['phase1_clean_ms'])} ({pct(r['clean_overhead'])})",
        f"{fmt(recorded)} ({pct(r['attribution_overhead'])})", fmt(r["report_idle_pct"], ".1f"),
        f"{graphs(plain) or '—'} | {graphs(phase1) or '—'} | {','.join(g or '—' for g in r['breaks_graphs']['phase2']) or '—'}",
        f"{fmt(r['idle_pct_script'], '.1f')}",
        f"{dyn.get('graph_breaks', '—')}/{dyn.get('unique_graphs', '—')}/{dyn.get('recompiles', '—')}" if dyn else "—",
        fmt(r["phase2_s"], ".1f"), hot, str(len(r["hot_without_counters_join"] or {})),
    ])

head = ["workload", "plain ms", "report ms", "ratio", "ph1 plain ms", "ph1 clean ms", "ph1 recorded ms", "idle %",
        "breaks/graphs plain | ph1 | ph2", "idle % (script)", "report breaks/graphs/recompiles", "phase-2 s",
        "hot with counters", "hot w/o"]
widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
print()
for line in [head, ["-" * n for n in widths], *rows]:
    print("  ".join(str(c).ljust(n) for c, n in zip(line, widths)))
print()
print("plain ms: the script alone (median of steps 6-15); report ms / idle %: what `kerneltriage report`")
print("says; ratio = report / plain (goal ≤ 1.03); idle % (script) = (plain − report's GPU busy) / plain. Phase 1's own steps (CUDA events in the profiled")
print("process, medians; in brackets against its plain steps): plain (nothing installed, the report's step")
print("time), clean (CUDA-only profiler: the report's GPU busy time), recorded (CPU ops + module ranges).")
for w, r in results.items():
    for key in ("hot_without_counters_join", "hot_without_counters_manifest"):
        for name, why in (r[key] or {}).items():
            print(f"{w}: {key}: {name}: {why}")
    for warning in r["warnings"] or []:
        print(f"{w}: manifest warning: {warning}")
(work / "results.json").write_text(json.dumps(results, indent=2))
EOF
cp "$WORK/results.json" "$OUT/results.json" 2>/dev/null

if [ ${#FAILED[@]} -gt 0 ]; then
  say ""
  say "FAILED or skipped:"
  for f in "${FAILED[@]}"; do say "  $f"; done
else
  say "all workloads ran"
fi

# The run directories without the large Nsight Compute reports (examples/runs holds three).
tar czf "$OUT/runs.tgz" -C "$WORK" --exclude='*.ncu-rep' --exclude='*.tmp*' runs
tar czf "$OUT/logs.tgz" -C "$WORK" logs
rm -rf "$WORK"
say "== done in $((SECONDS - START)) s, $(date -u +%FT%TZ); $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
