#!/usr/bin/env bash
# How many replay passes each group of the roofline metrics costs (ncu prints "- N passes"
# per profiled kernel): one bf16 GEMM and one elementwise kernel per metric set. BENCHMARKS.md's
# "Replay passes" table comes from it.
#
#   bash benchmarks/probes/ncu_passes.sh OUT_DIR          # SETS_RUN="all sm_pct" for a subset
#
# Needs: a CUDA GPU; torch with CUDA; Nsight Compute's ncu on PATH; kerneltriage's
# dependencies (pip install -e .). OUT_DIR gets ncu_passes.txt.
set -uo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
APP=$(mktemp --suffix=.py)
cat > "$APP" <<'PY'
import torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(2):
    (a @ a).add_(1.0)
torch.cuda.synchronize()
PY
M=$(python3 -c "from kerneltriage.profile.nsight_compute import ROOFLINE_METRICS as m; print(','.join(m))")
declare -A SETS=(
  [all]="$M"
  [time_dram_l2]="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum"
  [sass_flops]="$(echo "$M" | tr ',' '\n' | grep sass_thread | paste -sd,)"
  [tensor_ops]="$(echo "$M" | tr ',' '\n' | grep ops_path_tensor | paste -sd,)"
  [sol_pct]="$(echo "$M" | tr ',' '\n' | grep pct_of_peak | paste -sd,)"
  [all_but_sol]="$(echo "$M" | tr ',' '\n' | grep -v pct_of_peak | paste -sd,)"
  [sm_pct]="sm__throughput.avg.pct_of_peak_sustained_elapsed"
  [memory_pct]="gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
  [dram_pct]="gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
  [all_but_sol+dram_pct]="$(echo "$M" | tr ',' '\n' | grep -v pct_of_peak | paste -sd,),gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
)
for name in ${SETS_RUN:-all time_dram_l2 sass_flops tensor_ops sol_pct all_but_sol sm_pct memory_pct dram_pct all_but_sol+dram_pct}; do
  passes=$(ncu --clock-control none --metrics "${SETS[$name]}" -c 4 python3 "$APP" 2>&1 | grep -oE "[0-9]+ pass(es)?" | sort | uniq -c | tr '\n' ' ')
  echo "$name: $passes" | tee -a "$OUT/ncu_passes.txt"
done
