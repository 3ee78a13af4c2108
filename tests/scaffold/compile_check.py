"""Compile a scaffold's Triton kernels for a GPU target, without a GPU.

    python compile_check.py SCAFFOLD_DIR FUNCTION [--backward] [--arch 90] [--all-configs]

Runs the scaffold's own functions (forward and backward) on small CPU tensors with Triton's
interpreter off and a stand-in driver: every kernel launch is compiled for ``sm_<arch>`` (TTIR →
PTX → cubin with the bundled ptxas) instead of launched. This catches what the interpreter cannot:
code that runs in numpy but does not compile (types, unsupported ops, constexpr misuse). Outputs
are uninitialized memory; only compilation is checked. Prints one line per compiled kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Shared memory a block may use, bytes (opt-in maximum per block).
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scaffold", type=Path)
    parser.add_argument("function", help="the scaffold's public function, e.g. rms_norm")
    parser.add_argument("--backward", action="store_true", help="also compile the backward kernels")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--all-configs", action="store_true", help="compile every autotune config")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported: the compiler path
    scaffold = args.scaffold.resolve()
    sys.path.insert(0, str(scaffold))
    os.chdir(scaffold)

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    class StandInDriver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", args.arch, 32)

    driver.set_active(StandInDriver())
    compiled: list[str] = []
    jit_run = JITFunction.run

    too_big: list[str] = []

    def compile_only(self, *a, grid, warmup, **kw):
        kernel = jit_run(self, *a, grid=grid, warmup=True, **kw)
        meta = {k: v for k, v in kw.items() if k.isupper() or k in ("num_warps", "num_stages")}
        shared = getattr(kernel.metadata, "shared", 0)
        line = f"{self.__name__} {meta} shared={shared}"
        if line not in compiled:
            compiled.append(line)
            print("compiled", line, flush=True)
            if shared > SHARED_LIMIT.get(args.arch, 101376):
                too_big.append(line)
        return kernel

    def tune_compile_only(self, *a, **kw):
        kw.pop("warmup", None)
        self.nargs = dict(zip(self.arg_names, a))
        configs = self.prune_configs(kw) if args.all_configs else self.prune_configs(kw)[:1]
        for config in configs:
            self.fn.run(*a, warmup=True, **kw, **config.all_kwargs())
        self.nargs = None

    JITFunction.run = compile_only
    Autotuner.run = tune_compile_only

    import kernel
    import test_kernel

    kernel._check_device = lambda *tensors: None  # CPU tensors stand in for CUDA ones
    fn = getattr(kernel, args.function)
    shapes = test_kernel.ODD_SHAPES[:1] + test_kernel.INTERPRETER_SHAPES[:1]
    for dtypes in test_kernel.DTYPES:
        for shape in shapes:
            inputs = test_kernel.make_inputs(shape, dtypes, requires_grad=args.backward)
            with torch.no_grad():
                fn(*inputs)
            if args.backward:
                outs = fn(*inputs)
                outs = outs if isinstance(outs, (tuple, list)) else (outs,)
                outs = [o for o in outs if o.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.zeros_like(o) for o in outs])
    print(f"{len(compiled)} kernel variants compiled for sm_{args.arch} (triton {triton.__version__})")
    for line in too_big:
        print("over the shared-memory limit:", line)
    return 0 if compiled and not too_big else 1


if __name__ == "__main__":
    sys.exit(main())
