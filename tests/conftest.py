"""Test set-up shared by every test module.

Kernel tests run on a CUDA GPU when there is one, else on CPU tensors through Triton's
interpreter; TRITON_INTERPRET must be set before triton is first imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import CORPUS_SKIP, EXTERNAL, corpus_present

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _cuda_possible() -> bool:
    """Whether torch could see a GPU, without importing torch (3 s of every run, most of
    which never touch it): a CUDA build of torch (its version.py names a CUDA) and a device."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        version = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return _cuda_available()
    built_with_cuda = re.search(r"^cuda\b[^=]*=\s*['\"]", version, re.M) is not None
    return built_with_cuda and any(Path("/dev").glob("nvidia[0-9]*"))


if not _cuda_possible():
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


@pytest.fixture(scope="session")
def external_traces() -> Path:
    """The corpus's external-traces/ folder (tests/helpers.py says where). A test or fixture
    that requests it is skipped, as a `corpus`-marked test is, when the corpus is absent."""
    if not corpus_present():
        pytest.skip(CORPUS_SKIP)
    return EXTERNAL


def pytest_configure(config):
    if os.environ.get("KERNELTRIAGE_REQUIRE_CORPUS") and not corpus_present():  # CI: none may skip
        raise pytest.UsageError(f"KERNELTRIAGE_REQUIRE_CORPUS is set but {CORPUS_SKIP.partition(': ')[2]}")
    config.addinivalue_line(
        "markers",
        "corpus: reads the third-party trace corpus ($KERNELTRIAGE_CORPUS, else ../shared beside the "
        "checkout); skipped with a reason when it is absent",
    )


def _needs_corpus(item) -> bool:
    return item.get_closest_marker("corpus") is not None or "external_traces" in getattr(
        item, "fixturenames", ()
    )


