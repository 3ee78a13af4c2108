"""Phase 2 over several GPUs: which GPUs it may use, which hot kernels each profiles, and one
export made of theirs.

A single-process script's hot kernels are shared among concurrent ncu processes, one per GPU,
each running the same command with ``CUDA_VISIBLE_DEVICES`` set to its GPU (the script's
``cuda:0`` lands there) and a kernel filter on its share. Kernels keep their policy (every
launch of a variable-size kernel, one launch per configuration of the others); the shares are
balanced on the launches each process is expected to profile plus what a process start costs.
Each process exports its own CSV; the exports of one policy become one file whose rows follow
the step's launch order, as one process would have written them. The parent never imports
torch: the GPUs come from ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.timeline.hot_kernels import HotKernels
    from kerneltriage.ingest.tables import Timeline

#: What starting one more ncu process costs, in profiled launches: the script's imports, model
#: build and warm-up steps under ncu, whose launches ncu serializes. ConvNeXt-T on an H200
#: (2026-11-27, 19 metrics, 6 replay passes a launch): 24 launches in 23.1 s and 156 in 57.2 s,
#: one process after the other, so 0.26 s a launch and 17 s a start, some 65 launches; 22 s (86)
#: with two GPUs' processes starting at once on one host. Two processes on one GPU gain nothing
#: from running at once (measured: 55-57 s for what takes 57 s in turn): the start is mostly
#: launches under ncu's lock, not the host's imports.
START_COST_LAUNCHES = 75
#: ... and a process started early, held at its gate while the timing processes ran: its turn
#: adds only its warm-up steps under ncu, 2.3-4.4 s from its gate's opening to its profiled
#: step on an H200 (2026-11-27, four models), some 15 launches at 0.2-0.4 s.
START_COST_GATED = 15
#: ... and a second process on a GPU that runs one already, started with it and held before its
#: profiled step (``turns.py``, measure gates): its start-up and warm-up overlap the first's,
#: so it adds little more than their two warm-ups sharing the GPU.
START_COST_BESIDE = 3
#: ... and a first process on a GPU other than the script's, warmed up while the timing
#: processes ran there (``turns.Turns.warm_ahead``): it profiles as soon as phase 2 begins, and
#: costs what every process does besides its launches, its first launch and its exit (ncu
#: writing its report): 1.5-2 s a process on two H200s (2026-11-28, three models).
START_COST_AHEAD = 4
#: What one launch of the memory-bound kernels' pass costs, in launches with the instruction
#: counters: 0.04 s against 0.2-0.5 s on an H200 (``ncu_passes.LIGHT_MIN_CONFIGS``).
LIGHT_LAUNCH = 0.2
#: Seconds ``nvidia-smi -L`` may take before the GPUs count as one.
SMI_TIMEOUT = 20.0

_SMI_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_NAME_COLUMNS = ("Kernel Name", "Function Name", "Name")


@dataclass(frozen=True)
class Gpu:
    """One GPU a child process may be given: how ``CUDA_VISIBLE_DEVICES`` names it, and its
    model when ``nvidia-smi`` says."""

    device: str
    name: str | None = None


@dataclass
class GpuChoice:
    """The GPUs phase 2 splits its kernels over (none: one ncu process at a time, as on one
    GPU), and why it does not when several are visible."""

    gpus: list[Gpu] = field(default_factory=list)
    reason: str | None = None


@dataclass
class Share:
    """One GPU's part of phase 2: its every-launch kernels and their launches a step, its
    one-launch-per-configuration kernels and their configurations."""

    gpu: Gpu
    variable: list[str] = field(default_factory=list)
    variable_launches: int = 0
    configs: list[str] = field(default_factory=list)
    config_count: int = 0
    # The memory-bound kernels' pass (``ncu_passes.light_split``): its kernels and configurations.
    light: list[str] = field(default_factory=list)
    light_count: int = 0
    # Its processes warm up while the timing processes run on the first GPU (``plan_shares``).
    ahead: bool = False


@dataclass
class StepLaunches:
    """The step the hot kernels were picked from: each hot kernel's launches and launch
    configurations in it, and the launch keys (base name, grid, block) in launch order."""

    launches: dict[str, int]
    configs: dict[str, int]
    order: list[tuple]
    devices: list[int]


def visible_gpus(environ: Mapping[str, str] | None = None, timeout: float = SMI_TIMEOUT) -> list[Gpu]:
    """The GPUs a child process can be given: ``CUDA_VISIBLE_DEVICES``'s entries when it is set,
    else every GPU ``nvidia-smi -L`` lists; none when neither says (no nvidia-smi, a timeout)."""
    env = os.environ if environ is None else environ
    listed = _smi_gpus(timeout)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [Gpu(index, name) for index, name, _ in listed]
    gpus = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break  # CUDA stops enumerating at the first invalid entry
        # Named by index or by (a prefix of) its UUID; its model, when nvidia-smi lists it.
        model = next(
            (
                name
                for index, name, uuid in listed
                if entry in (index, uuid) or (entry.startswith("GPU-") and uuid.startswith(entry))
            ),
            None,
        )
        gpus.append(Gpu(entry, model))
    return gpus


def _smi_gpus(timeout: float) -> list[tuple[str, str, str]]:
    """``nvidia-smi -L``'s GPUs: (index, model, UUID); none where MIG instances are listed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    gpus = []
    for line in proc.stdout.splitlines():
        if line.lstrip().startswith("MIG "):
            # CUDA enumerates MIG instances there, not GPUs: phase 2 stays on one.
            return []
        match = _SMI_GPU.match(line)
        if match:
            gpus.append((match.group(1), match.group(2).strip(), match.group(3) or ""))
    return gpus


