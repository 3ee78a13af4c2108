"""The measured attention table: interpolated inside its range, never used outside it."""

from __future__ import annotations

import pytest

from kerneltriage.analysis.judge.attention_rates import attention_rates, measured_range


def test_a_row_is_used_as_measured():
    r = attention_rates("H100-SXM", 64, False, 1024, backward=False)
    assert r.rates["cudnn"] == 416 and r.measured == (1024, 1024)
    assert "the S=1024 row" in r.basis


def test_rates_are_interpolated_between_the_rows_that_bracket_the_length():
    r = attention_rates("H100-SXM", 64, False, 1536, backward=False)
    assert r.measured == (1024, 2048)
    assert r.rates["cudnn"] == pytest.approx((416 + 437) / 2)
    assert "interpolated between the S=1024 and S=2048 rows" in r.basis


@pytest.mark.parametrize("seq_len", [197, 559, 1023, 8193])
def test_no_rate_outside_the_measured_range(seq_len):
    # ViT-B/16 (S=197) and Qwen 0.5B (S=559) lie below the shortest measured length
    assert attention_rates("H100-SXM", 64, False, seq_len, backward=False) is None
    assert measured_range("H100-SXM", 64, False) == (1024, 8192)


def test_no_rate_for_an_unmeasured_gpu_or_head_dim():
    assert attention_rates("MI300X", 128, False, 4096, backward=False) is None
    assert attention_rates("H100-SXM", 96, False, 4096, backward=False) is None
    assert measured_range("MI300X", 128, False) is None


def test_training_rates_combine_forward_and_backward():
    r = attention_rates("H100-SXM", 128, True, 4096, backward=True)
    fwd, bwd = 537, 432
    assert r.rates["cudnn"] == pytest.approx(3.5 / (1 / fwd + 2.5 / bwd))


def test_the_backends_come_from_the_table_with_how_to_ask_for_them():
    from kerneltriage.analysis.judge.attention_rates import backend_of, how

    assert backend_of("FlashAttention") == "flash" and backend_of("cuDNN") == "cudnn"
    assert backend_of("Inductor") is None and backend_of(None) is None
    assert how("cudnn").endswith("sdpa_kernel(SDPBackend.CUDNN_ATTENTION)")
    assert how("kerneltriage") == "kerneltriage.kernels.flash_attention"


def test_a_row_naming_an_unknown_backend_is_refused():
    from pydantic import ValidationError

    from kerneltriage.analysis.judge.attention_rates import _AttentionPerf
    from kerneltriage.resources import load_yaml

    data = dict(load_yaml("attention_perf.yaml"))
    data["rates"] = {
        "X": {"source": "s", "rows": [{"head_dim": 64, "causal": False, "seq_len": 1, "magic": [1, 2]}]}
    }
    with pytest.raises(ValidationError, match="not one of the backends"):
        _AttentionPerf.model_validate(data)