def pytest_terminal_summary(terminalreporter):
    """One line saying how many tests the absent corpus skipped (and how to run them); one
    naming the worker processes the tests left running, which are stopped here: the
    interpreter's exit would wait for them, and a hung one would hold the run forever."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if CORPUS_SKIP in str(r.longrepr)]
    if skipped:
        terminalreporter.write_sep("-", f"{len(skipped)} skipped: {CORPUS_SKIP}", yellow=True)
    import multiprocessing

    left = multiprocessing.active_children()
    for process in left:
        process.terminate()
    if left:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in left)
        terminalreporter.write_sep(
            "-", f"stopped {len(left)} process(es) the tests left running: {names}", red=True
        )


# --- the quick subset: `pytest -m "not slow"` (README; CI runs everything) ----------------------
# Slow: Triton kernels under the interpreter, the corpus of external traces and the tests that
# read those traces one by one, headless-Chromium screenshots, real profiling sessions
# (subprocesses, ncu/nsys stand-ins with timeouts), scaffolded packages running their own
# tests, and end-to-end runs that repeat what faster tests check piece by piece. Listed here,
# by file or test, so the list is one place to read.
SLOW = (
    "tests/kernels/",
    "tests/corpus/",
    "tests/render/test_screenshot.py",
    "tests/profile/test_fidelity.py",
    "tests/profile/test_distributed.py",
    "tests/profile/test_session.py",
    "tests/verify/test_trials.py",
    "tests/recipes/test_install.py::test_compile_model_compiles_the_root_of_a_bert_mlm",
    "tests/recipes/test_install.py::test_norm_swap_on_hugging_face_llama_takes_the_drop_in",
    "tests/ingest/test_kineto_stream.py",
    "tests/scaffold/test_scaffold.py::test_scaffold_renders_lints_and_passes_its_tests",
    "tests/scaffold/test_scaffold.py::test_bench_smoke_writes_json",
    "tests/scaffold/test_scaffold.py::test_generated_kernels_compile_for_sm90",
    "tests/scaffold/test_scaffold.py::test_cli_refuses_non_empty_out_unless_force",
    "tests/scaffold/test_scaffold.py::test_cli_unknown_candidate_lists_valid_ids",
    "tests/scaffold/test_scaffold.py::test_class_without_template_says_so_and_writes_generic",
    "tests/analysis/compare/test_diff.py::test_cli_formats",
    "tests/analysis/compare/test_ranks.py::test_cli_json_for_several_ranks",
    "tests/render/test_plots.py::test_cli_plot",
    "tests/render/test_html.py::test_cli_writes_html",
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
    # Measured (CPU time per test, `-m "not slow"` on the 2-core machine, 2026-11-22): each of
    # these took 0.5 s or more (a module's first quick test pays its fixtures, so a second
    # measurement added those), most of it building a report of a shipped run that a faster
    # test also checks. Together they were five sixths of the subset's 190 s of CPU.
    "tests/analysis/timeline/test_attribution.py::test_active_steps_are_the_two_profiler_steps",
    "tests/analysis/timeline/test_attribution.py::test_kerneltriage_step_ranges",
    "tests/analysis/timeline/test_attribution.py::test_optimizer_steps_when_there_is_no_profiler_step",
    "tests/analysis/timeline/test_attribution.py::test_pytorch_1_9_profiler_steps_are_steps_in_any_category",
    "tests/analysis/timeline/test_attribution.py::test_whole_trace_when_no_step_is_marked",
    "tests/analysis/timeline/test_compiled.py::test_a_gather_does_not_read_its_whole_table",
    "tests/analysis/timeline/test_compiled.py::test_an_eager_run_has_no_compiled_section",
    "tests/analysis/timeline/test_compiled.py::test_an_inductor_kernel_at_its_roof_is_skip_compiled_at_roof",
    "tests/analysis/timeline/test_compiled.py::test_diff_matches_compiled_kernels_with_the_eager_ops_they_replaced",
    "tests/analysis/timeline/test_compiled.py::test_every_inductor_kernel_of_the_compiled_example_is_a_candidate_with_a_ceiling",
    "tests/analysis/compare/test_diff.py::test_a_run_against_itself_changes_nothing",
    "tests/analysis/compare/test_diff.py::test_before_and_after_the_fix",
    "tests/analysis/compare/test_diff.py::test_built_in_kernels_realize_attention_and_norm_savings",
    "tests/analysis/compare/test_diff.py::test_candidates_match_by_what_they_compute",
    "tests/analysis/compare/test_diff.py::test_ceilings_from_different_sources_are_flagged",
    "tests/analysis/compare/test_diff.py::test_naive_attention_replaced_by_sdpa_realizes_the_prediction",
    "tests/analysis/compare/test_diff.py::test_not_comparable_runs_are_flagged",
    "tests/analysis/test_gpus.py::test_device_properties_entry_is_the_kernels_device",
    "tests/analysis/test_gpus.py::test_nameless_mi300x_and_the_unnamed_mi250_gcd",
    "tests/analysis/timeline/test_idle.py::test_profiler_steps_are_never_an_idle_cause",
    "tests/analysis/test_kernel_classes.py::test_mangled_names_classify_like_their_demangled_spelling",
    "tests/analysis/compare/test_ranks.py::test_a_missing_rank_trace_reports_the_ranks_present",
    "tests/analysis/compare/test_ranks.py::test_every_rank_is_reported",
    "tests/analysis/compare/test_ranks.py::test_stragglers_are_flagged",
    "tests/analysis/candidates/test_roofline.py",
    "tests/analysis/test_rules.py::test_missing_rules_file",
    "tests/analysis/test_triage.py::test_naive_attention_region_ranks_first",
    "tests/analysis/test_triage.py::test_thresholds_come_from_rules",
    "tests/ingest/test_kineto.py::test_other_json_layouts_read_the_same",
    "tests/ingest/test_nsys.py::test_report_on_export_without_nvtx",
    "tests/ingest/test_nsys.py::test_report_separates_communication",
    "tests/ingest/test_source.py::test_the_rank_is_peeked_from_the_head_of_the_file",
    "tests/profile/test_nsight_compute.py::test_phase_two_end_to_end_with_a_stand_in_ncu",
    "tests/profile/test_nsys_timeline.py::test_an_nsys_export_is_the_timeline",
    "tests/render/test_diff_render.py::test_a_slowdown_reads_as_a_slowdown",
    "tests/render/test_html.py::test_escapes_trace_text",
    "tests/render/test_html.py::test_idle_warning_comes_first",
    "tests/render/test_html.py::test_no_actionable_candidates",
    "tests/render/test_html.py::test_render_dispatches_html",
    "tests/render/test_html.py::test_self_contained",
    "tests/render/test_plots.py::test_degenerate_reports_still_draw",
    "tests/render/test_plots.py::test_hostile_names_stay_escaped_in_svg",
    "tests/render/test_plots.py::test_save_png",
    "tests/render/test_plots.py::test_save_svg",
    "tests/render/test_ranks_render.py::test_html_is_one_document_with_a_section_per_rank",
    "tests/render/test_ranks_render.py::test_the_example_numbers_ids_per_rank",
    "tests/render/test_render.py::test_a_report_without_a_gpu_renders_in_every_format",
    "tests/render/test_render.py::test_header_says_how_a_nameless_gpu_was_found",
    "tests/scaffold/test_scaffold.py::test_readme_carries_verdict_conditions_ceiling_and_ladder",
    "tests/scaffold/test_scaffold_gpu.py::test_no_gpu_is_a_one_line_error_asking_for_gpu",
    "tests/test_api.py::test_diff",
    "tests/test_api.py::test_importing_and_reporting_need_no_torch",
    "tests/test_api.py::test_kernels_table",
    "tests/test_api.py::test_ops_table",
    "tests/test_api.py::test_options_are_the_clis_flags",
    "tests/test_api.py::test_profile_reports_reuse_what_was_read",
    "tests/test_api.py::test_report_is_the_clis_report",
    "tests/test_api.py::test_several_ranks",
    "tests/test_cli.py::test_a_slowdown_reads_as_a_slowdown",
    "tests/test_cli.py::test_export_as_parquet",
    "tests/test_cli.py::test_export_writes_every_table",
    "tests/test_cli.py::test_one_rank_picked_names_its_rank_in_scaffold_commands",
    "tests/test_cli.py::test_report_as_csv_is_the_candidates_table",
    "tests/test_cli.py::test_report_on_a_trace_with_counters_as_json",
    "tests/test_cli.py::test_report_on_the_shipped_example",
    "tests/test_cli.py::test_scaffold_a_rank",
    "tests/test_cli.py::test_thresholds_from_flags",
    "tests/test_layers.py::test_the_graph_is_read",
    "tests/test_parallel.py::test_cli_scheduler",
    "tests/test_parallel.py::test_cli_without_the_dask_extra",
    "tests/test_parallel.py::test_workers_make_the_reports_one_process_makes",
    "tests/test_robustness.py::test_a_full_disk_is_one_line",
    "tests/test_robustness.py::test_bad_input",
    "tests/test_robustness.py::test_duplicated_events_are_dropped",
    "tests/test_robustness.py::test_outputs_are_written_whole",
    "tests/test_robustness.py::test_the_ncu_rank_warning_names_the_cause",
    "tests/test_robustness.py::test_ncu_report_without_ncu_is_one_line_exit_3",
    "tests/test_parallel.py::test_an_hta_rank_folder",
    "tests/analysis/timeline/test_compiled.py::test_diff_checks_the_predictions_of_the_eager_report",
    "tests/analysis/timeline/test_compiled.py::test_library_kernels_inside_compiled_code_keep_their_kinds",
    "tests/render/test_diff_render.py::test_html_is_styled_like_the_report_and_charts_the_savings",
    "tests/analysis/timeline/test_attribution.py::test_pytorch_1_9_backward_and_optimizer_phases",
    "tests/render/test_ranks_render.py::test_terminal_summary_is_rich_tables",
    "tests/scaffold/test_scaffold.py::test_attention_constants_and_builtin",
    "tests/analysis/compare/test_ranks.py::test_summary_across_ranks",
    "tests/render/test_render.py::test_plot_without_a_gpu",
    "tests/scaffold/test_scaffold.py::test_cross_entropy_constants_from_concrete_inputs",
    "tests/analysis/timeline/test_compiled.py::test_diff_renders_the_compiled_table",
    "tests/analysis/timeline/test_compiled.py::test_graph_breaks_recompiles_and_the_launch_bound_graph_of_the_compiled_example",
    "tests/analysis/compare/test_ranks.py::test_ranks_with_different_step_counts_are_flagged",
    "tests/render/test_diff_render.py::test_html_marks_a_slowdown",
    "tests/render/test_ranks_render.py::test_markdown_has_tables_and_a_section_per_rank",
    # Measured again (wall time, `-m "not slow"` on the 2-core machine, 2026-11-26, while other
    # work ran on it): 1.7 s or more each, 45 s of a subset that took 140 s.
    "tests/test_cli.py::test_cli_and_api_pick_the_counters_rank",
    "tests/test_hostile.py::test_profile_force_replaces_only_with_a_complete_run",
    "tests/verify/test_plan.py::test_diff_shows_what_verify_measured_on_the_run_before",
    "tests/test_apply.py::test_apply_swaps_the_verified_norms_at_the_first_forward_and_refuses_what_cannot_hold",
    "tests/recipes/test_install.py::test_compile_module_compiles_every_instance_of_the_class",
    "tests/test_hostile3.py::test_input_dims_no_gpu_could_hold_are_warned_and_ignored",
    "tests/test_hostile3.py::test_a_writable_output_is_still_replaced",
    "tests/test_hostile3.py::test_counters_that_imply_impossible_rates_are_left_unmeasured",
    "tests/analysis/timeline/test_compiled.py::test_the_terminal_report_says_it",
    "tests/scaffold/test_scaffold.py::test_hostile_trace_names_stay_inert",
    "tests/test_hostile.py::test_report_on_hostile_input",
    "tests/test_hostile.py::test_in_a_process_of_its_own",
    "tests/analysis/fixes/test_fix_scope.py::test_compiling_the_attention_module_counts_the_eager_softmax_chain",
    "tests/analysis/test_triage.py::test_attention_fused_ceiling_is_traceable_to_shapes",
    "tests/test_docs.py::test_every_sample_is_what_the_tool_prints_today",  # a report each, 10 s
    "tests/test_corpus_skip.py",  # pytest in a subprocess
    # Measured once more (16:31, 82 s of wall time for the subset): 1.2 s or more each.
    "tests/test_hostile3.py::test_rates_above_the_gpu_are_warned_and_their_rows_marked_in_every_format",
    "tests/analysis/compare/test_diff.py::test_every_diff_format_shows_the_fixes_and_their_combination",
    "tests/test_hostile3.py::test_a_step_time_of_a_rank_the_run_lacks_is_named",
    "tests/test_hostile3.py::test_diff_says_what_report_says_about_a_rules_file",
    "tests/test_hostile3.py::test_a_kernel_timed_far_outside_the_recording_is_dropped_by_name",
    "tests/test_hostile3.py::test_colliding_external_ids_are_ignored_and_named",
    "tests/test_apply.py::test_apply_with_the_model_applies_now",
    "tests/analysis/compare/test_diff.py::test_a_diff_against_another_run_than_the_parent_is_flagged",
    "tests/test_hostile3.py::test_a_trace_shifted_to_negative_times_reports_as_before",
    "tests/test_hostile3.py::test_a_stray_rank_trace_is_left_out_and_named",
    "tests/test_hostile3.py::test_export_refuses_a_read_only_table_before_replacing_any",
    "tests/render/test_plots.py::test_roof_labels_stay_clear_of_points_and_above_arrows",
)


def _quick_only(config) -> bool:
    return (config.option.markexpr or "").strip() == "not slow"


def pytest_ignore_collect(collection_path, config):
    """With ``-m "not slow"``, folders and files that are slow as a whole are not even
    imported (their modules import torch and the kernels: seconds of a quick run)."""
    if not _quick_only(config):
        return None
    try:
        path = Path(collection_path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    whole = [slow for slow in SLOW if "::" not in slow]
    if any(path == slow.rstrip("/") or path.startswith(slow) for slow in whole):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    if not corpus_present():
        for item in items:
            if _needs_corpus(item):
                # First, so that this reason shows rather than "got empty parameter set" for a
                # parametrization over the corpus's files.
                item.add_marker(pytest.mark.skip(reason=CORPUS_SKIP), append=False)
    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        test = f"{path}::{item.originalname or item.name}"
        # "path/": a folder; "path.py": a file; "path.py::name": a test (all its parameters)
        if any(test == slow if "::" in slow else path.startswith(slow) for slow in SLOW):
            item.add_marker(pytest.mark.slow)
