"""Join Nsight Compute rows to trace kernels.

ncu and the PyTorch profiler demangle names differently, so full names do not join. Two
methods, tried in this order for each row:

1. **by position**: ncu profiles launches in API order, like the trace's launch order. When
   consecutive ncu rows line up with a stretch of a step's kernel sequence (keys: base name,
   grid, block; steps repeat, so the sequence is cyclic), row *i* is the kernel at position
   *o + i* of every active step. Used for exports of consecutive launches.
   A capture of the first launch of each problem size (``sizes.py``) aligns with the step's
   launches that were first of their size instead, and each of its rows then also stands for
   every later launch of the same kernel, configuration and size (method ``size``).
2. **by launch configuration**: ``--filter-mode per-launch-config`` profiles one launch per
   unique (kernel, grid, block); such a row stands for every launch of that kernel with that
   grid and block. Among trace kernels with the row's base name, grid and block, the row goes
   to the one whose canonical full name is most alike; a tie is left unjoined.

A join is then checked: a row whose duration differs from the trace kernel's by more than
``join_max_duration_ratio`` is rejected as a wrong join (ncu replays each kernel with cold
caches, so durations differ somewhat, never by integer factors).

3. **scaled**: an elementwise instantiation that phase 2 profiled at one configuration per
   L2 regime (``one_size.py``; the manifest's ``scaled_kernels``) lends the counters of its
   joined launch nearest in threads to its launches of other configurations, times their
   ratio of threads (``JoinResult.scale``). They are estimates: no roof moves on them
   (``measured_row``), and the result counts their time apart. Nothing joins silently:
the result counts rows and kernel time joined, by method, and the rejects, and names each hot
kernel left with counters on less than half of its time, and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kerneltriage.analysis.timeline.hot_kernels import short_name, without_counter_rows
from kerneltriage.analysis.timeline.sizes import first_of_size
from kerneltriage.ingest.kernel_names import base_name, name_similarity
from kerneltriage.ingest.ncu_csv import Counters
from kerneltriage.ingest.tables import LAUNCH_CONFIG

_MIN_SIMILARITY = 0.5
_MIN_MARGIN = 0.02
_MIN_POSITION_MATCH = 0.9


@dataclass
class JoinResult:
    """``row`` (Series aligned with the attribution's kernel table): ncu row index or -1."""

    row: pd.Series
    method: pd.Series
    rows_total: int
    rows_joined: int
    rows_rejected: int
    time_joined_share: float
    warnings: list[str] = field(default_factory=list)
    # The kernels phase 2 targeted (base names), when known: how many got counters, and the
    # share of their in-step time that did.
    hot_kernels: int = 0
    hot_kernels_joined: int = 0
    hot_time_joined_share: float | None = None
    # Hot kernels with counters on less than half of their time (none, most often), and why.
    hot_without_counters: dict[str, str] = field(default_factory=dict)
    # Per kernel: the factor its row's counts are multiplied by (1 but for ``scaled`` joins),
    # and the share of the kernel time (of the targeted kernels' time) joined that way.
    scale: pd.Series | None = None
    time_scaled_share: float = 0.0
    hot_time_scaled_share: float | None = None

    @property
    def measured_row(self) -> pd.Series:
        """``row`` with the scaled joins left out: counters measured on the launch's own size."""
        return self.row.where(self.method != "scaled", -1)

    def scale_of(self, index: pd.Index) -> np.ndarray:
        if self.scale is None:
            return np.ones(len(index))
        return self.scale.reindex(index).fillna(1.0).to_numpy(dtype=float)

    def to_json(self) -> dict:
        data = {
            "rows": self.rows_total,
            "rows_joined": self.rows_joined,
            "rows_rejected": self.rows_rejected,
            "kernel_time_joined_share": round(self.time_joined_share, 4),
            "methods": self.method[self.row >= 0].value_counts().to_dict(),
        }
        if self.time_scaled_share:
            data["kernel_time_scaled_share"] = round(self.time_scaled_share, 4)
        if self.hot_time_joined_share is not None:
            data["hot_kernels"] = self.hot_kernels
            data["hot_kernels_joined"] = self.hot_kernels_joined
            data["hot_time_joined_share"] = round(self.hot_time_joined_share, 4)
            data["hot_kernels_without_counters"] = dict(self.hot_without_counters)
            if self.hot_time_scaled_share:
                data["hot_time_scaled_share"] = round(self.hot_time_scaled_share, 4)
        return data


def _key(name: str, gx, gy, gz, bx, by, bz) -> tuple:
    return (base_name(name), int(gx), int(gy), int(gz), int(bx), int(by), int(bz))


def join_counters(
    kernels: pd.DataFrame,
    counters: Counters,
    max_ratio: float,
    hot_kernels: list[str] | None = None,
    sizes: np.ndarray | None = None,
    scaled_kernels: frozenset[str] = frozenset(),
) -> JoinResult:
    """Join ``counters`` rows onto the in-step kernels of ``kernels`` (the attribution table).

    ``hot_kernels``: the base names phase 2 targeted; the result then measures them apart.
    ``sizes``: each kernel row's problem size (``sizes.launch_sizes``), for the captures of
    the first launch of each size. ``scaled_kernels``: instantiations whose unprofiled
    configurations take a profiled one's counters scaled by threads.
    """
    row = pd.Series(-1, index=kernels.index, dtype="int64")
    method = pd.Series("", index=kernels.index, dtype=object)
    in_step = kernels[(kernels["step"] >= 0) & (kernels["kind"] == "kernel")]
    ncu = counters.rows
    warnings: list[str] = []
    if in_step.empty or ncu.empty:
        return JoinResult(row, method, len(ncu), 0, 0, 0.0, warnings)

    in_step = in_step.assign(_key=_keys(in_step, "name"))
    if sizes is not None:
        in_step = in_step.assign(_size=sizes[kernels.index.get_indexer(in_step.index)])
    ncu_keys = _keys(ncu, "kernel_name")
    _join_captures(in_step, ncu, ncu_keys, row, method, counters.first_of_size, max_ratio)
    rejected_rows, bad = _reject_by_duration(kernels, ncu, row, method, max_ratio, warnings)
    scale = _join_scaled(in_step, ncu, row, method, scaled_kernels) if scaled_kernels else None
    rows_joined = int(row[row >= 0].nunique())
    total_time = float(in_step["dur"].sum())
    time_joined = float(kernels.loc[row[row >= 0].index, "dur"].sum())
    share = time_joined / total_time if total_time else 0.0
    unjoined = len(ncu) - rows_joined
    if unjoined:
        warnings.append(f"{unjoined} of {len(ncu)} counter rows matched no kernel of the recorded steps")
    result = JoinResult(
        row, method, len(ncu), rows_joined, len(rejected_rows - set(row.tolist())), share, warnings
    )
    if scale is not None:
        result.scale = scale
        scaled_time = float(kernels.loc[method[method == "scaled"].index, "dur"].sum())
        result.time_scaled_share = scaled_time / total_time if total_time else 0.0
    if hot_kernels:
        _measure_hot(result, in_step, ncu, ncu_keys, bad, hot_kernels, counters.hot_instances)
    return result


def _threads(frame: pd.DataFrame) -> np.ndarray:
    return np.prod(frame[LAUNCH_CONFIG].to_numpy(dtype=float), axis=1)


def _join_scaled(
    in_step: pd.DataFrame, ncu: pd.DataFrame, row: pd.Series, method: pd.Series, scaled: frozenset[str]
) -> pd.Series:
    """Join each unjoined launch of a ``scaled`` instantiation to the counter row of a joined
    launch of the same instantiation nearest in threads; returns the factor per kernel (its
    threads over the row's)."""
    scale = pd.Series(1.0, index=row.index)
    of = in_step[in_step["name"].isin(scaled)]
    if of.empty:
        return scale
    ncu_threads = _threads(ncu)
    joined = of[row[of.index] >= 0]
    sources: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, launches in joined.groupby("name", sort=False):
        rows = np.unique(row[launches.index].to_numpy())
        rows = rows[ncu_threads[rows] > 0]
        if len(rows):
            sources[str(name)] = (rows, np.log(ncu_threads[rows]))
    left = of[row[of.index] < 0]
    if left.empty or not sources:
        return scale
    threads = _threads(left)
    for index, name, n in zip(left.index, left["name"], threads):
        source = sources.get(str(name))
        if source is None or n <= 0:
            continue
        rows, logs = source
        best = int(rows[np.argmin(np.abs(logs - np.log(n)))])
        row[index], method[index] = best, "scaled"
        scale[index] = n / ncu_threads[best]
    return scale


def _keys(frame: pd.DataFrame, name_column: str) -> list[tuple]:
    """The join key (base name, grid, block) of every row of ``frame``."""
    return [
        _key(*t)
        for t in zip(
            frame[name_column],
            frame["grid_x"],
            frame["grid_y"],
            frame["grid_z"],
            frame["block_x"],
            frame["block_y"],
            frame["block_z"],
        )
    ]


def _join_captures(
    in_step: pd.DataFrame,
    ncu: pd.DataFrame,
    ncu_keys: list[tuple],
    row: pd.Series,
    method: pd.Series,
    first_of_size: frozenset[int] = frozenset(),
    max_ratio: float = float("inf"),
) -> None:
    """Several captures (every launch of some kernels, or the first of each size; one launch
    per configuration of the rest): each joins what the ones before it left, by position, then
    by configuration."""
    captures = ncu["capture"].tolist() if "capture" in ncu else [0] * len(ncu)
    for capture in dict.fromkeys(captures):
        ids = [i for i, c in enumerate(captures) if c == capture]
        left = in_step[row[in_step.index] < 0]
        if left.empty:
            break
        keys_c = [ncu_keys[i] for i in ids]
        local_row = pd.Series(-1, index=row.index, dtype="int64")
        if capture in first_of_size and "_size" in in_step:
            durations = ncu["duration_ns"].to_numpy(dtype=float)[ids]
            _join_first_of_size(in_step, left, keys_c, durations, local_row, method, max_ratio)
        else:
            matched_name: dict[int, str] = {}
            _join_by_position(left, keys_c, local_row, method, matched_name)
            _join_by_config(
                left, ncu.iloc[ids].reset_index(drop=True), keys_c, local_row, method, matched_name
            )
        hit = local_row >= 0
        row[hit] = np.asarray(ids, dtype=np.int64)[local_row[hit].to_numpy()]


def _join_first_of_size(
    in_step: pd.DataFrame,
    left: pd.DataFrame,
    keys: list[tuple],
    durations: np.ndarray,
    row: pd.Series,
    method: pd.Series,
    max_ratio: float,
) -> None:
    """Rows of the first launch of each problem size, in launch order: aligned with the first
    step's launches that were first of their size (of the rows' kernels). The alignment is the
    common subsequence of equal keys, durations within ``max_ratio``, with the most pairs, and
    among those the closest durations: a launch the process took that the trace does not count
    as first, or the reverse, costs one row, not the alignment, and a missing row does not
    shift its neighbours onto launches of another size with the same kernel and grid. Each
    aligned launch's row then stands for every launch of its kernel, configuration and size."""
    bases = {k[0] for k in keys}
    first = in_step[first_of_size(in_step, in_step["_size"].to_numpy())]
    first = first[first["_key"].map(lambda k: k[0] in bases)]
    if first.empty:
        return
    reference = first[first["step"] == first["step"].min()].sort_values("correlation")
    ref_keys = list(reference["_key"])
    ref_dur = reference["dur"].to_numpy(dtype=float)
    n, m = len(keys), len(ref_keys)
    limit = np.log(max_ratio) if np.isfinite(max_ratio) and max_ratio > 1 else np.inf
    # score[i, j]: a pair counts 1, plus a bonus for how close its durations are that all the
    # pairs' bonuses together keep below 1, so that more pairs always win.
    score = np.zeros((n, m))
    for i in range(n):
        for j in range(m):
            if keys[i] != ref_keys[j]:
                continue
            a, b = durations[i], ref_dur[j]
            gap = abs(np.log(max(a, 1.0) / max(b, 1.0))) if np.isfinite(a) else 0.0
            if gap <= limit:
                score[i, j] = 1.0 + (1.0 - gap / limit if np.isfinite(limit) else 1.0) / (n + 1)
    table = np.zeros((n + 1, m + 1))
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            pair = table[i + 1, j + 1] + score[i, j] if score[i, j] else 0.0
            table[i, j] = max(pair, table[i + 1, j], table[i, j + 1])
    by_size: dict[tuple, int] = {}
    i = j = 0
    while i < n and j < m:
        if score[i, j] and table[i, j] == table[i + 1, j + 1] + score[i, j]:
            index = reference.index[j]
            size = int(reference.at[index, "_size"])
            if size >= 0:
                by_size[(ref_keys[j], size)] = i
            elif row[index] < 0:  # a launch whose size the trace did not record: itself only
                row[index] = i
                method[index] = "first-of-size"
            i, j = i + 1, j + 1
        elif table[i + 1, j] >= table[i, j + 1]:
            i += 1
        else:
            j += 1
    for index, key, size in zip(left.index, left["_key"], left["_size"]):
        found = by_size.get((key, int(size))) if size >= 0 else None
        if found is not None:
            row[index] = found
            method[index] = "size"


def _reject_by_duration(
    kernels: pd.DataFrame,
    ncu: pd.DataFrame,
    row: pd.Series,
    method: pd.Series,
    max_ratio: float,
    warnings: list[str],
) -> tuple[set[int], pd.Index]:
    """Undo the joins whose durations disagree by more than ``max_ratio``; returns the
    rejected counter rows and the kernels whose joins were undone."""
    joined = row[row >= 0]
    rejected_rows: set[int] = set()
    bad = joined.index[:0]
    if len(joined):
        trace_dur = kernels.loc[joined.index, "dur"].to_numpy(dtype=float)
        ncu_dur = ncu["duration_ns"].to_numpy(dtype=float)[joined.to_numpy()]
        ratio = np.maximum(trace_dur, ncu_dur) / np.maximum(np.minimum(trace_dur, ncu_dur), 1.0)
        bad = joined.index[(ratio > max_ratio) & np.isfinite(ncu_dur)]
        if len(bad):
            rejected_rows = set(row[bad].tolist())
            row[bad] = -1
            method[bad] = ""
            warnings.append(
                f"{len(bad)} kernel launches had counters whose duration differs from the trace's by "
                f"more than {max_ratio:g}×; those joins were rejected"
            )
    return rejected_rows, bad


def _measure_hot(
    result: JoinResult,
    in_step: pd.DataFrame,
    ncu: pd.DataFrame,
    ncu_keys: list[tuple],
    bad: pd.Index,
    hot_kernels: list[str],
    instances: dict[str, list[str]],
) -> None:
    """How many of the kernels phase 2 targeted got counters, on what share of their time;
    those with counters on less than half of it are named, and why. ``instances``: the
    instantiations targeted of kernels targeted in part."""
    row = result.row
    bases = in_step["_key"].map(lambda k: k[0])
    targeted = bases.isin(set(hot_kernels))
    if instances:
        wanted = {n for names in instances.values() for n in names}
        targeted &= ~bases.isin(set(instances)) | in_step["name"].isin(wanted)
    hot = in_step[targeted]
    hot_joined = row[hot.index] >= 0
    hot_time = float(hot["dur"].sum())
    if result.scale is not None:
        scaled = hot_joined & (result.method[hot.index] == "scaled")
        result.hot_time_scaled_share = float(hot.loc[scaled, "dur"].sum()) / hot_time if hot_time else 0.0
    result.hot_kernels = len(set(hot_kernels))
    result.hot_kernels_joined = int(bases[hot.index][hot_joined].nunique())
    result.hot_time_joined_share = float(hot.loc[hot_joined, "dur"].sum()) / hot_time if hot_time else 0.0
    result.hot_without_counters = _hot_without_counters(
        hot.assign(_base=bases[hot.index], _joined=hot_joined, _rejected=hot.index.isin(bad)),
        set(ncu_keys),
        set(without_counter_rows(hot_kernels, [ncu])),
    )
    if result.hot_without_counters:
        result.warnings.append(
            "hot kernels without counters: "
            + "; ".join(f"{short_name(name)} ({why})" for name, why in result.hot_without_counters.items())
        )


def _hot_without_counters(hot: pd.DataFrame, row_keys: set[tuple], no_rows: set[str]) -> dict[str, str]:
    """Why each hot kernel has counters on less than half of its in-step time (``no_rows``:
    the hot kernels no counter row names)."""
    out: dict[str, str] = {}
    for name, launches in hot.groupby("_base", sort=False):
        time = float(launches["dur"].sum())
        joined = float(launches.loc[launches["_joined"], "dur"].sum())
        if time <= 0 or joined >= 0.5 * time:
            continue
        if name in no_rows:
            why = "no counter row: ncu did not profile it in phase 2's step"
        else:
            left = launches[~launches["_joined"]]
            rejected = int(left["_rejected"].sum())
            unprofiled = int((~left["_key"].isin(row_keys) & ~left["_rejected"]).sum())
            unmatched = len(left) - rejected - unprofiled
            parts = []
            if rejected:
                parts.append(
                    f"{rejected} launches had counters of another duration, rejected (another problem "
                    "size under the same launch configuration, or another program)"
                )
            if unprofiled:
                parts.append(f"{unprofiled} launches in launch configurations ncu did not profile")
            if unmatched:
                parts.append(
                    f"{unmatched} launches matched no counter row of their launch configuration by name "
                    "(other template instantiations)"
                )
            why = "; ".join(parts)
        if joined:
            why = f"counters on {joined / time:.0%} of its time; {why}"
        out[str(name)] = why
    return out


def _join_by_position(
    in_step: pd.DataFrame,
    ncu_keys: list[tuple],
    row: pd.Series,
    method: pd.Series,
    matched_name: dict[int, str],
) -> None:
    """Align the rows as a subsequence of the (cyclic) step sequence: filters such as NVTX
    ranges (which do not cover the autograd thread) or ``-k`` drop kernels between rows."""
    steps = sorted(in_step["step"].unique())
    per_step = {s: in_step[in_step["step"] == s].sort_values("correlation") for s in steps}
    reference = per_step[steps[0]]
    ref_keys = list(reference["_key"])
    ref_names = list(reference["name"])
    length = len(ref_keys)
    n = len(ncu_keys)
    if length == 0 or n < 2 or len(set(ncu_keys)) == n:
        return  # one row per configuration: rows stand for configurations, not positions
    where: dict[tuple, list[int]] = {}
    for p, key in enumerate(ref_keys):
        where.setdefault(key, []).append(p)
    first = next((i for i, k in enumerate(ncu_keys) if k in where), None)
    if first is None:
        return
    best: list[int] = []
    for start in where[ncu_keys[first]]:
        positions = _greedy(ncu_keys, first, start, where, length)
        if sum(p >= 0 for p in positions) > sum(p >= 0 for p in best):
            best = positions
    if sum(p >= 0 for p in best) < _MIN_POSITION_MATCH * n:
        return
    for _s, frame in per_step.items():
        keys = list(frame["_key"])
        same = len(keys) == length
        for i, p in enumerate(best):
            if p >= 0 and same and keys[p] == ref_keys[p]:
                index = frame.index[p]
                if row[index] < 0:
                    row[index] = i
                    method[index] = "position"
        for i, p in enumerate(best):
            if p >= 0:
                matched_name[i] = ref_names[p]


def _greedy(
    keys: list[tuple], first: int, start: int, where: dict[tuple, list[int]], length: int
) -> list[int]:
    """Position (mod step length) of each row, walking forward; -1 where no match within a step."""
    out = [-1] * len(keys)
    cursor = start  # absolute position in the repeated sequence
    out[first] = start
    for i in range(first + 1, len(keys)):
        occurrences = where.get(keys[i])
        if not occurrences:
            continue
        base = cursor + 1
        # Next occurrence at or after `base` in the cyclic sequence.
        offset = base % length
        later = [p for p in occurrences if p >= offset]
        p = later[0] if later else occurrences[0] + length
        absolute = base - offset + p
        if absolute - cursor > length:
            continue
        out[i] = absolute % length
        cursor = absolute
    return out


def _join_by_config(
    in_step: pd.DataFrame,
    ncu: pd.DataFrame,
    ncu_keys: list[tuple],
    row: pd.Series,
    method: pd.Series,
    matched_name: dict[int, str],
) -> None:
    remaining = in_step[row[in_step.index] < 0]
    if remaining.empty:
        return
    by_key: dict[tuple, dict[str, list[int]]] = {}
    for index, key, name in zip(remaining.index, remaining["_key"], remaining["name"]):
        by_key.setdefault(key, {}).setdefault(name, []).append(index)
    # Several rows for one (key, name) (launches of one configuration): the row nearest the
    # median duration stands for the launches no row was aligned with.
    claims: dict[tuple[tuple, str], list[int]] = {}
    for i, key in enumerate(ncu_keys):
        names = by_key.get(key)
        if not names:
            continue
        if i in matched_name:
            if matched_name[i] in names:
                claims.setdefault((key, matched_name[i]), []).append(i)
            continue
        scored = sorted(((name_similarity(ncu.at[i, "kernel_name"], n), n) for n in names), reverse=True)
        best_score, best_name = scored[0]
        if best_score < _MIN_SIMILARITY:
            continue
        if len(scored) > 1 and best_score - scored[1][0] < _MIN_MARGIN:
            continue  # ambiguous: two trace kernels fit this row equally well
        claims.setdefault((key, best_name), []).append(i)
    durations = ncu["duration_ns"].to_numpy(dtype=float)
    for (key, name), rows_i in claims.items():
        if len(rows_i) > 1:
            median = float(np.nanmedian(durations[rows_i]))
            rows_i = sorted(rows_i, key=lambda r: abs(durations[r] - median))
        for index in by_key[key][name]:
            row[index] = rows_i[0]
            method[index] = "config"
