"""Triage across the ranks of a multi-process (torchrun) run.

Every rank gets its own report. Across them: each rank's step time, GPU busy and exposed
communication; each candidate's mean and max share and its skew (max ÷ mean time); and
stragglers, ranks whose step time or a hot candidate's time stands out from the median.

- **Step time** is each rank's own plain steps (nothing installed; ``profile``'s
  ``logs/status.timeline.rank<r>.json``), as the first rank's is. The recorded steps are no
  measure of a rank's step: in DDP every rank finishes every step together, and a rank waits
  in its all-reduce while another rank is being profiled. A straggler is a rank whose plain
  median stands out from the typical rank's beyond both ``STRAGGLER_STEP`` and the two
  medians' intervals (``slower_beyond_noise``).
- **Communication** is split into *wait* and *transfer* where the traces allow: the same
  collective is matched on every rank (same kernel, the same place in the sequence, ends that
  coincide: a collective ends together on every rank); the time a rank's kernel ran before the
  last rank's kernel started is wait (its peer had not arrived), the rest transfer. The ranks'
  clocks are aligned on the collectives' ends, so hosts whose clocks differ are compared too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# The exposed communication and the settings offered for it live in ``exposed``; the names stay
# importable from here, where the ranks' reports are put together.
from kerneltriage.analysis.compare.exposed import COMMUNICATION as COMMUNICATION
from kerneltriage.analysis.compare.exposed import communication_fix as communication_fix
from kerneltriage.analysis.compare.exposed import last_collective as last_collective
from kerneltriage.analysis.model import Candidate, Gap, Report, json_safe
from kerneltriage.analysis.timeline.idle import HOST_BUSY
from kerneltriage.ingest.tables import Timeline

SCHEMA = "kerneltriage.ranks/1"
STRAGGLER_STEP = 1.10  # a rank's step this much slower than the median step
STRAGGLER_CANDIDATE = 1.25  # a hot candidate this much slower on one rank than its median


#: Two ranks' ends of one collective further apart than this (after the clocks' offset), plus
#: ``END_MATCH_SHARE`` of the shorter kernel, are not the same collective.
END_MATCH_NS = 50_000
END_MATCH_SHARE = 0.05
#: How far the sequences of one collective kernel may be shifted against each other (a rank's
#: trace may hold a collective of the step before the first recorded one).
MAX_SHIFT = 3


@dataclass
class RankRow:
    rank: int
    step_time_ms: float
    gpu_busy_pct: float
    communication_ms: float
    exposed_communication_ms: float
    timed_on: str = "recorded steps"  # or "plain steps": the steps ``step_time_ms`` is of
    step_low_ms: float | None = None  # the step time's interval (plain steps)
    step_high_ms: float | None = None
    wait_ms: float | None = None  # of ``communication_ms``: waiting for a peer (None: not known)
    transfer_ms: float | None = None


@dataclass
class CommSplit:
    """One rank's matched collectives: their kernel time and the part spent waiting."""

    matched: int
    kernel_ns: float
    wait_ns: float
    last: int = 0  # collectives this rank started last (the others waited for it)

    @property
    def wait_fraction(self) -> float:
        return self.wait_ns / self.kernel_ns if self.kernel_ns > 0 else 0.0


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
    notes: list[str] = field(default_factory=list)  # where ranks waited for each other
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return json_safe({"schema": data.pop("schema"), **data})


