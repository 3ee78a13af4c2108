#!/usr/bin/env bash
# One-off probe of the GPU image: versions, Python packages kerneltriage needs, ncu metric
# names for the roofline set, and whether ncu's NVTX filter on a start/end range covers
# kernels launched from the autograd thread. Output goes to $OUT.
set -u
OUT=${OUT:-/tmp/probe}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  for m in pandas numpy orjson ijson yaml rich click jinja2 matplotlib nvtx; do
    python3 -c "import $m; print('$m', getattr($m, '__version__', 'ok'))" 2>&1 | tail -1
  done
  which ncu nsys; ncu --version | tail -1
} > "$OUT/env.txt" 2>&1
ncu --query-metrics --chip gh100 > "$OUT/metrics_gh100.txt" 2>&1
grep -E "^(sm__ops_path_tensor|sm__inst_executed_pipe_tensor|smsp__sass_thread_inst_executed_op_[a-z]+_pred_on|dram__bytes|lts__t_bytes |gpu__time_duration)" "$OUT/metrics_gh100.txt" | awk '{print $1}' > "$OUT/roofline_metrics.txt"
cat > /tmp/nvtx_probe.py <<'PY'
import torch
x = torch.randn(4096, 4096, device="cuda", requires_grad=True)
w = torch.randn(4096, 4096, device="cuda", requires_grad=True)
for step in range(3):
    rid = torch.cuda.nvtx.range_start("kt.probe") if step == 1 else None
    y = (x @ w).relu().sum()
    y.backward()
    torch.cuda.synchronize()
    if rid is not None:
        torch.cuda.nvtx.range_end(rid)
print("done")
PY
for spec in "kt.probe" "kt.probe/" "regex:kt.probe"; do
  echo "=== --nvtx-include '$spec'" >> "$OUT/nvtx_probe.txt"
  timeout 120 ncu --target-processes all --clock-control none --nvtx --nvtx-include "$spec" --metrics gpu__time_duration.sum python3 /tmp/nvtx_probe.py 2>&1 | grep -E "==PROF== Profiling|ERROR|WARNING|done" >> "$OUT/nvtx_probe.txt"
done
cat "$OUT/env.txt"; cat "$OUT/roofline_metrics.txt" | head -60; cat "$OUT/nvtx_probe.txt"
