"""The cached launch path (kernels/fast_launch.py).

On CPU: its logic against a stand-in kernel and launcher (which launch goes where, with which
arguments in which order, and when it must fall back to Triton's own path). On a GPU: that
every compiled kernel it keeps is the one Triton's own cache picks for those arguments, across
the argument classes Triton specializes on (alignment, ``== 1``, ``% 16``), and that the norms
and attention computed through it match the launches through Triton's path bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from kerneltriage.kernels import config, fast_launch, native
from kerneltriage.kernels.fast_launch import _arg_class, _Driver


class CudaLauncher:  # the name the fast path checks for: Triton's NVIDIA launcher class
    def __init__(self, scratch: int = 0):
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = 0
        self.launch_pdl = 0
        self.calls: list[tuple] = []

    def launch(self, *args):
        self.calls.append(args)

    def __call__(self, *args):  # what a kernel with scratch memory is launched through
        self.calls.append(("__call__", *args))


class Compiled:
    def __init__(self, runner):
        self.run = runner
        self.function = 1234
        self.packed_metadata = (4, 1, 0)


class Param:
    def __init__(self, name):
        self.name = name


class FakeKernel:
    """Records the launches that go through Triton's path (``JITFunction.run``)."""

    def __init__(self, runner, names):
        self.params = [Param(n) for n in names]
        self.runner = runner
        self.slow: list[tuple] = []

    def run(self, *args, grid, warmup, **kwargs):
        self.slow.append((grid, args, kwargs))
        return Compiled(self.runner)


class Hooks:
    def __init__(self):
        self.calls: list = []


class Runtime:
    def __init__(self):
        self.launch_enter_hook = Hooks()
        self.launch_exit_hook = Hooks()


@pytest.fixture
def fake_driver(monkeypatch):
    runtime = Runtime()
    monkeypatch.setattr(_Driver, "ok", True)
    monkeypatch.setattr(_Driver, "device", staticmethod(lambda: 0))
    monkeypatch.setattr(_Driver, "stream", staticmethod(lambda device: 777))
    monkeypatch.setattr(_Driver, "runtime", runtime)
    monkeypatch.setattr(fast_launch, "_LAUNCHERS", {})
    return runtime.launch_enter_hook


def test_arg_class_follows_triton_specialization():
    x = torch.zeros(64, dtype=torch.float32)
    assert _arg_class((x,)) == _arg_class((x[4:],))  # 16 bytes on: still aligned
    assert _arg_class((x,)) != _arg_class((x[1:],))  # 4 bytes on: not
    assert _arg_class((x,)) != _arg_class((x.to(torch.bfloat16),))
    assert _arg_class((1,)) != _arg_class((2,))  # 1 is a constant to Triton
    assert _arg_class((16,)) != _arg_class((17,))  # divisibility by 16
    assert _arg_class((17,)) == _arg_class((33,))
    assert _arg_class((2**31 - 1,)) != _arg_class((2**31 + 15,))  # i32 vs i64
    assert _arg_class((None,)) != _arg_class((0,))
    assert _arg_class((True,)) != _arg_class((1,))
    assert _arg_class((0.5,)) == _arg_class((1e-6,))  # floats are not specialized


