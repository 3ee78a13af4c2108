"""Fuzzing the inputs of the shipped runs (issue 18): traces, ncu CSVs, manifests,
``regions.jsonl`` and rules files mutated by hypothesis, each through ``kerneltriage report``.

Whatever the mutation, the command ends with a report (exit 0) or one line (exit 2), never an
uncaught exception, and a report never states an impossible number. Derandomized (the same
examples on every run) and bounded to about a minute on two cores.
"""

from __future__ import annotations

import copy
import csv
import functools
import gzip
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneltriage.cli import main
from tests.helpers import EXAMPLE_RUN
from tests.test_robustness import assert_possible

pytestmark = pytest.mark.slow

RUNS = (EXAMPLE_RUN, EXAMPLE_RUN.parent / "gpt-builtin-h200")
EXAMPLES = 30  # about two seconds each on two loaded cores


@functools.cache
def base(run: Path) -> dict:
    rows = list(csv.reader(io.StringIO(gzip.decompress((run / "ncu.csv.gz").read_bytes()).decode())))
    return {
        "trace": json.loads(gzip.decompress((run / "trace.json.gz").read_bytes())),
        "ncu": rows,
        "manifest": json.loads((run / "manifest.json").read_text()),
        "regions": (run / "regions.jsonl").read_text().splitlines(),
    }


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.lists(st.lists(st.integers(min_value=-3, max_value=3), max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
cells = st.one_of(
    st.sampled_from(
        ["n/a", "", "-1", "1e309", "nan", "inf", "1,5", "0,25", "abc", "-0", "1.980.000", "(1, 2)"]
    ),
    st.text(max_size=6),
)
EVENT_FIELDS = ("ts", "dur", "name", "cat", "args", "ph", "pid", "tid")
ARG_FIELDS = ("grid", "block", "External id", "correlation", "Input Dims", "Input type", "device", "stream")
THRESHOLDS = ("min_headroom", "min_share", "max_shapes", "gap_us", "join_warn", "max_estimated_headroom")


@st.composite
def mutations(draw):
    run = draw(st.sampled_from(RUNS))
    target = draw(st.sampled_from(["trace", "trace", "ncu", "manifest", "regions", "rules"]))
    return run, target, draw(st.randoms(use_true_random=False)), draw(st.lists(junk, min_size=3, max_size=3))


def mutate_trace(data: dict, rnd, values: list) -> dict:
    data = dict(data)
    events = list(data["traceEvents"])
    action = rnd.choice(["field", "field", "arg", "delete", "duplicate", "meta", "all-durations"])
    i = rnd.randrange(len(events))
    event = copy.deepcopy(events[i])
    if action == "field":
        event[rnd.choice(EVENT_FIELDS)] = values[0]
    elif action == "arg" and isinstance(event.get("args"), dict):
        event["args"][rnd.choice(ARG_FIELDS)] = values[0]
    elif action == "delete" and event:
        event.pop(rnd.choice(sorted(event)))
    elif action == "duplicate":
        events.insert(i, copy.deepcopy(event))
    elif action == "meta":
        data[rnd.choice(["deviceProperties", "distributedInfo", "traceEvents"])] = values[0]
    elif action == "all-durations":
        factor = values[1] if isinstance(values[1], (int, float)) and not isinstance(values[1], bool) else -1
        events = [
            {**e, "dur": e["dur"] * factor} if isinstance(e, dict) and "dur" in e else e for e in events
        ]
    if isinstance(data.get("traceEvents"), list):
        events[i if i < len(events) else 0] = event
        data["traceEvents"] = events
    return data


def mutate_ncu(rows: list[list[str]], rnd, cell: str) -> list[list[str]]:
    rows = [list(r) for r in rows]
    for _ in range(rnd.randint(1, 3)):
        r = rnd.randrange(len(rows))
        rows[r][rnd.randrange(len(rows[r]))] = cell
    return rows


def mutate_manifest(data: dict, rnd, value) -> dict:
    data = copy.deepcopy(data)
    where = rnd.choice(
        [data, data, data["schedule"], data["phases"], data["phases"].get("ncu", {}), data["calibration"]]
    )
    key = rnd.choice(sorted(where)) if where else "x"
    if rnd.random() < 0.2:
        where.pop(key, None)
    else:
        where[key] = value
    return data


def rules_text(rnd, value) -> str:
    choice = rnd.choice(["threshold", "op_classes", "recommendation", "regions", "top"])
    if choice == "threshold":
        data = {"thresholds": {rnd.choice(THRESHOLDS): value}}
    elif choice == "op_classes":
        data = {"op_classes": [{"kind": "gemm", rnd.choice(["ops", "kernels", "activity"]): value}]}
    elif choice == "recommendation":
        data = {"recommendations": {rnd.choice(["gemm", "norm", "attention"]): value}}
    elif choice == "regions":
        data = {"regions": {rnd.choice(["attention", "norms", "boundary_kinds", "kind_priority"]): value}}
    else:
        data = {rnd.choice(["thresholds", "op_classes", "kernel_kinds", "fixes", "library_ops"]): value}
    try:
        return yaml.safe_dump(data)
    except yaml.YAMLError:
        return "thresholds: {min_share: .nan}\n"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutations())
def test_mutated_inputs_never_crash_or_lie(case):
    run, target, rnd, values = case
    data = base(run)
    with tempfile.TemporaryDirectory() as tmp:
        copy_ = Path(tmp) / "run"
        shutil.copytree(run, copy_)
        args = []
        if target == "trace":  # plain JSON under the .gz name: the reader goes by the bytes
            (copy_ / "trace.json.gz").write_text(json.dumps(mutate_trace(data["trace"], rnd, values)))
        elif target == "ncu":
            out = io.StringIO()
            csv.writer(out, quoting=csv.QUOTE_ALL).writerows(mutate_ncu(data["ncu"], rnd, str(values[0])))
            (copy_ / "ncu.csv.gz").write_text(out.getvalue())
        elif target == "manifest":
            (copy_ / "manifest.json").write_text(
                json.dumps(mutate_manifest(data["manifest"], rnd, values[0]))
            )
        elif target == "regions":
            lines = list(data["regions"])
            lines[rnd.randrange(len(lines))] = rnd.choice([json.dumps(values[0]), "\x00\xff", "{"])
            (copy_ / "regions.jsonl").write_text("\n".join(lines), errors="surrogateescape")
        else:
            (Path(tmp) / "rules.yaml").write_text(rules_text(rnd, values[0]))
            args = ["--rules", str(Path(tmp) / "rules.yaml")]
        result = CliRunner().invoke(main, ["report", str(copy_), "--format", "json", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in (0, 2), result.output[-1000:]
    if result.exit_code == 2:
        assert len(result.output.strip().splitlines()) == 1, result.output
    else:
        assert_possible(json.loads(result.output))
