"""The kernels inside ``torch.compile``: the ``kerneltriage::`` custom ops keep a compiled model
in one graph, with no graph break and no recompilation when the batch size changes, and the
compiled model computes what the eager one does, gradients included.

On CPU the ops' implementation runs through Triton's interpreter, as in the other kernel tests.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import make_boxed_func

from kerneltriage.kernels import FusedAddRMSNorm, LayerNorm, LlamaRMSNorm, RMSNorm, flash_attention

# Small: each attention program costs the interpreter ~0.1 s.
D_MODEL, HEADS, SEQ = 64, 2, 19


class Block(nn.Module):
    """A pre-norm transformer block made of every built-in kernel."""

    def __init__(self):
        super().__init__()
        self.norm1 = RMSNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.norm2 = FusedAddRMSNorm(D_MODEL)
        self.mlp = nn.Linear(D_MODEL, D_MODEL)
        self.hf_norm = LlamaRMSNorm(D_MODEL)
        self.ln = LayerNorm(D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, HEADS, -1).permute(2, 0, 3, 1, 4).unbind(0)
        a = flash_attention(q, k, v, causal=True).transpose(1, 2).reshape(B, S, D_MODEL)
        normed, residual = self.norm2(self.proj(a), x)
        return self.ln(self.hf_norm(self.mlp(normed)) + residual)


def _model(device):
    torch.manual_seed(0)
    model = Block().to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.startswith("ln"):
                p.uniform_(0.5, 1.5)
    return model


class Recorder:
    """A backend that counts the graphs dynamo hands it and records the ops of the forward and
    backward graphs AOTAutograd makes of them, then runs those graphs as they are."""

    def __init__(self):
        self.graphs = 0
        self.ops = {"forward": set(), "backward": set()}
        self._aot = aot_autograd(
            fw_compiler=self._compiler("forward"), bw_compiler=self._compiler("backward")
        )

    def _compiler(self, kind):
        def compile_graph(gm, example_inputs):
            self.ops[kind] |= {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
            return make_boxed_func(gm.forward)

        return compile_graph

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self._aot(gm, example_inputs)


def _run(fn, model, x, dynamic_batch=False):
    """Output, input gradient and parameter gradients of ``fn`` (the model or its compiled form)."""
    x = x.detach().clone().requires_grad_()
    if dynamic_batch:
        torch._dynamo.mark_dynamic(x, 0)  # the batch dim is dynamic: one graph for all sizes
    out = fn(x)
    out.float().square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return out.detach(), x.grad, grads


FORWARD_OPS = {
    "kerneltriage.rms_norm.default",
    "kerneltriage.fused_add_rms_norm.default",
    "kerneltriage.layer_norm.default",
    "kerneltriage.flash_attention.default",
}
BACKWARD_OPS = {"kerneltriage.norm_backward.default", "kerneltriage.flash_attention_backward.default"}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_one_graph_no_break_no_recompile_across_batch_sizes(device):
    model = _model(device)
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    for batch in (2, 3, 4):
        x = torch.randn(batch, SEQ, D_MODEL, device=device, dtype=torch.bfloat16)
        if batch == 3:  # forward only (backward is one graph too, compiled on the first call)
            x = x.requires_grad_()
            torch._dynamo.mark_dynamic(x, 0)
            compiled(x)
            continue
        got = _run(compiled, model, x, dynamic_batch=True)
    want = _run(model, model, x)  # the last batch size, run eagerly
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, msg=lambda m, name=name: f"grad of {name}: {m}")

    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert recorder.graphs == 1, "the batch sizes 2, 3 and 4 recompiled the model"
    assert recorder.ops["forward"] >= FORWARD_OPS, recorder.ops["forward"]
    assert recorder.ops["backward"] >= BACKWARD_OPS, recorder.ops["backward"]


def test_dynamic_true_keeps_one_graph(device):
    """``dynamic=True`` (every dim symbolic, the checks in the functions traced on symbols):
    still one graph, one frame, no break, in inference (forward kernels only, to keep the
    interpreter's time down). Dynamo traces it twice while it specializes the modules' float
    eps (a restart, not a recompile)."""
    model = _model(device)
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 4):
            x = torch.randn(batch, SEQ, D_MODEL, device=device, dtype=torch.bfloat16)
            got = compiled(x)
        torch.testing.assert_close(got, model(x))
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["frames"]["ok"] == 1 and counters["frames"]["total"] == 1


def test_custom_ops_pass_torch_library_checks(device):
    """torch.library.opcheck: schema, fake (meta) implementation against the real one, and the
    autograd registration, on one input per op."""
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    x, r, w, b = rnd(3, 5, 40), rnd(3, 5, 40), rnd(40), rnd(40)
    q, k = rnd(1, 4, 20, 16, dtype=torch.bfloat16), rnd(1, 2, 24, 16, dtype=torch.bfloat16)
    v = rnd(1, 2, 24, 16, dtype=torch.bfloat16)
    cases = [
        (torch.ops.kerneltriage.rms_norm.default, (x, w, 1e-6, 0.0, True)),
        (torch.ops.kerneltriage.layer_norm.default, (x, w, b, 1e-5)),
        (torch.ops.kerneltriage.fused_add_rms_norm.default, (x, r, w, 1e-6, 1.0, False)),
        (torch.ops.kerneltriage.flash_attention.default, (q, k, v, True, None, 8, 0, 30.0)),
    ]
    for op, args in cases:
        args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
        # test_aot_dispatch_dynamic is left out: it retraces each op under several modes,
        # many seconds of interpreter time for what the model tests above already cover.
        torch.library.opcheck(
            op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor")
        )