def test_second_launch_of_a_class_goes_direct(fake_driver):
    runner = CudaLauncher()
    kernel = FakeKernel(runner, ["X", "M", "N", "BLOCK", "FLAG"])
    kwargs = {"BLOCK": 128, "FLAG": True, "num_warps": 4}
    x = torch.zeros(64)
    fast_launch.fast_launch(kernel, (3,), (x, 17, 64), kwargs)
    assert len(kernel.slow) == 1 and runner.calls == []  # first: through Triton
    fast_launch.fast_launch(kernel, (5, 2), (x, 33, 64), kwargs)  # same class
    assert len(kernel.slow) == 1
    (call,) = runner.calls
    # grid, stream, function, cooperative, pdl, scratch x2, metadata, launch metadata,
    # hooks x2, then every parameter in order, constexprs from kwargs
    assert call[:13] == (5, 2, 1, 777, 1234, 0, 0, None, None, (4, 1, 0), None, None, None)
    assert call[13:] == (x, 33, 64, 128, True)

    fast_launch.fast_launch(kernel, (3,), (x[1:], 17, 64), kwargs)  # unaligned: new class
    fast_launch.fast_launch(kernel, (3,), (x, 1, 64), kwargs)  # M == 1: new class
    assert len(kernel.slow) == 3 and len(runner.calls) == 1
    fast_launch.fast_launch(kernel, (3,), (x, 1, 64), kwargs)
    assert len(kernel.slow) == 3 and len(runner.calls) == 2

    other = {"BLOCK": 256, "FLAG": True, "num_warps": 4}  # another configuration
    fast_launch.fast_launch(kernel, (3,), (x, 33, 64), other)
    assert len(kernel.slow) == 4


def test_falls_back_to_triton(fake_driver):
    x = torch.zeros(64)
    # a launch hook (a profiler's): every launch through Triton, which calls it
    kernel = FakeKernel(CudaLauncher(), ["X", "M", "BLOCK"])
    kwargs = {"BLOCK": 128}
    fast_launch.fast_launch(kernel, (1,), (x, 17), kwargs)
    fake_driver.calls.append(print)
    fast_launch.fast_launch(kernel, (1,), (x, 17), kwargs)
    assert len(kernel.slow) == 2 and kernel.runner.calls == []
    fake_driver.calls.clear()
    fast_launch.fast_launch(kernel, (1,), (x, 17), kwargs)
    assert len(kernel.slow) == 2 and len(kernel.runner.calls) == 1

    # another backend's launcher: never cached
    kernel = FakeKernel(object(), ["X", "M", "BLOCK"])
    block64 = {"BLOCK": 64}
    for _ in range(3):
        fast_launch.fast_launch(kernel, (1,), (x, 17), block64)
    assert len(kernel.slow) == 3
    assert "CudaLauncher" in fast_launch.launcher_for(kernel, block64).why

    # a launcher that rejects the arguments (another version's layout): Triton's path from then on
    class Rejecting(CudaLauncher):
        def launch(self, *args):
            raise TypeError("function takes exactly 17 arguments")

    kernel = FakeKernel(Rejecting(), ["X", "M", "BLOCK"])
    for _ in range(3):
        fast_launch.fast_launch(kernel, (1,), (x, 17), {"BLOCK": 32})
    assert len(kernel.slow) == 3

    # a parameter with a default that kwargs do not give: the tail is unknown
    kernel = FakeKernel(CudaLauncher(), ["X", "M", "BLOCK", "EXTRA"])
    for _ in range(2):
        fast_launch.fast_launch(kernel, (1,), (x, 17), {"BLOCK": 64})
    assert len(kernel.slow) == 2


def test_scratch_kernels_launch_through_the_launcher_object(fake_driver):
    """A kernel with global scratch memory (device-side tensor descriptors) is launched through
    CudaLauncher.__call__, which allocates the scratch, with __call__'s argument layout."""
    runner = CudaLauncher(scratch=64)
    kernel = FakeKernel(runner, ["X", "M", "BLOCK"])
    kwargs = {"BLOCK": 64}
    x = torch.zeros(64)
    for _ in range(2):
        fast_launch.fast_launch(kernel, (4, 3), (x, 17), kwargs)
    assert len(kernel.slow) == 1
    (call,) = runner.calls
    assert call == ("__call__", 4, 3, 1, 777, 1234, (4, 1, 0), None, None, None, x, 17, 64)


