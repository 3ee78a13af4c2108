"""GEMM shapes from the trace: the (M, N, K, dtype) of a GEMM candidate's recorded op, and
the notes a GPU engineer writes first on a library GEMM below its roof (dims off a multiple
of 64, wave quantization, skinny N or K, projections one GEMM could run, MLM logits of every
position).
"""

from __future__ import annotations

import math
import re
from typing import Any

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.fixes.fix_environment import Environment

#: Convolutions a GEMM kernel runs (a 1×1 convolution's kind is ``gemm``): their operands are
#: an activation [N, C, H, W] and a filter [O, C/groups, kh, kw], whose implicit GEMM cuDNN
#: maps; read as a matmul's, they gave dims such as N=1 and the padding of a Linear layer.
_CONVOLUTION = re.compile(r"^aten::(_?conv|cudnn_conv|miopen_conv|mkldnn_conv)")


def gemm_dims(c: Any) -> tuple[int, int, int, str] | None:
    """(M, N, K, dtype) of a GEMM candidate's recorded op (linear, mm, addmm, matmul, bmm);
    None for a convolution run as a GEMM."""
    op = (c.example or [{}])[0]
    tensors = tensor_inputs(op.get("dims"), op.get("types"))
    name = op.get("name", "")
    if _CONVOLUTION.match(name) or len(tensors) < 2:
        return None
    if name == "aten::addmm" and len(tensors) >= 3:
        tensors = tensors[1:]
    (a, at), (b, _) = tensors[:2]
    if len(a) < 2 or len(b) < 1:
        return None
    if name == "aten::linear":
        return math.prod(a[:-1]), b[0], a[-1], at
    if len(b) >= 2:
        return math.prod(a[:-1]), b[-1], a[-1], at
    return None


#: Leaf module names of projections that read the same input (q/k/v, gate/up): one GEMM on
#: their concatenated weights could run them.
_PROJECTIONS = (
    {"q_proj", "k_proj", "v_proj"},
    {"query", "key", "value"},
    {"gate_proj", "up_proj"},
    {"wq", "wk", "wv"},
)
#: The output tile a cuBLAS/CUTLASS GEMM of these sizes typically runs, for the wave count.
_TILE = 128


def gemm_diagnostics(c: Any, candidates: list[Any], env: Environment) -> list[str]:
    """What a GPU engineer checks first on a library GEMM below its roof: dims that are not
    multiples of 64 (and the padded size), wave quantization, skinny N or K, separate
    projections of one module that one GEMM could run, logits of every position where the loss
    reads a few."""
    if c.kind != "gemm" or not (c.attrs.get("library_op") or c.attrs.get("vendor_share", 0.0) >= 0.5):
        return []
    if not c.headroom or c.headroom < 1.25:
        return []
    d = gemm_dims(c)
    if not d:
        return []
    m, n, k, _ = d
    out = []
    for name, v in (("N", n), ("K", k)):
        if v % 64:
            out.append(
                f"{name}={v} is not a multiple of 64: pad it to {math.ceil(v / 64) * 64} (a vocabulary padded as GPT-2 scripts pad 50257 to 50304)"
            )
    if env.sms:
        tiles = math.ceil(m / _TILE) * math.ceil(n / _TILE)
        waves = tiles / env.sms
        last = waves - math.floor(waves)
        if waves < 4 and 0 < last <= 0.5:
            out.append(
                f"{tiles} output tiles of {_TILE}x{_TILE} fill {waves:.2f} waves of {env.sms} SMs: the last wave runs {last:.0%} full"
            )
    for name, v in (("N", n), ("K", k)):
        if v <= 128:
            out.append(f"skinny {name}={v}: too little work per output tile to keep the tensor cores busy")
    path = (c.module or "").partition(" (")[0]
    parent, _, leaf = path.rpartition(".")
    for group in _PROJECTIONS:
        if leaf in group:
            siblings = {}
            for g in candidates:
                gp = (g.module or "").partition(" (")[0]
                gparent, _, gleaf = gp.rpartition(".")
                gd = gemm_dims(g) if g.kind == "gemm" else None
                if gparent == parent and gleaf in group and gd and gd[2] == k:
                    siblings[gleaf] = gd[1]
            if len(siblings) >= 2:
                names = " / ".join(sorted(siblings))
                out.append(
                    f"{names} are {len(siblings)} GEMMs on the same input: one fused projection "
                    f"({sum(siblings.values())}x{k} weight, their weights concatenated) runs one larger GEMM"
                )
    if "predictions" in path or leaf == "decoder":
        out.append(
            f"the MLM logits are computed for all {m} positions, while the loss reads only the masked ones: "
            "run the decoder on the masked positions (hidden[labels != -100])"
        )
    return out
