"""kerneltriage.kernels.config: the settings object the host code reads per call."""

from __future__ import annotations

import pytest
import torch

from kerneltriage.kernels import config, rms_norm
from kerneltriage.kernels.norms import launch
from kerneltriage.kernels.norms.launch import row_config


def test_override_nests_restores_and_rejects_unknown_settings():
    base = config.current()
    forced = row_config(4, 1, 128, True, 1)
    with config.override(poison=True) as outer:
        assert outer is config.current() and outer.poison
        with config.override(norm_configs={"fwd": forced}) as inner:
            assert inner.poison and inner.norm_config("fwd") is forced and inner.norm_config("bwd") is None
            hash(inner)  # hashable: part of the launch-plan cache key
        assert config.current() is outer
        with pytest.raises(RuntimeError), config.override(attention_tma="on"):
            raise RuntimeError("restored on the way out")
        assert config.current() is outer
    assert config.current() is base
    with (
        pytest.raises(TypeError, match="KernelConfig has no setting poison_workspaces"),
        config.override(poison_workspaces=True),
    ):
        pass


def test_forced_config_gets_its_own_plan(device):
    """A forced configuration changes what launches (the plan cache keys on it) and leaves the
    default plan alone afterwards."""
    x = torch.randn(6, 300, device=device)
    rms_norm(x, None)  # a real launch first: on a GPU it autotunes (the stub is for later calls)
    seen = []

    def record(kernel, grid, args, kwargs):
        seen.append((grid, kwargs["BLOCK_N"], kwargs["LOOPED"]))

    with config.override(launcher=record):
        rms_norm(x, None)
        with config.override(norm_configs={"fwd": row_config(4, 1, 128, True, 1)}):
            rms_norm(x, None)
        rms_norm(x, None)
    default, forced, again = seen
    assert default == again and not default[2]
    assert forced == ((min(6, launch.num_sms(x.device)),), 128, True)
