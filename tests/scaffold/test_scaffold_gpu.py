"""The GPU in a scaffold: the package's benchmark measures against the ceilings the report used,
and a report without a GPU (a trace with no name and no deviceProperties) asks for ``--gpu``."""

from __future__ import annotations

import ast

import pytest
from click.testing import CliRunner

from kerneltriage.api import build_report
from kerneltriage.cli import main
from kerneltriage.errors import InputError
from kerneltriage.scaffold import plan_candidate, scaffold_candidate
from kerneltriage.scaffold.common import gpu_context
from tests.helpers import EXTERNAL, corpus

DLRM = EXTERNAL / "hta-dlrm-2rank-a100" / "sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def no_gpu_report(external_traces):
    return build_report(DLRM)


def test_no_gpu_is_a_one_line_error_asking_for_gpu(no_gpu_report, tmp_path):
    assert no_gpu_report.gpu is None
    with pytest.raises(InputError, match=r"pass --gpu KEY") as err:
        scaffold_candidate(DLRM, "C2", tmp_path / "c2", report=no_gpu_report)
    assert "\n" not in str(err.value) and "A100-40GB" in str(err.value)
    assert not (tmp_path / "c2").exists()  # nothing written
    with pytest.raises(InputError, match="ceilings"):
        gpu_context(None)
    result = CliRunner().invoke(main, ["scaffold", str(DLRM), "C2", "--out", str(tmp_path / "cli")])
    assert result.exit_code == 2 and "pass --gpu KEY" in result.output
    assert "Traceback" not in result.output


@corpus
def test_the_benchmark_measures_against_the_ceilings(tmp_path):
    report = build_report(DLRM, gpu="A100-40GB")
    gpu = report.gpu
    assert (gpu.key, gpu.resolved_by) == ("A100-40GB", "--gpu")
    _, context, _ = plan_candidate(report, "C2")
    assert context["gpu"]["bandwidth_gbs"] == pytest.approx(gpu.ceiling_bandwidth_gbs, abs=0.05)
    assert context["gpu"]["bandwidth_gbs"] < gpu.peak_bandwidth_gbs  # datasheet × achievable
    result = scaffold_candidate(DLRM, "C2", tmp_path / "c2", report=report)
    bench = (result.out / "bench.py").read_text()
    table = next(
        node.value
        for node in ast.parse(bench).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "GPU"
    )
    literal = ast.literal_eval(table)
    assert literal["bandwidth_gbs"] == pytest.approx(gpu.ceiling_bandwidth_gbs, abs=0.05)
    for precision, ceiling in gpu.ceiling_tflops.items():
        assert literal["peak_tflops"][precision] == pytest.approx(ceiling, abs=0.005)