def summarize(reports: dict[int, Report]) -> RankSummary:
    rows = [_rank_row(r, rep) for r, rep in sorted(reports.items())]
    warnings = []
    steps = {r: rep.steps for r, rep in reports.items()}
    if len(set(steps.values())) > 1:
        warnings.append(f"ranks recorded different numbers of steps: {steps}")
    transfer = {row.rank: _transfer_fraction(row) for row in rows}
    by_key: dict[tuple[str, str], dict[int, Candidate]] = {}
    for r, rep in reports.items():
        for c in rep.candidates:
            by_key.setdefault((c.kind, c.name), {})[r] = c

    def own_ms(r: int, c: Candidate) -> float | None:
        """The candidate's time on rank ``r``; a collective's without the wait for its peers
        (None: a collective whose wait is not known)."""
        if c.kind != COMMUNICATION:
            return c.time_ms_per_step
        fraction = transfer[r]
        return None if fraction is None else c.time_ms_per_step * fraction

    across = []
    for (kind, name), per_rank in by_key.items():
        missing = [0.0] * (len(reports) - len(per_rank))
        own = {r: own_ms(r, c) for r, c in per_rank.items()}
        times = [
            t if t is not None else c.time_ms_per_step for (r, c), t in zip(per_rank.items(), own.values())
        ]
        shares = [
            c.time_share * (t / c.time_ms_per_step if c.time_ms_per_step else 1.0)
            for c, t in zip(per_rank.values(), times)
        ]
        times, shares = times + missing, shares + missing
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
        stragglers += _step_stragglers(rows, warnings)
        min_share = min(rep.thresholds.min_share for rep in reports.values())
        for a in across:
            if a.mean_share < min_share or len(a.ids) < 2:
                continue
            timed = {r: own_ms(r, c) for r, c in by_key[(a.kind, a.name)].items()}
            per = {r: t for r, t in timed.items() if t is not None}
            if len(per) < 2:
                continue  # a collective's kernel time is mostly waiting where the wait is not known
            median = statistics.median(per.values())
            for r, t in per.items():
                if median and t > STRAGGLER_CANDIDATE * median:
                    stragglers.append(f"rank {r}: {a.name} takes {t:.2f} ms vs median {median:.2f} ms")
    return RankSummary(rows, across, stragglers, warnings, _wait_notes(reports, rows))


def _wait_notes(reports: dict[int, Report], rows: list[RankRow]) -> list[str]:
    """Where a rank's collectives waited for another rank: measured in the recorded steps,
    where one rank may be slowed by its profiler, so it is stated, not judged."""
    last = {
        r: int((rep.source.get("communication") or {}).get("arrived_last") or 0) for r, rep in reports.items()
    }
    matched = max(
        (
            int((rep.source.get("communication") or {}).get("matched_collectives") or 0)
            for rep in reports.values()
        ),
        default=0,
    )
    notes = []
    for row in rows:
        if row.wait_ms is None or row.wait_ms < 0.05 * row.step_time_ms:
            continue
        others = {r: n for r, n in last.items() if r != row.rank and n}
        late = max(others, key=lambda r: others[r]) if others else None
        who = (
            f" for rank {late} (last to start {others[late]} of {matched} collectives)"
            if late is not None
            else ""
        )
        notes.append(
            f"rank {row.rank}: {row.wait_ms:.2f} ms per step of its {row.communication_ms:.2f} ms of collectives "
            f"is waiting{who}, in the recorded steps; the rest ({row.transfer_ms or 0.0:.2f} ms) is transfer"
        )
    return notes


def _rank_row(rank: int, rep: Report) -> RankRow:
    timing = rep.source.get("timing") or {}
    comm = rep.source.get("communication") or {}
    row = RankRow(
        rank,
        rep.step_time_ms,
        rep.gpu_busy_pct,
        rep.communication_ms_per_step,
        rep.exposed_communication_ms_per_step,
        wait_ms=comm.get("wait_ms_per_step"),
        transfer_ms=comm.get("transfer_ms_per_step"),
    )
    if timing.get("plain_median_ms"):
        row.timed_on = "plain steps"
        interval = rep.step_interval_ms or step_interval(
            timing.get("plain_ms") or [rep.step_time_ms], rep.step_time_ms
        )
        row.step_low_ms, row.step_high_ms = float(interval[0]), float(interval[1])
    return row


def _transfer_fraction(row: RankRow) -> float | None:
    if row.wait_ms is None or row.transfer_ms is None:
        return None
    total = row.wait_ms + row.transfer_ms
    return row.transfer_ms / total if total > 0 else 1.0


# --- stragglers --------------------------------------------------------------------------------


def step_interval(values: Sequence[float], median: float | None = None) -> tuple[float, float]:
    """The interval of a rank's median step from its plain steps (``analysis.steady``'s bootstrap
    interval of the median); one step: no interval (the value itself). The report's own
    ``step_interval_ms`` (the steady plain steps') is used first where it has one."""
    from kerneltriage.analysis.timeline.steady import median_interval

    x = [float(v) for v in values if v is not None and math.isfinite(v)]
    mid = float(np.median(x)) if x else float(median or 0.0)
    if len(x) < 2:
        return mid, mid
    low, high = median_interval(x)
    return float(low), float(high)


