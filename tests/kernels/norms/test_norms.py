"""Norm kernels (kerneltriage/kernels/norms) against a float64 reference.

Runs on CUDA when present, else on CPU through Triton's interpreter (tests/conftest.py). Every
case draws fresh random inputs (the seed is in the failure message), and every buffer the host
code allocates (outputs, statistics, partial sums) is filled with NaN (``config.override(
poison=True)``), as are the output buffers the kernel-level tests pass, so that an element the
kernel fails to write fails the comparison.
"""

from __future__ import annotations

import re
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kerneltriage.errors import KernelInputError  # noqa: E402
from kerneltriage.kernels import config, norms  # noqa: E402
from kerneltriage.kernels.norms import launch  # noqa: E402
from kerneltriage.kernels.norms.launch import kernel_config, row_config  # noqa: E402
from kerneltriage.kernels.norms.reference import (  # noqa: E402
    fused_add_rms_norm_ref,
    layer_norm_ref,
    rms_norm_ref,
)
from tests.kernels.norms.checks import BF16, DTYPES, FP16, FP32, assert_close, randn  # noqa: E402

OPS = ("rms", "ln", "add")


@pytest.fixture(autouse=True)
def _poison_buffers():
    with config.override(poison=True):
        yield


@pytest.fixture
def rng():
    # Fresh inputs every run; failures print gen.initial_seed() to replay one.
    return torch.Generator().manual_seed(time.time_ns() % 2**63)


def _make_case(op, shape, dtype, device, gen, layout="contiguous"):
    """Inputs for one case. ``layout``: "contiguous", "rows" (a column slice of a wider tensor:
    row stride > N, last dim contiguous) or "transposed" (last dim strided, copied by the host)."""
    n = shape[-1]
    shift = 3.0 if op == "ln" else 0.0

    def act(scale=1.0, s=0.0):
        if layout == "rows":
            wide = randn(gen, (*shape[:-1], n + 37), dtype, device, scale, s)
            return wide[..., 5 : 5 + n]
        if layout == "transposed":
            base = randn(gen, (n, *shape[:-1]), dtype, device, scale, s)
            return base.movedim(0, -1)
        return randn(gen, shape, dtype, device, scale, s)

    case = {
        "x": act(2.0, shift),
        "weight": randn(gen, (n,), dtype, device, 0.5, 1.0),
        "bias": randn(gen, (n,), dtype, device) if op == "ln" else None,
        "residual": act() if op == "add" else None,
        "dy": act(),
        "dres": act() if op == "add" else None,
        "eps": 1e-5 if op == "ln" else 1e-6,
    }
    assert layout != "rows" or case["x"].stride(-2) == n + 37
    assert layout != "transposed" or case["x"].stride(-1) != 1
    return case


def _reference(op, c):
    """Float64 forward outputs and gradients from autograd on norms_ref."""
    leaves = {
        k: c[k].double().requires_grad_() for k in ("x", "weight", "bias", "residual") if c[k] is not None
    }
    if op == "rms":
        outs = [rms_norm_ref(leaves["x"], leaves["weight"], c["eps"])]
        grads_in = [c["dy"].double()]
    elif op == "ln":
        outs = [layer_norm_ref(leaves["x"], leaves["weight"], leaves["bias"], c["eps"])]
        grads_in = [c["dy"].double()]
    else:
        # new_residual rounded to the input dtype, as the kernel stores (and normalizes) it.
        outs = list(
            fused_add_rms_norm_ref(
                leaves["x"], leaves["residual"], leaves["weight"], c["eps"], residual_dtype=c["x"].dtype
            )
        )
        grads_in = [c["dy"].double(), c["dres"].double()]
    names = list(leaves)
    grads = torch.autograd.grad(outs, [leaves[k] for k in names], grads_in)
    return [o.detach() for o in outs], dict(zip(names, grads))


