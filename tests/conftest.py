"""Test set-up shared by every test module.

Kernel tests run on a CUDA GPU when there is one, else on CPU tensors through Triton's
interpreter; TRITON_INTERPRET must be set before triton is first imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _interpreter_numpy_shim(monkeypatch):
    """Triton 3.6's interpreter turns loop bounds into ints with ``int(ndarray of shape (1,))``,
    which NumPy >= 2.4 rejects; use ``.item()`` instead (interpreter only)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if _cuda_available() else "cpu"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


# --- the quick subset: `pytest -m "not slow"` (README; CI runs everything) ----------------------
# Slow: Triton kernels under the interpreter, the corpus of external traces and the tests that
# read those traces one by one, headless-Chromium screenshots, real profiling sessions
# (subprocesses, ncu/nsys stand-ins with timeouts), scaffolded packages running their own
# tests, and end-to-end runs that repeat what faster tests check piece by piece. Listed here,
# by file or test, so the list is one place to read.
SLOW = (
    "tests/kernels/",
    "tests/corpus/",
    "tests/report/test_screenshot.py",
    "tests/profile/test_fidelity.py",
    "tests/profile/test_distributed.py",
    "tests/profile/test_session.py",
    "tests/ingest/test_kineto_stream.py",
    "tests/scaffold/test_scaffold.py::test_scaffold_renders_lints_and_passes_its_tests",
    "tests/scaffold/test_scaffold.py::test_bench_smoke_writes_json",
    "tests/scaffold/test_scaffold.py::test_generated_kernels_compile_for_sm90",
    "tests/scaffold/test_scaffold.py::test_cli_refuses_non_empty_out_unless_force",
    "tests/scaffold/test_scaffold.py::test_cli_unknown_candidate_lists_valid_ids",
    "tests/scaffold/test_scaffold.py::test_class_without_template_says_so_and_writes_generic",
    "tests/analysis/test_diff.py::test_cli_formats",
    "tests/analysis/test_ranks.py::test_cli_json_for_several_ranks",
    "tests/report/test_plots.py::test_cli_plot",
    "tests/report/test_html.py::test_cli_writes_html",
    "tests/scaffold/test_scaffold_gpu.py::test_the_benchmark_measures_against_the_ceilings",
    "tests/profile/test_nsight_compute.py::test_a_report_written_before_a_hang_is_kept",
    "tests/profile/test_nsight_compute.py::test_a_hung_ncu_is_stopped_and_the_timeline_kept",
    "tests/analysis/test_gpus.py::test_amd_launch_floor_is_the_first_percentile_of_the_mi300x_traces",
    "tests/analysis/test_gpus.py::test_inference_without_the_name_agrees_with_the_name",
    "tests/analysis/test_gpus.py::test_every_external_trace_resolves_to_its_row",
    "tests/analysis/test_kernel_classes.py::test_real_names_get_the_expected_class",
    "tests/analysis/test_kernel_classes.py::test_table_covers_every_library_and_kind_that_occurs",
    "tests/analysis/test_kernel_classes.py::test_every_name_of_every_trace_gets_a_sensible_class",
    "tests/ingest/test_source.py::test_separate_captures_claiming_one_rank_are_refused_with_their_names",
    "tests/ingest/test_source.py::test_a_single_trace_checks_its_own_rank",
    "tests/ingest/test_nsys.py::test_report_without_a_gpu_name_still_reports_and_asks_for_gpu",
    "tests/ingest/test_nsys.py::test_report_json_per_device",
    "tests/test_api.py::test_the_notebook_page_runs",
    "tests/test_cli.py::test_several_ranks_as_one_html_document",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        test = f"{path}::{item.originalname or item.name}"
        # "path/": a folder; "path.py": a file; "path.py::name": a test (all its parameters)
        if any(test == slow if "::" in slow else path.startswith(slow) for slow in SLOW):
            item.add_marker(pytest.mark.slow)
