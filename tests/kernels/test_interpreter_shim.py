"""The Triton-interpreter NumPy shim ships with the package and with every scaffold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kerneltriage.resources import data_path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_a_kernel_module_under_the_interpreter_applies_the_shim():
    code = (
        "from triton.runtime import interpreter\n"
        "import kerneltriage.kernels.norms.triton_kernels\n"
        "assert getattr(interpreter._patch_lang_tensor, 'numpy_shim', False)\n"
        "from kerneltriage.kernels import interpreter_shim\n"
        "assert interpreter_shim.apply()  # idempotent\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_scaffold_kernel_includes_the_shim():
    templates = data_path("templates")
    kernels = sorted(templates.glob("*/kernel.py.j2"))
    assert len(kernels) >= 6
    for path in kernels:
        assert '{% include "_shared/interpreter_shim.py.j2" %}' in path.read_text(), path
