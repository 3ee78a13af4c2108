"""``gemm-pad`` as a runner kind: the ``nn.Linear`` layers a candidate names run their GEMM on
dimensions padded to a multiple, with the same math.

A GEMM whose N (``out_features``) or K (``in_features``) is not a multiple of 8 (16-bit) or 4
(TF32) runs cuBLAS's unaligned kernels: 2.7-5.5× slower in bf16 at a GPT-2 or BERT vocabulary
(``gemm_alignment.yaml``). By hand the layer is made wider (``model.resize_token_embeddings(...,
pad_to_multiple_of=64)``); the runner gets the same GEMMs without touching the parameters. At
each forward the weight is padded with zero rows to N' (and zero columns to K', the input with
zero columns too), the GEMM runs on N' × K', and the output is sliced back to N columns:

    y = F.linear(F.pad(x, (0, K' − K)), F.pad(W, (0, K' − K, 0, N' − N)), F.pad(b, (0, N' − N)))[..., :N]

The padded rows and columns are zeros, so every kept output is the same sum (the kernel may
differ: rounding, not math). The backward GEMMs come out aligned too: ``dX = dY' W'`` has K' and
N' and ``dW' = dY'ᵀ X'`` has N'. The pads cost a copy of the weight a forward (GPT-2's 50257 ×
1024 fp32: 0.2 GB, under 0.1 ms on an H100) and of the input where K is padded. A tied weight
(GPT-2's ``lm_head`` and ``wte``) stays tied: the parameter is read, never replaced.
"""

from __future__ import annotations

import fnmatch
from typing import Any


class NothingToPad(Exception):
    """Nothing to pad here; the runner stops the script with the reason (``install.ApplyFailed``)."""


def check(apply: dict[str, Any]) -> str | None:
    """Why a ``gemm-pad`` mapping cannot be applied, or None."""
    modules, multiple = apply.get("modules"), apply.get("multiple")
    if not isinstance(modules, (str, list)) or not modules:
        return "apply kind 'gemm-pad' takes modules: the layers' paths (wildcards allowed)"
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 2:
        return f"apply kind 'gemm-pad': multiple must be a whole number of at least 2, not {multiple!r}"
    return None


def padded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def pad_layers(torch: Any, root: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """Each ``nn.Linear`` under ``root`` whose path matches ``fields['modules']`` (``*`` for a
    layer index, as the report writes ``transformer.h.*.mlp.c_fc``) and whose N or K is off the
    multiple gets the padded forward; what was padded, by path."""
    patterns = [fields["modules"]] if isinstance(fields["modules"], str) else list(fields["modules"])
    multiple = int(fields["multiple"])
    named = [
        (name, m) for name, m in root.named_modules() if any(fnmatch.fnmatchcase(name, p) for p in patterns)
    ]
    if not named:
        raise NothingToPad(f"gemm-pad found no module {' or '.join(patterns)} under {type(root).__name__}")
    done: dict[str, str] = {}
    for name, module in named:
        if not isinstance(module, torch.nn.Linear):
            raise NothingToPad(f"gemm-pad pads torch.nn.Linear layers; {name} is a {type(module).__name__}")
        n, k = module.out_features, module.in_features
        n2, k2 = padded(n, multiple), padded(k, multiple)
        if (n2, k2) != (n, k):
            module.forward = _padded_forward(torch, module, n, k, n2, k2)
            done[name] = f"N {n} → {n2}, K {k} → {k2}"
    if not done:
        raise NothingToPad(
            f"gemm-pad: every layer of {' or '.join(patterns)} is a multiple of {multiple} already"
        )
    return {"padded": done}


def _padded_forward(torch: Any, module: Any, n: int, k: int, n2: int, k2: int) -> Any:
    F = torch.nn.functional

    def forward(x: Any) -> Any:
        weight = F.pad(module.weight, (0, k2 - k, 0, n2 - n))
        bias = None if module.bias is None else F.pad(module.bias, (0, n2 - n))
        if k2 != k:
            x = F.pad(x, (0, k2 - k))
        y = F.linear(x, weight, bias)
        return y[..., :n] if n2 != n else y

    return forward
