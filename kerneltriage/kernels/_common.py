"""Shared host-side helpers for the built-in Triton kernels."""

from __future__ import annotations

import os

from kerneltriage.errors import KernelInputError


def interpreter_mode() -> bool:
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(*tensors, name: str = "kernel") -> None:
    """Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise KernelInputError(f"{name}: tensors are on different devices: {sorted(map(str, devices))}")
    (device,) = devices
    if device.type == "cuda":
        return
    if device.type == "cpu" and interpreter_mode():
        return
    raise KernelInputError(
        f"{name}: tensors are on {device}; the Triton kernels need a CUDA device "
        "(or CPU tensors with TRITON_INTERPRET=1 for testing)"
    )


def check_dtype(t, allowed, *, what: str, name: str = "kernel") -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise KernelInputError(
            f"{name}: {what} has dtype {str(t.dtype).replace('torch.', '')}; expected one of {names}"
        )