def test_bound_is_the_latest_launch_of_this_thread(fake_driver):
    """``Bound.latest`` hands out the entry this thread just launched, and nothing when another
    thread launched the same kernel since (it may have had another argument class)."""
    import threading

    runner = CudaLauncher()
    kernel = FakeKernel(runner, ["X", "M", "BLOCK"])
    kwargs = {"BLOCK": 64}
    x = torch.zeros(64)
    assert fast_launch.Bound.latest(kernel, kwargs) is None  # never launched
    fast_launch.fast_launch(kernel, (2,), (x, 17), kwargs)
    b = fast_launch.Bound.latest(kernel, kwargs)
    assert b is not None and b.function == 1234 and b.packed == (4, 1, 0) and b.tail == (64,)
    b.launch(
        7,
        1,
        1,
        b.stream(0),
        b.function,
        b.coop,
        b.pdl,
        None,
        None,
        b.packed,
        None,
        None,
        None,
        x,
        33,
        *b.tail,
    )
    assert runner.calls[-1][:4] == (7, 1, 1, 777) and runner.calls[-1][-3:] == (x, 33, 64)

    t = threading.Thread(target=fast_launch.fast_launch, args=(kernel, (2,), (x[1:], 17), kwargs))
    t.start()
    t.join()
    assert fast_launch.Bound.latest(kernel, kwargs) is None
    fast_launch.fast_launch(kernel, (2,), (x, 17), kwargs)  # this thread again
    assert fast_launch.Bound.latest(kernel, kwargs) is not None


def test_interpreter_and_off_switch_take_triton_path(device):
    """What the library runs under the interpreter (CI) never touches the fast path."""
    cfg = config.current()
    if cfg.interpreter:
        from kerneltriage.kernels import rms_norm

        before = dict(fast_launch._LAUNCHERS)
        rms_norm(torch.randn(4, 32, device=device), torch.ones(32, device=device))
        assert before == fast_launch._LAUNCHERS
    with config.override(fast_launch=False) as c:
        assert not c.fast_launch


# ------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (Triton's own cache)")


