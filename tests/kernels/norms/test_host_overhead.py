"""Host overhead of the norm wrappers: what a call costs in Python with the kernel launch itself
stubbed out through ``config.override(launcher=...)``.

The budget is for this project's 2-core CPU machine, where a call measured (best of 40 rounds)
~18 µs forward without autograd (fused add, LayerNorm ~24 µs), ~40 µs forward through autograd
and ~170 µs forward + backward, against ~17 µs for ``F.rms_norm`` computing a 8×64 row block
(~200 µs forward + backward); the budgets leave about twice that (a loaded CI machine, another
Python build). What the budget catches is per-call work that
does not belong there: autotuner lookups, launch configurations rebuilt per call, extra tensor
operations, host reads of device memory. Forward + backward is dominated by torch's autograd
engine (``torch.autograd.backward`` itself costs ~100 µs here).

Besides the time: with the launches stubbed, a call may dispatch nothing but allocations and
views (no tensor work, no ``.item()``-style host read, which on a GPU is a sync), and the host
code names no synchronizing call.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kerneltriage import kernels
from kerneltriage.kernels import config, flash_attention, fused_add_rms_norm, layer_norm, rms_norm

BUDGET_US = {
    "rms_norm forward": 40,
    "fused_add_rms_norm forward": 50,
    "layer_norm forward": 50,
    "rms_norm forward through autograd": 80,
    "rms_norm forward + backward": 400,
}
# The same budgets as multiples of torch's own F.rms_norm call (~17 µs here), measured in the
# same process: a machine slowed by load or another Python build slows both, so the budget
# scales with it. A call is over budget only when it is over both.
BUDGET_X_TORCH = {name: us / 17.0 for name, us in BUDGET_US.items()}


def per_call_us(fn, budget: float, calls: int = 40, rounds: int = 40, attempts: int = 5) -> float:
    """Best of ``rounds`` means over ``calls`` calls. The machine's noise only adds time, and
    rounds of a millisecond or two each mostly fit in one scheduler time slice, so the best of
    many finds an undisturbed one even while other processes share the 2 cores; a burst of load
    that covers them all passes, so up to ``attempts`` tries (a slow wrapper stays slow)."""
    best = float("inf")
    for _ in range(attempts):
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        if best <= budget:
            break
        time.sleep(0.2)
    return best


class CountingLauncher:
    def __init__(self):
        self.kernels: list[str] = []

    def __call__(self, kernel, grid, args, kwargs):
        self.kernels.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)


def test_wrapper_overhead_within_budget(device):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=gen).to(device)
    r = torch.randn(8, 64, generator=gen).to(device)
    w = torch.rand(64, generator=gen).to(device)
    b = torch.randn(64, generator=gen).to(device)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.ones_like(x)
    cases = {
        "rms_norm forward": lambda: rms_norm(x, w),
        "fused_add_rms_norm forward": lambda: fused_add_rms_norm(x, r, w),
        "layer_norm forward": lambda: layer_norm(x, w, b),
        "rms_norm forward through autograd": lambda: rms_norm(xg, wg),
        "rms_norm forward + backward": lambda: torch.autograd.backward(rms_norm(xg, wg), dy),
    }
    for fn in cases.values():
        fn()  # real launches first: plans resolved (autotuned on a GPU), kernels compiled

    launcher = CountingLauncher()
    with config.override(launcher=launcher):
        # the stub is what runs: one launch per forward, backward adds its kernel + the dw sum
        rms_norm(x, w)
        torch.autograd.backward(rms_norm(xg, wg), dy)
        assert launcher.kernels == [
            "_norm_fwd_kernel",
            "_norm_fwd_kernel",
            "_norm_bwd_kernel",
            "_sum_partials_kernel",
        ]
        measured = {name: per_call_us(fn, BUDGET_US[name]) for name, fn in cases.items()}
    baseline = per_call_us(lambda: torch.nn.functional.rms_norm(x, (64,), w), 0.0, attempts=1)
    budget = {name: max(us, BUDGET_X_TORCH[name] * baseline) for name, us in BUDGET_US.items()}
    over = {
        name: f"{us:.1f} µs > {budget[name]:.0f} µs" for name, us in measured.items() if us > budget[name]
    }
    assert not over, f"host time per call over budget: {over} (all: {measured}; F.rms_norm {baseline:.1f} µs)"


class OpRecorder(TorchDispatchMode):
    """Every aten op that reaches the dispatcher inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def test_no_tensor_work_beyond_allocation(device):
    """With the launches stubbed, a call dispatches allocations and views only: no copies, no
    reductions, and no ``_local_scalar_dense`` (what ``.item()``, ``float(t)`` and ``bool(t)``
    become: a device sync on a GPU). Backward included (``autograd.grad``: no ``.grad`` to
    accumulate); contiguous inputs (a strided last dim is copied, by design)."""
    gen = torch.Generator().manual_seed(0)
    x, r = (torch.randn(8, 64, generator=gen).to(device) for _ in range(2))
    w = torch.rand(64, generator=gen).to(device)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    q, k, v = (
        torch.randn(2, 2, 24, 16, generator=gen).to(device, torch.bfloat16).requires_grad_() for _ in range(3)
    )
    calls = {
        "rms_norm": lambda: rms_norm(x, w),
        "layer_norm": lambda: layer_norm(x, w, w),
        "rms_norm fwd+bwd": lambda: torch.autograd.grad(rms_norm(xg, wg), (xg, wg), x),
        "fused_add_rms_norm fwd+bwd": lambda: torch.autograd.grad(
            fused_add_rms_norm(xg, r, wg), (xg, wg), (x, r)
        ),
        "flash_attention fwd+bwd": lambda: torch.autograd.grad(
            flash_attention(q, k, v, causal=True), (q, k, v), q
        ),
    }
    allowed = {"aten.empty.memory_format", "aten.view.default", "aten.detach.default"}
    for fn in calls.values():
        fn()  # real launches first: on a GPU the first call of a shape autotunes
    with config.override(launcher=lambda *args: None):
        for name, fn in calls.items():
            with OpRecorder() as rec:
                fn()
            assert rec.ops <= allowed, f"{name} dispatched {sorted(rec.ops - allowed)}"


def test_host_code_has_no_sync_calls():
    """No explicit synchronization or host read in the kernels' host code."""
    root = Path(kernels.__file__).parent
    pattern = re.compile(r"\.item\(\)|synchronize\(|\.tolist\(\)|\.cpu\(\)|\.numpy\(\)")
    hits = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        # interpreter_shim.py patches Triton's CPU interpreter only (TRITON_INTERPRET=1): no GPU.
        if path.name not in ("reference.py", "triton_kernels.py", "interpreter_shim.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []
