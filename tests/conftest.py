"""Test set-up shared by every test module.

Kernel tests run on a CUDA GPU when there is one, else on CPU tensors through Triton's
interpreter; TRITON_INTERPRET must be set before triton is first imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _interpreter_numpy_shim(monkeypatch):
    """Triton 3.6's interpreter turns loop bounds into ints with ``int(ndarray of shape (1,))``,
    which NumPy >= 2.4 rejects; use ``.item()`` instead (interpreter only)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if _cuda_available() else "cpu"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA
