#!/usr/bin/env bash
# Can Nsight Compute's filters and metrics be given after the application has started?
#
# A script's start-up (imports, model build) is 10-16 s for a Hugging Face model, and phase 2's
# processes can only start once phase 1's trace has chosen their kernels. With `ncu --mode
# launch` the application starts under ncu's injection and is held at its first CUDA call;
# `ncu --mode attach` then brings the filters, the NVTX include, the metrics and the report
# file. This probe launches a small torch script (3 s of host work before its first CUDA
# call), attaches 8 s later with phase 2's kind of options, and exports the report.
#
# Seen on an H100 (2026-11-28, BENCHMARKS.md): ncu holds the process at its first CUDA call of
# any kind (torch.cuda.is_available() is one), and an attach made before the process is held
# there fails at once ("No attachable process found"); it does not wait.
#
#   bash benchmarks/probes/ncu_attach.sh OUT_DIR
#
# Needs: one CUDA GPU, torch, Nsight Compute's ncu on PATH. OUT_DIR gets ncu_attach.txt.
set -u
out=${1:?usage: ncu_attach.sh OUT_DIR}
mkdir -p "$out"
exec > "$out/ncu_attach.txt" 2>&1
work=$(mktemp -d)
cat > "$work/app.py" <<'PY'
import time

import torch

t0 = time.time()
time.sleep(3)
x = torch.randn(1 << 20, device="cuda")
print("first CUDA use done at", round(time.time() - t0, 2), "s", flush=True)
r = torch.cuda.nvtx.range_start("kerneltriage.ncu")
for _ in range(5):
    y = x * 1.5
    z = x + y
torch.cuda.synchronize()
torch.cuda.nvtx.range_end(r)
print("done at", round(time.time() - t0, 2), "s", flush=True)
PY
ncu --version | tail -n 1
# --nvtx belongs to the launching side: the attach side refuses it.
ncu --mode launch --nvtx --port 49200 python3 "$work/app.py" > "$work/launch.log" 2>&1 &
app=$!
sleep 8
timeout 60 ncu --mode attach --hostname 127.0.0.1 --port 49200 --nvtx-include kerneltriage.ncu \
  --kernel-name-base mangled -k regex:elementwise --filter-mode per-launch-config --launch-count 1 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum -o "$work/attached" --force-overwrite
echo "attach exit code $?"
timeout 30 tail --pid=$app -f /dev/null
echo "--- the launched application:"
cat "$work/launch.log"
ncu --import "$work/attached.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum | cut -c1-200
rm -rf "$work"