@gpu
def test_cached_kernels_are_tritons_choice():
    """For each argument class the fast path kept a compiled kernel for, Triton's own lookup
    (``warmup``: bind, specialize, cache key) returns the same binary."""
    from kerneltriage.kernels import fused_add_rms_norm, layer_norm, rms_norm
    from kerneltriage.kernels.norms import launch as NL

    fast_launch._LAUNCHERS.clear()
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(80, 1040, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.rand(1024, device="cuda", generator=gen, dtype=torch.bfloat16)
    cases = [
        base[:64, :1024],  # aligned, M % 16 == 0
        base[:1, :1024],  # M == 1
        base[:33, 8:1032],  # aligned (16 bytes on), M odd
        base[:17, 1:1025],  # unaligned
        base.float()[:48, :1024],  # another dtype
    ]
    for x in cases:
        for _ in range(3):
            y = rms_norm(x, w)
            fused_add_rms_norm(x, x, w)
            layer_norm(x, w, w)
        with config.override(fast_launch=False):
            ref = rms_norm(x, w)
        assert torch.equal(y, ref)
    checked = 0
    assert [fl.why for fl in fast_launch._LAUNCHERS.values() if fl.disabled] == []
    for fl in fast_launch._LAUNCHERS.values():
        for (dev, cls), entry in fl.compiled.items():
            checked += 1
            assert dev == torch.cuda.current_device()
            assert cls  # non-empty
            assert entry[1] is not None
    assert checked >= len(cases)
    # Triton's own choice for each launcher's last arguments: replay through warmup
    plan = NL.plan(
        "fwd", 1024, (torch.bfloat16,) * 3 + (None,),
        tuple({"IS_RMS": True, "HAS_RES": False, "HAS_W": True, "HAS_B": False, "CAST_X": False,
               "INTERP": False}.items()),
        torch.device("cuda", torch.cuda.current_device()), None, False,
    )  # fmt: skip
    fl = fast_launch.launcher_for(NL.KERNELS["fwd"], plan.kwargs)
    assert fl is not None and not fl.disabled
    for x in cases[:4]:
        M, N = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(M, device="cuda", dtype=torch.float32)
        args = (x, None, w, None, y, None, None, rstd, M, N, x.stride(0), 0, y.stride(0), 0, 1e-6, 0.0)
        grid = plan.grid(M, N, plan.kwargs)
        compiled = NL.KERNELS["fwd"].warmup(*args, grid=grid, **plan.kwargs)
        entry = fl.compiled[(torch.cuda.current_device(), _arg_class(args))]
        assert entry[1] == compiled.function
        assert entry[2] == compiled.packed_metadata


@gpu
def test_attention_through_fast_path_matches_triton_path():
    from kerneltriage.kernels import flash_attention

    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(2, 4, 200, 64, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    do = torch.randn(2, 4, 200, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
    for _ in range(2):
        out = flash_attention(q, k, v, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), do)
    with config.override(fast_launch=False):
        ref = flash_attention(q, k, v, causal=True)
        ref_grads = torch.autograd.grad(ref, (q, k, v), do)
    assert torch.equal(out, ref)
    for g, r in zip(grads, ref_grads):
        assert torch.equal(g, r)


@gpu
def test_bound_norm_calls_match_the_generic_path():
    """The second and later eager calls of a signature take its bound launch (norms/fast.py);
    their outputs and gradients equal the generic path's bit for bit, for each norm, with and
    without a gradient, at a single row, odd row counts and strided rows."""
    from kerneltriage.kernels import fused_add_rms_norm, layer_norm, rms_norm
    from kerneltriage.kernels.norms import fast

    gen = torch.Generator(device="cuda").manual_seed(2)
    base = torch.randn(2, 37, 1040, device="cuda", generator=gen, dtype=torch.bfloat16)
    shapes = [base[0, :1, :1024], base[:, :, :1024], base[0, :33, 8:1032], base.reshape(-1, 1040)[:50, :768]]
    w = torch.rand(1024, device="cuda", generator=gen, dtype=torch.bfloat16) + 0.5
    b = torch.randn(1024, device="cuda", generator=gen, dtype=torch.bfloat16)

    def run_all(x, r, dy):
        n = x.shape[-1]
        xg = x.detach().clone().requires_grad_()
        wg = w[:n].detach().clone().requires_grad_()
        bg = b[:n].detach().clone().requires_grad_()
        outs = [rms_norm(x, w[:n]), layer_norm(x, w[:n], b[:n]), *fused_add_rms_norm(x, r, w[:n])]
        y = rms_norm(xg, wg)
        outs += [y, *torch.autograd.grad(y, (xg, wg), dy)]
        y = layer_norm(xg, wg, bg)
        outs += [y, *torch.autograd.grad(y, (xg, wg, bg), dy)]
        y, h = fused_add_rms_norm(xg, r, wg)
        outs += [y, h, *torch.autograd.grad((y, h), (xg, wg), (dy, dy))]
        return outs

    for x in shapes:
        fast._FWD.clear()
        fast._BWD.clear()
        if fast.TABLE is not None:
            fast.TABLE.clear()
        r = torch.randn(x.shape, device="cuda", generator=gen, dtype=x.dtype)
        dy = torch.randn(x.shape, device="cuda", generator=gen, dtype=x.dtype)
        with config.override(fast_launch=False):
            ref = run_all(x, r, dy)
        for _ in range(3):  # tune/compile, bind, then bound
            got = run_all(x, r, dy)
        bound = sorted((k[0], k[-2]) for k in fast._FWD)
        assert len(fast._FWD) == 6 and len(fast._BWD) == 3, (tuple(x.shape), bound, len(fast._BWD))
        if native.status() == "loaded":  # and each also to its C++ call
            assert len(fast.TABLE) == 6
        for i, (g, r) in enumerate(zip(got, ref)):
            assert torch.equal(g, r), (tuple(x.shape), i)
