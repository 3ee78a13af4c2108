"""Phase 2 over several GPUs, piece by piece: the GPUs a child may be given, when the phase
splits, each GPU's share of the real H200 capture's hot kernels, the merged exports."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import stat
import sys
from collections import Counter
from pathlib import Path

import pytest

from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.hot_kernels import HotKernels, select_hot_kernels
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.profile import ncu_gpus
from kerneltriage.profile.ncu_gpus import Gpu, StepLaunches
from tests.helpers import NCU_ALL, NCU_PER_CONFIG, timeline

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def hot() -> HotKernels:
    return select_hot_kernels(timeline(), load_rules(None), coverage=0.95, max_kernels=64)


@pytest.fixture(scope="module")
def step(hot) -> StepLaunches:
    return ncu_gpus.step_launches(timeline(), hot)


def _smi(tmp_path, monkeypatch, body: str) -> None:
    """An nvidia-smi on PATH that runs ``body`` (Python)."""
    bin_dir = tmp_path / "smi"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))


def _listing(*lines: str) -> str:
    return "print(" + repr("\n".join(lines)) + ")"


def test_gpus_from_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert ncu_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == [Gpu("0"), Gpu("1")]
    assert ncu_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": " 2, 3 "}) == [Gpu("2"), Gpu("3")]
    assert ncu_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == [Gpu("2")]  # CUDA stops there
    assert ncu_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert ncu_gpus.visible_gpus({}) == []  # neither says: one process, as before


def test_gpus_from_nvidia_smi(tmp_path, monkeypatch):
    _smi(
        tmp_path,
        monkeypatch,
        _listing(f"GPU 0: {H100} (UUID: GPU-5c3e0a)", f"GPU 1: {H100} (UUID: GPU-77ab10)"),
    )
    assert ncu_gpus.visible_gpus({}) == [Gpu("0", H100), Gpu("1", H100)]
    # CUDA_VISIBLE_DEVICES first; nvidia-smi still names the models, by index or UUID prefix.
    assert ncu_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "1,GPU-5c3e"}) == [
        Gpu("1", H100),
        Gpu("GPU-5c3e", H100),
    ]


def test_nvidia_smi_that_hangs_fails_or_lists_mig_counts_as_no_gpus(tmp_path, monkeypatch):
    _smi(tmp_path, monkeypatch, "import time; time.sleep(30)")
    assert ncu_gpus.visible_gpus({}, timeout=0.5) == []
    (tmp_path / "smi" / "nvidia-smi").write_text(f"#!{sys.executable}\nimport sys; sys.exit(9)\n")
    assert ncu_gpus.visible_gpus({}) == []
    (tmp_path / "smi" / "nvidia-smi").write_text(
        f"#!{sys.executable}\n"
        + _listing(f"GPU 0: {H100} (UUID: GPU-5c3e0a)", "  MIG 3g.40gb     Device  0: (UUID: MIG-1d2e)")
    )
    assert ncu_gpus.visible_gpus({}) == []


def test_when_phase_two_splits():
    two = [Gpu("0", H100), Gpu("1", H100)]
    assert ncu_gpus.choose_gpus(None, False, [0], two).gpus == two
    assert ncu_gpus.choose_gpus(1, False, [0], two) == ncu_gpus.GpuChoice()  # asked for one: no reason
    assert ncu_gpus.choose_gpus(None, False, [0], two[:1]) == ncu_gpus.GpuChoice()
    three = [*two, Gpu("2", H100)]
    assert ncu_gpus.choose_gpus(2, False, [0], three).gpus == two
    torchrun = ncu_gpus.choose_gpus(None, True, [0], two)
    assert not torchrun.gpus and "torchrun" in torchrun.reason
    both = ncu_gpus.choose_gpus(None, False, [0, 1], two)
    assert not both.gpus and "devices 0, 1" in both.reason  # the script itself uses two GPUs
    mixed = ncu_gpus.choose_gpus(None, False, [0], [Gpu("0", H100), Gpu("1", "NVIDIA A10")])
    assert not mixed.gpus and "different models" in mixed.reason


def test_step_launches_count_what_hot_kernel_selection_counted(hot, step):
    assert sum(step.configs.values()) == hot.configs
    assert sum(step.launches[n] for n in hot.variable) == hot.variable_launches
    assert set(step.launches) == set(hot.names) and step.devices == [0]
    assert len(step.order) == 452 and sum(step.launches.values()) < len(step.order)  # cold ones too


def _assigned(shares) -> Counter:
    return Counter(n for s in shares for n in (*s.variable, *s.configs))


def test_every_hot_kernel_on_one_gpu_with_its_policy(hot, step):
    for n in (2, 3, 4, 8):
        gpus = [Gpu(str(i)) for i in range(n)]
        shares = ncu_gpus.plan_shares(hot, step, gpus, whole_run=False)
        assert _assigned(shares) == Counter(hot.names)  # the hot set, each kernel once
        # The every-launch kernels together, with their launch budget, on the first GPU.
        assert shares[0].variable == hot.variable and shares[0].variable_launches == hot.variable_launches
        assert not any(s.variable for s in shares[1:])
        assert sum(s.config_count for s in shares) == hot.configs - hot.variable_configs
        assert len(shares) <= n and [s.gpu for s in shares] == sorted((s.gpu for s in shares), key=gpus.index)
    # A whole-run recording has one policy: one launch per configuration for all.
    whole = ncu_gpus.plan_shares(hot, step, [Gpu("0"), Gpu("1")], whole_run=True)
    assert not any(s.variable for s in whole) and sum(s.config_count for s in whole) == hot.configs


def test_a_process_start_weighs_in_the_plan(hot, step):
    two = [Gpu("0"), Gpu("1")]
    # A start costs more than the configurations: the every-launch GPU runs nothing else.
    default = ncu_gpus.plan_shares(hot, step, two, whole_run=False)
    assert [(len(s.variable), s.config_count) for s in default] == [(2, 0), (0, hot.configs - 2)]
    # Free starts: the first GPU takes configurations too where that ends sooner, until both
    # end together (here 41 every-launch launches against 39 configurations: it need not).
    free = ncu_gpus.plan_shares(hot, step, two, whole_run=False, start_cost=0)
    loads = [s.variable_launches + s.config_count for s in free]
    assert abs(loads[0] - loads[1]) <= max(step.configs.values())
    more = dataclasses.replace(step, configs={n: c * 3 for n, c in step.configs.items()})
    heavy = ncu_gpus.plan_shares(hot, more, two, whole_run=False, start_cost=0)
    assert heavy[0].configs and heavy[0].variable == hot.variable


def test_another_gpu_warmed_up_ahead_takes_more_of_the_configurations(hot, step):
    # The second GPU's processes warm up while the timing processes run (``ahead``): its start
    # is off phase 2's path, so it takes configurations the every-launch GPU took before.
    two = [Gpu("0"), Gpu("1")]
    more = dataclasses.replace(step, configs={n: c * 3 for n, c in step.configs.items()})
    gated = ncu_gpus.plan_shares(hot, more, two, whole_run=False, start_cost=15, second_start=3)
    ahead = ncu_gpus.plan_shares(hot, more, two, whole_run=False, start_cost=15, second_start=3, ahead=1)
    assert [s.ahead for s in gated] == [False, False] and [s.ahead for s in ahead] == [False, True]
    assert ahead[1].config_count > gated[1].config_count
    assert sum(s.config_count for s in ahead) == sum(s.config_count for s in gated)

    def ends(shares, away):
        first = 15 + shares[0].variable_launches + (3 + shares[0].config_count if shares[0].configs else 0)
        return max(first, away + shares[1].config_count)

    assert ends(ahead, 1) < ends(gated, 1)


def test_the_others_are_balanced_around_the_light_pass():
    # T5-base's shape of phase 2 (H200, 2026-11-28): 16 every-launch launches, 22
    # per-configuration launches in four kernels, a light pass of 87 configurations. Placed
    # after the others, the light pass went behind the every-launch pass (ends 31 + 3 + 17.4):
    # placed first, the per-configuration kernels fill in around it and both GPUs end sooner.
    names = ["v", "c1", "c2", "c3", "c4", "m"]
    hot = HotKernels(names, 0, 0.9, [], variable=["v"])
    configs = {"v": 1, "c1": 8, "c2": 6, "c3": 5, "c4": 3, "m": 65}
    step = StepLaunches(dict.fromkeys(names, 1) | {"v": 16}, configs, [], [0])
    first, second = ncu_gpus.plan_shares(hot, step, [Gpu("0"), Gpu("1")], False, 15, 3, light=(["m"], 65))
    assert first.variable == ["v"] and first.configs and second.configs
    assert second.light_count == 87 and not first.light
    ends = [15 + 16 + 3 + first.config_count, 15 + 87 * ncu_gpus.LIGHT_LAUNCH + 3 + second.config_count]
    assert max(ends) < 15 + 16 + 3 + 87 * ncu_gpus.LIGHT_LAUNCH  # the light pass behind the first


def test_the_every_launch_pass_goes_to_a_gpu_warmed_up_ahead_where_that_ends_sooner():
    # The same shape with the second GPU warmed up ahead (its start costs 1, the script's GPU's
    # 15): the every-launch and light passes go to it, the per-configuration kernels to the
    # script's GPU, which would otherwise pay its start before the every-launch launches.
    names = ["v", "c1", "c2", "c3", "c4", "m"]
    hot = HotKernels(names, 0, 0.9, [], variable=["v"])
    configs = {"v": 1, "c1": 8, "c2": 6, "c3": 5, "c4": 3, "m": 65}
    step = StepLaunches(dict.fromkeys(names, 1) | {"v": 16}, configs, [], [0])
    two = [Gpu("0"), Gpu("1")]
    first, second = ncu_gpus.plan_shares(hot, step, two, False, 15, 3, light=(["m"], 65), ahead=1)
    assert (first.gpu, first.variable, first.config_count, first.light, first.ahead) == (
        two[0],
        [],
        22,
        [],
        False,
    )
    assert (second.gpu, second.variable, second.light_count, second.ahead) == (two[1], ["v"], 87, True)
    ends = [15 + 22, 1 + 16 + 3 + 87 * ncu_gpus.LIGHT_LAUNCH]
    lead_first = ncu_gpus.plan_shares(hot, step, [Gpu("0")], False, 15, 3, light=(["m"], 65), ahead=1)
    assert lead_first[0].variable == ["v"]  # one GPU: nowhere else to go
    assert max(ends) < 15 + 16 + 3 + 11  # the first GPU's end with the every-launch pass on it


def test_configurations_are_balanced():
    names = [f"k{i}" for i in range(6)]
    hot = HotKernels(names, 60, 0.9, [])
    step = StepLaunches({n: 1 for n in names}, dict(zip(names, [20, 15, 10, 7, 5, 3])), [], [0])
    shares = ncu_gpus.plan_shares(hot, step, [Gpu("0"), Gpu("1")], whole_run=False)
    assert sorted(s.config_count for s in shares) == [30, 30]
    assert all(s.configs == sorted(s.configs, key=names.index) for s in shares)  # hottest first
    assert ncu_gpus.plan_shares(HotKernels(["k0"], 20, 0.9, []), step, [Gpu("0"), Gpu("1")], False)[
        0
    ].configs == ["k0"]


def _csv(header: list[str], units: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([header, units, *rows])
    return out.getvalue()


def _table(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))


def test_merged_rows_follow_the_steps_launch_order(step):
    # The every-launch capture of the H200 run cut in three by kernel, as three processes would
    # have exported it: the merge puts its rows back in launch order.
    header, units, *rows = _table(NCU_ALL)
    name = header.index("Kernel Name")
    kernels = sorted({base_name(r[name]) for r in rows})
    parts = [[r for r in rows if kernels.index(base_name(r[name])) % 3 == i] for i in range(3)]
    merged = list(
        csv.reader(io.StringIO(ncu_gpus.merge_exports([_csv(header, units, p) for p in parts], step.order)))
    )
    assert merged[:2] == [header, units]
    assert [r[1:] for r in merged[2:]] == [r[1:] for r in rows]
    assert [r[0] for r in merged[2:]] == [str(i) for i in range(len(rows))]


def test_merge_keeps_one_export_as_it_is_and_unites_columns(step):
    text = gzip.decompress(NCU_PER_CONFIG.read_bytes()).decode()
    assert ncu_gpus.merge_exports([text], step.order) == text
    assert ncu_gpus.merge_exports(["", text], step.order) == text
    header, units, *rows = list(csv.reader(io.StringIO(text)))
    # ncu's own lines before a CSV, and a part with a column the other lacks.
    short = _csv(header[:-1], units[:-1], [r[:-1] for r in rows[:3]])
    merged = list(
        csv.reader(io.StringIO(ncu_gpus.merge_exports(["==PROF== Disconnected\n" + short, text], step.order)))
    )
    assert merged[0] == header and merged[1] == units and len(merged) == 2 + 3 + len(rows)
    assert Counter(r[-1] for r in merged[2:])[""] == 3  # the short part's rows lack that column


def test_merge_reads_every_part_in_the_first_ones_units(step):
    # ncu scales each export's columns on its own values: the Mixtral-class MoE's light pass
    # printed its durations in ms and DRAM bytes in Gbyte where the per-configuration pass
    # printed us and Mbyte (H200, 2026-11-28); read as printed, its joins were rejected.
    from kerneltriage.ingest.ncu_csv import parse_counters

    text = gzip.decompress(NCU_PER_CONFIG.read_bytes()).decode()
    header, units, *rows = list(csv.reader(io.StringIO(text)))
    t, b = header.index("gpu__time_duration.sum"), header.index("dram__bytes_read.sum")
    assert (units[t], units[b]) == ("us", "Gbyte")
    half = len(rows) // 2
    scaled_units = list(units)
    scaled_units[t], scaled_units[b] = "ms", "Mbyte"
    scaled = [list(r) for r in rows[half:]]
    for r in scaled:
        r[t], r[b] = str(float(r[t]) / 1e3), str(float(r[b].replace(",", "")) * 1e3)
    merged = ncu_gpus.merge_exports(
        [_csv(header, units, rows[:half]), _csv(header, scaled_units, scaled)], step.order
    )
    got = parse_counters(merged, source="merged").rows
    want = parse_counters(text, source="whole").rows
    assert sorted(got["duration_ns"]) == pytest.approx(sorted(want["duration_ns"]))
    assert sorted(got["dram_read_bytes"]) == pytest.approx(sorted(want["dram_read_bytes"]))


def test_the_full_passs_rows_take_their_places_among_the_light_passs():
    # The light pass exports every configuration without the instruction counters, the full
    # pass some kernels' with them: filled in, the export reads as one pass with every counter
    # would have written it, in that one process's launch order.
    text = gzip.decompress(NCU_PER_CONFIG.read_bytes()).decode()
    header, units, *rows = list(csv.reader(io.StringIO(text)))
    name = header.index("Kernel Name")
    keep = [i for i, c in enumerate(header) if not c.startswith(("smsp__sass_", "sm__ops_path_tensor"))]
    full = [r for r in rows if "nvjet" in r[name] or "softmax" in r[name].lower()]
    light = _csv([header[i] for i in keep], [units[i] for i in keep], [[r[i] for i in keep] for r in rows])
    filled = list(csv.reader(io.StringIO(ncu_gpus.fill_in(light, _csv(header, units, full)))))
    assert filled[0] == header and filled[1] == units and len(filled) == len(rows) + 2
    assert [r[name] for r in filled[2:]] == [r[name] for r in rows]
    sass = header.index("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum")
    assert full and all(f == r for f, r in zip(filled[2:], rows) if r in full)
    assert all(f[sass] == "" for f, r in zip(filled[2:], rows) if r not in full)
    # A pass that failed left no export: the other's is the file.
    assert ncu_gpus.fill_in(light, "") == light and ncu_gpus.fill_in("", text) == text


def test_each_process_gets_a_lock_of_its_own_and_inductors_cache(tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assignments = dict(a.split("=", 1) for a in ncu_gpus.apart_env(str(tmp_path / "lock"), {}))
    assert assignments == {"TMPDIR": str(tmp_path / "lock"), "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    # A cache the user chose is theirs: the script inherits it.
    assert ncu_gpus.apart_env("/t", {"TORCHINDUCTOR_CACHE_DIR": "/c"}) == ["TMPDIR=/t"]


def test_a_second_process_started_beside_the_first_costs_less(hot, step):
    # On the every-launch GPU, a per-configuration pass that warms up beside the every-launch
    # pass (measure gates) costs less than a start of its own: that GPU takes more of the
    # configurations, and both GPUs end sooner.
    two = [Gpu("0"), Gpu("1")]
    more = dataclasses.replace(step, configs={n: c * 3 for n, c in step.configs.items()})
    apart = ncu_gpus.plan_shares(hot, more, two, whole_run=False, start_cost=15)
    beside = ncu_gpus.plan_shares(hot, more, two, whole_run=False, start_cost=15, second_start=0)
    assert beside[0].config_count > apart[0].config_count > 0
    assert sum(s.config_count for s in beside) == sum(s.config_count for s in apart)

    def ends(shares, second):
        first = (
            15 + shares[0].variable_launches + (second + shares[0].config_count if shares[0].configs else 0)
        )
        return max(first, 15 + shares[1].config_count)

    assert ends(beside, 0) < ends(apart, 0)
    # The default second start is a start like any other.
    assert ncu_gpus.plan_shares(hot, more, two, whole_run=False, start_cost=15, second_start=15) == apart
