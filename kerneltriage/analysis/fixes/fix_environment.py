"""The trace's environment, and whether a fix recipe's preconditions hold in it: the PyTorch
version (from the run's manifest, else bounded by the trace's format) and the GPU (compute
capability, bf16 tensor cores, SMs, ceilings) a recipe's ``requires`` is checked against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kerneltriage.analysis.fixes.fix_recipes import VERSION_REQUIREMENT, Recipe
from kerneltriage.errors import RulesError


@dataclass(frozen=True)
class Environment:
    """What a recipe's preconditions are checked against: the trace's PyTorch version and GPU."""

    torch: str | None = None  # "2.11.0+cu130"; None: unknown
    torch_source: str = "unknown"  # "manifest", "legacy Kineto categories (PyTorch < 1.10)" …
    torch_below: str | None = None  # an upper bound known without the version ("1.10")
    capability: tuple[int, int] | None = None
    bf16: bool | None = None  # bf16 tensor cores
    tf32: bool | None = None  # TF32 tensor cores (none on V100 or AMD's CDNA2)
    gpu: str | None = None
    vendor: str | None = None
    sms: int | None = None
    bandwidth: float | None = None  # B/s
    rates: dict[str, float] = field(default_factory=dict)  # precision -> FLOP/s


def environment(gpu: Any, source: dict[str, Any] | None, meta: dict[str, Any] | None) -> Environment:
    """The environment of a trace: PyTorch from the run's manifest, else bounded by the
    trace's format (Kineto's capitalized categories end with PyTorch 1.9); the GPU from its
    spec (capability, bf16 units, SMs, ceilings)."""
    versions = (source or {}).get("versions") or {}
    torch, how, below = None, "unknown", None
    if versions.get("torch"):
        torch, how = str(versions["torch"]), "manifest"
    elif (meta or {}).get("kineto_legacy_categories"):
        how, below = "legacy Kineto categories (PyTorch < 1.10)", "1.10"
    if gpu is None:
        return Environment(torch=torch, torch_source=how, torch_below=below)
    rates = {}
    for p in ("fp32", "tf32", "bf16", "fp16"):
        if p in gpu.peak_tflops or p in gpu.measured_tflops:
            rates[p] = gpu.ceiling_tflop(p) * 1e12
    bf16 = "bf16" in gpu.peak_tflops and "bf16" not in gpu.emulated
    tf32 = "tf32" in gpu.peak_tflops and "tf32" not in gpu.emulated
    return Environment(
        torch=torch,
        torch_source=how,
        torch_below=below,
        capability=gpu.compute,
        bf16=bf16,
        tf32=tf32,
        gpu=gpu.name,
        vendor=gpu.vendor,
        sms=gpu.sms,
        bandwidth=gpu.bandwidth,
        rates=rates,
    )


def _requirement(text: str) -> tuple[str, str]:
    """The operator and version of a ``requires`` entry (``parse_recipes`` checked its form)."""
    m = VERSION_REQUIREMENT.match(text)
    if m is None:
        raise RulesError(f"requirement {text!r} is not like '>=2.0'")
    return m.group(1), m.group(2)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    n = max(len(have), len(want))
    have, want = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
    return {">=": have >= want, "<=": have <= want, "==": have == want, "<": have < want, ">": have > want}[
        op
    ]


def unmet(recipe: Recipe, env: Environment, params: dict[str, Any]) -> str | None:
    """Why ``recipe``'s preconditions fail on ``env`` (None: met or unknown)."""
    req = recipe.requires
    if req.torch:
        op, want = _requirement(req.torch)
        if env.torch:
            if not _compare(_version(env.torch), op, _version(want)):
                return f"PyTorch {env.torch} (needs {req.torch})"
        elif (
            env.torch_below
            and op in (">=", ">", "==")
            and _compare(_version(want), ">=", _version(env.torch_below))
        ):
            return f"{env.torch_source} (needs {req.torch})"
    if req.capability and env.capability and env.vendor in (None, "nvidia"):
        op, want = _requirement(req.capability)
        if not _compare(env.capability, op, _version(want)):
            major, minor = env.capability
            return f"{env.gpu or 'the GPU'} is compute capability {major}.{minor} (needs {req.capability})"
    if req.bf16 and env.bf16 is False:
        return f"{env.gpu or 'the GPU'} has no bf16 tensor cores"
    if req.tf32 and env.tf32 is False:
        return f"{env.gpu or 'the GPU'} has no TF32 tensor cores"
    if req.fused_linear_ce_gain:
        judged = params.get("fused_linear_ce")
        if not judged:
            return "no lm_head GEMM of this loss in the trace to judge a fused linear CE against"
        if judged["gain_ms"] <= 0:
            return judged["why"]
        if judged["saving_share"] < judged.get("loss_only_share", 0.0):
            return (
                f"{judged['why']}: {judged['saving_share']:.1%} of the step, below the "
                f"{judged['loss_only_share']:.1%} the loss-only kernel saves"
            )
    return None
