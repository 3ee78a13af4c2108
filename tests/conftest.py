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


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if _cuda_available() else "cpu"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA
