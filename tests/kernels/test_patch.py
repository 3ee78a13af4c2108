"""kerneltriage.kernels.patch: swapping torch.nn norms for the Triton drop-ins in place."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch import nn  # noqa: E402

from kerneltriage.kernels import LayerNorm, RMSNorm, patch  # noqa: E402


class LlamaRMSNorm(nn.Module):
    """A look-alike (as in Hugging Face models): must be reported, not swapped."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MyLayerNorm(nn.LayerNorm):
    pass


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm1 = nn.RMSNorm(n, eps=None)
        self.proj = nn.Linear(n, n)
        self.norm2 = nn.LayerNorm(n)

    def forward(self, x):
        return self.norm2(self.proj(self.norm1(x)))


def _model(n=64):
    torch.manual_seed(0)
    shared = nn.LayerNorm(n, bias=False)
    model = nn.Sequential(Block(n), shared, nn.GELU(), shared, LlamaRMSNorm(n), MyLayerNorm(n))
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(0.5, 1.5)
    return model


def test_patch_swaps_in_place_and_reports(device):
    model = _model().to(device)
    x = torch.randn(5, 7, 64, device=device)
    old_params = {name: p for name, p in model.named_parameters()}
    expected = model(x)
    expected.sum().backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    report = patch(model)

    assert [name for name, _, _ in report.swapped] == ["0.norm1", "0.norm2", "1", "3"]
    assert type(model[0].norm1) is RMSNorm and type(model[0].norm2) is LayerNorm
    assert model[1] is model[3], "a shared module stays shared"
    assert type(model[1]) is LayerNorm and model[1].bias is None
    assert type(model[4]) is LlamaRMSNorm and type(model[5]) is MyLayerNorm
    skipped = dict(report.skipped)
    assert "is not a torch.nn norm" in skipped["4"]
    assert "subclasses a torch.nn norm" in skipped["5"]
    text = str(report)
    assert "swapped 4 norm module(s)" in text
    assert "0.norm1: torch.nn.modules.normalization.RMSNorm -> " in text
    assert "kerneltriage.kernels.norms.RMSNorm" in text
    # The very same Parameter objects (an optimizer built earlier keeps working).
    for name, p in model.named_parameters():
        assert p is old_params[name], name
    assert model[0].norm1.eps is None  # torch.nn.RMSNorm(eps=None) semantics carried over

    got = model(x)
    got.sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_grads[name], rtol=1e-4, atol=1e-4)

    assert patch(model).swapped == [], "patching twice swaps nothing more"


def test_patch_keeps_mode_and_skips_what_it_cannot_run(device):
    model = nn.Sequential(nn.LayerNorm(32), nn.RMSNorm(32)).to(device).eval()
    model[1].register_forward_hook(lambda *args: None)
    model.append(nn.LayerNorm(32, device=device, dtype=torch.float64))
    report = patch(model)
    assert [name for name, _, _ in report.swapped] == ["0"]
    assert not model[0].training
    skipped = dict(report.skipped)
    assert skipped["1"] == "has forward hooks, which the swap would drop"
    assert skipped["2"] == "parameters are float64; the kernels take bf16, fp16, fp32"


def test_patch_skips_parameters_on_an_unsupported_device():
    model = nn.Sequential(nn.LayerNorm(8, device="meta"))
    report = patch(model)
    assert report.swapped == []
    assert report.skipped == [("0", "parameters are on meta; the kernels need a CUDA device")]


def test_patch_root_norm_is_reported():
    norm = nn.RMSNorm(16)
    report = patch(norm)
    assert report.swapped == []
    assert report.skipped[0][0] == "<root>"