def slower_beyond_noise(mine: tuple[float, float, float], typical: tuple[float, float, float]) -> bool:
    """Whether a rank's step (``(median, low, high)``) is a straggler against the typical rank's:
    more than ``STRAGGLER_STEP`` times slower, and its interval wholly above the typical one's
    (the gap is no noise of either rank's steps). The one place the test is made."""
    value, low, _high = mine
    t_value, _t_low, t_high = typical
    return value > STRAGGLER_STEP * t_value and low > t_high


def _step_stragglers(rows: list[RankRow], warnings: list[str]) -> list[str]:
    """Ranks whose step time stands out, judged on the plain steps of the ranks that have them
    (a recorded step carries the wait for ranks being profiled); recorded steps only where no
    rank has plain steps."""
    plain = [row for row in rows if row.timed_on == "plain steps"]
    if plain and len(plain) < len(rows):
        others = ", ".join(str(row.rank) for row in rows if row.timed_on != "plain steps")
        warnings.append(
            f"rank(s) {others} have no plain steps: their step time is the recorded steps' (profiler "
            "included, and the wait for ranks being profiled), and they are not judged as stragglers"
        )
    judged = plain or rows
    if len(judged) < 2:
        return []

    def interval(row: RankRow) -> tuple[float, float, float]:
        low = row.step_low_ms if row.step_low_ms is not None else row.step_time_ms
        high = row.step_high_ms if row.step_high_ms is not None else row.step_time_ms
        return row.step_time_ms, low, high

    out = []
    for row in judged:
        # Against the typical other rank: the medians of the others' medians and interval ends
        # (with two ranks, the other one).
        rest = [interval(r) for r in judged if r is not row]
        typical = (
            statistics.median(o[0] for o in rest),
            statistics.median(o[1] for o in rest),
            statistics.median(o[2] for o in rest),
        )
        if slower_beyond_noise(interval(row), typical):
            out.append(
                f"rank {row.rank}: step {row.step_time_ms:.2f} ms vs {typical[0]:.2f} ms, the median of the "
                f"other ranks ({row.timed_on})"
            )
    return out


# --- communication: wait and transfer ----------------------------------------------------------

#: One collective kernel on one rank: (kernel name, start ns, end ns).
Collective = tuple[str, int, int]


def collectives(timeline: Timeline, is_comm: Callable[[str], bool]) -> list[Collective]:
    """The communication kernels of a rank's trace, in start order."""
    k = timeline.kernels
    if k.empty:
        return []
    k = k[k["kind"] == "kernel"]
    names = k["name"].astype(str)
    mask = names.map(is_comm).to_numpy(dtype=bool)
    if not mask.any():
        return []
    starts = k["start"].to_numpy()[mask].astype(np.int64)
    ends = starts + k["dur"].to_numpy()[mask].astype(np.int64)
    picked = names.to_numpy()[mask]
    order = np.argsort(starts, kind="stable")
    return [(str(picked[i]), int(starts[i]), int(ends[i])) for i in order]


