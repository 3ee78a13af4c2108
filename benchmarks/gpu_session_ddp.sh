#!/usr/bin/env bash
# Two GPUs (device tool, nvidia-h200-x2): time plain DDP steps, then profile the same job with
# `kerneltriage profile -- torchrun …` (counters on rank 0) and report across ranks.
#   carry: .whl
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off on these machines (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG="$OUT/summary.txt"
say() { echo "$*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }
TR="python3 -m torch.distributed.run --nproc-per-node 2"
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
t0=$(now); $TR examples/train_gpt.py --ddp --steps 6 > /tmp/plain.log 2>&1; say "plain DDP 6 steps: $(since $t0) s (rc $?)"
$TR examples/train_gpt.py --ddp --steps 30 --time 2>&1 | grep step_ms | tee -a "$LOG"
t0=$(now)
timeout 420 python3 -m kerneltriage profile -q --ncu-timeout 150 --out runs/gpt-ddp-2gpu --force -- $TR examples/train_gpt.py --ddp --steps 12 2>&1 | tail -n 8 | tee -a "$LOG"
say "profile wall: $(since $t0) s"
python3 -c "import json; m=json.load(open('runs/gpt-ddp-2gpu/manifest.json')); print(json.dumps({'status': m['status'], 'ranks': m['ranks'], 'phases': {k: {kk: vv for kk, vv in v.items() if kk not in ('metrics', 'kernels')} for k, v in m['phases'].items()}}))" | tee -a "$LOG"
python3 -m kerneltriage report runs/gpt-ddp-2gpu --top 8 --format markdown >> "$LOG" 2>&1
tar czf "$OUT/ddp.tgz" --exclude='*.ncu-rep' runs/gpt-ddp-2gpu
say "== done $(date -u +%FT%TZ)"
