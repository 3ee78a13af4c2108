"""Which built-in replaces naive attention: the built-in flash attention for the variants SDPA
cannot run fused (softcap, a custom mask), else whichever of SDPA and the built-in the shipped
benchmark table measured faster on this GPU, else SDPA's fastest measured backend.
"""

from __future__ import annotations

from kerneltriage.analysis.gpus import GPUSpec, attention_perf
from kerneltriage.analysis.judge.attention_rates import attention_rates, how
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.rules_schema import Recommendation
from kerneltriage.analysis.vocabulary import Reason


def choose_attention(c: Candidate, rec: Recommendation, gpu: GPUSpec) -> tuple[str | None, str]:
    """SDPA or the built-in flash attention: variants SDPA cannot fuse get the built-in; plain
    attention gets whichever the shipped benchmark table measured faster on this GPU."""
    library, ours = rec.get("builtin"), rec.get("variant_builtin")
    if c.attrs.get("softcap") or c.attrs.get("mask") == "custom-mask":
        return ours, Reason.VARIANT_NEEDS_BUILTIN
    perf = attention_perf(gpu, c.attrs.get("head_dim"), c.attrs.get("mask") == "causal")
    if perf is None:
        q = c.q or [0, 0]
        rates = attention_rates(
            gpu.key,
            int(c.attrs.get("head_dim") or 0),
            c.attrs.get("mask") == "causal",
            int(q[-2]),
            c.bwd_ms_per_step > 0,
        )
        if rates is None:
            return library, Reason.NO_BUILTIN_BENCHMARK.text(gpu=gpu.name)
        best, rate = rates.best
        return library, Reason.SDPA_BEST_BACKEND.text(
            gpu=gpu.name,
            backend=best,
            rate=rate,
            head_dim=rates.head_dim,
            seq_len=rates.seq_len,
            how=how(best),
        )
    sdpa, built = perf
    if built > sdpa:
        return ours, Reason.BUILTIN_FASTER.text(built=built, sdpa=sdpa)
    return library, Reason.SDPA_FASTER.text(sdpa=sdpa, built=built)