def _pairing(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> tuple[float, dict[int, int]]:
    """Rank b's clock offset against rank a's, and which kernel of b is which of a (index ->
    index), for one kernel name: the shift of the two sequences whose ends agree best."""
    best: tuple[float, float, dict[int, int]] | None = None
    for shift in range(-MAX_SHIFT, MAX_SHIFT + 1):
        pairs = [(i, i + shift) for i in range(len(a)) if 0 <= i + shift < len(b)]
        if not pairs:
            continue
        diffs = np.array([b[j][1] - a[i][1] for i, j in pairs], dtype=float)
        offset = float(np.median(diffs))
        matched = {}
        for (i, j), d in zip(pairs, diffs):
            shorter = min(a[i][1] - a[i][0], b[j][1] - b[j][0])
            if abs(d - offset) <= END_MATCH_NS + END_MATCH_SHARE * shorter:
                matched[i] = j
        # Ties in what matches go to the shift whose ends agree best on average.
        score = float(np.mean(np.abs(diffs - offset)))
        key = (-len(matched), score)
        if best is None or key < (-len(best[2]), best[1]):
            best = (offset, score, matched)
    return (best[0], best[2]) if best else (0.0, {})


def communication_waits(per_rank: dict[int, list[Collective]]) -> dict[int, CommSplit]:
    """Wait and transfer of every rank's collectives that are matched on all ranks.

    The same collective ends together on every rank; where its kernels start apart, the ranks
    that started early waited for the last one: wait = the last rank's start − this rank's
    start (clocks aligned on the ends), at most the kernel's time; the rest is transfer."""
    ranks = sorted(r for r, c in per_rank.items() if c)
    if len(ranks) < 2:
        return {}
    ref = ranks[0]
    names = sorted({name for name, _s, _e in per_rank[ref]})
    totals = {r: CommSplit(0, 0.0, 0.0) for r in ranks}
    for name in names:
        a = [(s, e) for n, s, e in per_rank[ref] if n == name]
        pairings = {}
        for r in ranks[1:]:
            b = [(s, e) for n, s, e in per_rank[r] if n == name]
            pairings[r] = (b, *_pairing(a, b))
        for i, (start, end) in enumerate(a):
            if not all(i in matched for _b, _off, matched in pairings.values()):
                continue
            spans = {ref: (float(start), float(end))}
            for r, (b, offset, matched) in pairings.items():
                b_start, b_end = b[matched[i]]
                spans[r] = (b_start - offset, b_end - offset)
            last = max(s for s, _e in spans.values())
            totals[max(spans, key=lambda r: spans[r][0])].last += 1
            for r, (s, e) in spans.items():
                total = totals[r]
                total.matched += 1
                total.kernel_ns += e - s
                total.wait_ns += min(max(0.0, last - s), e - s)
    return {r: t for r, t in totals.items() if t.matched}


def split_communication(reports: dict[int, Report], per_rank: dict[int, list[Collective]]) -> None:
    """Put each rank's wait and transfer (its communication per step, split in the matched
    collectives' proportion) in its report's ``source["communication"]``.

    Where every rank was timed on its plain steps and none stands out from the others (the job
    runs in step), the wait measured in the recorded steps is the profiler's, not the job's: a
    rank waited while its peer was still in a profiled step. Its collectives' candidates and its
    exposed communication then count their transfer only (``_leave_out_wait``)."""
    in_step = _ranks_in_step(reports)
    for r, split in communication_waits(per_rank).items():
        rep = reports.get(r)
        if rep is None or rep.communication_ms_per_step <= 0:
            continue
        comm = rep.communication_ms_per_step
        rep.source["communication"] = {
            "wait_ms_per_step": comm * split.wait_fraction,
            "transfer_ms_per_step": comm * (1.0 - split.wait_fraction),
            "matched_collectives": split.matched,
            "arrived_last": split.last,
            "how": "collectives matched across ranks; wait = time before the last rank's kernel started",
        }
        if split.wait_fraction < WAIT_NOTE_SHARE:
            continue
        if in_step:
            _leave_out_wait(rep, split.wait_fraction)
            continue
        for c in rep.candidates:
            if c.kind == COMMUNICATION and c.time_ms_per_step > 0:
                note = (
                    f"about {split.wait_fraction:.0%} of its kernel time ({c.time_ms_per_step * split.wait_fraction:.2f} "
                    "ms per step) is waiting for other ranks to start the same collective (matched across ranks, "
                    "in the recorded steps); the rest is transfer"
                )
                c.note = "; ".join(x for x in (c.note, note) if x)


#: A rank's collectives that wait this share of their time or more say so on their candidates.
WAIT_NOTE_SHARE = 0.2


def _ranks_in_step(reports: dict[int, Report]) -> bool:
    """Every rank timed on its plain steps, and no rank's step stands out beyond the noise."""
    rows = [_rank_row(r, rep) for r, rep in sorted(reports.items())]
    if len(rows) < 2 or any(row.timed_on != "plain steps" for row in rows):
        return False
    return not _step_stragglers(rows, [])


def _leave_out_wait(rep: Report, wait_fraction: float) -> None:
    """The rank's collectives counted at their transfer time, the wait for a rank still in a
    profiled step left out (a note says how much), its exposed communication likewise; the
    candidates re-ranked as the triage ranks them."""
    from kerneltriage.analysis.judge.verdict import rank_in_order

    comm = rep.source["communication"]
    wait = comm["wait_ms_per_step"]
    comm["wait_left_out"] = True
    keep = 1.0 - wait_fraction
    for c in rep.candidates:
        if c.kind != COMMUNICATION or c.time_ms_per_step <= 0:
            continue
        waited = c.time_ms_per_step * wait_fraction
        c.time_ms_per_step *= keep
        c.time_share *= keep
        c.gpu_share *= keep
        note = (
            f"{waited:.2f} ms per step of waiting for other ranks left out ({wait_fraction:.0%} of its kernel "
            "time in the recorded steps): the ranks' plain steps run in step, so the wait was for a rank "
            "still in a profiled step; the time shown is the transfer"
        )
        c.note = "; ".join(x for x in (c.note, note) if x)
    rep.exposed_communication_ms_per_step = max(0.0, rep.exposed_communication_ms_per_step - wait)
    busy = _busy_without_wait(rep, wait)
    rep.notes.append(
        f"communication: {wait:.2f} ms per step of the recorded steps' collectives was waiting for a rank "
        "still in a profiled step (the ranks' plain steps run in step): left out of the collectives' "
        "candidates and of the exposed communication"
        + (", and of GPU busy (the idle time and its causes follow)" if busy else "")
    )
    rank_in_order(rep.candidates)


def _busy_without_wait(rep: Report, wait: float) -> bool:
    """GPU busy less the collectives' wait, and the idle time, its interval, its causes and its
    headline made again from it. The clean steps that measure busy time are profiled steps as
    well, so a rank's collectives wait there as they do in the recorded steps: a rank that
    waited 181 of its 219 ms for a peer read 100% busy and 0% idle while the peer read 40% busy
    (an FSDP2 job on two H100s); busy taken from the recorded steps holds the same wait. Needs
    ``profile``'s timing (the plain steps, and the recorded steps' busy time); False where it is
    not there."""
    from kerneltriage.analysis.triage import idle_interval, idle_of

    timing = rep.source.get("timing") or {}
    recorded_step, recorded_busy = timing.get("recorded_step_ms"), timing.get("recorded_busy_ms")
    step = rep.step_time_ms
    if recorded_step is None or recorded_busy is None or step <= 0:
        return False
    measured = timing.get("gpu_busy_ms")  # the clean steps', else the recorded steps'
    busy = min(step, max(0.0, float(recorded_busy if measured is None else measured) - wait))
    # The wait lengthened the recorded steps as much as their busy time: their idle causes stay
    # what they were, scaled to the plain steps' idle as before.
    recorded_idle = float(recorded_step) - float(recorded_busy)
    scale = (step - busy) / recorded_idle if recorded_idle > 0 else 0.0
    for g in rep.gaps:
        if g.recorded_ms_per_step is not None:
            g.ms_per_step = g.recorded_ms_per_step * scale
    timing["idle_scale"] = scale
    timing["gpu_busy_less_wait_ms"] = busy
    rep.gpu_busy_ms = busy
    rep.gpu_busy_pct = 100.0 * busy / step
    rep.idle_pct = max(0.0, 100.0 - rep.gpu_busy_pct)
    if "idle" in rep.kind_breakdown:
        rep.kind_breakdown["idle"] = max(0.0, step - busy)
        rep.kind_breakdown = dict(sorted(rep.kind_breakdown.items(), key=lambda kv: -kv[1]))
    rep.idle_interval_pct = idle_interval(rep.step_interval_ms, busy)
    # The report keeps the biggest gaps; each class's other gaps count in its total as one more.
    kept: dict[str, float] = {}
    for g in rep.gaps:
        kept[g.kind or HOST_BUSY] = kept.get(g.kind or HOST_BUSY, 0.0) + (g.recorded_ms_per_step or 0.0)
    rest = [
        Gap(f"{kind}: other gaps", (total - kept.get(kind, 0.0)) * scale, 0.0, 0.0, kind=kind)
        for kind, total in (timing.get("recorded_idle_by_class") or {}).items()
        if total > kept.get(kind, 0.0)
    ]
    low = rep.step_interval_ms[0] if rep.step_interval_ms else None
    exposed = rep.exposed_communication_ms_per_step
    rep.idle = idle_of(step, busy, rep.step_spread_ms, [*rep.gaps, *rest], exposed, rep.thresholds, low)
    return True
