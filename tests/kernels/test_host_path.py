"""The host path (kerneltriage/kernels/host_path.py): its switch, its fallback and the reasons it
reports, and every norm the package ships on both settings of the switch.

The fast path launches compiled CUDA binaries, so under Triton's interpreter (the CPU runs) the
switch on still means plain launches, and ``launch_path()`` says so; there the norms are checked
on both settings against the float64 reference and against each other. On a GPU the switch on is
the fast path (bound calls after the first calls of a signature), and its outputs and gradients
must equal the plain path's bit for bit. The fallback cases simulate another Triton, a Triton
without the internals, a failing set-up and a missing C++ compiler by monkeypatching what the
set-up checks, and run on whatever Triton is installed.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from kerneltriage.kernels import (  # noqa: E402
    FusedAddRMSNorm,
    GemmaRMSNorm,
    LayerNorm,
    LlamaRMSNorm,
    Olmo2RMSNorm,
    RMSNorm,
    _common,
    config,
    host_path,
    launch_path,
    native,
    set_fast_launch,
)
from kerneltriage.kernels import fast_launch as fast_launch_mod  # noqa: E402
from kerneltriage.kernels.norms import __all__ as NORMS  # noqa: E402
from kerneltriage.kernels.norms.reference import (  # noqa: E402
    fused_add_rms_norm_ref,
    layer_norm_ref,
    rms_norm_ref,
)
from tests.kernels.norms.checks import DTYPES, TOL, assert_close, randn  # noqa: E402

#: This Triton's internals are the fast path's (else it takes plain launches, naming the version).
FAST_TRITON = tuple(int(x) for x in triton.__version__.split(".")[:2]) in host_path.SUPPORTED_TRITON

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kerneltriage" / "kernels"
GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _fresh_host_path():
    """Each test sets the fast path up from scratch and leaves the switch as it found it."""
    on = config.default().fast_launch
    host_path._reset()
    yield
    set_fast_launch(on)
    host_path._reset()


@pytest.fixture
def rng():
    # Fresh inputs every run; failures print gen.initial_seed() to replay one.
    return torch.Generator().manual_seed(time.time_ns() % 2**63)


# ------------------------------------------------------------------ the norms, switch on and off

MODULES = {
    "RMSNorm": RMSNorm,
    "LayerNorm": LayerNorm,
    "FusedAddRMSNorm": FusedAddRMSNorm,
    "LlamaRMSNorm": LlamaRMSNorm,
    "GemmaRMSNorm": GemmaRMSNorm,
    "Olmo2RMSNorm": Olmo2RMSNorm,
}
SHAPES = [(1, 1), (3, 17), (5, 4097)]


def test_every_shipped_norm_is_covered():
    modules = {name for name in NORMS if name[0].isupper()}
    assert modules == set(MODULES)


def _reference(name, x, r, w, b, eps, dtype):
    """Float64 outputs of module ``name`` for inputs (x, residual, weight, bias) of ``dtype``."""
    if name in ("RMSNorm", "Olmo2RMSNorm"):
        return [rms_norm_ref(x, w, eps)]
    if name == "LayerNorm":
        return [layer_norm_ref(x, w, b, eps)]
    if name == "LlamaRMSNorm":
        return [rms_norm_ref(x, w, eps, cast_before_weight=True, normed_dtype=dtype)]
    if name == "GemmaRMSNorm":
        return [rms_norm_ref(x, w, eps, weight_offset=1.0)]
    return list(fused_add_rms_norm_ref(x, r, w, eps, residual_dtype=dtype))


def _case(name, shape, dtype, device, gen):
    n = shape[-1]
    leaves = {
        "x": randn(gen, shape, dtype, device, 2.0, 3.0 if name == "LayerNorm" else 0.0),
        "weight": randn(gen, (n,), dtype, device, 0.5, 0.0 if name == "GemmaRMSNorm" else 1.0),
    }
    if name == "LayerNorm":
        leaves["bias"] = randn(gen, (n,), dtype, device)
    if name == "FusedAddRMSNorm":
        leaves["residual"] = randn(gen, shape, dtype, device)
    n_out = 2 if name == "FusedAddRMSNorm" else 1
    dys = [randn(gen, shape, dtype, device) for _ in range(n_out)]
    return leaves, dys


def _run(name, leaves, dys):
    """Outputs and the gradients of every input, through the module and torch.autograd."""
    n = leaves["x"].shape[-1]
    eps = 1e-5 if name == "LayerNorm" else 1e-6
    kwargs = {"device": leaves["x"].device, "dtype": leaves["x"].dtype}
    module = MODULES[name](n, eps=eps, **kwargs)
    with torch.no_grad():
        module.weight.copy_(leaves["weight"])
        if name == "LayerNorm":
            module.bias.copy_(leaves["bias"])
    x = leaves["x"].detach().clone().requires_grad_()
    inputs = [x]
    if name == "FusedAddRMSNorm":
        inputs.append(leaves["residual"].detach().clone().requires_grad_())
    outs = module(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    params = [p for p in (module.weight, getattr(module, "bias", None)) if p is not None]
    grads = torch.autograd.grad(outs, [*inputs, *params], dys)
    return [o.detach() for o in outs], list(grads)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(MODULES))
def test_norms_agree_with_the_switch_on_and_off(name, dtype, shape, device, rng):
    seed = rng.initial_seed()
    leaves, dys = _case(name, shape, dtype, device, rng)
    results = {}
    for on in (False, True):
        set_fast_launch(on)
        path = launch_path()
        if not on:
            assert (path.path, path.reason) == ("plain", "turned off by set_fast_launch(False)")
        elif config.current().interpreter:
            assert path.path == "plain" and "interpreter" in path.reason
        else:
            assert path.path == "fast", path.reason
        # On the fast path the first call of a signature tunes and compiles, the second binds,
        # the third takes the bound call: all three must agree with plain launches.
        for _ in range(3 if path.path == "fast" else 1):
            results[on] = _run(name, leaves, dys)

    (plain_outs, plain_grads), (fast_outs, fast_grads) = results[False], results[True]
    for i, (a, b) in enumerate(zip(plain_outs + plain_grads, fast_outs + fast_grads)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name} {dtype} {shape}: result {i} differs"

    ref_leaves = {k: v.double().requires_grad_() for k, v in leaves.items()}
    ref_outs = _reference(
        name,
        ref_leaves["x"],
        ref_leaves.get("residual"),
        ref_leaves["weight"],
        ref_leaves.get("bias"),
        1e-5 if name == "LayerNorm" else 1e-6,
        dtype,
    )
    order = ["x", "residual", "weight", "bias"]
    wrt = [ref_leaves[k] for k in order if k in ref_leaves]
    ref_grads = torch.autograd.grad(ref_outs, wrt, [d.double() for d in dys])
    for i, (o, r) in enumerate(zip(fast_outs, ref_outs)):
        assert_close(o, r.detach(), dtype, f"{name} {tuple(shape)} output {i}", seed)
    dx_terms = _dx_term_scale(name, ref_leaves, dys)
    for k, g, r in zip([k for k in order if k in ref_leaves], fast_grads, ref_grads):
        tol = TOL[dtype]
        if k in ("x", "residual"):
            tol *= max(1.0, dx_terms / (r.pow(2).mean().sqrt().item() or 1.0))
        assert_close(g, r, dtype, f"{name} {tuple(shape)} d{k}", seed, tol=tol)


def _dx_term_scale(name, leaves, dys):
    """The size of the terms that cancel in dx = rstd·(g − x̂·c1 [− c2]), g = w·dy: rms(dy)·
    rms(w)·rstd. On a row of one element dx is that difference of two nearly equal terms (about
    1e-7 of them): its error is judged against them, not against the tiny result."""
    x = leaves["x"].detach()
    if name == "FusedAddRMSNorm":
        x = x + leaves["residual"].detach()
    if name == "LayerNorm":
        x = x - x.mean(-1, keepdim=True)
    w = leaves["weight"].detach() + (1.0 if name == "GemmaRMSNorm" else 0.0)
    rstd = (x.pow(2).mean() + 1e-6).rsqrt().item()
    dy = dys[0].double()
    return dy.pow(2).mean().sqrt().item() * w.pow(2).mean().sqrt().item() * rstd


# ------------------------------------------------------------------------------- the fallback


class RecordingKernel:
    """A stand-in ``triton.jit`` kernel: records plain launches (``kernel[grid](...)``)."""

    def __init__(self):
        self.plain: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.plain.append((grid, args, kwargs))

    def run(self, *args, **kwargs):  # what the fast path calls first: never, on the plain path
        raise AssertionError("launched through the fast path")


def _assert_plain_launches():
    """Both launch functions (attention's, and the norms' plans' ``_common.launch``, routed
    through the host path) launch plainly."""
    kernel = RecordingKernel()
    kwargs = {"BLOCK": 64, "num_warps": 4}
    host_path.launch(kernel, (3,), (1, 2), kwargs, config.current())
    _common.launch(kernel, (5,), (1, 2), kwargs, config.current())
    assert kernel.plain == [((3,), (1, 2), kwargs), ((5,), (1, 2), kwargs)]


def test_another_triton_takes_plain_launches_and_says_why(monkeypatch):
    monkeypatch.setattr(host_path, "_triton_version", lambda: "3.5.1")
    with config.override(interpreter=False):  # past the interpreter, to the set-up's own checks
        path = launch_path()
        assert path.path == "plain"
        assert path.reason == "Triton 3.5.1: the fast path relies on the internals of Triton 3.6 only"
        assert path.triton == "3.5.1" and path.native == "not used"
        _assert_plain_launches()


def test_a_triton_without_the_launch_internals_takes_plain_launches(monkeypatch):
    """Triton's version passes but ``triton.knobs`` (the launch hooks) is missing, as before
    Triton 3.4: the driver lookup fails and says what it missed."""
    monkeypatch.setattr(host_path, "_triton_version", lambda: "3.6.0")
    monkeypatch.delattr(triton, "knobs")
    monkeypatch.setitem(sys.modules, "triton.knobs", None)  # import triton.knobs: ImportError
    monkeypatch.setattr(fast_launch_mod._Driver, "ok", False)
    monkeypatch.setattr(fast_launch_mod._Driver, "failed", False)
    monkeypatch.setattr(fast_launch_mod._Driver, "why", None)
    with config.override(interpreter=False):
        path = launch_path()
        assert path.path == "plain"
        assert path.reason.startswith("Triton's launch internals not found (ModuleNotFoundError: ")
        assert "triton.knobs" in path.reason
        _assert_plain_launches()


def test_a_failing_set_up_is_a_reason_not_an_exception(monkeypatch):
    def broken():
        raise OSError("driver library unreadable")

    monkeypatch.setattr(host_path, "_check_version", broken)
    with config.override(interpreter=False):
        assert launch_path().reason == "setting the fast path up failed: OSError: driver library unreadable"
        _assert_plain_launches()


def test_the_interpreter_takes_plain_launches_before_any_set_up(monkeypatch):
    def must_not_run():
        raise AssertionError("the fast path was set up under the interpreter")

    monkeypatch.setattr(host_path, "_check_version", must_not_run)
    with config.override(interpreter=True):
        path = launch_path()
        assert path.path == "plain"
        assert path.reason == "Triton's interpreter (TRITON_INTERPRET=1): no compiled launcher to call"
        _assert_plain_launches()


def test_the_switch_off_takes_plain_launches_and_names_itself():
    with config.override(fast_launch=False, interpreter=False):
        assert launch_path().reason == "turned off by config.override(fast_launch=False)"
        _assert_plain_launches()
    set_fast_launch(False)
    with config.override(interpreter=False):  # an override keeps the default's switch
        assert not config.current().fast_launch
        _assert_plain_launches()
    assert launch_path().reason == "turned off by set_fast_launch(False)"


def test_the_environment_variable_turns_the_fast_path_off():
    code = "from kerneltriage.kernels import launch_path; p = launch_path(); print(p.path, '|', p.reason)"
    env = {**os.environ, "KERNELTRIAGE_FAST_LAUNCH": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "plain | turned off (KERNELTRIAGE_FAST_LAUNCH=0)"


def test_set_fast_launch_inside_an_override_outlives_it():
    with config.override(poison=True):
        set_fast_launch(False)
        assert config.current().poison and not config.current().fast_launch
    assert config.current() is config.default() and not config.current().fast_launch
    set_fast_launch(True)
    assert config.current() is config.default() and config.current().fast_launch


def test_with_the_set_up_passing_the_fast_path_is_chosen(monkeypatch):
    """On this Triton with its driver found (a GPU; on CPU the driver check is stubbed): the
    fast path, with the norms' bound calls only under the default configuration; on a Triton
    whose internals it was not set up for, the plain path, naming the version."""
    if not GPU:
        monkeypatch.setattr(host_path, "_check_driver", lambda: None)
    if not FAST_TRITON:
        with config.override(interpreter=False):
            path = launch_path()
        assert path.path == "plain" and path.reason.startswith(f"Triton {triton.__version__}: the fast path")
        return
    with config.override(interpreter=False):
        path = launch_path()
        assert path.path == "fast", path.reason
        assert "the norms' bound calls are off while config.override" in path.reason
        assert not host_path.select().bound
    interpreter = config.default().interpreter
    config.set_defaults(interpreter=False)
    try:
        path = launch_path()
        assert (path.path, path.reason) == (
            "fast",
            f"Triton {triton.__version__}: direct launches and bound norm calls",
        )
        assert host_path.select().bound
    finally:
        config.set_defaults(interpreter=interpreter)


def test_a_missing_compiler_keeps_the_python_fast_path_and_says_why(monkeypatch):
    """The C++ layer's build fails without a compiler: ``native`` says why, the path stays fast
    (its Python bound calls), and nothing raises."""
    from torch.utils import cpp_extension

    if not GPU:
        monkeypatch.setattr(host_path, "_check_driver", lambda: None)
    monkeypatch.setenv("KERNELTRIAGE_NATIVE", "1")
    monkeypatch.setenv("CXX", "kerneltriage-no-such-compiler")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    for attr in ("module", "why", "thread"):
        monkeypatch.setattr(native._State, attr, None)
    assert native.build(timeout=60) is None
    with config.override(interpreter=False):
        path = launch_path()
    if not FAST_TRITON:  # another Triton: plain launches, the C++ layer never asked for
        assert path.path == "plain" and path.reason.startswith(f"Triton {triton.__version__}")
        return
    assert path.path == "fast", path.reason
    assert path.native == "unavailable: RuntimeError: no C++ compiler (kerneltriage-no-such-compiler) on PATH"


# -------------------------------------------------------------------------- one import point

FAST_PATH_MODULES = {
    "kerneltriage.kernels.fast_launch",
    "kerneltriage.kernels.native",
    "kerneltriage.kernels.norms.fast",
}
# The fast path's own modules import each other; everything else goes through host_path.
FAST_PATH_FILES = {"host_path.py", "fast_launch.py", "native.py", "norms/fast.py"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_only_host_path_imports_the_fast_path():
    offenders = {}
    for path in sorted(KERNELS.rglob("*.py")):
        rel = path.relative_to(KERNELS).as_posix()
        if rel in FAST_PATH_FILES:
            continue
        found = _imports(path) & FAST_PATH_MODULES
        if found:
            offenders[rel] = sorted(found)
    assert offenders == {}
    assert _imports(KERNELS / "host_path.py") >= FAST_PATH_MODULES
