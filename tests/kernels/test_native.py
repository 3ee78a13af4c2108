"""The C++ bound norm calls (kernels/native.py, csrc/norm_node.cpp).

On CPU: the launch description built from a compiled kernel's signature and metadata (which
parameters go to the kernel, in which slot kind; which kernels are refused), and the extension
itself builds against this torch and refuses malformed programs. On a GPU: every norm through
the C++ call and node gives the outputs and gradients of Triton's own launch path bit for bit,
its backward is bound per gradient signature (and an unbound one, e.g. an expanded gradient,
takes the generic path), and autograd's checks still hold (retain_graph, in-place changes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from kerneltriage.kernels import config, native
from kerneltriage.kernels.native import F32, I32, I64, PTR, Ref


def _bound(types: list[str], **md) -> SimpleNamespace:
    meta = {"num_warps": 4, "num_ctas": 1, "shared": 1024, "launch_cooperative_grid": False, "launch_pdl": False,
            "global_scratch_size": 0, "profile_scratch_size": 0, "tensordesc_meta": None} | md  # fmt: skip
    compiled = SimpleNamespace(
        metadata=SimpleNamespace(**meta),
        src=SimpleNamespace(signature={f"p{i}": t for i, t in enumerate(types)}),
        function=0xABC,
    )
    return SimpleNamespace(compiled=compiled)


def test_launch_spec_lays_out_tritons_parameters():
    # x, residual (None: constexpr), y, M (== 1: constexpr), N, stride (i64), eps, then a
    # constexpr block size after the positional arguments
    types = ["*bf16", "constexpr", "*bf16", "constexpr", "i32", "i64", "fp32", "constexpr"]
    args = (Ref(0), None, Ref(4), 1, 1024, 2**40, 1e-6)
    spec = native.launch_spec(_bound(types), (4096, 1, 1), args)
    function, grid, block, smem, kinds, ints, floats = spec
    assert (function, grid, block, smem) == (0xABC, [4096, 1, 1], 128, 1024)
    assert kinds == [PTR, PTR, I32, I64, F32]
    assert ints == [0, 4, 1024, 2**40, 0]
    assert floats[:4] == [0.0] * 4 and floats[4] == pytest.approx(1e-6)


@pytest.mark.parametrize(
    ("types", "args", "md"),
    [
        (["*bf16", "i32"], (Ref(0), 7), {"num_ctas": 2}),  # a cluster launch
        (["*bf16", "i32"], (Ref(0), 7), {"launch_pdl": True}),
        (["*bf16", "i32"], (Ref(0), 7), {"global_scratch_size": 64}),  # needs a scratch buffer
        (["*bf16", "i32"], (Ref(0), 7), {"tensordesc_meta": [{}]}),  # TMA descriptors
        (["*bf16", "i32"], (3, 7), {}),  # a pointer parameter given an int
        (["*bf16", "i1"], (Ref(0), True), {}),  # a type this launcher does not lay out
        (["*bf16", "i32", "i32"], (Ref(0), 7), {}),  # a non-constexpr parameter after the args
        (["*bf16"], (Ref(0), 7), {}),  # more arguments than parameters
    ],
)
def test_launch_spec_refuses_what_it_cannot_lay_out(types, args, md):
    assert native.launch_spec(_bound(types, **md), (1, 1, 1), args) is None


def test_launch_spec_needs_the_compiled_kernel():
    assert native.launch_spec(SimpleNamespace(), (1, 1, 1), (Ref(0),)) is None


@pytest.mark.slow
def test_extension_builds_against_this_torch_and_checks_programs():
    """The C++ source builds here (torch 2.13 owns autograd nodes by intrusive_ptr; the GPU
    image's 2.11 by shared_ptr: both must compile) and a malformed program is refused."""
    m = native.build()
    assert m is not None, native.status()
    assert native.status() == "loaded"
    p = m.Program(4, 8, 0)
    with pytest.raises(RuntimeError, match="out of range"):
        p.add_alloc(8, [4], torch.empty(0))
    with pytest.raises(RuntimeError, match="out of range"):
        p.add_launch(1, [1, 1, 1], 128, 0, [PTR], [9], [0.0])
    with pytest.raises(RuntimeError, match="differ in length"):
        p.add_launch(1, [1, 1, 1], 128, 0, [PTR, I32], [0], [0.0])
    with pytest.raises(RuntimeError, match="grid"):
        p.add_launch(1, [1, 1], 128, 0, [], [], [])
    p.set_outputs([4, 5, 6, 7])
    if not torch.cuda.is_available():
        x = torch.zeros(2, 4)
        with pytest.raises(RuntimeError):  # no libcuda here: refused, never a crash
            p.run([x, x, x, x])


@pytest.mark.slow
def test_backward_fallback_is_set_whichever_loads_first():
    """The C++ node calls back into Python for an unbound gradient signature: that callback is
    set whether the extension loads before or after the norms are imported (a build started by
    ``native.build()`` in a fresh process, then the first norm call, failed on a GPU before)."""
    code = (
        "from kerneltriage.kernels import native\n"
        "m = native.build()\n"
        "assert m is not None, native.status()\n"
        "before = m.has_fallback()\n"
        "import kerneltriage.kernels.norms.fast\n"
        "print(before, m.has_fallback())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True"]


@pytest.mark.slow
def test_build_survives_its_process_and_a_stale_lock(tmp_path):
    """A process that exits while its background build runs (a short script, Ctrl-C) must not
    leave torch's build lock behind: every later build would wait on it forever (seen on a
    GPU). The compile runs in a child of its own session, which finishes anyway; a lock older
    than any build is removed."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path), KERNELTRIAGE_NATIVE="1")
    lock = tmp_path / native.NAME / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = time.time() - 2 * native.STALE_LOCK_S
    os.utime(lock, (old, old))  # left by a build killed long ago
    leave = "from kerneltriage.kernels import native; import time; native.module(); time.sleep(3)"
    r = subprocess.run([sys.executable, "-c", leave], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    build = "from kerneltriage.kernels import native; m = native.build(600); print(native.status())"
    r = subprocess.run([sys.executable, "-c", build], env=env, capture_output=True, text=True, timeout=700)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["loaded"]
    assert not lock.exists()
    assert list((tmp_path / native.NAME).glob("*.so"))


# ------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (compiled Triton kernels)")


def _calls(kind: str, dtype: torch.dtype, M: int, N: int, weight: bool, bias: bool):
    """(fn(x, r, w, b) -> output tensors, inputs) of one norm call."""
    from kerneltriage.kernels import fused_add_rms_norm, layer_norm, rms_norm

    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N)
    x = torch.randn(M, N, device="cuda", dtype=dtype, generator=gen)
    r = torch.randn(M, N, device="cuda", dtype=dtype, generator=gen)
    w = torch.rand(N, device="cuda", dtype=dtype, generator=gen) + 0.5 if weight else None
    b = torch.randn(N, device="cuda", dtype=dtype, generator=gen) if bias else None
    if kind == "rms":
        return (lambda x, r, w, b: (rms_norm(x, w),)), (x, None, w, None)
    if kind == "ln":
        return (lambda x, r, w, b: (layer_norm(x, w, b),)), (x, None, w, b)
    return (lambda x, r, w, b: fused_add_rms_norm(x, r, w)), (x, r, w, None)


def _run(fn, inputs, grad: bool, dys=None):
    leaves = [None if t is None else t.detach().clone().requires_grad_(grad) for t in inputs]
    outs = fn(*leaves)
    if not grad:
        return outs, None, outs
    wrt = [t for t in leaves if t is not None]
    dys = dys or [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(outs, wrt, dys)
    return outs, grads, outs


CASES = [
    ("rms", torch.bfloat16, 4096, 1024, True, False),
    ("rms", torch.float32, 33, 768, True, False),
    ("rms", torch.bfloat16, 1, 4096, False, False),
    ("ln", torch.bfloat16, 257, 1024, True, True),
    ("ln", torch.float16, 64, 2048, True, False),
    ("add", torch.bfloat16, 4096, 1024, True, False),
    ("add", torch.float32, 17, 4096, True, False),
]


@gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}x{c[3]}")
def test_native_calls_match_tritons_path_bit_for_bit(case):
    from kerneltriage.kernels.norms import fast

    assert native.build() is not None, native.status()
    fast._forget()  # this case's signatures are bound afresh, into an empty table
    fn, inputs = _calls(*case)
    gen = torch.Generator(device="cuda").manual_seed(3)
    probe = fn(*inputs)
    dys = [torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=gen) for o in probe]
    for grad in (False, True):
        with config.override(fast_launch=False):  # Triton's own launch path, Python autograd
            ref_out, ref_grads, _ = _run(fn, inputs, grad, dys)
        for _ in range(4):  # generic + bind, C++ forward + generic backward + bind, C++ both
            outs, grads, live = _run(fn, inputs, grad, dys)
            for o, r in zip(outs, ref_out):
                assert torch.equal(o, r)
            if grad:
                for g, r in zip(grads, ref_grads):
                    assert torch.equal(g, r)
        if grad:
            assert live[0].grad_fn.name() == "kerneltriage::NormBackward"
    # one bound call without a gradient, one with, whose backward was bound on its first use
    assert sorted(n.n_backwards() for n in fast.TABLE.norms()) == [0, 1]


@gpu
def test_native_backward_with_an_unbound_gradient_takes_the_generic_path():
    from kerneltriage.kernels import rms_norm

    assert native.build() is not None, native.status()
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        rms_norm(x.requires_grad_(), w)
    xg = x.detach().clone().requires_grad_()
    y = rms_norm(xg, w)
    assert y.grad_fn.name() == "kerneltriage::NormBackward"
    (g,) = torch.autograd.grad(y.sum(), xg)  # dy: an expanded scalar, stride 0
    with config.override(fast_launch=False):
        xr = x.detach().clone().requires_grad_()
        (ref,) = torch.autograd.grad(rms_norm(xr, w).sum(), xr)
    assert torch.equal(g, ref)


@gpu
def test_native_node_keeps_autograds_checks():
    from kerneltriage.kernels import fused_add_rms_norm

    assert native.build() is not None, native.status()
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16).requires_grad_()
    for _ in range(3):
        fused_add_rms_norm(x, r, w)[0].sum().backward()
    y, h = fused_add_rms_norm(x, r, w)
    assert y.grad_fn.name() == "kerneltriage::NormBackward" and h.grad_fn is y.grad_fn
    dy = torch.randn_like(y)
    first = torch.autograd.grad(y, w, dy, retain_graph=True)
    second = torch.autograd.grad(y, w, dy)
    assert torch.equal(first[0], second[0])
    with pytest.raises(RuntimeError, match=r"backward through the graph a second time|freed"):
        torch.autograd.grad(y, w, dy)
    y, h = fused_add_rms_norm(x, r, w)
    h.mul_(2)  # the saved new_residual changed in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, w, dy)


@gpu
def test_native_call_runs_on_the_current_stream():
    from kerneltriage.kernels import layer_norm

    assert native.build() is not None, native.status()
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    new = torch.randn_like(x)
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            layer_norm(x, w, None)  # bound on this stream's calls
        torch.cuda._sleep(50_000_000)  # the side stream is busy, then x changes on it
        x.copy_(new)
        y = layer_norm(x, w, None)  # on another stream it would read x before the copy
    torch.cuda.current_stream().wait_stream(s)
    ref = torch.nn.functional.layer_norm(new.float(), (1024,), w.float(), None, 1e-5).to(x.dtype)
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)


@gpu
def test_native_calls_show_in_the_profiler():
    """Under torch.profiler (as in ``kerneltriage profile``) the C++ call records its op name,
    the node its backward, and CUPTI sees the kernels it launches."""
    from torch.profiler import ProfilerActivity, profile

    from kerneltriage.kernels import rms_norm

    assert native.build() is not None, native.status()
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(3):
        rms_norm(x, w).sum().backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        y = rms_norm(x, w)
        assert y.grad_fn.name() == "kerneltriage::NormBackward"
        y.backward(torch.ones_like(y))
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert "kerneltriage::rms_norm" in names
    assert any("kerneltriage::NormBackward" in n for n in names)
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("norm" in k for k in kernels) >= 2, kernels  # forward and backward kernels
