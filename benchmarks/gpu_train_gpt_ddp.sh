#!/usr/bin/env bash
# kerneltriage on a two-GPU DDP job: plain DDP steps of examples/train_gpt.py, then the same job
# under `kerneltriage profile -- torchrun …` (counters on rank 0) and its report across ranks.
# BENCHMARKS.md's "Two GPUs" table comes from it; the run is examples/runs/gpt-ddp-2gpu-h200.
#
#   bash benchmarks/gpu_train_gpt_ddp.sh OUT_DIR
#
# Needs: two CUDA GPUs of one host with NCCL; torch with CUDA and triton; Nsight Compute's ncu
# on PATH; kerneltriage's dependencies (pip install -e .).
#
# OUT_DIR gets summary.txt (plain DDP wall time and step times, the profile's phases, the
# report in Markdown) and runs/gpt-ddp-2gpu (the run directory).
set -u -o pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The figures were measured with NCCL's NVLink multicast (NVLS) off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG="$OUT/summary.txt"
RUN="$OUT/runs/gpt-ddp-2gpu"
say() { echo "$*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }
TR="python3 -m torch.distributed.run --nproc-per-node 2"

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
say "$(python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "nccl", torch.cuda.nccl.version())' 2>&1 | tail -1)"
t0=$(now)
$TR examples/train_gpt.py --ddp --steps 6 >"$OUT/plain.log" 2>&1
say "plain DDP 6 steps: $(since "$t0") s (rc $?)"
$TR examples/train_gpt.py --ddp --steps 30 --time 2>&1 | grep step_ms | tee -a "$LOG"
t0=$(now)
python3 -m kerneltriage profile -q --ncu-timeout 150 --out "$RUN" --force -- \
  $TR examples/train_gpt.py --ddp --steps 12 2>&1 | tail -n 8 | tee -a "$LOG"
say "profile wall: $(since "$t0") s"
python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(json.dumps({'status': m['status'], 'ranks': m['ranks'], 'phases': {k: {kk: vv for kk, vv in v.items() if kk not in ('metrics', 'kernels')} for k, v in m['phases'].items()}}))" \
  "$RUN/manifest.json" | tee -a "$LOG"
python3 -m kerneltriage report "$RUN" --top 8 --format markdown >>"$LOG" 2>&1
say "== done $(date -u +%FT%TZ)"
