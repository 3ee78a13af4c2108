"""``verify --start-together`` (``verify/together.py``) on CPU: a round's runs start at once, each
held by the harness at its first CUDA use, and take the GPU in the round's order, no timed
step beside another run's start-up. The script calls ``torch.cuda._lazy_init`` itself (a CPU
build then raises, which it ignores), so the gate holds it as the first CUDA use of a model on a
GPU would."""

from __future__ import annotations

import sys
from pathlib import Path

from kerneltriage import rundir
from kerneltriage.verify import together
from kerneltriage.verify.plan import Plan, Settings
from kerneltriage.verify.trials import run_verify
from tests.verify.test_trials import planned, run_dir

SCRIPT = """
import atexit, os, sys, time, torch
from torch import nn
label = os.path.basename(os.environ["KERNELTRIAGE_VERIFY"]).split(".")[0]
log = open(os.environ["KT_TEST_EVENTS"], "a")
def note(what):
    log.write(f"{what} {label} {time.time()}\\n"); log.flush()
time.sleep(1.0 if label == "C1" else 0.0)  # a slower start-up: the others wait for it
note("ready")
try:
    torch.cuda._lazy_init()  # the first CUDA use: a run started with others waits here
except Exception:
    pass  # a CPU build has no CUDA
note("gpu")
atexit.register(note, "exit")
model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for step in range(50):
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


def _events(path: Path) -> dict[tuple[str, str], float]:
    rows = (line.split() for line in path.read_text().splitlines() if line)
    return {(what, label): float(t) for what, label, t in rows}


def _verify(tmp_path: Path, monkeypatch, apart: str | None):
    run = run_dir(tmp_path, SCRIPT)
    events = tmp_path / "events.txt"
    monkeypatch.setenv("KT_TEST_EVENTS", str(events))
    # The run was profiled on a GPU; here none is visible, which would keep the runs apart.
    monkeypatch.setattr(together, "why_apart", lambda *args: apart)
    settings = Settings(repeats=1, warmup=2, steps=3, loss_steps=2, max_repeats=1, together=True)
    plan = Plan(
        str(run),
        [sys.executable, "train.py"],
        settings,
        [
            planned("C1", {"kind": "norm-swap", "classes": ["LayerNorm"]}),
            planned("C2", command=[sys.executable, str(tmp_path / "train.py")]),
        ],
        run_seconds=None,
    )
    data = run_verify(plan, rundir.read_manifest(run))
    return data, _events(events)


def test_a_rounds_runs_start_together_and_take_the_gpu_in_turn(tmp_path, monkeypatch):
    data, e = _verify(tmp_path, monkeypatch, None)
    round_ = ["baseline", "C1", "C2"]
    # The warm-up run goes alone, before the round starts.
    assert e[("exit", "warm-up")] <= min(e[("ready", label)] for label in round_)
    # Every run of the round started up before the first of them was given the GPU, and that
    # one waited for the slowest start-up (C1's).
    assert e[("gpu", "baseline")] >= max(e[("ready", label)] for label in round_)
    # Then one at a time, in the round's order: each gets the GPU once the one before exited.
    assert e[("gpu", "C1")] >= e[("exit", "baseline")] and e[("gpu", "C2")] >= e[("exit", "C1")]
    c1, c2 = data.candidates
    assert data.complete and c1.fixed.steps == 3 and c1.baseline.steps == 3 and c2.fixed.steps == 3
    assert c1.applied["swapped"] == 1
    assert "each round's runs started together and took the GPU in turn" in data.notes
    logs = Path(data.run) / rundir.LOGS / "verify"
    assert (logs / "baseline.0.stdout").is_file() and (logs / "C1.0.stderr").is_file()


def test_where_the_runs_cannot_start_together_they_go_one_at_a_time_and_say_why(tmp_path, monkeypatch):
    data, e = _verify(tmp_path, monkeypatch, "no GPU is visible here (nvidia-smi -L lists none)")
    assert e[("ready", "C1")] >= e[("exit", "baseline")] and e[("ready", "C2")] >= e[("exit", "C1")]
    assert any("one at a time, as no GPU is visible here" in n for n in data.notes)


def test_runs_start_together_only_on_a_gpu_and_where_the_host_holds_them(tmp_path, monkeypatch):
    import json

    from kerneltriage.profile import context, ncu_gpus
    from kerneltriage.profile.command import parse_command

    run = tmp_path / "run"
    (run / rundir.LOGS).mkdir(parents=True)
    (run / rundir.LOGS / "status.timeline.rank0.json").write_text(json.dumps({"max_rss_mb": 10240.0}))
    (tmp_path / "train.py").write_text("")
    plain = parse_command([sys.executable, str(tmp_path / "train.py")])
    on_gpu = rundir.Manifest(command=["python", "train.py"], gpu={"name": "NVIDIA H200"})
    monkeypatch.setattr(ncu_gpus, "visible_gpus", lambda environ=None: [ncu_gpus.Gpu("0", "NVIDIA H200")])
    monkeypatch.setattr(context, "available_mb", lambda: 100 * 1024.0)
    assert together.why_apart(run, on_gpu, plain, 4) is None  # 4 x 10 GiB within 80% of 100 GiB
    held = together.why_apart(run, on_gpu, plain, 9)
    assert held is not None and "9 runs of 10.0 GiB" in held and "100.0 GiB available" in held
    assert "not profiled on a GPU" in str(together.why_apart(run, rundir.Manifest(command=[]), plain, 2))
    job = parse_command(["torchrun", "--nproc-per-node", "2", str(tmp_path / "train.py")])
    assert "torchrun" in str(together.why_apart(run, on_gpu, job, 2))
    monkeypatch.setattr(ncu_gpus, "visible_gpus", lambda environ=None: [])
    assert "no GPU is visible" in str(together.why_apart(run, on_gpu, plain, 2))
