"""The built-in flash attention as a Hugging Face attention function (kerneltriage/kernels/
hf_attention.py): tiny Gemma2 and Llama models built from configs train with it and give eager
attention's logits, loss and gradients; wrong variants (window dropped or off by one, softcap
or scale dropped, causality dropped) do not; padding masks run eager's own path.

The kernel runs fp16/bf16 only, so the models run in fp16 (3 more mantissa bits than bf16: the
rounding noise sits far below what a wrong variant changes) against the same model in fp32 with
``attn_implementation="eager"``. The tolerances are fp16's: eager attention in fp16 must meet
them too. Logits are made large enough (initializer_range 0.2) and the softcap small enough (5)
that the softcap and the scale change the result; on CPU the kernels run in Triton's
interpreter.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kerneltriage.errors import InputError  # noqa: E402
from kerneltriage.kernels import hf_attention, use_flash_attention  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FP16 = torch.float16
# fp16 rounding, measured on these models: eager fp16 against eager fp32 moves the loss by
# ~5e-4, the logits by ~1e-2 and the gradients by ~3e-3 of their largest entry. The wrong
# variants below move them by >= 2e-2, >= 0.3 and >= 0.1.
TOL = {"loss": 2e-3, "logits": 4e-2, "grads": 1e-2}
SEQ, WINDOW = 24, 8


def _gemma2(**over):
    cfg = transformers.Gemma2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,  # layer_types: sliding, full
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=24,  # scaling 24**-0.5, not head_dim**-0.5
        attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0,
        max_position_embeddings=64,
        initializer_range=0.2,
        attn_implementation="eager",
        **over,
    )
    torch.manual_seed(0)
    return transformers.Gemma2ForCausalLM(cfg)


def _llama(**over):
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        attn_implementation="eager",
        **over,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _ids(device):
    return torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(1)).to(device)


def _step(model, device, dtype, implementation=None, attention_mask=None, backward=True):
    """One training step's forward and backward: loss, logits, the attention projections' grads."""
    model = copy.deepcopy(model).to(device=device, dtype=dtype).train()
    if implementation is not None:
        model.set_attn_implementation(implementation)
    ids = _ids(device)
    out = model(input_ids=ids, labels=ids, attention_mask=attention_mask)
    if not backward:
        return {"loss": out.loss.float(), "logits": out.logits.float()}
    out.loss.backward()
    grads = {
        n: p.grad.float()
        for n, p in model.named_parameters()
        if n.endswith(("q_proj.weight", "k_proj.weight"))
    }
    return {"loss": out.loss.float(), "logits": out.logits.float(), "grads": grads}


def _deviation(got, ref) -> dict:
    grads = max(((got["grads"][n] - g).abs().max() / g.abs().max()).item() for n, g in ref["grads"].items())
    return {
        "loss": (got["loss"] - ref["loss"]).abs().item(),
        "logits": (got["logits"] - ref["logits"]).abs().max().item(),
        "grads": grads,
    }


def _within(dev: dict) -> bool:
    return all(dev[k] <= TOL[k] for k in TOL)


def _variant(name: str, **change):
    """Register the kerneltriage attention with one parameter changed, as a wrong fix would."""

    def forward(module, query, key, value, attention_mask, **kwargs):
        for key_, fn in change.items():
            kwargs[key_] = fn(kwargs.get(key_))
        return hf_attention.attention_forward(module, query, key, value, attention_mask, **kwargs)

    transformers.AttentionInterface.register(name, forward)
    transformers.masking_utils.AttentionMaskInterface.register(name, hf_attention.mask_interface)
    return name


def test_gemma2_trains_like_eager_and_wrong_variants_do_not(device):
    model = _gemma2()
    carried = use_flash_attention(copy.deepcopy(model))
    assert carried == {
        "implementation": "kerneltriage",
        "layers": 2,
        "causal": True,
        "softcap": 5.0,
        "sliding_window": WINDOW,
        "sliding_layers": 1,
        "scaling": 24**-0.5,
        "gqa": 2,
        "head_dim": 16,
    }
    ref = _step(model, device, torch.float32)
    eager16 = _step(model, device, FP16)
    assert _within(_deviation(eager16, ref)), _deviation(eager16, ref)  # the tolerance is fp16's

    before = hf_attention.CALLS["kernel"]
    got = _step(model, device, FP16, "kerneltriage")
    assert hf_attention.CALLS["kernel"] - before == 2  # both layers ran the kernel, none fell back
    assert _within(_deviation(got, ref)), _deviation(got, ref)

    wrong = {
        "window dropped": {"sliding_window": lambda w: None},
        "window one too wide": {"sliding_window": lambda w: None if w is None else w + 1},
        "softcap dropped": {"softcap": lambda c: None},
        "scale dropped": {"scaling": lambda s: None},
    }
    for what, change in wrong.items():  # forward only: the logits tell
        name = _variant(f"kerneltriage-test-{what}", **change)
        logits = _step(model, device, FP16, name, backward=False)["logits"]
        assert (logits - ref["logits"]).abs().max() > 5 * TOL["logits"], what


def test_llama_trains_like_eager_and_non_causal_does_not(device):
    model = _llama()
    carried = use_flash_attention(copy.deepcopy(model))
    assert carried["layers"] == 2 and carried["causal"] is True and carried["gqa"] == 2
    assert carried["softcap"] is None and carried["sliding_window"] is None and carried["sliding_layers"] == 0
    assert carried["scaling"] == 16**-0.5

    ref = _step(model, device, torch.float32)
    assert _within(_deviation(_step(model, device, FP16), ref))
    got = _step(model, device, FP16, "kerneltriage")
    assert _within(_deviation(got, ref)), _deviation(got, ref)
    name = _variant("kerneltriage-test-bidirectional", is_causal=lambda c: False)
    logits = _step(model, device, FP16, name, backward=False)["logits"]
    assert (logits - ref["logits"]).abs().max() > 5 * TOL["logits"]


def test_padding_runs_eager_and_an_all_ones_mask_runs_the_kernel(device):
    model = _gemma2()
    hf_attention.register()

    padded = torch.ones(2, SEQ, dtype=torch.long, device=device)
    padded[1, :5] = 0  # left padding in the second sequence
    counts = dict(hf_attention.CALLS)
    eager = _step(model, device, FP16, "eager", attention_mask=padded)
    got = _step(model, device, FP16, "kerneltriage", attention_mask=padded)
    # the model's own eager function with eager's mask: the same numbers, bit for bit
    assert torch.equal(got["logits"], eager["logits"]) and torch.equal(got["loss"], eager["loss"])
    assert hf_attention.CALLS["kernel"] == counts.get("kernel", 0)
    assert hf_attention.CALLS["eager: mask"] - counts.get("eager: mask", 0) == 2

    ones = torch.ones(2, SEQ, dtype=torch.long, device=device)
    ref = _step(model, device, torch.float32, attention_mask=ones)
    got = _step(model, device, FP16, "kerneltriage", attention_mask=ones)
    assert hf_attention.CALLS["kernel"] - counts.get("kernel", 0) == 2
    assert _within(_deviation(got, ref)), _deviation(got, ref)


# ----------------------------------------------------------------------------- no kernel runs below


def test_the_mask_interface_leaves_only_causality_and_window_to_the_kernel():
    from transformers import masking_utils

    ask = dict(batch_size=2, q_length=6, kv_length=6, allow_is_causal_skip=True, dtype=torch.float32)
    assert hf_attention.mask_interface(**ask) is None
    assert hf_attention.mask_interface(**ask, attention_mask=torch.ones(2, 6, dtype=torch.bool)) is None
    assert hf_attention.mask_interface(**ask, local_size=3) is None

    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[0, :2] = False
    mask = hf_attention.mask_interface(**ask, attention_mask=pad)
    expected = masking_utils.eager_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=pad)
    assert torch.equal(mask, expected) and mask[0, 0, 5, 1] == torch.finfo(torch.float32).min

    window = masking_utils.sliding_window_causal_mask_function(3)
    custom = dict(
        ask, allow_is_causal_skip=False, mask_function=window, local_size=3
    )  # e.g. packed sequences
    expected = masking_utils.eager_mask(batch_size=2, q_length=6, kv_length=6, mask_function=window)
    assert torch.equal(hf_attention.mask_interface(**custom), expected)
    # a decoding step whose keys end at its query is the kernel's bottom-right alignment; keys
    # beyond it (a static cache's empty slots) are not
    assert hf_attention.mask_interface(**dict(ask, q_length=1, q_offset=5)) is None
    assert hf_attention.mask_interface(**dict(ask, q_length=1, q_offset=3)) is not None

    class Chunked:
        attention_chunk_size = 3

    assert hf_attention.mask_interface(**ask, local_size=3, config=Chunked()) is not None


def test_the_window_matches_transformers_sliding_mask():
    """Row i sees keys j with i - w < j <= i: the kernel's window (w - 1, 0)."""
    from transformers import masking_utils

    w, n = 4, 9
    mask = masking_utils.sdpa_mask(
        batch_size=1,
        q_length=n,
        kv_length=n,
        mask_function=masking_utils.sliding_window_causal_mask_function(w),
        allow_is_causal_skip=False,
    )[0, 0]
    left, right = hf_attention._window(w, causal=True)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    assert torch.equal(mask, (j >= i - left) & (j <= i + right))
    assert hf_attention._window(w, causal=False) == (w - 1, w - 1)