def choose_gpus(
    asked: int | None, distributed: bool, devices: list[int], gpus: list[Gpu] | None = None
) -> GpuChoice:
    """The GPUs phase 2 splits over: up to ``asked`` (None: all) of the visible ones, for a
    single-process script whose phase-1 kernels all ran on its first GPU (``devices``)."""
    if asked == 1:
        return GpuChoice()
    gpus = visible_gpus() if gpus is None else gpus
    if len(gpus) < 2:
        return GpuChoice()
    if distributed:
        return GpuChoice(reason="a torchrun job: ncu profiles one rank's kernels in the job itself")
    if any(d != 0 for d in devices):
        used = ", ".join(str(d) for d in sorted(set(devices)))
        return GpuChoice(reason=f"the script ran kernels on devices {used}: it needs more than one GPU")
    models = sorted({g.name for g in gpus if g.name})
    if len(models) > 1:
        return GpuChoice(reason=f"the visible GPUs are of different models ({', '.join(models)})")
    return GpuChoice(gpus[: asked or len(gpus)])


def apart_env(lock_dir: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """``env`` assignments that give one of the concurrent ncu processes a lock of its own.

    ncu makes the kernel replays of every process on the machine take turns through one lock
    file, ``$TMPDIR/nsight-compute-lock``; processes on different GPUs need not, so each gets
    ``TMPDIR`` (``lock_dir``) of its own. The script sees that ``TMPDIR`` too: Inductor's cache,
    which lives under it unless ``TORCHINDUCTOR_CACHE_DIR`` says otherwise, stays where phase 1
    left it, so a compiled script loads the kernels phase 1 ran instead of compiling anew.
    """
    import tempfile

    env = os.environ if environ is None else environ
    assignments = [f"TMPDIR={lock_dir}"]
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        assignments.append(f"TORCHINDUCTOR_CACHE_DIR={_inductor_cache(tempfile.gettempdir())}")
    return assignments


def _inductor_cache(temp: str) -> str:
    """Inductor's default cache folder (``torch/_inductor/runtime/cache_dir_utils.py``)."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(os.path.abspath(temp), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def step_launches(timeline: Timeline, hot: HotKernels) -> StepLaunches:
    """``hot``'s kernels in the step ``select_hot_kernels`` picked them from (its first step
    with compute kernels): each one's launches and configurations, and the step's launch order."""
    from kerneltriage.analysis.timeline.attribution import attribute
    from kerneltriage.ingest.kernel_names import base_name
    from kerneltriage.ingest.tables import LAUNCH_CONFIG

    k = attribute(timeline).kernels
    k = k[(k["step"] >= 0) & (k["kind"] == "kernel")]
    k = k.assign(base=k["name"].map(base_name))
    devices = sorted(int(d) for d in k["device"].unique())
    compute = k[~k["base"].isin(hot.left_out)]
    if compute.empty:
        return StepLaunches({}, {}, [], devices)
    one_step = compute[compute["step"] == compute["step"].min()].sort_values("correlation")
    key = ["name", *LAUNCH_CONFIG]
    mine = one_step[hot.chosen(one_step)]
    launches = mine.groupby("base").size()
    configs = mine.drop_duplicates(key).groupby("base").size()
    order = [
        (b, *map(int, dims)) for b, *dims in one_step[["base", *key[1:]]].itertuples(index=False, name=None)
    ]
    return StepLaunches(
        {str(n): int(c) for n, c in launches.items()},
        {str(n): int(c) for n, c in configs.items()},
        order,
        devices,
    )


def plan_shares(
    hot: HotKernels,
    step: StepLaunches,
    gpus: list[Gpu],
    whole_run: bool,
    start_cost: float = START_COST_LAUNCHES,
    second_start: float | None = None,
    light: tuple[list[str], int] = ([], 0),
    ahead: float | None = None,
) -> list[Share]:
    """The hot kernels shared among ``gpus``: every kernel on one GPU, with its own policy.

    The every-launch kernels stay together on one GPU, the first unless another ends sooner:
    the join aligns their rows with the step's launches by position, and one process's export
    has them in launch order. The per-configuration kernels, whose rows each stand for a
    configuration, are spread over the others (and that one, when that ends sooner). A pass
    costs a process start plus its launches, and a GPU runs its passes one after the other; of
    the ways to give the per-configuration kernels to 1, 2, … GPUs (heaviest kernel first, to
    the GPU that finishes it soonest), the one that ends soonest wins, then the one with fewer
    processes. ``second_start``: what a GPU's second process costs (started beside its first
    and held before its profiled step), ``start_cost`` unless given. ``ahead``: what a first
    process costs on a GPU other than the first (the script's), where those warm up while the
    timing processes run (``turns.Turns.warm_ahead``), ``start_cost`` unless given; the
    every-launch kernels then also try the second GPU. ``light``: the memory-bound kernels
    that get a pass of their own and their configurations (``ncu_passes.light_split``): one
    process that takes every per-configuration kernel (its rows give the launch order the
    others' fill), each launch at ``LIGHT_LAUNCH``; each GPU it may go to is tried, the others'
    kernels then placed around it. GPUs left without kernels are not in the result.
    """
    every = set() if whole_run else set(hot.variable)
    variable = [n for n in hot.names if n in every]
    launches = sum(step.launches.get(n, 1) for n in variable)
    if variable and hot.variable_first_of_size:
        launches = hot.variable_launches  # the first launch of each problem size
    light_names, light_count = light
    configs = {n: step.configs.get(n, 1) for n in hot.names if n not in every and n not in light_names}
    n = len(gpus)
    second = start_cost if second_start is None else second_start
    firsts = [start_cost] + [start_cost if ahead is None else ahead] * (n - 1)
    all_configs = light_count + sum(configs.values())
    best: tuple[tuple[float, int], list[list[str]], int | None, list[int]] | None = None
    # The GPU of the every-launch pass first, then the others in order (the rest are alike).
    for lead in [0, 1] if variable and ahead is not None and n > 1 else [0]:
        perm = [lead] + [g for g in range(n) if g != lead]
        first = [firsts[g] for g in perm]
        for used in range(1, n + 1) if configs or light_names else [0]:
            # After the every-launch GPU while there are others; all of them at most.
            where = range(1, used + 1) if variable and used < n else range(used)
            # It takes every per-configuration kernel, so that its rows give the launch order.
            places: list[int | None] = sorted({*where, *([0] if variable else [])}) if light_names else [None]
            for light_on in places:
                procs = [int(bool(variable))] + [0] * (n - 1)
                cost = [first[0] + launches if variable else 0.0] + [0.0] * (n - 1)
                start = _starts(procs, first, second)
                if light_on is not None:
                    cost[light_on] += all_configs * LIGHT_LAUNCH + start(light_on)
                    procs[light_on] += 1
                on: list[list[str]] = [[] for _ in range(n)]
                _fill(configs, where, cost, on, start)
                rank = (max(cost), sum(bool(c) for c in on) + bool(variable) + bool(light_names))
                if best is None or rank < best[0]:
                    best = (rank, on, light_on, perm)
    if best is None:
        return []
    _, on_perm, light_perm, perm = best
    on = [on_perm[perm.index(g)] for g in range(n)]
    light_on = None if light_perm is None else perm[light_perm]
    shares = []
    for g, (gpu, c) in enumerate(zip(gpus, on)):
        v = variable if g == perm[0] else []
        mine = [k for k in hot.names if k in light_names or k in configs] if g == light_on else []
        if v or c or mine:
            c = sorted(c, key=hot.names.index)
            shares.append(
                Share(
                    gpu,
                    v,
                    launches if v else 0,
                    c,
                    sum(configs[x] for x in c),
                    mine,
                    all_configs if mine else 0,
                    ahead=g > 0 and ahead is not None,
                )
            )
    return shares


def _starts(procs: list[int], first: list[float], second: float) -> Callable[[int], float]:
    """What one more process costs on GPU ``i``: its first (``first``), or a GPU's second, as
    ``procs`` counts the processes each runs already."""
    return lambda i: second if procs[i] else first[i]


def _fill(
    weights: dict[str, int],
    where: range,
    cost: list[float],
    into: list[list[str]],
    start: Callable[[int], float],
) -> None:
    """Longest-first: each kernel to the GPU of ``where`` that would finish it soonest; a GPU's
    first kernel adds its process's start (``start``)."""
    for name, weight in sorted(weights.items(), key=lambda kv: -kv[1]):
        g = min(where, key=lambda i: (cost[i] + weight + (0 if into[i] else start(i)), i))
        cost[g] += weight + (0 if into[g] else start(g))
        into[g].append(name)


def merge_exports(parts: list[str], order: list[tuple]) -> str:
    """One ``--page raw`` export from several processes' exports of one policy: the header's
    columns united, the rows of each kept in its order and interleaved by where their launches
    stand in the step (``order``: launch keys in launch order), IDs numbered anew."""
    parts = [text for text in parts if text.strip()]
    if len(parts) < 2:
        return parts[0] if parts else ""  # one process's export, as it wrote it
    tables = [t for t in map(_table, parts) if t]
    header: list[str] = []
    units: dict[str, str] = {}
    for table in tables:
        for i, column in enumerate(table[0]):
            if column not in units:
                header.append(column)
                units[column] = table[1][i] if len(table) > 1 and i < len(table[1]) else ""
    places: dict[tuple, list[int]] = {}
    for p, key in enumerate(order):
        places.setdefault(key, []).append(p)
    queues = []
    for table in tables:
        columns = table[0]
        rows = [dict(zip(columns, r)) for r in table[2:] if any(c.strip() for c in r)]
        if len(table) > 1:
            _to_units(rows, dict(zip(columns, table[1])), units)
        queues.append(list(zip(_hints(rows, columns, places, len(order)), rows)))
    merged: list[dict[str, str]] = []
    heads = [0] * len(queues)
    while True:
        ready = [(q[h][0], i) for i, (q, h) in enumerate(zip(queues, heads)) if h < len(q)]
        if not ready:
            break
        _, i = min(ready)
        merged.append(queues[i][heads[i]][1])
        heads[i] += 1
    return _write(header, units, merged)


def fill_in(light: str, full: str) -> str:
    """One per-configuration export from the light pass's (every configuration, time and bytes
    only) and the full pass's (some kernels' configurations, every counter): each full row in
    place of the light row of its kernel and configuration, so that the rows keep one process's
    launch order; a full row the light pass lacks goes last. The columns are the full
    export's, the light rows' counter cells empty; IDs numbered anew."""
    light_table, full_table = _table(light), _table(full)
    if len(full_table) < 2:
        return light
    if len(light_table) < 2:
        return full
    header, units = full_table[0], dict(zip(full_table[0], full_table[1]))
    key = [c for c in ("Kernel Name", "Grid Size", "Block Size") if c in header and c in light_table[0]]
    waiting: dict[tuple, list[dict[str, str]]] = {}
    for r in full_table[2:]:
        if any(c.strip() for c in r):
            row = dict(zip(header, r))
            waiting.setdefault(tuple(row[c] for c in key), []).append(row)
    rows = [dict(zip(light_table[0], r)) for r in light_table[2:] if any(c.strip() for c in r)]
    _to_units(rows, dict(zip(light_table[0], light_table[1])), units)
    merged = []
    for row in rows:
        mine = waiting.get(tuple(row.get(c, "") for c in key))
        merged.append(mine.pop(0) if mine else row)
    merged += [row for left in waiting.values() for row in left]
    return _write(header, units, merged)


def _write(header: list[str], units: dict[str, str], rows: list[dict[str, str]]) -> str:
    """An export of ``rows`` under ``header`` and its ``units``, as ncu quotes it, IDs numbered anew."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(header)
    writer.writerow([units[c] for c in header])
    for number, row in enumerate(rows):
        if "ID" in row:
            row["ID"] = str(number)
        writer.writerow([row.get(c, "") for c in header])
    return out.getvalue()


def _to_units(rows: list[dict[str, str]], theirs: dict[str, str], units: dict[str, str]) -> None:
    """``rows``' cells in the merged export's ``units`` where their export printed another: ncu
    scales each export's columns on its own values (``Mbyte`` in one, ``Gbyte`` in another)."""
    from kerneltriage.ingest.ncu_csv import unit_scale

    for column, unit in theirs.items():
        want = units.get(column, unit)
        if unit == want:
            continue
        have_scale, want_scale = unit_scale(unit), unit_scale(want)
        if have_scale is None or want_scale is None:
            continue
        factor = have_scale / want_scale
        for row in rows:
            cell = row.get(column, "").strip().replace(",", "")
            try:
                row[column] = repr(float(cell) * factor)
            except ValueError:
                continue  # empty, "n/a": left as printed


def _table(text: str) -> list[list[str]]:
    lines = text.splitlines()
    while lines and (lines[0].startswith("==") or not lines[0].strip()):
        lines.pop(0)  # ncu's own ==PROF== / ==WARNING== lines before the CSV
    return list(csv.reader(io.StringIO("\n".join(lines))))


def _hints(
    rows: list[dict[str, str]], columns: list[str], places: dict[tuple, list[int]], length: int
) -> list[int]:
    """Where each row's launch stands in the (repeating) step: the next launch of its key after
    the row above it, as the rows a filter left are a subsequence of the launches; a row whose
    key the step lacks stays with the row above."""
    from bisect import bisect_left

    from kerneltriage.ingest.kernel_names import base_name

    name_col = next((c for c in _NAME_COLUMNS if c in columns), None)
    hints = []
    last = -1  # absolute: laps of the step times its length, plus the position in it
    for row in rows:
        key = (
            base_name(row.get(name_col, "")) if name_col else "",
            *_triple(row.get("Grid Size", "")),
            *_triple(row.get("Block Size", "")),
        )
        at = places.get(key)
        if at:
            lap, offset = divmod(last + 1, length)
            i = bisect_left(at, offset)
            last = lap * length + at[i] if i < len(at) else (lap + 1) * length + at[0]
        hints.append(last)
    return hints


def _triple(text: str) -> tuple[int, ...]:
    """``(128, 1, 1)`` as the counters' reader takes it (-1s when it says nothing)."""
    numbers = [int(x) for x in re.findall(r"\d+", text)][:3]
    return tuple(numbers + [1] * (3 - len(numbers))) if numbers else (-1, -1, -1)
