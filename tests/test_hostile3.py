"""Hostile input, third campaign: the last tracebacks, a read-only output, impossible numbers
(shapes, counters, step timings, timestamps, ids) and misleading messages.

Each case mutates a copy of the shipped run ``examples/runs/gpt-naive-h200`` (or writes a small
file of its own), runs one command and compares what happened with what must: an exit code, a
one-line error or a report, the text that names the problem, and inputs left as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import kerneltriage
from kerneltriage.cli import main
from kerneltriage.errors import InputError, OutputError
from kerneltriage.outputs import read_only, refuse_read_only
from tests.helpers import EXAMPLE_RUN
from tests.test_hostile import expect, fingerprint, outcome
from tests.test_robustness import copy_run, edit_ncu, edit_trace

REPO = Path(__file__).resolve().parents[1]


# --- tracebacks -------------------------------------------------------------------------------


def first_cpu_ops_last(seconds_us: float, count: int = 5):
    def edit(data):
        ops = [e for e in data["traceEvents"] if e.get("cat") == "cpu_op"]
        for e in ops[:count]:
            e["dur"] = seconds_us

    return edit


def test_cpu_ops_of_absurd_duration_are_skipped_not_a_traceback(tmp_path):
    run = copy_run(tmp_path)
    edit_trace(run, first_cpu_ops_last(1e15))
    got = outcome(["report", run, "--format", "json"], "malformed CPU op", [run])
    assert got == expect(0, "malformed CPU op")


def test_module_label_ignores_missing_modules():
    from kerneltriage.analysis.candidates.grouping import module_label

    assert module_label([float("nan"), "blocks.0.attn:Attention", "blocks.1.attn:Attention"]) == (
        "blocks.*.attn (Attention)"
    )
    assert module_label([float("nan")]) is None


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"ranks": []}, "empty list"),
        ({"ranks": ["0"]}, "whole numbers"),
        ({"ranks": [-1]}, "whole numbers"),
        ({"ranks": 0}, "a list"),
        ({"workers": "2"}, "workers must be a whole number"),
        ({"workers": 2.0}, "workers must be a whole number"),
    ],
    ids=["empty", "string", "negative", "not-a-list", "workers-string", "workers-float"],
)
def test_reports_with_bad_ranks_is_input_error(kwargs, text):
    with pytest.raises(InputError, match=text):
        kerneltriage.reports(EXAMPLE_RUN, **kwargs)


@pytest.mark.parametrize("rank", ["0", True, -1, 1.0], ids=["string", "bool", "negative", "float"])
def test_report_with_a_rank_of_the_wrong_type_says_so(rank):
    with pytest.raises(InputError, match="rank must be a whole number") as info:
        kerneltriage.report(EXAMPLE_RUN, rank=rank)
    assert "not in the run directory" not in str(info.value)


def test_profile_of_a_directory_is_one_line(tmp_path):
    (tmp_path / "pkg").mkdir()
    args = ["profile", "-q", "--cpu", "--out", tmp_path / "run", "--", sys.executable, tmp_path / "pkg"]
    got = outcome(args, "directory without a __main__.py", [tmp_path / "pkg"], fmt_json=False)
    assert got == expect(2, "directory without a __main__.py")
    assert not (tmp_path / "run").exists()


def test_runner_names_a_missing_module_in_one_line(tmp_path):
    from kerneltriage.profile.runner import _missing_target

    assert "no module named 'kerneltriage_no_such_module'" in (
        _missing_target(["-m", "kerneltriage_no_such_module"]) or ""
    )
    assert "without a __main__" in (_missing_target(["-m", "kerneltriage.analysis"]) or "")
    assert "directory without a __main__.py" in (_missing_target([str(tmp_path)]) or "")
    assert _missing_target(["-m", "kerneltriage"]) is None
    (tmp_path / "__main__.py").write_text("")
    assert _missing_target([str(tmp_path)]) is None


# --- a read-only output is never replaced ---------------------------------------------------


def test_read_only_output_is_refused_and_kept(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("keep me\n")
    out.chmod(0o444)
    got = outcome(["report", EXAMPLE_RUN, "-o", out], "read-only", [out], fmt_json=False)
    assert got == expect(2, "read-only")
    assert out.read_text() == "keep me\n"


def test_a_writable_output_is_still_replaced(tmp_path):
    out = tmp_path / "out.md"
    out.write_text("old\n")
    code = CliRunner().invoke(main, ["report", str(EXAMPLE_RUN), "--format", "markdown", "-o", str(out)])
    assert (code.exit_code, out.read_text().startswith("old")) == (0, False), code.output


def test_read_only_is_the_owner_write_bit_even_for_root(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    assert not read_only(path)
    path.chmod(0o444)
    assert read_only(path)  # root may write it; the user said not to
    with pytest.raises(OutputError, match="read-only"):
        refuse_read_only(path, "-o")
    assert not read_only(tmp_path / "missing")


def test_scaffold_does_not_replace_a_read_only_file(tmp_path):
    out = tmp_path / "k"
    args = ["scaffold", "--kind", "rmsnorm", "--shape", "16x4096", "--out", str(out)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    target = next(p for p in sorted(out.iterdir()) if p.is_file())
    before = fingerprint(out)
    target.chmod(0o444)
    second = CliRunner().invoke(main, [*args, "--force"])  # even --force keeps a read-only file
    assert (second.exit_code, "read-only" in second.output, fingerprint(out)) == (2, True, before), (
        second.output
    )


def _nobody() -> int | None:
    if os.geteuid() != 0:
        return os.geteuid()  # not root already: os.access refuses for this user
    try:
        import pwd

        return pwd.getpwnam("nobody").pw_uid
    except (ImportError, KeyError):
        return None


def test_read_only_output_is_refused_for_a_user_without_root(request):
    """As a user who cannot write the file (os.access semantics), in a process of its own."""
    uid = _nobody()
    if uid is None:
        pytest.skip("no unprivileged user ('nobody') to run as")
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="kerneltriage-ro-", dir="/tmp"))  # pytest's is root's only
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    out = folder / "report.txt"
    out.write_text("keep me\n")
    os.chmod(out, 0o644)  # writable by its owner (root), not by 'nobody'
    os.chmod(folder, 0o777)
    code = (
        "import os, sys\n"
        "from kerneltriage.outputs import read_only\n"  # imported first: nobody may not read it
        f"os.setuid({uid})\n"
        "sys.exit(0 if read_only(sys.argv[1]) else 1)\n"
    )
    if os.geteuid() != 0:
        code = code.replace(f"os.setuid({uid})\n", "")
        os.chmod(out, 0o444)
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "keep me\n"


# --- impossible numbers ----------------------------------------------------------------------


def linear_dims(size: int):
    def edit(data):
        for e in data["traceEvents"]:
            if e.get("cat") == "cpu_op" and e.get("name") in ("aten::linear", "aten::mm", "aten::matmul"):
                dims = (e.get("args") or {}).get("Input Dims")
                if dims:
                    e["args"]["Input Dims"] = [[size if x >= 1024 else x for x in d] for d in dims]

    return edit


def test_input_dims_no_gpu_could_hold_are_warned_and_ignored(tmp_path):
    run = copy_run(tmp_path)
    edit_trace(run, linear_dims(10**18))
    got = outcome(["report", run, "--format", "json"], "no GPU could hold", [run])
    assert got == expect(0, "no GPU could hold")


def test_implausible_dims_by_value():
    from kerneltriage.ingest.schemas import implausible_dims

    assert implausible_dims([[4, 2048, 1024], [], None, [[2, 3], [4]]]) is None
    assert implausible_dims([[4, 2048, 10**18]]) == [4, 2048, 10**18]
    assert implausible_dims([[[2, 3], [-1, 4]]]) == [-1, 4]


def dram_read(value: str):
    def change(rows):
        rows[2][rows[0].index("dram__bytes_read.sum")] = value

    return change


def test_counters_that_imply_impossible_rates_are_left_unmeasured(tmp_path):
    run = copy_run(tmp_path)
    edit_ncu(run, dram_read("1e30"))
    got = outcome(["report", run, "--format", "json"], "impossible rates", [run])
    assert got == expect(0, "impossible rates")
    report = kerneltriage.report(run)
    assert all((c.roofline.achieved_gbs or 0) < 1e5 for c in report.candidates)


# --- misleading messages ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [str(2**63 - 1), str(2**63), "99999999999999999999"])
def test_max_shapes_of_any_size_is_a_whole_number(value):
    result = CliRunner().invoke(main, ["report", str(EXAMPLE_RUN), "--max-shapes", value, "--format", "json"])
    assert (result.exit_code, "whole number" in result.output) == (0, False), result.output[-500:]


def test_shipped_run_is_unchanged_by_the_checks():
    report = kerneltriage.report(EXAMPLE_RUN)
    implausible = [w for w in report.warnings if "impossible" in w or "no GPU could hold" in w]
    assert implausible == []


# --- steps and timestamps, judged relative to the trace ----------------------------------------


def shift_every_timestamp(us: float):
    def edit(data):
        for e in data["traceEvents"]:
            if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + us

    return edit


def test_a_trace_shifted_to_negative_times_reports_as_before(tmp_path):
    run = copy_run(tmp_path)
    edit_trace(run, shift_every_timestamp(-1e13))
    shifted, before = kerneltriage.report(run), kerneltriage.report(EXAMPLE_RUN)
    summary = [
        (
            r.step_time_ms,
            r.unattributed_share,
            [(c.name, c.verdict, round(c.time_share, 6)) for c in r.candidates],
        )
        for r in (shifted, before)
    ]
    assert summary[0] == summary[1]
    assert not any("no launch" in w for w in shifted.warnings)


def profiler_steps(change):
    def edit(data):
        steps = [e for e in data["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep")]
        change(data, steps)

    return edit


def same_start(data, steps):
    start = min(e["ts"] for e in steps)
    for e in steps:
        e["ts"] = start


def tiny_steps(count: int):
    def change(data, steps):
        first, start = steps[0], min(e["ts"] for e in steps)
        data["traceEvents"] = [e for e in data["traceEvents"] if e not in steps]
        data["traceEvents"] += [
            dict(first, name=f"ProfilerStep#{i}", ts=start + i * 0.01, dur=0.01) for i in range(count)
        ]

    return change


@pytest.mark.parametrize(
    ("change", "text"),
    [(same_start, "overlap the one before"), (tiny_steps(2000), "shorter than one kernel launch")],
    ids=["overlapping", "10-ns"],
)
def test_impossible_steps_are_refused(tmp_path, change, text):
    run = copy_run(tmp_path)
    edit_trace(run, profiler_steps(change))
    got = outcome(["report", run, "--format", "json"], text, [run])
    assert got == expect(2, text)


def test_step_checks_by_value():
    from kerneltriage.analysis.timeline.attribution import Step
    from kerneltriage.analysis.timeline.plausibility import check_steps
    from kerneltriage.errors import TraceFormatError

    ms = 1_000_000
    check_steps(
        [Step(i, f"s{i}", i * 50 * ms, (i + 1) * 50 * ms + 500) for i in range(4)], "s", "t"
    )  # 0.5 µs
    with pytest.raises(TraceFormatError, match="s2 starts 20 ms before s1 ends"):
        check_steps(
            [Step(0, "s0", 0, 50 * ms), Step(1, "s1", 50 * ms, 100 * ms), Step(2, "s2", 80 * ms, 130 * ms)],
            "s",
            "t",
        )


# --- ids, args, manifest timings, stray ranks ---------------------------------------------------


def every_external_id(value: int):
    def edit(data):
        for e in data["traceEvents"]:
            args = e.get("args") if isinstance(e, dict) else None
            if isinstance(args, dict) and "External id" in args:
                args["External id"] = value

    return edit


def test_colliding_external_ids_are_ignored_and_named(tmp_path):
    run = copy_run(tmp_path)
    edit_trace(run, every_external_id(1))
    got = outcome(["report", run, "--format", "json"], "External id collisions", [run])
    assert got == expect(0, "External id collisions")
    collided, before = kerneltriage.report(run), kerneltriage.report(EXAMPLE_RUN)
    # Placed by time instead, the candidates are the shipped run's, not one op holding the step.
    assert [c.name for c in collided.candidates[:4]] == [c.name for c in before.candidates[:4]]
    assert max(c.time_share for c in collided.candidates) < 0.7


def null_args(data):
    for e in data["traceEvents"]:
        if e.get("cat") == "cpu_op":
            e["args"] = None


def test_ops_without_args_are_named(tmp_path):
    run = copy_run(tmp_path)
    edit_trace(run, null_args)
    got = outcome(["report", run, "--format", "json"], "CPU op event(s) have no args", [run])
    assert got == expect(0, "CPU op event(s) have no args")


def test_the_shipped_traces_have_args_and_distinct_ids():
    report = kerneltriage.report(EXAMPLE_RUN)
    assert not [w for w in report.warnings if "no args" in w or "External id" in w]


def plain_step(ms: float):
    def edit(run: Path) -> None:
        path = run / "manifest.json"
        data = json.loads(path.read_text())
        data["phases"]["timeline"]["step_time"] = {
            "rank": 0,
            "plain_median_ms": ms,
            "plain_ms": [ms] * 5,
            "clean_ms": [17.0] * 5,
        }
        path.write_text(json.dumps(data))

    return edit


def test_a_plain_step_far_longer_than_the_recorded_ones_is_refused(tmp_path):
    run = copy_run(tmp_path)
    plain_step(1e12)(run)
    got = outcome(["report", run, "--format", "json"], "phases.timeline.step_time", [run])
    assert got == expect(2, "phases.timeline.step_time")


def test_a_stray_rank_trace_is_left_out_and_named(tmp_path):
    run = copy_run(tmp_path)
    shutil.copy(EXAMPLE_RUN.parent / "gpt-ddp-2gpu-h200" / "trace.rank1.json.gz", run / "trace.rank1.json.gz")
    got = outcome(["report", run, "--format", "json"], "stray trace(s) trace.rank1.json.gz", [run])
    assert got == expect(0, "stray trace(s) trace.rank1.json.gz")
    assert list(kerneltriage.reports(run, workers=1)) == [0]
    assert not any("are missing" in w for w in kerneltriage.report(run).warnings)


# --- rules files: the same warnings everywhere, duplicated and misplaced keys named ------------


def write_rules(tmp: Path, text: str) -> Path:
    path = tmp / "rules.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "thresholds: {min_share: 0.05}\nthresholds: {min_share: 0.2}\n",
            "key 'thresholds' is given twice (lines 1 and 2)",
        ),
        ("thresholds: {min_share: 0.05, min_share: 0.2}\n", "key 'min_share' is given twice (line 1)"),
    ],
    ids=["block", "flow"],
)
def test_a_duplicated_rules_key_is_refused_by_name(tmp_path, text, said):
    path = write_rules(tmp_path, text)
    got = outcome(["report", EXAMPLE_RUN, "--rules", path], said, [path], fmt_json=False)
    assert got == expect(2, said)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("ops: 5\n", "'ops'"),
        ("op_classes: [{kind: gemm, opz: ['x']}]\n", "'op_classes[0].opz'"),
        ("recommendations: {norm: {notes: x}}\n", "'recommendations.norm.notes'"),
    ],
    ids=["top-level", "in-a-list", "in-a-mapping"],
)
def test_unknown_rules_keys_are_named_at_any_depth(tmp_path, text, key):
    from kerneltriage.analysis.rules import load_rules

    warnings = load_rules(write_rules(tmp_path, text)).warnings
    assert [w for w in warnings if f"unknown key {key} is ignored" in w], warnings


def test_diff_says_what_report_says_about_a_rules_file(tmp_path):
    path = write_rules(tmp_path, "ops: 5\n")
    said = "unknown key 'ops' is ignored"
    result = CliRunner().invoke(main, ["diff", str(EXAMPLE_RUN), str(EXAMPLE_RUN), "--rules", str(path)])
    assert (result.exit_code, said in result.output) == (0, True), result.output[-2000:]
    api = kerneltriage.diff(EXAMPLE_RUN, EXAMPLE_RUN, rules_file=path)
    assert [w for w in api.warnings if said in w]
    assert [w for w in kerneltriage.report(EXAMPLE_RUN, rules_file=path).warnings if said in w]


# --- calibration, scaffold, memory ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"hbm_gbs": 0}, "hbm_gbs 0"),
        ({"peak_tflops": {"bf16": -3.0}}, "peak_tflops.bf16 -3.0"),
    ],
    ids=["zero", "negative"],
)
def test_calibration_values_that_are_no_rate_are_named(tmp_path, change, said):
    run = copy_run(tmp_path)
    path = run / "manifest.json"
    data = json.loads(path.read_text())
    data["calibration"].update(change)
    path.write_text(json.dumps(data))
    warned = [w for w in kerneltriage.report(run).warnings if "calibration" in w]
    assert [w for w in warned if said in w and "not a positive rate" in w], warned


def test_the_shipped_calibration_is_not_warned_about():
    assert not [w for w in kerneltriage.report(EXAMPLE_RUN).warnings if "calibration" in w]


@pytest.mark.parametrize("dtype", ["", " "], ids=["empty", "blank"])
def test_scaffold_refuses_an_empty_dtype(tmp_path, dtype):
    args = ["scaffold", "--kind", "rmsnorm", "--shape", "16x4096", "--dtype", dtype, "--out", tmp_path / "k"]
    got = outcome(args, "--dtype", [], fmt_json=False)
    assert got == expect(2, "--dtype")
    assert not (tmp_path / "k").exists()


def test_a_parse_out_of_memory_is_not_called_invalid_json():
    import orjson

    from kerneltriage.ingest.kineto import _json_error

    memory = _json_error(
        orjson.JSONDecodeError("Not enough memory to allocate buffer for parsing", "", 0), "t"
    )
    invalid = _json_error(orjson.JSONDecodeError("unexpected character", "x", 0), "t")
    assert ("out of memory" in str(memory), "not valid JSON" in str(memory)) == (True, False)
    assert "not valid JSON" in str(invalid)


def linear_k_times(factor: int):
    """Every linear's inner dimension (1024) recorded ``factor`` times larger: tensors a GPU
    could hold, FLOPs no GPU could do in the measured time."""

    def edit(data):
        for e in data["traceEvents"]:
            if e.get("cat") == "cpu_op" and e.get("name") == "aten::linear":
                dims = (e.get("args") or {}).get("Input Dims")
                if dims and dims[0] and dims[0][-1] == 1024:
                    e["args"]["Input Dims"] = [[x * factor if x == 1024 else x for x in d] for d in dims]

    return edit


def test_rates_above_the_gpu_are_warned_and_their_rows_marked_in_every_format(tmp_path):
    run = copy_run(tmp_path)
    edit_trace(run, linear_k_times(1000))
    got = outcome(["report", run, "--format", "json"], "run faster than H200's datasheet allows", [run])
    assert got == expect(0, "run faster than H200's datasheet allows")
    report = kerneltriage.report(run)
    marked = [c for c in report.candidates if c.note.startswith("implausible: achieved_tflops")]
    assert marked and all(c.name.startswith("aten::linear") for c in marked)
    assert all(
        (c.verdict, c.reason, c.expected_saving_share) == ("skip", "estimate-failed", 0.0) for c in marked
    )
    for fmt in ("terminal", "markdown", "csv", "html", "json"):
        rows = []
        for source in (run, EXAMPLE_RUN):
            out = tmp_path / f"report.{fmt}"
            result = CliRunner().invoke(main, ["report", str(source), "--format", fmt, "-o", str(out)])
            assert result.exit_code == 0, result.output
            rows.append("estimate-failed" in out.read_text())
        assert rows == [True, False], fmt


@pytest.mark.parametrize("us", [1e12, -1e12], ids=["days-after", "days-before"])
def test_a_kernel_timed_far_outside_the_recording_is_dropped_by_name(tmp_path, us):
    def edit(data):
        kernels = [e for e in data["traceEvents"] if e.get("cat") == "kernel"]
        kernels[len(kernels) // 2]["ts"] += us

    run = copy_run(tmp_path)
    edit_trace(run, edit)
    got = outcome(["report", run, "--format", "json"], "timed far outside the recording", [run])
    assert got == expect(0, "timed far outside the recording")
    assert kerneltriage.report(run).step_time_ms == pytest.approx(
        kerneltriage.report(EXAMPLE_RUN).step_time_ms, rel=0.01
    )


def test_export_refuses_a_read_only_table_before_replacing_any(tmp_path):
    out = tmp_path / "tables"
    first = CliRunner().invoke(
        main, ["report", str(EXAMPLE_RUN), "--export", str(out), "-o", str(tmp_path / "r.md")]
    )
    assert first.exit_code == 0, first.output
    (out / "ranks.csv").chmod(0o444)
    for table in out.iterdir():
        os.utime(table, (1_000_000_000, 1_000_000_000))
    again = CliRunner().invoke(
        main, ["report", str(EXAMPLE_RUN), "--export", str(out), "-o", str(tmp_path / "r.md")]
    )
    assert (again.exit_code, "read-only" in again.output) == (2, True), again.output
    assert {t.name: t.stat().st_mtime for t in out.iterdir()} == dict.fromkeys(
        (t.name for t in out.iterdir()), 1_000_000_000
    )


def test_a_step_time_of_a_rank_the_run_lacks_is_named(tmp_path):
    run = copy_run(tmp_path)
    path = run / "manifest.json"
    data = json.loads(path.read_text())
    data["phases"]["timeline"]["step_time"] = {
        "rank": 7,
        "plain_median_ms": 47.9,
        "plain_ms": [47.9] * 5,
        "clean_ms": [17.0] * 5,
    }
    path.write_text(json.dumps(data))
    said = "phases.timeline.step_time.rank 7 names no trace of the run"
    got = outcome(["report", run, "--format", "json"], said, [run])
    assert got == expect(0, said)
    for shipped in sorted(EXAMPLE_RUN.parent.glob("gpt-*")):
        assert not [w for w in kerneltriage.reports(shipped, workers=1)[0].warnings if "step_time.rank" in w]


def correlation_of_every(tenth_only: bool):
    def edit(data):
        for e in data["traceEvents"]:
            args = e.get("args") if isinstance(e, dict) else None
            if (
                e.get("cat") in ("kernel", "cuda_runtime")
                and isinstance(args, dict)
                and "correlation" in args
            ) and (not tenth_only or args["correlation"] % 10 == 0):
                args["correlation"] = 10

    return edit


@pytest.mark.parametrize(
    ("tenth_only", "code", "said"),
    [(True, 0, "correlation id collisions"), (False, 2, "kernels cannot be matched to their launches")],
    ids=["some-warned", "most-refused"],
)
def test_correlation_ids_shared_by_launches_are_named(tmp_path, tenth_only, code, said):
    run = copy_run(tmp_path)
    edit_trace(run, correlation_of_every(tenth_only))
    got = outcome(["report", run, "--format", "json"], said, [run])
    assert got == expect(code, said)
