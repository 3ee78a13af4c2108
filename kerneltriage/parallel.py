"""Many ranks: each rank's trace read and reduced to its report in parallel (map/reduce).

A folder of per-rank traces or a run directory with several ranks is planned in this process
(which file is which rank, the counters, the manifest's warnings: ``load_profile(…,
read_traces=False)``), then each rank is a task: read its trace, make its report
(``pipeline.rank_report``), return the report. Only the reports come back (a few hundred kB each, whatever the trace's size), and a
worker holds one rank's tables at a time, so memory is bounded by the workers, not the ranks.

- ``workers=1``: in this process, one rank after another;
- ``workers=N`` (default: one per core, at most one per rank): N worker processes;
- ``scheduler``: a Dask distributed scheduler (``tcp://host:8786``, or ``local`` for a
  LocalCluster on this machine); each worker reads its rank's trace where it lies: a path on a
  filesystem the workers share, or a URL (``s3://``, ``gs://``, …) through fsspec.

Input named by a URL is a folder of per-rank traces. dask, distributed and fsspec are optional
(``pip install 'kerneltriage[dask]'``); they are imported only when asked for.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Report
from kerneltriage.analysis.rules import Rules
from kerneltriage.errors import InputError, ToolError
from kerneltriage.ingest import source
from kerneltriage.inputs import is_url
from kerneltriage.pipeline import collectives, communication_fixes, last_collective, rank_report, with_waits
from kerneltriage.worker_pool import completed, worker_pool

_EXTRA = "pip install 'kerneltriage[dask]'"


def default_workers(n_ranks: int) -> int:
    """One worker per core this process may run on, at most one per rank."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, n_ranks))


# --- many ranks -------------------------------------------------------------------------------


@dataclass
class RankTask:
    """One rank's work, sent to a worker: everything it needs but the trace's contents."""

    rank: int
    trace: str  # a path, or a URL
    shell: source.LoadedProfile  # the plan, without timelines; counters only for the counters rank
    rules: Rules
    gpu: str | GPUSpec | None
    step_marker: str | None
    reader_workers: int | None  # processes the trace reader may start (0: none)


def analyse_rank(task: RankTask) -> Report:
    """Worker: read one rank's trace, return its report (the tables are dropped here)."""
    from kerneltriage.ingest.kineto import read_trace

    with _local_file(task.trace) as local:
        if source._is_nsys(Path(local)):  # pragma: no cover - folders hold Kineto traces
            timeline = source.read_timeline(Path(local))
        else:
            timeline = read_trace(local, workers=task.reader_workers)
    timeline.rank = task.rank
    timeline.source = task.trace
    profile = replace(task.shell, timelines={task.rank: timeline})
    report = rank_report(profile, task.rank, rules=task.rules, gpu=task.gpu, step_marker=task.step_marker)
    # The rank's collectives come back with its report (taken off again by ``report_ranks``):
    # their wait for the other ranks is known only once every rank is read.
    report.source[_COLLECTIVES] = collectives(timeline, task.rules)
    last_collective(report, timeline, task.rules)
    return report


_COLLECTIVES = "_collectives"


