"""Turns on the GPU (``gate.py``, ``turns.py``): a process started with others waits at its first
CUDA use until its gate opens; the parent gives the GPU to one process at a time, a timed one
only once the later ones are all waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kerneltriage.profile import gate as gates
from kerneltriage.profile.processes import Child, child_env
from kerneltriage.profile.turns import Turn, Turns


def fake_torch(calls: list[str]):
    def lazy_init():
        calls.append("init")

    random = SimpleNamespace(_lazy_init=lazy_init)
    cuda = SimpleNamespace(_lazy_init=lazy_init, is_initialized=lambda: "init" in calls, random=random)
    return SimpleNamespace(cuda=cuda), lazy_init


def test_the_first_cuda_use_waits_for_the_gate(tmp_path):
    calls: list[str] = []
    torch, original = fake_torch(calls)
    gate = tmp_path / "gate.timing1"
    seen: list[str] = []
    gates.hold_at_first_cuda_use(torch, gate, 0, on_wait=seen.append)
    first = threading.Thread(target=torch.cuda._lazy_init)
    first.start()
    deadline = time.monotonic() + 10
    while not gates.at_gate(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert gates.at_gate(gate) and calls == [] and first.is_alive() and seen == ["at_gate"]
    gates.open_gate(gate)
    first.join(timeout=10)
    assert calls == ["init"] and seen == ["at_gate", "gate_open"]
    # Held once: later uses go straight to torch's own function, also through torch.cuda.random.
    assert torch.cuda._lazy_init is original and torch.cuda.random._lazy_init is original


def test_a_held_process_whose_parent_is_gone_stops(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    start = time.monotonic()
    with pytest.raises(SystemExit):
        gates.wait_for_gate(tmp_path / "gate.x", gone.pid)
    assert time.monotonic() - start < 10


def test_the_runner_holds_the_script_at_its_first_cuda_use(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import time, torch
            open("before", "w").write(str(time.time()))
            try:
                torch.cuda._lazy_init()  # what moving a model to the GPU calls first
            except Exception:
                pass  # a CPU-only torch
            open("after", "w").write(str(time.time()))
            """
        )
    )
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    gate = out / "logs" / "gate.timing1"
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "mode": "timing",
                "out": str(out),
                "warmup": 0,
                "steps": 1,
                "cpu": True,
                "timing_steps": 1,
                "status_name": "timing1",
                "gate": str(gate),
                "parent_pid": __import__("os").getpid(),
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerneltriage.profile.runner", str(script)],
        env=child_env(config),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while not gates.at_gate(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    assert gates.at_gate(gate) and (tmp_path / "before").exists() and not (tmp_path / "after").exists()
    opened = time.time()
    gates.open_gate(gate)
    assert proc.wait(timeout=60) == 0
    assert float((tmp_path / "after").read_text()) >= opened
    status = json.loads((out / "logs" / "status.timing1.rank0.json").read_text())
    assert status["wall"]["gate_open"] - status["wall"]["at_gate"] >= 0.5
    # Its peak host memory: what another process of the script will hold at its gate.
    assert status["max_rss_mb"] > 10


CHILD = """
import json, os, sys, time
from kerneltriage.profile.gate import wait_for_gate
conf = json.load(open(os.environ["KERNELTRIAGE_PROFILE"]))
log = open(conf["log"], "a")
time.sleep(conf["start_s"])  # the host's start-up: imports, the model built
log.write(f"ready {conf['name']} {time.time()}\\n"); log.flush()
wait_for_gate(conf["gate"], conf["parent_pid"])
log.write(f"gpu {conf['name']} {time.time()}\\n"); log.flush()
if conf.get("measure"):  # its first step and warm-up, then the step it is there for
    time.sleep(conf["warmup_s"])
    log.write(f"warm {conf['name']} {time.time()}\\n"); log.flush()
    wait_for_gate(conf["measure"], conf["parent_pid"])
    log.write(f"measured {conf['name']} {time.time()}\\n"); log.flush()
time.sleep(0.3)  # its steps on the GPU
log.write(f"done {conf['name']} {time.time()}\\n"); log.flush()
time.sleep(conf.get("linger_s", 0))  # after its GPU work: ncu writing its report, the exit
log.write(f"exit {conf['name']} {time.time()}\\n"); log.flush()
sys.exit(conf.get("exit", 0))
"""


def _turns(
    tmp_path: Path,
    starts: list[float],
    *,
    quiet: bool,
    exits: list[int] | None = None,
    first: int = 0,
    linger_s: float = 0.0,
    warmups: list[float] | None = None,
    together: int = 2,
) -> Turns:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    turns = []
    for i, start_s in enumerate(starts, start=first):
        gate = tmp_path / f"gate.{i}"
        measure = tmp_path / f"measure.{i}" if warmups is not None else None
        config = tmp_path / f"config.{i}.json"
        config.write_text(
            json.dumps(
                {
                    "name": i,
                    "start_s": start_s,
                    "gate": str(gate),
                    "parent_pid": __import__("os").getpid(),
                    "log": str(tmp_path / "events.txt"),
                    "exit": (exits or [0] * len(starts))[i - first],
                    "linger_s": linger_s,
                    "measure": str(measure) if measure else None,
                    "warmup_s": warmups[i - first] if warmups is not None else 0.0,
                }
            )
        )
        child = Child(
            [sys.executable, str(script)], config, tmp_path / f"child{i}", lambda line, stream: None
        )
        turns.append(Turn(child, gate, measure))
    return Turns(turns, quiet=quiet, together=together)


def _done_of(tmp_path: Path):
    """``done(i)``: whether turn ``i`` has ended its GPU work (its "done" event is logged)."""

    def done(i: int):
        def gpu_done() -> bool:
            events = tmp_path / "events.txt"
            return events.is_file() and f"done {i} " in events.read_text()

        return gpu_done

    return done


def _events(tmp_path: Path) -> dict[tuple[str, int], float]:
    lines = (tmp_path / "events.txt").read_text().split("\n")
    return {(w, int(n)): float(t) for w, n, t in (line.split() for line in lines if line)}


def test_timed_turns_share_no_start_up_and_run_in_order(tmp_path):
    # The second and third start slower than the first: the first waits for both to be ready.
    start = time.monotonic()
    batch = _turns(tmp_path, [0.0, 1.0, 1.5], quiet=True)
    try:
        results = [batch.next() for _ in range(3)]
    finally:
        batch.close()
    wall = time.monotonic() - start
    e = _events(tmp_path)
    assert e[("gpu", 0)] >= e[("ready", 2)] and e[("gpu", 0)] >= e[("ready", 1)]
    assert e[("gpu", 1)] >= e[("done", 0)] and e[("gpu", 2)] >= e[("done", 1)]
    assert [code for _, code, _ in results] == [0, 0, 0]
    # The start-ups overlapped: the whole took about the slowest start plus three turns, not
    # every start one after the other (0 + 1 + 1.5 s more).
    assert wall < 1.5 + 3 * 0.3 + 2.0
    assert sum(seconds for seconds, _, _ in results) == pytest.approx(wall, abs=1.0)


def test_a_failed_turn_can_stop_the_ones_after_it(tmp_path):
    batch = _turns(tmp_path, [0.0, 0.0, 0.0], quiet=False, exits=[1, 0, 0])
    try:
        _, code, _ = batch.next()
        assert code == 1
        batch.cancel()
    finally:
        batch.close()
    e = _events(tmp_path)
    assert ("gpu", 1) not in e and ("gpu", 2) not in e
    assert all(t.child.exited() for t in batch.turns)


def test_timed_turns_wait_for_the_next_phase_started_meanwhile(tmp_path):
    # The timing processes (0, 1), then phase 2's processes (2, 3) started while they start up:
    # no timed turn opens before the later batch is at its gates too, and the later batch's
    # turns count their seconds from when it is resumed, not from its start.
    timing = _turns(tmp_path, [0.0, 0.0], quiet=True)
    later = _turns(tmp_path, [1.0, 1.2], quiet=False, first=2)
    try:
        timing.also_wait_for(later.turns)
        for _ in range(2):
            timing.next()
        time.sleep(0.5)  # the parent's work between the phases
        later.resume()
        seconds = [later.next()[0] for _ in range(2)]
    finally:
        timing.close()
        later.close()
    e = _events(tmp_path)
    assert e[("gpu", 0)] >= max(e[("ready", 2)], e[("ready", 3)])
    assert e[("gpu", 2)] >= e[("done", 1)] and e[("gpu", 3)] >= e[("done", 2)]
    # Each later turn took its 0.3 s on the GPU and the gate's poll, not the wait before.
    assert all(s < 0.3 + 1.0 for s in seconds)


def test_a_timed_turn_warms_up_during_the_others_start_ups_and_measures_once_they_wait(tmp_path):
    # Timing processes with measure gates: the pair warms up while phase 2's processes are
    # still starting up (a warm-up is not timed); no timed step runs before they all wait.
    timing = _turns(tmp_path, [0.0, 0.0], quiet=True, warmups=[0.1, 0.1])
    later = _turns(tmp_path, [1.5, 1.5], quiet=False, first=2)
    done = _done_of(tmp_path)
    try:
        timing.also_wait_for(later.turns)
        for i in range(2):
            timing.next(done(i))
    finally:
        timing.close()
        later.close()
    e = _events(tmp_path)
    assert e[("gpu", 0)] < e[("ready", 2)] and e[("gpu", 1)] < e[("ready", 2)]  # warmed up meanwhile
    assert e[("measured", 0)] >= max(e[("ready", 2)], e[("ready", 3)])
    assert e[("measured", 1)] >= e[("done", 0)]


def test_a_batch_warmed_up_ahead_holds_the_timed_steps_then_measures_at_once(tmp_path):
    # Phase 2's passes on another GPU: warmed up ahead while the timing processes start, held at
    # their measure gates. A timed step waits until they are there; their turns then measure
    # without a warm-up, one at a time.
    timing = _turns(tmp_path, [0.0, 0.0], quiet=True, warmups=[0.1, 0.1])
    ahead = _turns(tmp_path, [0.3, 0.3], quiet=False, first=2, warmups=[1.0, 0.6], linger_s=0.3)
    done = _done_of(tmp_path)
    try:
        assert ahead.warm_ahead() == 2
        timing.also_wait_for(ahead.turns)
        for i in range(2):
            timing.next(done(i))
        ahead.resume()
        seconds = [ahead.next(done(i))[0] for i in (2, 3)]
    finally:
        timing.close()
        ahead.close()
    e = _events(tmp_path)
    assert e[("gpu", 2)] < e[("measured", 0)] and e[("gpu", 3)] < e[("measured", 0)]
    assert e[("measured", 0)] >= max(e[("warm", 2)], e[("warm", 3)])  # no warm-up beside a timed step
    assert e[("measured", 2)] >= e[("done", 1)]  # its turn comes after the timed ones
    assert e[("done", 2)] <= e[("measured", 3)] < e[("exit", 2)]
    assert seconds[0] < 1.0  # 0.3 s of GPU work and its exit; its 1 s warm-up was off the path


@pytest.mark.parametrize("overlap", [True, False])
def test_the_next_turn_opens_once_the_gpu_work_is_done_where_asked(tmp_path, overlap):
    # An ncu pass's process writes its report after its profiled step (1.1-2.0 s on an H100):
    # where two processes fit on the GPU, the next pass's first steps run meanwhile.
    batch = _turns(tmp_path, [0.0, 0.0], quiet=False, linger_s=1.0)

    def gpu_done() -> bool:
        events = tmp_path / "events.txt"
        return events.is_file() and "done 0 " in events.read_text()

    try:
        results = [batch.next(gpu_done if overlap else None), batch.next()]
    finally:
        batch.close()
    e = _events(tmp_path)
    assert [code for _, code, _ in results] == [0, 0]
    assert e[("gpu", 1)] >= e[("done", 0)]
    if overlap:
        assert e[("gpu", 1)] < e[("exit", 0)]
    else:
        assert e[("gpu", 1)] >= e[("exit", 0)]


def test_turns_with_measure_gates_warm_up_in_pairs_and_measure_in_turn(tmp_path):
    # ncu passes: each process holds before its profiled step. Where the caller says when a
    # turn's GPU work is done, the next one starts with it; the first measures only once the
    # second waits at its measure gate (the second warms up slower), the second once the
    # first's GPU work is done, before its exit. The third starts at the second's end of work.
    batch = _turns(tmp_path, [0.0, 0.0, 0.0], quiet=False, linger_s=0.8, warmups=[0.1, 0.6, 0.1])

    done = _done_of(tmp_path)
    try:
        results = [batch.next(done(i)) for i in range(3)]
    finally:
        batch.close()
    e = _events(tmp_path)
    assert [code for _, code, _ in results] == [0, 0, 0]
    assert e[("gpu", 1)] < e[("warm", 0)]  # started together
    assert e[("measured", 0)] >= e[("warm", 1)]  # nothing warms up while one is measured
    assert e[("done", 0)] <= e[("measured", 1)] < e[("exit", 0)]
    assert e[("done", 1)] <= e[("gpu", 2)] < e[("exit", 1)]
    assert e[("measured", 2)] >= e[("warm", 2)]
    assert not any(Path(str(t.measure) + gates.OPEN).exists() for t in batch.turns)  # cleared


def test_three_turns_that_fit_warm_up_at_once_and_measure_in_turn(tmp_path):
    # Three ncu passes (every launch, per configuration, the memory-bound kernels'), where three
    # processes fit on the GPU: all three warm up with the first, each measures once the one
    # before it has done its GPU work, and none warms up while another is measured.
    batch = _turns(tmp_path, [0.0, 0.0, 0.0], quiet=False, linger_s=0.8, warmups=[0.1, 0.6, 0.4], together=3)

    done = _done_of(tmp_path)
    try:
        results = [batch.next(done(i)) for i in range(3)]
    finally:
        batch.close()
    e = _events(tmp_path)
    assert [code for _, code, _ in results] == [0, 0, 0]
    assert e[("gpu", 1)] < e[("warm", 0)] and e[("gpu", 2)] < e[("warm", 0)]  # started together
    assert e[("measured", 0)] >= max(e[("warm", 1)], e[("warm", 2)])
    assert e[("done", 0)] <= e[("measured", 1)] < e[("exit", 0)]
    assert e[("done", 1)] <= e[("measured", 2)] < e[("exit", 1)]
    assert e[("warm", 2)] < e[("done", 0)]  # its warm-up was off the path


def test_turns_with_measure_gates_run_one_after_the_other_where_not_asked(tmp_path):
    batch = _turns(tmp_path, [0.0, 0.0], quiet=False, linger_s=0.3, warmups=[0.1, 0.1])
    try:
        results = [batch.next(), batch.next()]
    finally:
        batch.close()
    e = _events(tmp_path)
    assert [code for _, code, _ in results] == [0, 0]
    assert e[("gpu", 1)] >= e[("exit", 0)]


def test_a_measured_turn_opens_when_the_next_one_exits_during_its_warm_up(tmp_path):
    batch = _turns(tmp_path, [0.0, 0.0], quiet=False, exits=[0, 1], warmups=[0.1, 0.1])
    # The second process never reaches its measure gate: it ends before (a script that stops
    # before its profiled step).
    config = json.loads((tmp_path / "config.1.json").read_text())
    config["measure"] = None
    (tmp_path / "config.1.json").write_text(json.dumps(config))
    try:
        start = time.monotonic()
        _, code, _ = batch.next(lambda: False)
        assert code == 0 and time.monotonic() - start < 10
        _, code, _ = batch.next()
        assert code == 1
    finally:
        batch.close()
    e = _events(tmp_path)
    assert e[("measured", 0)] >= e[("exit", 1)]
