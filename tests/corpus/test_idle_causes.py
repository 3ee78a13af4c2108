"""The idle GPU's headline names its cause, on five traces of ``../shared/external-traces``.

Each trace idles (or waits) for a different reason: kernels queued behind a dependency (DLRM
compiled), one blocking copy (SGLang), DDP's buffer broadcast between launches (CNN DDP),
communication no compute overlaps (recsys), work launched before the profiled window (Qwen).
The report is made once per trace and format through the CLI; what the headline says is
checked against the trace's own events (read with the json module). Read in place.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from tests.helpers import EXTERNAL, corpus

CORPUS = EXTERNAL
pytestmark = corpus
DLRM = CORPUS / "hta-dlrm-compiled-a100-80g" / "rank0.json.gz"
SGLANG = CORPUS / "tracelens-sglang-qwen3-8b-mi300x" / "sglang_Qwen3-8B_prefilldecode.json.gz"
CNN_DDP = CORPUS / "hta-cnn-ddp-a100" / "nccl_data.json.gz"
RECSYS = CORPUS / "hta-recsys-8rank-a100" / "control.json.gz"
QWEN = CORPUS / "tracelens-qwen05b-h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@cache
def _run(path: Path, fmt: str) -> str:
    assert path.is_file(), f"{path} missing (../shared/external-traces must sit beside the checkout)"
    result = CliRunner().invoke(main, ["report", str(path), "--format", fmt])
    assert result.exit_code == 0, result.output[-400:]
    return result.output


def _json(path: Path) -> dict:
    return json.loads(_run(path, "json"))


def _text(path: Path, fmt: str = "terminal") -> str:
    """The rendered text as one line: panel borders and wrapping removed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", _run(path, fmt)).split())


@cache
def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _headline(path: Path) -> str:
    text = _text(path)
    assert "GPU idle" in text, "no idle headline"
    return text[text.index("GPU idle") :]


def test_dlrm_compiled_is_led_by_kernels_waiting_on_a_dependency():
    """150 of the 158 ms of idle per step: kernels already queued (~64 ms before they ran), not
    a host too slow to launch them. The headline says so, not "bound by the host"."""
    rep = _json(DLRM)
    idle = rep["idle"]
    assert idle["above_noise"] and idle["lead"] == "dependency wait"
    assert idle["classes"]["dependency wait"] >= 0.85 * idle["ms_per_step"]
    # The trace's own GPU activities that ran ≥ 50 ms after their launch: the queue is real.
    events = _events(DLRM)
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    queued = [
        e
        for e in events
        if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
        and e["args"].get("correlation") in launch
        and e["ts"] - launch[e["args"]["correlation"]] >= 50_000
    ]
    assert len(queued) >= 5
    head = _headline(DLRM)
    assert "Led by dependency wait" in head and "bound by the host" not in head
    assert f"{idle['classes']['dependency wait']:.0f} ms per step" in head


def test_sglang_one_blocking_copy_is_a_single_stall_and_does_not_dilute_the_shares():
    """One 493 ms gap, spanned by one blocking hipMemcpyWithStream in aten::to, longer than all
    the step's GPU work: named as a single stall; shares are of the step without it."""
    rep = _json(SGLANG)
    idle = rep["idle"]
    copy = max(
        (e for e in _events(SGLANG) if e.get("name") == "hipMemcpyWithStream" and e.get("ph") == "X"),
        key=lambda e: e["dur"],
    )
    assert idle["lead"] == "single stall"
    stall = next(g for g in rep["gaps"] if g["kind"] == "single stall")
    assert stall["cause"].endswith("host sync: hipMemcpyWithStream in aten::to")
    assert stall["example_ms"] == pytest.approx(copy["dur"] / 1e3, rel=0.01)
    assert stall["ms_per_step"] > rep["gpu_busy_ms"]
    assert idle["share_step_ms"] == pytest.approx(rep["step_time_ms"] - stall["ms_per_step"], rel=1e-4)
    for c in rep["candidates"]:
        assert c["time_share"] == pytest.approx(c["time_ms_per_step"] / idle["share_step_ms"], rel=1e-3)
    # No other cause is billed for the stall's time.
    assert sum(g["ms_per_step"] for g in rep["gaps"] if g["kind"] != "single stall") < 5
    head = _headline(SGLANG)
    assert "One stall leads it" in head and "hipMemcpyWithStream in aten::to" in head
    assert "the shares below are of the step without it" in head


def test_cnn_ddp_names_the_buffer_broadcast_not_a_microsecond_stream_wait():
    """The 15.7 ms gap each step is aten::unflatten_dense_tensors in DDP's buffer broadcast;
    the cudaStreamWaitEvent calls in it last under 3 µs and are no cause."""
    waits = [e["dur"] for e in _events(CNN_DDP) if e.get("name") == "cudaStreamWaitEvent"]
    assert waits and max(waits) < 3.0  # µs
    rep = _json(CNN_DDP)
    assert rep["idle"]["above_noise"] and rep["idle"]["lead"] == "host busy"
    assert not any("cudaStreamWaitEvent" in g["cause"] for g in rep["gaps"])
    gap = next(g for g in rep["gaps"] if g["cause"] == "host busy: aten::unflatten_dense_tensors")
    unflatten = [
        e["dur"]
        for e in _events(CNN_DDP)
        if e.get("name") == "aten::unflatten_dense_tensors" and e.get("ph") == "X"
    ]
    assert gap["example_ms"] == pytest.approx(max(unflatten) / 1e3, rel=0.05)
    assert "broadcast_buffers=False" in gap["fix"]
    head = _headline(CNN_DDP)
    assert "Led by host busy" in head
    assert "unflatten_dense_tensors" in head and "broadcast_buffers=False" in head


@pytest.mark.parametrize("fmt", ["terminal", "markdown", "html"])
def test_recsys_exposed_communication_leads_in_every_format(fmt):
    """14.7 ms per step (19% of the step) of communication that no compute overlaps: more than
    any idle cause, and in every format, not only the JSON."""
    rep = _json(RECSYS)
    exposed = rep["exposed_communication_ms_per_step"]
    assert exposed == pytest.approx(14.7, abs=0.1)
    assert rep["idle"]["lead"] == "exposed communication"
    assert rep["idle"]["classes"]["exposed communication"] == pytest.approx(exposed)
    share = f"{exposed / rep['step_time_ms']:.0%}"
    assert share == "19%"
    text = _text(RECSYS, fmt)
    assert f"{exposed:.2f} ms exposed ({share} of the step" in text
    if fmt != "html":
        assert f"Led by exposed communication: {exposed:.2f} ms per step ({share} of the step)" in text


def test_qwen_kernels_launched_before_the_window_are_counted_as_unattributed():
    """509 activities launched before the profiled window run inside its step (13.5 ms): no op
    of the trace holds them, so they are unattributed, not "0 µs"."""
    rep = _json(QWEN)
    assert rep["unattributed_before_window_ms"] == pytest.approx(13.48, abs=0.05)
    assert rep["unattributed_ms_per_step"] >= rep["unattributed_before_window_ms"]
    assert rep["kind_breakdown"]["launched before the window"] == pytest.approx(
        rep["unattributed_before_window_ms"]
    )
    text = _text(QWEN)
    assert "Unattributed kernel time: 13.48 ms per step" in text
    assert "13.48 ms of it launched before the profiled window" in text
    # 8% idle, under the 10% cut-off: a line, not a headline.
    assert not rep["idle"]["above_noise"] and "GPU idle" not in text
    assert "not a headline" in text
