"""The corpus of third-party traces is optional: without it the tests that read it are skipped
with the reason and counted in the summary; CI, which must run them, can require it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import CORPUS_ENV

ROOT = Path(__file__).resolve().parents[1]
MARKED = "tests/ingest/test_source.py::test_the_traces_are_there"  # reads the corpus


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in (CORPUS_ENV, "KERNELTRIAGE_REQUIRE_CORPUS")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_the_corpus_its_tests_are_skipped_with_the_reason_and_counted(tmp_path):
    absent = tmp_path / "no-corpus"
    run = _pytest(MARKED, **{CORPUS_ENV: str(absent)})
    assert run.returncode == 0, run.stdout[-2000:]
    assert "1 skipped" in run.stdout
    reason = f"needs the trace corpus: no {absent / 'external-traces'} (set {CORPUS_ENV}"
    assert f"1 skipped: {reason}" in run.stdout  # the summary line
    assert f"SKIPPED [1] {MARKED.split('::')[0]}" in run.stdout and reason in run.stdout


def test_ci_can_require_the_corpus(tmp_path):
    run = _pytest(MARKED, KERNELTRIAGE_REQUIRE_CORPUS="1", **{CORPUS_ENV: str(tmp_path / "none")})
    assert run.returncode == 4  # a usage error: nothing ran
    assert "KERNELTRIAGE_REQUIRE_CORPUS is set but no" in run.stdout + run.stderr
