"""Shared host-side helpers of the built-in Triton kernels: input checks, allocation, launch."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels import config

# The host path's choice for a config (``host_path.select``: fast or plain launches), installed
# by ``host_path`` when it is imported, which every kernel package does before its first launch.
# A hook, not an import: host_path reaches the launch plans through the norms' bound calls, so
# importing it here would close an import cycle. Until it is installed: plain launches.
_select_host: Callable[[config.KernelConfig], Any] | None = None


def route_launches(select: Callable[[config.KernelConfig], Any]) -> None:
    """Launch through ``select(cfg).launch`` from now on (``host_path`` calls it)."""
    global _select_host
    _select_host = select


def interpreter_mode() -> bool:
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return config.current().interpreter


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_device(*tensors, name: str = "kernel") -> None:
    """Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter; never on a
    DTensor (a shard: its data pointer holds a slice of the shape it reports)."""
    device = None
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "_local_tensor"):
            raise KernelInputError(
                f"{name}: a DTensor (sharded, e.g. an FSDP2 parameter outside its forward) cannot be "
                "passed to a Triton kernel; pass the full tensor (FSDP2 gathers it inside the forward)"
            )
        if device is None:
            device = t.device
        elif t.device != device:
            devices = sorted({str(u.device) for u in tensors if u is not None})
            raise KernelInputError(f"{name}: tensors are on different devices: {devices}")
    if device is None or device.type == "cuda":  # no tensor: nothing to check
        return
    if device.type == "cpu" and config.current().interpreter:
        return
    raise KernelInputError(
        f"{name}: tensors are on {device}; the Triton kernels need a CUDA device "
        "(or CPU tensors with TRITON_INTERPRET=1 for testing)"
    )


def check_dtype(t, allowed, *, what: str, name: str = "kernel") -> None:
    if t.dtype not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise KernelInputError(f"{name}: {what} has dtype {dtype_name(t.dtype)}; expected one of {names}")


def empty(shape, dtype: torch.dtype, device: torch.device, cfg: config.KernelConfig) -> torch.Tensor:
    """An uninitialised buffer; NaN-filled when ``cfg.poison`` (floating dtypes only)."""
    if cfg.poison and dtype.is_floating_point:
        return torch.full(shape, math.nan, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def launch(kernel, grid: tuple[int, ...], args: tuple, kwargs: dict, cfg: config.KernelConfig) -> None:
    """``kernel[grid](*args, **kwargs)``, or ``cfg.launcher`` with the same arguments, on the
    host path ``host_path.select`` picks (fast or plain); ``kwargs`` should be one dict per
    configuration, kept by the caller (a launch plan), not built per call: the fast path caches
    its launchers by that dict."""
    if cfg.launcher is not None:
        cfg.launcher(kernel, grid, args, kwargs)
    elif _select_host is None:
        kernel[grid](*args, **kwargs)
    else:
        _select_host(cfg).launch(kernel, grid, args, kwargs)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a jit function: slow to call from the host