def test_what_the_kernel_cannot_carry_is_refused():
    model = _gemma2()
    module = model.model.layers[0].self_attn
    q = torch.zeros(1, 4, 8, 16, dtype=FP16)
    k = v = torch.zeros(1, 2, 8, 16, dtype=FP16)
    with pytest.raises(InputError, match="dropout"):
        hf_attention.attention_forward(module, q, k, v, None, dropout=0.1)
    with pytest.raises(InputError, match="sinks"):
        hf_attention.attention_forward(module, q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(InputError, match="autocast"):
        hf_attention.attention_forward(module, q.float(), k.float(), v.float(), None)
    with pytest.raises(InputError, match="packed"):
        hf_attention.attention_forward(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 8]))

    with pytest.raises(InputError, match=r"attention dropout 0\.1"):
        use_flash_attention(_llama(attention_dropout=0.1).train())
    assert use_flash_attention(_llama(attention_dropout=0.1).eval())["layers"] == 2
    with pytest.raises(InputError, match="head dim 24"):
        use_flash_attention(_llama(head_dim=24))
    with pytest.raises(InputError, match="not a transformers model"):
        use_flash_attention(torch.nn.Linear(2, 2))


def test_register_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert hf_attention.register() == hf_attention.register() == "kerneltriage"
    assert AttentionInterface._global_mapping["kerneltriage"] is hf_attention.attention_forward
    assert AttentionMaskInterface._global_mapping["kerneltriage"] is hf_attention.mask_interface


def test_the_package_imports_without_torch_or_transformers():
    code = (
        "import sys, kerneltriage.kernels as K, kerneltriage.kernels.hf_attention; "
        "assert callable(K.use_flash_attention); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
