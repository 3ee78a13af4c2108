"""Which errors cross from kernels/csrc/norm_node.cpp into Python safely in this torch build
(a probe for kernels/native.py): each case runs in its own process, so a crash shows as a
return code. (A launch of a function handle that is not one, e.g. 1, crashes inside libcuda:
the handles come from Triton's compiled kernels only.) BENCHMARKS.md, "One fault found and
fixed": the reason the extension throws std::runtime_error only.

    PYTHONPATH=. python3 benchmarks/probes/native_throw.py

Needs torch, triton, ninja and a C++ compiler; a CUDA GPU for the launch and allocation cases."""

import subprocess
import sys

import torch

CASES = {
    "alloc_ref": "p.add_alloc(8, [4], torch.empty(0))",
    "ctor": "m.Program(9, 8, 0)",
    "outputs": "p.set_outputs([99])",
    "launch_len": "p.add_launch(1, [1, 1, 1], 128, 0, [0, 1], [0], [0.0])",
    "oom": "p.add_alloc(4, [1 << 46], torch.empty(0)); p.set_outputs([4]); p.run([x, x, x, x])",
}

if len(sys.argv) > 1:
    from kerneltriage.kernels import native

    m = native.build()
    p = m.Program(4, 8, 0)
    x = torch.zeros(4, device="cuda" if torch.cuda.is_available() else "cpu")
    try:
        exec(CASES[sys.argv[1]])
        print("no error")
    except Exception as e:
        print(type(e).__name__, str(e).splitlines()[0][:160])
    sys.exit(0)

from kerneltriage.kernels import native  # noqa: E402

print("build:", native.build() is not None, native.status())
for name in CASES:
    r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True)
    print(
        f"{name:<14} rc {r.returncode:<4} {r.stdout.strip()} {r.stderr.strip()[-200:] if r.returncode else ''}"
    )
