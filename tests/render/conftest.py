"""Reports the renderer tests share, built once per session (the analysis is what costs; the
renderers are what these tests check). Read-only: a test that changes one copies it first."""

from __future__ import annotations

from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"


@pytest.fixture(scope="session")
def example_report():
    """examples/runs/gpt-naive-h200: the GPT with naive attention on an H200, with counters."""
    from kerneltriage.api import build_report

    return build_report(RUNS / "gpt-naive-h200")


@pytest.fixture(scope="session")
def sdpa_report():
    """examples/runs/gpt-sdpa-h200: the same GPT with SDPA."""
    from kerneltriage.api import build_report

    return build_report(RUNS / "gpt-sdpa-h200")


@pytest.fixture(scope="session")
def ddp_reports():
    """examples/runs/gpt-ddp-2gpu-h200: the GPT under DDP on two H200s, {rank: Report}."""
    from kerneltriage.api import build_reports

    return build_reports(RUNS / "gpt-ddp-2gpu-h200")
