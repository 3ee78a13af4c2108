"""``profile --timing-processes``: the step time and its interval over several processes of the
script (processes of one script differ by more than the steps of one process do)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from kerneltriage import api, rundir
from kerneltriage.profile import hooks, phase_timeline
from kerneltriage.profile.command import parse_command
from kerneltriage.profile.context import Options, ProfileSession
from kerneltriage.profile.phase_timeline import TimelineRuns, time_more_processes

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "runs" / "hf-llama-h100"


def with_processes(tmp_path: Path, series: list[list[float]]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(LLAMA, run)
    manifest = json.loads((run / rundir.MANIFEST).read_text())
    manifest["phases"]["timeline"]["step_time"]["processes_plain_ms"] = series
    (run / rundir.MANIFEST).write_text(json.dumps(manifest))
    return run


def test_the_report_spans_the_timing_processes(tmp_path):
    one = api.report(LLAMA)
    plain = json.loads((LLAMA / rundir.MANIFEST).read_text())["phases"]["timeline"]["step_time"]["plain_ms"]
    slower = [t * 1.06 for t in plain]
    faster = [t * 0.97 for t in plain]
    three = api.report(with_processes(tmp_path, [plain, slower, faster]))
    # The mean of the three processes' medians, and an interval wider than one process's.
    assert three.step_time_ms == pytest.approx(one.step_time_ms * (1 + 1.06 + 0.97) / 3, rel=1e-3)
    assert three.step_interval_ms[0] <= three.step_time_ms <= three.step_interval_ms[1]
    assert three.source["timing"]["processes"] == 3 and one.source["timing"]["processes"] == 1
    from kerneltriage.render.text import step_time_text

    assert "(95%, from 3 processes)" in step_time_text(three) and "processes" not in step_time_text(one)
    assert "a run falls in" in step_time_text(three) and "95% interval" in step_time_text(one)


def test_a_timing_process_far_from_the_others_is_left_out_and_said(tmp_path):
    # ConvNeXt-T on an H100: two processes at their floor, one through a slow stretch (ms).
    first = [32.24, 35.89, 35.42, 36.65, 34.22, 32.63] + [28.71] * 14
    second = [28.86, 28.82, 28.80, 28.80, 28.93, 28.93, 28.95, 72.04, 46.64, 34.44] + [28.92] * 10
    third = [31.70, 35.69, 33.63, 32.37, 33.19, 30.85, 50.32, 78.53, 35.22, 31.37]
    third += [33.29, 33.41, 32.55, 32.23, 31.85, 33.15, 32.26, 33.09, 33.64, 34.51]
    report = api.report(with_processes(tmp_path, [first, second, third]))
    assert report.step_time_ms == pytest.approx((28.71 + 28.92) / 2, abs=0.02)
    assert report.step_interval_ms[0] <= 28.75 <= report.step_interval_ms[1]
    said = [w for w in report.warnings if "left out of the step time" in w]
    assert len(said) == 1 and "(process 3)" in said[0]


def test_a_timing_process_runs_the_plain_steps_and_stops():
    class Event:
        def __init__(self, t):
            self.t = t

        def query(self):
            return True

        def elapsed_time(self, other):
            return other.t - self.t

    s = hooks.ProfiledProcess(
        {"mode": "timing", "out": "/nonexistent", "warmup": 2, "steps": 3, "timing_steps": 5}
    )
    s.config["plain_max"] = 5
    marks = iter(range(0, 1000, 10))
    s._mark = lambda step: s.clock.marks.__setitem__(step, Event(next(marks)))  # type: ignore[method-assign]
    s._finish_and_stop = lambda: (_ for _ in ()).throw(hooks.StepsDone())  # type: ignore[method-assign]
    with pytest.raises(hooks.StepsDone):
        for _ in range(20):
            s._step_ended()
    assert s.steps_seen == 2 + 5  # without a GPU: the warm-up and the plain steps, then it stops
    assert s.host_issue_ms == []


def _gpu_torch(calls: list[str]):
    """What a timing process calls of torch on a GPU, each call noted in ``calls``."""

    class Cuda:
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def synchronize():
            calls.append("sync")

        @staticmethod
        def empty_cache():
            calls.append("empty_cache")

    class Torch:
        cuda = Cuda

    return Torch


def test_a_timing_process_on_a_gpu_then_times_the_host_issuing_steps_from_an_idle_gpu(monkeypatch):
    calls: list[str] = []
    Torch = _gpu_torch(calls)
    s = hooks.ProfiledProcess(
        {"mode": "timing", "out": "/nonexistent", "warmup": 2, "steps": 3, "timing_steps": 5}
    )
    s.torch = Torch
    s.config["plain_max"] = 5
    s._mark = lambda step: calls.append(f"mark {step}")  # type: ignore[method-assign]
    s._finish_and_stop = lambda: (_ for _ in ()).throw(hooks.StepsDone())  # type: ignore[method-assign]
    s._extend_plain = lambda: False  # type: ignore[method-assign]
    clock = iter([10.0, 10.025, 11.0, 11.031, 12.0, 12.028])
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: next(clock))
    with pytest.raises(hooks.StepsDone):
        for _ in range(20):
            s._step_ended()
    # The plain steps are stamped as before; then each host step starts from a synchronize.
    assert calls[:7] == [f"mark {i}" for i in range(1, 8)]
    assert calls[7:] == ["sync"] * hooks.HOST_STEPS
    assert s.steps_seen == 2 + 5 + hooks.HOST_STEPS
    assert s.host_issue_ms == pytest.approx([25.0, 31.0, 28.0])


def test_profile_runs_the_extra_processes_and_records_their_steps(tmp_path, monkeypatch):
    out = tmp_path / "run"
    (out / rundir.LOGS).mkdir(parents=True)
    manifest = rundir.Manifest(command=["python", "train.py"])
    manifest.phases.timeline = rundir.TimelinePhase(
        seconds=10.0, step_time=rundir.StepTime(plain_ms=[50.0, 50.2], plain_median_ms=50.1)
    )
    medians: list[float] = []
    sizes: list[int] = []  # each batch's processes, started together
    waited: list = []  # the other phase's turns each batch waits for

    def fake_run(cmd, config, log, **kw):
        settings = json.loads(Path(config).read_text())
        assert settings["mode"] == "timing"
        # Every process runs in a batch's turns (its gate opened by the batch), the extra ones
        # too.
        assert "gate" in settings and kw.get("batch") is True
        m = medians.pop(0)
        status = {
            "rank": 0,
            "status": "ok",
            "step_times": {"plain_ms": [m, m + 0.1]},
            "host_issue_ms": [m / 2, m / 2 + 1],
        }
        (out / rundir.LOGS / f"status.{settings['status_name']}.rank0.json").write_text(json.dumps(status))
        return 3.0, 0, []

    class FakeTurns:
        """The asked processes, started together: each turn runs as fake_run would."""

        def __init__(self, turns, quiet):
            assert quiet  # timed processes: no start-up may overlap their steps
            self.turns = turns
            # Each with a config, status file and gate of its own.
            assert len({t.gate for t in turns}) == len({t.child.config for t in turns}) == len(turns)
            sizes.append(len(turns))

        index = 0

        def __len__(self):
            return self.index + len(self.turns)

        def next(self, gpu_done=None):
            self.index += 1
            return fake_run(None, self.turns.pop(0).child.config, None, batch=True)

        def pairs_with_next(self):
            return False  # no measure gates: two_processes_fit is False without a GPU peak

        def also_wait_for(self, others):
            waited.append(others)

        def close(self):
            pass

    monkeypatch.setattr(phase_timeline, "Turns", FakeTurns)

    runs = TimelineRuns(10.0, 0, [], [], [], 20)
    (tmp_path / "train.py").write_text("pass\n")
    command = parse_command([sys.executable, str(tmp_path / "train.py")])

    def session_with(options: Options) -> ProfileSession:
        session = ProfileSession(command, options, out, manifest)
        monkeypatch.setattr(session, "run", fake_run)
        return session

    def timed(options: Options, given: list[float]) -> list[list[float]]:
        medians[:] = given
        manifest.phases.timeline.step_time.processes_plain_ms = []
        manifest.phases.timeline.seconds = 10.0
        session = session_with(options)
        time_more_processes(session, runs, whole_run=False)
        assert not session.warnings
        return manifest.phases.timeline.step_time.processes_plain_ms

    # Three processes that agree (within ±3% for a further run): none more. The two a further
    # batch would start came with the asked ones and stay at their gates, unused.
    sizes.clear()
    agree = timed(Options(timing_processes=3), [50.12, 50.08, 99.0])
    assert agree == [[50.0, 50.2], [50.12, 50.22], [50.08, 50.18]] and medians == [99.0]
    assert sizes == [4]
    # Each timing process's steps issued from an idle GPU, gathered for the report.
    assert manifest.phases.timeline.step_time.host_issue_ms == [25.06, 26.06, 25.04, 26.04]
    assert manifest.phases.timeline.seconds == 16.0
    # Three 3.6% apart (a Qwen2-class LM on a shared H100: 89.0, 89.2, 92.2 ms): more, up to
    # measurement.yaml's six, which can bring a further run's interval near the target.
    sizes.clear()
    apart = timed(Options(timing_processes=3), [50.11, 51.8, 50.5, 50.0, 50.2, 99.0])
    assert [p[0] for p in apart] == [50.0, 50.11, 51.8, 50.5, 50.0, 50.2] and medians == [99.0]
    # The asked two with the first two extra ones (their start-ups overlap), then the last
    # extra one, up to six.
    assert sizes == [4, 1]
    # Two that agree and one far slower (left out of the step time): the slow one shows how far
    # a run may fall, so more are timed.
    slow = timed(Options(timing_processes=3), [50.12, 58.0, 50.05, 50.1, 50.08, 99.0])
    assert len(slow) == 6 and medians == [99.0]
    # Three 6% apart: even six of that spread would leave a further run ±8.5% of the step, so
    # no more are timed (a minute saved), and the warning says why.
    medians[:] = [52.0, 49.0, 50.5, 99.0]
    manifest.phases.timeline.step_time.processes_plain_ms = []
    session = session_with(Options(timing_processes=3))
    time_more_processes(session, runs, whole_run=False)
    assert len(manifest.phases.timeline.step_time.processes_plain_ms) == 3 and medians == [50.5, 99.0]
    (said,) = session.warnings
    assert "even at 6 processes" in said and "±8." in said and "differ from process to process" in said
    # --max-timing-processes equal to --timing-processes: exactly that many, none spare.
    sizes.clear()
    exact = timed(Options(timing_processes=3, max_timing_processes=3), [52.0, 49.0, 99.0])
    assert len(exact) == 3 and medians == [99.0] and sizes == [2]
    # A CPU dry run and --timing-processes 1 run none.
    for skip in (Options(timing_processes=3, cpu=True), Options(timing_processes=1)):
        assert timed(skip, [99.0]) == []
    # Phase 2's processes, started once the timing processes have started: their timed steps
    # wait for those at their gates too.
    waited.clear()
    medians[:] = [50.12, 50.08]
    time_more_processes(
        session_with(Options(timing_processes=3)), runs, whole_run=False, start_next=lambda: ["ncu"]
    )
    assert waited == [["ncu"]]


def test_processes_that_disagree_widen_the_interval_and_are_said(tmp_path):
    plain = json.loads((LLAMA / rundir.MANIFEST).read_text())["phases"]["timeline"]["step_time"]["plain_ms"]
    # A Qwen2-class LM's three processes on a shared H100: 89.0, 89.2, 92.2 ms (3.6% apart).
    series = [[t * k for t in plain] for k in (1.0, 1.002, 1.036)]
    report = api.report(with_processes(tmp_path, series))
    from kerneltriage.analysis.timeline import steady

    low, high = report.step_interval_ms
    levels = [steady.steady(s).median for s in series]
    # Wider than the processes' own spread: a further run may fall beyond the three.
    assert high - low > 2 * (max(levels) - min(levels))
    assert low < min(levels) and high > max(levels)
    said = [w for w in report.warnings if "a run of it falls anywhere in" in w]
    assert len(said) == 1 and "not a finding" in said[0]
    # Processes that agree: nothing said.
    same = api.report(with_processes(tmp_path / "same", [plain, plain, [t * 1.001 for t in plain]]))
    assert not [w for w in same.warnings if "a run of it falls anywhere in" in w]


def test_fewer_most_than_least_timing_processes_is_a_usage_error(tmp_path):
    from click.testing import CliRunner

    from kerneltriage.cli import main

    (tmp_path / "train.py").write_text("pass\n")
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--timing-processes",
            "3",
            "--max-timing-processes",
            "2",
            "--out",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            str(tmp_path / "train.py"),
        ],
    )
    assert (
        result.exit_code == 2
        and "--max-timing-processes 2 is fewer than --timing-processes 3" in result.output
    )
    assert not (tmp_path / "run").exists()


def test_spare_timing_processes_start_with_the_asked_ones_where_the_host_has_room(tmp_path, monkeypatch):
    # The first two processes a wide interval would add start with the asked ones, held at their
    # gates: an extra process then costs its steps, not its start-up. Each holds a model built
    # on the host, so they come only where they fit beside the asked ones and phase 2's two.
    from kerneltriage.profile import context

    out = tmp_path / "run"
    (out / rundir.LOGS).mkdir(parents=True)
    status = {"rank": 0, "status": "ok", "max_rss_mb": 10 * 1024.0}  # phase 1's peak: 10 GiB
    (out / rundir.LOGS / "status.timeline.rank0.json").write_text(json.dumps(status))
    (tmp_path / "train.py").write_text("pass\n")
    command = parse_command([sys.executable, str(tmp_path / "train.py")])
    manifest = rundir.Manifest(command=["python", "train.py"])

    def spare(available_gib: float, **options) -> int:
        monkeypatch.setattr(context, "available_mb", lambda: available_gib * 1024.0)
        return phase_timeline.spare_processes(ProfileSession(command, Options(**options), out, manifest))

    assert spare(100) == 2  # 2 asked + 2 spare + 2 ncu = 60 GiB <= 80 GiB
    assert spare(70) == 0  # 60 GiB > 56 GiB: the asked ones only
    assert spare(100, max_timing_processes=4) == 1 and spare(100, max_timing_processes=3) == 0
    assert spare(100, timing_processes=1) == 0 and spare(100, cpu=True) == 0


def test_a_timing_process_beside_another_waits_before_its_plain_steps(tmp_path):
    # Started with another timing process: before its last warm-up step it finishes its queued
    # work and waits at its measure gate (its cached blocks kept, as the script alone keeps
    # them); that step runs after the wait, untimed, and the plain steps follow.
    import os
    import threading
    import time

    from kerneltriage.profile import gate as gates

    calls: list[str] = []
    Torch = _gpu_torch(calls)
    measure = tmp_path / "measure.timing1"
    s = hooks.ProfiledProcess(
        {
            "mode": "timing",
            "out": str(tmp_path),
            "warmup": 3,
            "steps": 3,
            "timing_steps": 5,
            "measure_gate": str(measure),
            "parent_pid": os.getpid(),
        }
    )
    s.torch = Torch
    s.config["plain_max"] = 5
    s._mark = lambda step: calls.append(f"mark {step}")  # type: ignore[method-assign]
    s._finish_and_stop = lambda: (_ for _ in ()).throw(hooks.StepsDone())  # type: ignore[method-assign]
    s._extend_plain = lambda: False  # type: ignore[method-assign]

    def steps():
        with pytest.raises(hooks.StepsDone):
            for _ in range(20):
                s._step_ended()

    worker = threading.Thread(target=steps)
    worker.start()
    deadline = time.monotonic() + 30
    while not gates.at_gate(measure) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    assert calls == ["mark 1", "sync"]  # held at the end of the second of three warm-up steps
    gates.open_gate(measure)
    worker.join(timeout=30)
    assert not worker.is_alive()
    # The third warm-up step ends after the wait; plain steps 4-8 are stamped from its end.
    assert calls[:9] == ["mark 1", "sync", *(f"mark {i}" for i in range(2, 9))]
    assert s.plan.warmup == 3 and s.plan.plain_count == 5
    assert "empty_cache" not in calls
    assert s.wall["at_measure"] <= s.wall["measure_open"]


def test_timing_processes_start_in_pairs_where_two_fit_on_the_gpu(tmp_path, monkeypatch):
    from kerneltriage.profile import pairs

    out = tmp_path / "run"
    (out / rundir.LOGS).mkdir(parents=True)
    manifest = rundir.Manifest(command=["python", "train.py"])
    (tmp_path / "train.py").write_text("pass\n")
    command = parse_command([sys.executable, str(tmp_path / "train.py")])
    session = ProfileSession(command, Options(timing_processes=3), out, manifest)
    for fit in (True, False):
        monkeypatch.setattr(pairs, "two_processes_fit", lambda session, fit=fit: fit)
        config = json.loads(
            session.write_config(
                "timing", whole_run=False, name="timing1", measure_gate=pairs.measure_gates(session, 2)
            ).read_text()
        )
        assert ("measure_gate" in config) is fit
    # No warm-up steps: nothing to overlap, no measure gate.
    monkeypatch.setattr(pairs, "two_processes_fit", lambda session: True)
    session.options.warmup = 0
    assert not pairs.measure_gates(session, 2)