def _run_kernels_poisoned(op, c):
    """Host functions directly, with every output buffer prefilled with NaN."""
    x, dtype, dev = c["x"], c["x"].dtype, c["x"].device
    n = x.shape[-1]
    x2 = launch.as_rows(x)
    m = x2.shape[0]

    def nan(*shape, dt=dtype):
        return torch.full(shape, float("nan"), dtype=dt, device=dev)

    y, h = nan(m, n), nan(m, n)
    res2 = launch.as_rows(c["residual"]) if op == "add" else None
    _, _, mean, rstd = launch.norm_fwd(
        x2,
        c["weight"],
        c["bias"],
        res2,
        c["eps"],
        op != "ln",
        out=y,
        residual_out=h if op == "add" else None,
    )
    dx, dw, db = nan(m, n), nan(n), nan(n)
    launch.norm_bwd(
        launch.as_rows(c["dy"]),
        h if op == "add" else x2,
        c["weight"],
        mean,
        rstd,
        dresidual=launch.as_rows(c["dres"]) if op == "add" else None,
        need_db=op == "ln",
        dx_out=dx,
        dw_out=dw,
        db_out=db if op == "ln" else None,
    )
    shape = x.shape
    outs = [y.view(shape)] + ([h.view(shape)] if op == "add" else [])
    grads = {"x": dx.view(shape), "weight": dw}
    if op == "ln":
        grads["bias"] = db
    if op == "add":
        grads["residual"] = dx.view(shape)
    return outs, grads


def _check_case(op, shape, dtype, device, gen, layout="contiguous"):
    c = _make_case(op, shape, dtype, device, gen, layout)
    ref_outs, ref_grads = _reference(op, c)
    outs, grads = _run_kernels_poisoned(op, c)
    seed = gen.initial_seed()
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.dtype == dtype
        assert_close(o, r, dtype, f"{op} {tuple(shape)} {layout} output {i}", seed)
    for k, g in grads.items():
        assert_close(g, ref_grads[k], dtype, f"{op} {tuple(shape)} {layout} d{k}", seed)


# ---- numerics: every op x dtype on an odd shape, then the other shapes and layouts -------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_odd_shape_every_dtype(op, dtype, device, rng):
    _check_case(op, (1823, 781), dtype, device, rng)


SHAPES = [
    ((3, 5, 4097), "contiguous"),
    ((1, 65536), "contiguous"),  # the looped variant
    ((300, 64), "contiguous"),
    ((257, 1024), "rows"),  # column slice: row stride 1061, no copy
    ((2, 129, 96), "transposed"),  # last dim strided: copied by the host
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("shape", "layout"), SHAPES, ids=lambda v: str(v))
def test_shapes_and_layouts(op, shape, layout, device, rng):
    # Rotate dtypes over the cases so that each shape meets each dtype once across the ops.
    dtype = DTYPES[(SHAPES.index((shape, layout)) + OPS.index(op)) % 3]
    _check_case(op, shape, dtype, device, rng, layout)


@pytest.mark.parametrize("op", OPS)
def test_looped_variant_forced(op, device, rng):
    """The chunked two-pass path on a short row: 3 chunks (the last one partial), two rows per
    block with a masked tail, and a persistent backward whose programs own several row blocks
    (the dw/db partial read-modify-write). LN inputs sit far from zero (mean 3, fp32), where
    E[x²] − E[x]² in fp32 would miss the tolerance."""
    cfg = {"fwd": row_config(4, 2, 1024, True, 1), "bwd": row_config(4, 2, 1024, True, 1)}
    with config.override(norm_configs=cfg):
        _check_case(op, (19, 2300), FP32 if op == "ln" else BF16, device, rng)


@pytest.mark.parametrize("op", OPS)
def test_split_backward_forced(op, device, rng):
    """The two-kernel backward of long rows (row constants, then (column block, row group)
    tiles) on a short row: 3 column blocks, the last one partial, 5 row groups of 2-row blocks
    with a masked tail, so every group sums dw/db over several blocks."""
    cfg = {
        "bwd_dots": kernel_config(4, BLOCK_N=1024),
        "bwd_split": kernel_config(4, BLOCK_M=2, BLOCK_N=1024, PROGS_PER_SM=4),
    }
    with config.override(norm_split_bwd_above=1000, norm_configs=cfg):
        _check_case(op, (19, 2300), FP32 if op == "ln" else BF16, device, rng)


def test_single_block_multi_row_persistent(device, rng):
    """Single-block backward with several rows per block and a grid smaller than the row
    blocks, so each program accumulates dw over several iterations; forward persistent too."""
    cfg = {"fwd": row_config(4, 4, 256, False, 1), "bwd": row_config(4, 4, 256, False, 1)}
    with config.override(norm_configs=cfg):
        _check_case("ln", (45, 200), FP16, device, rng)


