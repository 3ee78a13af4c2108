"""Triage across the ranks of a multi-process (torchrun) run.

Every rank gets its own report. Across them: each rank's step time, GPU busy and exposed
communication; each candidate's mean and max share and its skew (max ÷ mean time); and
stragglers, ranks whose step time or a hot candidate's time stands out from the median.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from kerneltriage.analysis.model import Candidate, Report, json_safe

SCHEMA = "kerneltriage.ranks/1"
STRAGGLER_STEP = 1.10  # a rank's step this much slower than the median step
STRAGGLER_CANDIDATE = 1.25  # a hot candidate this much slower on one rank than its median


@dataclass
class RankRow:
    rank: int
    step_time_ms: float
    gpu_busy_pct: float
    communication_ms: float
    exposed_communication_ms: float


@dataclass
class CandidateAcross:
    name: str
    kind: str
    ids: dict[int, str]
    mean_share: float
    max_share: float
    mean_ms: float
    max_ms: float
    skew: float  # max ÷ mean time across ranks
    verdicts: dict[int, str]


@dataclass
class RankSummary:
    ranks: list[RankRow]
    candidates: list[CandidateAcross]
    stragglers: list[str]
    warnings: list[str] = field(default_factory=list)
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return json_safe({"schema": data.pop("schema"), **data})


def summarize(reports: dict[int, Report]) -> RankSummary:
    rows = [
        RankRow(
            r,
            rep.step_time_ms,
            rep.gpu_busy_pct,
            rep.communication_ms_per_step,
            rep.exposed_communication_ms_per_step,
        )
        for r, rep in sorted(reports.items())
    ]
    warnings = []
    steps = {r: rep.steps for r, rep in reports.items()}
    if len(set(steps.values())) > 1:
        warnings.append(f"ranks recorded different numbers of steps: {steps}")
    by_key: dict[tuple[str, str], dict[int, Candidate]] = {}
    for r, rep in reports.items():
        for c in rep.candidates:
            by_key.setdefault((c.kind, c.name), {})[r] = c
    across = []
    for (kind, name), per_rank in by_key.items():
        times = [c.time_ms_per_step for c in per_rank.values()] + [0.0] * (len(reports) - len(per_rank))
        shares = [c.time_share for c in per_rank.values()] + [0.0] * (len(reports) - len(per_rank))
        mean = statistics.fmean(times)
        across.append(
            CandidateAcross(
                name=name,
                kind=kind,
                ids={r: c.id for r, c in per_rank.items()},
                mean_share=statistics.fmean(shares),
                max_share=max(shares),
                mean_ms=mean,
                max_ms=max(times),
                skew=max(times) / mean if mean else 1.0,
                verdicts={r: c.verdict for r, c in per_rank.items()},
            )
        )
    across.sort(key=lambda c: -c.mean_share)
    stragglers = []
    if len(reports) > 1:
        median_step = statistics.median(row.step_time_ms for row in rows)
        for row in rows:
            if row.step_time_ms > STRAGGLER_STEP * median_step:
                stragglers.append(
                    f"rank {row.rank}: step {row.step_time_ms:.2f} ms vs median {median_step:.2f} ms"
                )
        min_share = min(rep.thresholds.min_share for rep in reports.values())
        for a in across:
            if a.mean_share < min_share or len(a.ids) < 2:
                continue
            per = {r: c.time_ms_per_step for r, c in by_key[(a.kind, a.name)].items()}
            median = statistics.median(per.values())
            for r, t in per.items():
                if median and t > STRAGGLER_CANDIDATE * median:
                    stragglers.append(f"rank {r}: {a.name} takes {t:.2f} ms vs median {median:.2f} ms")
    return RankSummary(rows, across, stragglers, warnings)
