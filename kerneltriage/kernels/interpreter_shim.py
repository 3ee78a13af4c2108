"""Triton 3.6's interpreter (``TRITON_INTERPRET=1``) with NumPy >= 2.4.

The interpreter turns loop bounds into ints with ``int(ndarray of shape (1,))``, which NumPy
2.4 rejects ("only 0-dimensional arrays can be converted to Python scalars"): every built-in
attention call failed. ``apply`` gives the interpreter's tensors an ``__index__`` that uses
``.item()``. Applied when ``kerneltriage.kernels`` is imported with the interpreter on; nothing
changes on a GPU. Scaffolded packages carry the same shim in their ``kernel.py``.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def apply() -> bool:
    """Patch the interpreter once (idempotent); False when Triton or its interpreter is absent."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, "numpy_shim", False):
        return True

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched.__dict__["numpy_shim"] = True  # the marker: already patched
    interpreter._patch_lang_tensor = patched
    return True