# ---- public API: autograd, modules --------------------------------------------------------------


def _leaf(t):
    return t.detach().clone().requires_grad_()


@pytest.mark.parametrize("op", OPS)
def test_autograd_matches_reference(op, device, rng):
    """Through the public functions and torch.autograd, on a 3-D sliced input."""
    dtype = BF16
    c = _make_case(op, (3, 41, 520), dtype, device, rng, layout="rows")
    ref_outs, ref_grads = _reference(op, c)
    leaves = {k: _leaf(c[k]) for k in ("x", "weight", "bias", "residual") if c[k] is not None}
    if op == "rms":
        outs = [norms.rms_norm(leaves["x"], leaves["weight"], c["eps"])]
        grads_in = [c["dy"]]
    elif op == "ln":
        outs = [norms.layer_norm(leaves["x"], leaves["weight"], leaves["bias"], c["eps"])]
        grads_in = [c["dy"]]
    else:
        outs = list(norms.fused_add_rms_norm(leaves["x"], leaves["residual"], leaves["weight"], c["eps"]))
        grads_in = [c["dy"], c["dres"]]
    torch.autograd.backward(outs, grads_in)
    seed = rng.initial_seed()
    for o, r in zip(outs, ref_outs):
        assert o.shape == c["x"].shape
        assert_close(o, r, dtype, f"{op} output", seed)
    for k, leaf in leaves.items():
        assert_close(leaf.grad, ref_grads[k], dtype, f"{op} d{k}", seed)


def test_no_weight_and_no_grad_paths(device, rng):
    """weight=None (RMSNorm and LayerNorm without affine), a LayerNorm with bias only, and
    inference (no autograd graph)."""
    x = randn(rng, (33, 300), FP32, device, 2.0, 1.0)
    b = randn(rng, (300,), FP32, device)
    seed = rng.initial_seed()
    assert_close(norms.rms_norm(x, None), rms_norm_ref(x.double()), FP32, "rms no weight", seed)
    assert_close(norms.layer_norm(x, None, b), layer_norm_ref(x.double(), None, b.double()), FP32, "ln", seed)
    xl, dy = _leaf(x), randn(rng, x.shape, FP32, device)
    norms.rms_norm(xl, None).backward(dy)
    xr = x.double().requires_grad_()
    rms_norm_ref(xr).backward(dy.double())
    assert_close(xl.grad, xr.grad, FP32, "rms no weight dx", seed)
    with torch.no_grad():
        y = norms.layer_norm(_leaf(x), None)
    assert not y.requires_grad


@pytest.mark.parametrize("looped", [False, True])
def test_eps_is_used(looped, device, rng):
    """A large eps against unit-variance rows: a kernel that drops or misreads eps fails."""
    cfg = row_config(4, 1, 128, True, 1)
    x = randn(rng, (9, 300), FP32, device)
    w = randn(rng, (300,), FP32, device, 0.5, 1.0)
    seed = rng.initial_seed()
    with config.override(norm_configs={"fwd": cfg, "bwd": cfg} if looped else {}):
        assert_close(norms.rms_norm(x, w, 0.5), rms_norm_ref(x, w, 0.5), FP32, "rms eps", seed)
        assert_close(norms.layer_norm(x, w, None, 0.5), layer_norm_ref(x, w, None, 0.5), FP32, "ln eps", seed)


def test_dtype_of_outputs_and_grads_follow_inputs(device, rng):
    """bf16 activations with an fp32 weight: y and dx in bf16, dweight in fp32."""
    x = _leaf(randn(rng, (16, 128), BF16, device))
    w = _leaf(randn(rng, (128,), FP32, device, 0.5, 1.0))
    y = norms.rms_norm(x, w)
    y.backward(torch.ones_like(y))
    assert (y.dtype, x.grad.dtype, w.grad.dtype) == (BF16, BF16, FP32)
    ref = rms_norm_ref(x.detach().double(), w.detach().double())
    assert_close(y, ref, BF16, "mixed-dtype output", rng.initial_seed())