def plan_ranks(
    path: str | os.PathLike[str],
    *,
    ncu: str | os.PathLike[str] | None = None,
    ranks: list[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> source.LoadedProfile:
    """What ``path`` holds, its ranks' traces unread: which file is which rank, the counters,
    the manifest. A single trace or an Nsight Systems export (one file for every rank) is read
    here, as the only way to know its ranks."""
    say = progress or (lambda _m: None)
    if is_url(path):
        return _plan_url(str(path), ncu, ranks, say)
    return source.load_profile(path, ncu=ncu, ranks=ranks, progress=say, read_traces=False)


def _only_rank(shell: source.LoadedProfile, rank: int) -> source.LoadedProfile:
    """``shell`` narrowed to one of its ranks."""
    return replace(
        shell,
        timelines={r: t for r, t in shell.timelines.items() if r == rank},
        trace_files={r: f for r, f in shell.trace_files.items() if r == rank},
    )


def report_ranks(
    path: str | os.PathLike[str],
    *,
    rules: Rules | None = None,
    ncu: str | os.PathLike[str] | None = None,
    ranks: list[int] | None = None,
    gpu: str | GPUSpec | None = None,
    step_marker: str | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Callable[[str], None] | None = None,
    one: bool = False,
) -> dict[int, Report]:
    """Every rank's report (or those of ``ranks``), each rank read and reduced by a worker:
    ``{rank: Report}`` in rank order, the same reports as ``api.load(…).reports()`` makes in
    one process. A single trace or an Nsight Systems export (one file for every rank) is read
    here. ``rules``: ready rules (``api.load_rules``), else the shipped ones. ``one``: only
    the rank a single report is of: that of ``ranks``, else the plan's ``default_rank`` (the
    only one, else the one Nsight Compute profiled); the input is planned once either way."""
    say = progress or (lambda _m: None)
    if rules is None:
        from kerneltriage.analysis.rules import load_rules

        rules = load_rules(None)
    if workers is not None and workers < 1:
        raise InputError(f"--workers must be at least 1, not {workers}")
    shell = plan_ranks(path, ncu=ncu, ranks=ranks, progress=say)
    if one:
        shell = _only_rank(shell, ranks[0] if ranks else shell.default_rank)
    from kerneltriage.analysis.compare.ranks import split_communication

    if shell.timelines:  # read already: a bare trace, or an export holding every rank
        reports = {
            r: rank_report(shell, r, rules=rules, gpu=gpu, step_marker=step_marker, progress=say)
            for r in sorted(shell.timelines)
        }
        return with_waits(reports, shell.timelines, rules)
    files = {r: str(f) for r, f in sorted(shell.trace_files.items())}
    if not files:
        raise InputError("no rank to report on (an empty list of ranks?)", path=str(path))
    counted = shell.counters_rank  # as one process would pick it
    n = len(files)
    # Without a scheduler: the worker processes, at most one per rank.
    processes = min(workers or default_workers(n), n)
    reader = _reader_workers(processes if scheduler is None else None)
    tasks = [
        RankTask(
            rank=r,
            trace=f,
            shell=replace(shell, counters=shell.counters if r == counted else None),
            rules=rules,
            gpu=gpu,
            step_marker=step_marker,
            reader_workers=reader,
        )
        for r, f in files.items()
    ]
    out: dict[int, Report] = {}
    comms: dict[int, list[Any]] = {}

    def reduce(report: Report) -> None:
        assert report.rank is not None  # the task's rank: analyse_rank sets it on the timeline
        rank = int(report.rank)
        comms[rank] = report.source.pop(_COLLECTIVES, None) or []
        out[rank] = _as_planned(report, shell, str(path), files)
        say(f"{len(out)}/{n} ranks analysed (rank {rank}: {source._name(files[rank])})")

    if scheduler is not None:
        _run_dask(tasks, scheduler, workers, reduce, say)
    elif processes == 1:
        for task in tasks:
            done = f"{len(out)}/{n} ranks analysed; " if n > 1 else ""
            say(f"{done}reading {source._name(task.trace)}")
            reduce(analyse_rank(task))
    else:
        say(f"analysing {n} ranks in {processes} processes")
        _run_processes(tasks, processes, reduce)
    if len(out) > 1:
        split_communication(out, comms)
        communication_fixes(out, rules)
    return {r: out[r] for r in sorted(out)}


def _reader_workers(workers: int | None) -> int | None:
    """Processes each rank's trace reader may start: its own default in this process; the cores
    left over when there are fewer ranks than cores; none on Dask (its workers are threads of
    a long-lived process, and the cluster already spreads the ranks)."""
    if workers is None:
        return 0
    if workers == 1:
        return None
    spare = default_workers(1 << 16) // workers
    return spare if spare >= 2 else 0


def _as_planned(report: Report, shell: source.LoadedProfile, path: str, files: dict[int, str]) -> Report:
    """A worker's report names only its own trace; give it the whole input, as one process would."""
    report.source["traces"] = {str(r): f for r, f in files.items()}
    report.source["counters"] = shell.counters.source if shell.counters else None
    if shell.run_dir is not None:
        report.source["path"] = str(shell.run_dir)
    elif is_url(path):
        report.source["path"] = path
    return report


# --- where the work runs ---------------------------------------------------------------------


def _run_processes(tasks: list[RankTask], workers: int, reduce: Callable[[Report], None]) -> None:
    # At most two tasks queued per worker: a failing rank stops the rest early.
    with worker_pool(workers) as pool:
        for report in completed(pool, analyse_rank, tasks, 2 * workers):
            reduce(report)


def _run_dask(
    tasks: list[RankTask],
    scheduler: str,
    workers: int | None,
    reduce: Callable[[Report], None],
    say: Callable[[str], None],
) -> None:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ToolError(
            f"--scheduler needs the optional packages dask and distributed, which are not installed ({_EXTRA})"
        ) from None
    cluster = None
    if scheduler == "local":
        n = workers or default_workers(len(tasks))
        say(f"starting a Dask LocalCluster of {n} workers")
        cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
        )
        address: Any = cluster
    else:
        address = scheduler
    try:
        client = Client(address, timeout="20s")
    except (OSError, TimeoutError, ValueError) as exc:
        if cluster is not None:
            cluster.close()
        raise ToolError(f"cannot reach the Dask scheduler at {scheduler} ({exc})") from None
    try:
        say(f"analysing {len(tasks)} ranks on Dask ({scheduler})")
        run = uuid.uuid4().hex[:8]
        futures = client.map(analyse_rank, tasks, key=[f"kerneltriage-rank{t.rank}-{run}" for t in tasks])
        for future in as_completed(futures):
            reduce(future.result())
            future.release()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# --- traces where they lie ------------------------------------------------------------------


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise ToolError(
            f"reading a URL needs the optional package fsspec, which is not installed ({_EXTRA})"
        ) from None
    return fsspec


def _url_to_fs(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url``: a protocol it does not know is bad input (exit 2), one
    whose package is missing (s3fs, gcsfs, …) a missing tool (exit 3)."""
    try:
        return _fsspec().core.url_to_fs(url)
    except ImportError as exc:
        raise ToolError(f"{exc}".rstrip(".") + " (pip install it to read this URL)", path=url) from None
    except ValueError as exc:
        known = "file, s3, gs, az, http, https, …"
        raise InputError(f"{exc} (a URL's protocol must be one fsspec reads: {known})", path=url) from None


@contextmanager
def _local_file(trace: str) -> Iterator[str]:
    """A local path for ``trace``: itself, or a URL's object copied to a temporary file (the
    reader seeks and re-opens by path), removed afterwards."""
    if not is_url(trace):
        yield trace
        return
    fs, inner = _url_to_fs(trace)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        yield inner
        return
    handle, tmp = tempfile.mkstemp(
        prefix="kerneltriage-", suffix=".json.gz" if trace.endswith(".gz") else ".json"
    )
    try:
        with os.fdopen(handle, "wb") as out, fs.open(inner, "rb") as src:
            shutil.copyfileobj(src, out, 8 << 20)
        yield tmp
    finally:
        Path(tmp).unlink(missing_ok=True)


def _plan_url(
    url: str, ncu: Any, ranks: list[int] | None, say: Callable[[str], None]
) -> source.LoadedProfile:
    """A folder of per-rank traces named by a URL: which object is which rank."""
    fsspec = _fsspec()
    fs, root = _url_to_fs(url)
    if not fs.isdir(root):
        raise InputError("a URL must name a folder of per-rank traces", path=url)
    say(f"listing {url}")
    entries = fs.ls(root, detail=True)
    names = {source._name(e["name"]) for e in entries}
    if source.rundir.MANIFEST in names:
        raise InputError(
            "a run directory is read from a filesystem path (a copy or a mount); "
            "URLs name folders of per-rank traces",
            path=url,
        )
    base = url.rstrip("/")
    files = sorted(
        f"{base}/{source._name(e['name'])}"
        for e in entries
        if e.get("type") == "file" and source._is_trace_name(source._name(e["name"]))
    )
    traces, warnings = source.assign_ranks(files, lambda f: source._peek_rank(f, fsspec.open), url)
    wanted = sorted(traces) if ranks is None else list(ranks)
    source._check_ranks(wanted, list(traces), url, "the folder")  # type: ignore[arg-type]
    counters = None
    if ncu:
        from kerneltriage.ingest.ncu_csv import read_counters

        counters = read_counters(ncu)
    shell = source.LoadedProfile({}, counters, None, None, warnings=warnings)
    shell.trace_files = {r: traces[r] for r in wanted}
    return shell
