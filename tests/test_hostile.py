"""Hostile input, second campaign (issue 30): no traceback, no hang, no lost run, and no
confident report on impossible input.

Each case builds its input (a mutated copy of the shipped run ``examples/runs/gpt-naive-h200``,
a rules file, a special file), runs one command and reduces what happened to an ``Outcome``:
the exit code, the shape of the output (one line, or a report whose numbers are possible),
whether the expected text is in it, and whether every input is byte for byte as before. One
assertion per case compares it with the expected outcome.

The classes: values checked alike from flags, rules files, manifests and the Python API;
plausibility of a trace's numbers before they are rendered; user patterns in linear time; OS,
encoding, recursion and optional-package errors; inputs that are not regular files; and
``profile --force``, which replaces a run only with a complete one. The cases that need a
process of their own (a named pipe, a full standard output, a pattern that backtracks) run
as a subprocess with a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

import kerneltriage
from kerneltriage.cli import main
from kerneltriage.errors import InputError
from tests.test_robustness import (
    assert_possible,
    copy_run,
    edit_kernels,
    edit_manifest,
    edit_trace,
    kernel_events,
)

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds a subprocess case may take before it counts as a hang


@dataclass(frozen=True)
class Outcome:
    code: int
    shape: str  # "one line" | "report" (possible numbers) | what else came out
    found: bool  # the expected text is in the output
    untouched: bool  # every input file is as it was
    output: str = field(default="", compare=False, repr=False)

    def __repr__(self) -> str:
        return f"Outcome({self.code}, {self.shape!r}, found={self.found}, untouched={self.untouched})\n{self.output[-1500:]}"


def fingerprint(*paths: Path) -> dict[str, str]:
    """Content hash of every file under ``paths`` (a missing path: None)."""
    out: dict[str, str] = {}
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    return out


def shape_of(code: int, output: str, fmt_json: bool) -> str:
    if "Traceback" in output:
        return "traceback"
    if code != 0:
        # The core's one line, or click's own usage error (its one "Error:" line under the usage).
        lines = [line for line in output.strip().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(("kerneltriage: error: ", "Error: "))]
        ours = len(lines) == 1 and lines[0].startswith("kerneltriage: error: ")
        return "one line" if ours or (len(errors) == 1 and lines[0].startswith("Usage:")) else "several lines"
    if not fmt_json:
        return "report"
    head, _, _ = output.partition("{")
    try:
        data = json.loads(output[len(head) :])
        assert_possible(data)
    except (ValueError, AssertionError):
        return "impossible report"
    return "report"


def invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return -1, f"Traceback: uncaught {type(result.exception).__name__}: {result.exception}"
    return result.exit_code, result.output


def outcome(args: list, text: str, inputs: list[Path], fmt_json: bool = True) -> Outcome:
    before = fingerprint(*inputs)
    code, output = invoke(args)
    found = text.lower() in output.lower()
    if code == 0 and fmt_json:  # a report: the text is one of its warnings
        head, _, _ = output.partition("{")
        with contextlib.suppress(ValueError):
            found = any(text.lower() in w.lower() for w in json.loads(output[len(head) :])["warnings"])
    return Outcome(code, shape_of(code, output, fmt_json), found, fingerprint(*inputs) == before, output)


def expect(code: int, text: str) -> Outcome:
    return Outcome(code, "one line" if code else "report", True, True)


# --- building inputs ------------------------------------------------------------------------


def rules(text: str | bytes):
    def make(tmp: Path) -> Path:
        path = tmp / "rules.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    return make


def step_time(ms):
    """A manifest whose profile timed plain steps at ``ms`` (the report then uses it)."""
    return edit_manifest(
        lambda m: m["phases"]["timeline"].update(
            step_time={"rank": 0, "plain_median_ms": ms, "plain_ms": [ms] * 5, "clean_ms": [17.0] * 5}
        )
    )


def calibration(**change):
    def edit(m):
        m["calibration"].update(change)

    return edit_manifest(edit)


def no_kernel_events(data):
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "kernel"]


def no_correlation(data):
    for e in data["traceEvents"]:
        if e.get("cat") == "kernel" and isinstance(e.get("args"), dict):
            e["args"].pop("correlation", None)


def huge_input_dims(data):
    for e in data["traceEvents"]:
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm":
            e.setdefault("args", {})["Input Dims"] = [[99999999999, 99999999999], [99999999999, 99999999999]]


def huge_cpu_dur(data):
    ops = [e for e in data["traceEvents"] if e.get("cat") == "cpu_op"]
    ops[len(ops) // 2]["dur"] = 1e300


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_manifest(run: Path) -> None:
    data = json.loads((run / "manifest.json").read_text())
    text = json.dumps(data)[:-1] + ', "deep": ' + nested(100_000) + "}"
    (run / "manifest.json").write_text(text)


A100_CALIBRATION = {"gpu": "NVIDIA A100-SXM4-80GB", "peak_tflops": {"bf16": 290.0}, "hbm_gbs": 1800.0}

# (id, mutation of the copied run or None, a rules-file maker or None, extra arguments,
#  expected exit code, text the output must hold)
REPORT_CASES = [
    # 1. Values: the same range checks from a rules file as from a flag.
    ("rules-min-share-above-1", None, rules("thresholds: {min_share: 1.5}"), [], 2, "min_share"),
    ("rules-max-shapes-0", None, rules("thresholds: {max_shapes: 0}"), [], 2, "max_shapes"),
    ("rules-max-shapes-fraction", None, rules("thresholds: {max_shapes: 2.5}"), [], 2, "max_shapes"),
    ("rules-join-ratio-0", None, rules("thresholds: {join_max_duration_ratio: 0}"), [], 2, "join_max"),
    ("rules-top-fraction-2", None, rules("thresholds: {top_fraction: 2}"), [], 2, "top_fraction"),
    ("rules-idle-warn-negative", None, rules("thresholds: {idle_warn: -0.5}"), [], 2, "idle_warn"),
    ("rules-share-string", None, rules("thresholds: {min_share: lots}"), [], 2, "min_share"),
    ("flag-max-shapes-0", None, None, ["--max-shapes", "0"], 2, "--max-shapes"),
    ("flag-top-0", None, None, ["--top", "0"], 2, "--top"),
    # ... and in a manifest.
    ("manifest-step-negative", step_time(-5.0), None, [], 2, "step_time"),
    ("manifest-step-nan", step_time(float("nan")), None, [], 2, "step_time"),
    ("manifest-step-string", step_time("fast"), None, [], 2, "step_time"),
    (
        "manifest-step-list",
        edit_manifest(lambda m: m["phases"].update(timeline=[1])),
        None,
        [],
        2,
        "timeline",
    ),
    # 2. Plausibility: refused or warned about by name.
    ("manifest-step-tiny", step_time(0.001), None, [], 2, "contradict"),
    ("kernel-longer-than-step", edit_kernels(1, lambda e: e.update(dur=8.6e10)), None, [], 2, "longer than"),
    (
        # Longer than its step (about 50 ms) but within the recording, on a GPU-bound run: the
        # shares of the step add up past what one stream can fill, and the report is refused.
        "kernel-longer-than-its-step",
        lambda run: edit_trace(run, middle_kernel_lasts(1.0e5)),
        None,
        [],
        2,
        "cannot be trusted",
    ),
    (
        "launches-without-kernels",
        lambda run: edit_trace(run, no_kernel_events),
        None,
        [],
        2,
        "no kernel event",
    ),
    ("kernels-without-correlation", lambda run: edit_trace(run, no_correlation), None, [], 0, "correlation"),
    (
        "calibration-100x",
        calibration(peak_tflops={"bf16": 67880.0}, hbm_gbs=422120.0),
        None,
        [],
        0,
        "datasheet",
    ),
    ("calibration-other-gpu", calibration(**A100_CALIBRATION), None, [], 0, "A100"),
    # 3. Patterns: linear time, or refused by name.
    ("rules-backreference", None, rules(r"library_ops: ['(a)\1']"), [], 2, "library_ops"),
    ("rules-lookahead", None, rules("library_ops: ['^(?=aten)']"), [], 2, "library_ops"),
    ("step-marker-unbalanced", None, None, ["--step-marker", "("], 2, "--step-marker"),
    ("step-marker-backreference", None, None, ["--step-marker", r"(a)\1"], 2, "--step-marker"),
    # 4. OS, encoding, recursion and value errors.
    (
        "rules-latin1",
        None,
        rules("# caf\xe9\nthresholds: {min_share: 0.1}\n".encode("latin-1")),
        [],
        2,
        "UTF-8",
    ),
    ("rules-binary", None, rules(bytes(range(256)) * 8), [], 2, "rules.yaml"),
    ("rules-nested", None, rules("library_ops: " + nested(50_000)), [], 2, "nested"),
    ("manifest-nested", nested_manifest, None, [], 2, "nested"),
    (
        "regions-nested",
        lambda run: (run / "regions.jsonl").write_text(nested(100_000) + "\n"),
        None,
        [],
        0,
        "regions.jsonl",
    ),
    ("kernel-durations-zero", edit_kernels(10**6, lambda e: e.update(dur=0)), None, [], 2, "duration"),
    ("kernel-durations-missing", edit_kernels(10**6, lambda e: e.pop("dur")), None, [], 2, "duration"),
    ("input-dims-huge", lambda run: edit_trace(run, huge_input_dims), None, [], 0, ""),
    ("cpu-op-duration-huge", lambda run: edit_trace(run, huge_cpu_dur), None, [], 0, "malformed"),
]


@pytest.mark.parametrize(
    ("mutate", "make_rules", "args", "code", "text"),
    [c[1:] for c in REPORT_CASES],
    ids=[c[0] for c in REPORT_CASES],
)
def test_report_on_hostile_input(tmp_path, mutate, make_rules, args, code, text):
    run = copy_run(tmp_path)
    if mutate is not None:
        mutate(run)
    inputs = [run]
    if make_rules is not None:
        path = make_rules(tmp_path)
        args = [*args, "--rules", path]
        inputs.append(path)
    got = outcome(["report", run, "--format", "json", *args], text, inputs)
    assert got == expect(code, text)


def middle_kernel_lasts(us: float):
    """A kernel in the middle of the trace (inside a step) made to last ``us`` µs."""

    def edit(data):
        events = kernel_events(data)
        events[len(events) // 2]["dur"] = us

    return edit


def fifo(tmp: Path) -> Path:
    path = tmp / "trace.json"
    os.mkfifo(path)
    return path


# (id, arguments with TMP for the case's folder, expected exit code, expected text)
PATH_CASES = [
    ("name-too-long", ["report", "TMP/" + "x" * 300 + ".json"], 2, "name too long"),
    ("url-without-s3fs", ["report", "s3://bucket/run/"], 3, "s3fs"),
    ("url-unknown-protocol", ["report", "nosuch://bucket/trace.json"], 2, "nosuch"),
    ("rules-is-a-directory", ["report", "EXAMPLE", "--rules", "TMP"], 2, "directory"),
    ("ncu-is-a-directory", ["report", "TRACE", "--ncu", "TMP"], 2, "directory"),
    ("trace-is-dev-null", ["report", "/dev/null"], 2, "not a regular file"),
    ("rules-is-dev-zero", ["report", "EXAMPLE", "--rules", "/dev/zero"], 2, "not a regular file"),
    ("ncu-is-dev-zero", ["report", "TRACE", "--ncu", "/dev/zero"], 2, "not a regular file"),
    ("diff-rules-is-a-directory", ["diff", "EXAMPLE", "EXAMPLE", "--rules", "TMP"], 2, "directory"),
    (
        "scaffold-shape-trailing-x",
        ["scaffold", "--kind", "rmsnorm", "--shape", "16x", "--out", "TMP/k"],
        2,
        "16x",
    ),
    (
        "scaffold-shape-absurd",
        ["scaffold", "--kind", "rmsnorm", "--shape", "99999999999x99999999999", "--out", "TMP/k"],
        2,
        "--shape",
    ),
    (
        "scaffold-shape-zero",
        ["scaffold", "--kind", "rmsnorm", "--shape", "0x4096", "--out", "TMP/k"],
        2,
        "--shape",
    ),
    (
        "profile-coverage-nan",
        ["profile", "--cpu", "--coverage", "nan", "--", "python", "TMP/x.py"],
        2,
        "--coverage",
    ),
    (
        "profile-ncu-timeout-nan",
        ["profile", "--cpu", "--ncu-timeout", "nan", "--", "python", "TMP/x.py"],
        2,
        "--ncu-timeout",
    ),
    (
        "profile-step-marker-bad",
        ["profile", "--cpu", "--step-marker", "(", "--", "python", "TMP/x.py"],
        2,
        "--step-marker",
    ),
    (
        "profile-rules-latin1",
        ["profile", "--cpu", "--rules", "LATIN1", "--", "python", "TMP/x.py"],
        2,
        "UTF-8",
    ),
]


@pytest.mark.parametrize(
    ("args", "code", "text"), [c[1:] for c in PATH_CASES], ids=[c[0] for c in PATH_CASES]
)
def test_paths_and_flags(tmp_path, args, code, text):
    from tests.helpers import EXAMPLE_RUN

    (tmp_path / "latin1.yaml").write_bytes("# caf\xe9\n".encode("latin-1"))
    (tmp_path / "x.py").write_text("raise SystemExit('never runs')\n")
    names = {
        "TMP": str(tmp_path),
        "EXAMPLE": str(EXAMPLE_RUN),
        "TRACE": str(EXAMPLE_RUN / "trace.json.gz"),
        "LATIN1": str(tmp_path / "latin1.yaml"),
    }
    args = [a.replace("TMP", names["TMP"]) if a.startswith("TMP") else names.get(a, a) for a in args]
    got = outcome(args, text, [EXAMPLE_RUN, tmp_path / "latin1.yaml"], fmt_json=False)
    assert got == expect(code, text)


# --- the Python API: the CLI's checks, raised as InputError ---------------------------------

API_CASES = [
    ("share-5", {"min_share": 5}),
    ("share-string", {"min_share": "x"}),
    ("share-nan", {"min_share": float("nan")}),
    ("shapes-0", {"max_shapes": 0}),
    ("shapes-fraction", {"max_shapes": 2.5}),
    ("headroom-below-1", {"min_headroom": 0.5}),
    ("gpu-int", {"gpu": 1}),
    ("gpu-object", {"gpu": object()}),
    ("gpu-empty", {"gpu": " "}),
    ("step-marker-int", {"step_marker": 5}),
    ("step-marker-backtracking", {"step_marker": r"(a)\1"}),
]


@pytest.mark.parametrize("kwargs", [c[1] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_checks_what_the_cli_checks(kwargs):
    from tests.helpers import EXAMPLE_RUN

    with pytest.raises(InputError):
        kerneltriage.report(EXAMPLE_RUN, **kwargs)


def test_exporting_no_report_is_input_error(tmp_path):
    from tests.helpers import EXAMPLE_RUN

    profile = kerneltriage.load(EXAMPLE_RUN)
    with pytest.raises(InputError, match="no report"):
        kerneltriage.export_tables(profile, {}, tmp_path / "tables")


# --- cases that need a process of their own ---------------------------------------------------


def run_cli(args: list[str], **kwargs) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kerneltriage", *map(str, args)],
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            env=env,
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        return -9, "hang"
    return done.returncode, done.stderr


BACKTRACKING = r"^(\w|\w)*!$"


def long_kernel_name(run: Path) -> None:
    edit_kernels(1, lambda e: e.update(name="k" * 5000))(run)


SUBPROCESS_CASES = [
    # (id, setup(tmp) -> args, expected code, text on stderr)
    ("trace-is-a-fifo", lambda tmp: ["report", fifo(tmp)], 2, "not a regular file"),
    ("rules-is-a-fifo", lambda tmp: ["report", copy_run(tmp), "--rules", fifo(tmp)], 2, "not a regular file"),
    (
        "stdout-full",
        lambda tmp: ["report", copy_run(tmp), "--format", "markdown"],
        2,
        "standard output",
    ),
    (
        "rules-backtracking-pattern",
        lambda tmp: (
            long_kernel_name(run := copy_run(tmp)),
            rules(f"op_classes: [{{kind: gemm, kernels: ['{BACKTRACKING}']}}]")(tmp),
            ["report", run, "--rules", tmp / "rules.yaml", "-o", tmp / "out.json", "--format", "json"],
        )[-1],
        0,
        "wrote",
    ),
    (
        "step-marker-backtracking",
        lambda tmp: ["report", copy_run(tmp), "--step-marker", BACKTRACKING, "-o", tmp / "out.md"],
        0,
        "wrote",
    ),
]


@pytest.mark.parametrize(
    ("setup", "code", "text"), [c[1:] for c in SUBPROCESS_CASES], ids=[c[0] for c in SUBPROCESS_CASES]
)
def test_in_a_process_of_its_own(tmp_path, setup, code, text):
    args = setup(tmp_path)
    with open("/dev/full" if "markdown" in args else os.devnull, "w") as stdout:
        got, err = run_cli(args, stdout=stdout)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    one_line = len(lines) == 1 and "Traceback" not in err
    assert (got, one_line, text in err) == (code, True, True), err[-3000:]


# --- profile --force: the old run stays until the new one is complete ------------------------


FAILING = "raise SystemExit(5)\n"
NO_STEPS = "import torch\nfor _ in range(3):\n    torch.ones(4) @ torch.ones(4)\n"


@pytest.mark.parametrize(
    ("script", "code", "replaced"),
    [(FAILING, 3, False), (NO_STEPS, 0, True)],
    ids=["failed-script-keeps-the-old-run", "complete-run-replaces-it"],
)
def test_profile_force_replaces_only_with_a_complete_run(tmp_path, script, code, replaced):
    run = copy_run(tmp_path)
    old = fingerprint(run)
    (tmp_path / "train.py").write_text(script)
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "-q",
            "--cpu",
            "--force",
            "--out",
            str(run),
            "--",
            sys.executable,
            str(tmp_path / "train.py"),
        ],
    )
    now = fingerprint(run)
    manifest = json.loads((run / "manifest.json").read_text())
    state = (
        result.exit_code,
        now != old,
        manifest.get("status"),
        sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")),
    )
    assert state == (code, replaced, "ok", []), result.output


def test_profile_out_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "train.py").write_text(NO_STEPS)
    args = [
        "profile",
        "-q",
        "--cpu",
        "--out",
        "/proc/kerneltriage-run",
        "--",
        sys.executable,
        str(tmp_path / "train.py"),
    ]
    got = outcome(args, "/proc/kerneltriage-run", [tmp_path / "train.py"], fmt_json=False)
    assert got == expect(2, "")