def test_modules_match_functional_and_torch(device, rng):
    """The nn.Module drop-ins: outputs against torch.nn on the same (loaded) parameters,
    including a two-dim normalized_shape and torch.nn.RMSNorm's eps=None."""
    x = randn(rng, (7, 4, 16), FP32, device, 2.0, 0.5)
    seed = rng.initial_seed()
    for ours, theirs in (
        (norms.RMSNorm((4, 16), eps=None), torch.nn.RMSNorm((4, 16), eps=None)),
        (norms.LayerNorm(16), torch.nn.LayerNorm(16)),
        (norms.LayerNorm((4, 16), bias=False), torch.nn.LayerNorm((4, 16), bias=False)),
    ):
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn(p.shape, generator=rng))
        ours.load_state_dict(theirs.state_dict())
        ours.to(device)
        theirs.to(device)
        assert_close(ours(x), theirs(x), FP32, type(ours).__name__, seed)
    fused = norms.FusedAddRMSNorm(16, eps=1e-6).to(device)
    r = randn(rng, (7, 4, 16), FP32, device)
    y, h = fused(x, r)
    assert_close(h, x + r, FP32, "fused module new_residual", seed)
    assert_close(y, rms_norm_ref(x + r, fused.weight.detach()), FP32, "fused module out", seed)


def test_state_dicts_load_both_ways():
    torch_rms = torch.nn.RMSNorm(64)
    torch_ln = torch.nn.LayerNorm(64)
    with torch.no_grad():
        for p in (*torch_rms.parameters(), *torch_ln.parameters()):
            p.uniform_(-1, 1)
    for ours, theirs in (
        (norms.RMSNorm(64), torch_rms),
        (norms.FusedAddRMSNorm(64), torch_rms),
        (norms.LayerNorm(64), torch_ln),
        (norms.LayerNorm(64, elementwise_affine=False), torch.nn.LayerNorm(64, elementwise_affine=False)),
    ):
        result = ours.load_state_dict(theirs.state_dict(), strict=True)
        assert not result.missing_keys and not result.unexpected_keys
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        for k, v in theirs.state_dict().items():
            assert torch.equal(ours.state_dict()[k], v), k
        theirs.load_state_dict(ours.state_dict(), strict=True)


# ---- errors -----------------------------------------------------------------------------------


def _raises(message, fn, *args, **kwargs):
    with pytest.raises(KernelInputError, match=re.escape(message)):
        fn(*args, **kwargs)


def test_errors_name_the_problem(device):
    x = torch.randn(4, 8, device=device)
    w = torch.ones(8, device=device)
    _raises(
        "rms_norm: x has dtype float64; expected one of bfloat16, float16, float32",
        norms.rms_norm,
        x.double(),
        w,
    )
    _raises(
        "layer_norm: weight has dtype int32; expected one of bfloat16, float16, float32",
        norms.layer_norm,
        x,
        w.int(),
    )
    _raises(
        "rms_norm: weight has shape (9,); expected (8,), the last dim of x",
        norms.rms_norm,
        x,
        torch.ones(9, device=device),
    )
    _raises(
        "layer_norm: bias has shape (1, 8); expected (8,), the last dim of x",
        norms.layer_norm,
        x,
        w,
        torch.ones(1, 8, device=device),
    )
    _raises(
        "fused_add_rms_norm: residual has shape (4, 9); expected (4, 8) like x",
        norms.fused_add_rms_norm,
        x,
        torch.ones(4, 9, device=device),
        w,
    )
    _raises(
        "fused_add_rms_norm: residual has dtype float16; expected float32 like x",
        norms.fused_add_rms_norm,
        x,
        x.half(),
        w,
    )
    _raises(
        "rms_norm: x has shape (4, 0); expected at least one dim and a non-empty last dim",
        norms.rms_norm,
        torch.ones(4, 0, device=device),
        None,
    )
    _raises(
        "RMSNorm: input has shape (4, 8); its last dims must be (16,)",
        norms.RMSNorm(16).to(device),
        x,
    )


def test_errors_wrong_device():
    x = torch.randn(4, 8, device="meta")
    _raises(
        "rms_norm: tensors are on meta; the Triton kernels need a CUDA device",
        norms.rms_norm,
        x,
        torch.ones(8, device="meta"),
    )
    _raises(
        "layer_norm: tensors are on different devices: ['cpu', 'meta']",
        norms.layer_norm,
        x,
        torch.ones(8),
    )


def test_empty_batch(device):
    x = torch.randn(0, 3, 64, device=device, requires_grad=True)
    w = torch.ones(64, device=device, requires_grad=True)
    y = norms.rms_norm(x, w)
    assert y.shape == (0, 3, 64)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
