"""The depthwise_conv scaffold family: a report's depthwise convolution (ConvNeXt's 7×7, judged
`write` from a synthetic candidate) scaffolds a package with the candidate's shapes, stride,
padding and bias, whose own tests pass under Triton's interpreter; other convolutions keep the
generic starting point; ``--kind depthwise_conv…`` takes the kernel size and stride."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from kerneltriage.analysis.gpus import spec_for
from kerneltriage.analysis.judge.verdict import decide
from kerneltriage.analysis.model import Candidate, KernelInfo, Report, Roofline, Shapes
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.errors import InputError
from kerneltriage.scaffold import FILES, plan_candidate, plan_kind, scaffold_candidate, scaffold_kind
from kerneltriage.scaffold.families import for_kind, for_report_kind
from kerneltriage.scaffold.families.depthwise_conv import conv_params
from tests.scaffold.test_scaffold import PROJECT_RUFF, PYTEST, Job, _env, _ruff

RULES = load_rules()
H100 = spec_for("H100-SXM", "test", "test")
# ConvNeXt-T's first-stage depthwise convolution, bf16 under autocast (the fp32 input cast inside).
CONVNEXT = {
    "name": "aten::conv2d",
    "dims": [[64, 96, 56, 56], [96, 1, 7, 7], [96], [], [], [], []],
    "types": ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Int"],
    "concrete": ["", "", "", "[1, 1]", "[3, 3]", "[1, 1]", "96"],
    "compute_type": "c10::BFloat16",
}


def _op(**changes) -> dict:
    return {**CONVNEXT, **changes}


def _candidate(op: dict, signatures: list[tuple[str, float]] | None = None) -> Candidate:
    """A convolution candidate as the report builds one: 20% of the step, 4× below its roof,
    80% of its time in cuDNN's depthwise backward."""
    kernels = [
        ("conv_depthwise2d_forward_kernel", "fwd", 2.0),
        ("conv_depthwise2d_backward_kernel", "bwd", 3.0),
        ("conv_depthwise2d_grad_weight_kernel", "bwd", 5.0),
    ]
    x, w = op["dims"][0], op["dims"][1]
    sig = f"arg0={'x'.join(map(str, x))} arg1={'x'.join(map(str, w))}"
    if op["dims"][2]:
        sig += f" arg2={op['dims'][2][0]}"
    return Candidate(
        id="",
        name=f"aten::conv2d({'x'.join(map(str, x))}, {'x'.join(map(str, w))})",
        kind="convolution",
        level="op",
        variant=None,
        time_ms_per_step=10.0,
        time_share=0.2,
        gpu_share=0.2,
        fwd_ms_per_step=2.0,
        bwd_ms_per_step=8.0,
        instances_per_step=3.0,
        ops=[op["name"]],
        module="stages.0.blocks.*.conv_dw (Conv2d)",
        kernels=[KernelInfo(n, n, 3.0, ms, phase, True) for n, phase, ms in kernels],
        roofline=Roofline(1.1e9, 2.3e11, 200.0, None, None, "memory", 2.5, "ncu", "bf16"),
        headroom=4.0,
        shapes=Shapes(
            1, 1.0, [], [{"shape": s, "share": share, "count": 3} for s, share in signatures or [(sig, 1.0)]]
        ),
        conditions={},
        example=[op],
    )


def _report(cand: Candidate) -> Report:
    other = Candidate(
        **{
            **cand.__dict__,
            "name": "nccl:all_reduce",
            "kind": "communication",
            "ops": ["nccl:all_reduce"],
            "kernels": [KernelInfo("ncclKernel_AllReduce", "ncclKernel_AllReduce", 1.0, 25.0, "fwd", True)],
            "example": [],
            "time_share": 0.5,
            "conditions": {},
            "attrs": {},
        }
    )
    decide([cand, other], RULES, H100)
    return Report(
        gpu=H100,
        source={},
        steps=3,
        step_source="ProfilerStep",
        step_time_ms=50.0,
        gpu_busy_ms=49.0,
        gpu_busy_pct=98.0,
        idle_pct=2.0,
        gaps=[],
        join=None,
        unattributed_ms_per_step=0.0,
        unattributed_share=0.0,
        kind_breakdown={},
        candidates=[cand, other],
        thresholds=RULES.thresholds,
        warnings=[],
    )


def _assign(text: str, name: str):
    """The value of a module-level ``name = …`` in generated Python."""
    node = next(
        n.value
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == name
    )
    return ast.literal_eval(node)


@pytest.fixture(scope="module")
def convnext(tmp_path_factory):
    """ConvNeXt's candidate scaffolded, its package's suite started in the background."""
    cand = _candidate(CONVNEXT)
    report = _report(cand)
    out = tmp_path_factory.mktemp("dw") / "c"
    result = scaffold_candidate("runs/convnext", cand.id, out, report=report)
    job = Job([sys.executable, "-c", PYTEST], result.out, out.parent / "pytest.log")
    yield cand, result, job
    if job.proc.poll() is None:
        job.proc.kill()


def test_a_depthwise_convolution_judged_write_picks_the_family(convnext):
    cand, result, _ = convnext
    assert cand.verdict == Verdict.WRITE  # the report's verdict on cuDNN's slow depthwise backward
    assert for_report_kind("convolution").name == "depthwise_conv"
    assert result.template == "depthwise_conv" and result.name == "depthwise_conv2d"
    assert [p.name for p in result.files] == list(FILES)
    assert result.messages == []
    files = {p.name: p.read_text() for p in result.files}
    for name, text in files.items():
        if name.endswith(".py"):
            compile(text, name, "exec")
    kernel, test = files["kernel.py"], files["test_kernel.py"]
    assert _assign(kernel, "KERNEL_SIZE") == (7, 7) and _assign(kernel, "STRIDE") == (1, 1)
    assert _assign(kernel, "PADDING") == (3, 3) and _assign(kernel, "HAS_BIAS") is True
    assert _assign(files["reference.py"], "PADDING") == (3, 3)
    observed = _assign(test, "OBSERVED_SHAPES")
    assert [s["layout"] for s in observed] == ["nchw", "channels_last"]  # the trace records no strides
    assert all(s["x"] == (64, 96, 56, 56) and s["weight"] == (96, 1, 7, 7) for s in observed)
    assert all(s["stride"] == (1, 1) and s["padding"] == (3, 3) and s["bias"] for s in observed)
    assert '{"x": torch.bfloat16}' in test  # autocast's compute dtype, not the recorded fp32
    assert "autocast" in files["reference.py"]  # the note says why
    for kernel_name in ("fwd", "dgrad", "wgrad"):
        assert f"def _depthwise_conv2d_{kernel_name}_kernel(" in kernel
    assert "def from_conv(cls, conv: nn.Conv2d)" in kernel and "torch.autograd.Function" in kernel
    readme = files["README.md"]
    assert "**write**" in readme and "x=64x96x56x56 weight=96x1x7x7" in readme
    bench = files["bench.py"]
    assert '"--json", "--out"' in bench and _assign(bench, "GPU")["bandwidth_gbs"] > 1000
    lint = _ruff("check", *PROJECT_RUFF, *(p for p in result.files if p.suffix == ".py"))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    default = _ruff("check", "--no-cache", *(p for p in result.files if p.suffix == ".py"))
    assert default.returncode == 0, default.stdout + default.stderr


@pytest.mark.slow
def test_the_written_package_passes_its_own_tests(convnext):
    _, _, job = convnext
    rc, log = job.result()
    assert rc == 0, log[-6000:]
    summary = log.strip().splitlines()[-1]
    assert " passed" in summary and not any(w in summary for w in ("failed", "error", "skipped")), log[-3000:]


@pytest.mark.slow
def test_bench_smoke_writes_json_with_out(convnext, tmp_path):
    _, result, _ = convnext
    target = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "bench.py", "--smoke", "--fwd-only", "--out", str(target)],
        cwd=result.out,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(target.read_text())
    assert data["schema"] == "kerneltriage.bench/1" and data["op"] == "depthwise_conv2d"
    assert {r["impl"] for r in data["rows"] if r.get("ms")} >= {"kernel", "reference"}
    row = next(r for r in data["rows"] if r["impl"] == "kernel")
    n, c, h, w = 2, 40, 14, 14  # the smoke shape: ConvNeXt's scaled for the interpreter
    assert row["flops"] == 2.0 * n * c * h * w * 49
    assert row["bytes"] == 2 * (2 * n * c * h * w + c * 49 + c)


def test_stride_padding_and_bias_come_from_the_trace(tmp_path):
    """A MobileNet-like 3×3 stride-2 depthwise convolution without bias, two shapes."""
    op = _op(
        dims=[[8, 32, 28, 28], [32, 1, 3, 3], [], [], [], [], []],
        concrete=["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "32"],
    )
    sigs = [("arg0=8x32x28x28 arg1=32x1x3x3", 0.7), ("arg0=8x32x27x27 arg1=32x1x3x3", 0.3)]
    cand = _candidate(op, sigs)
    report = _report(cand)
    template, context, _ = plan_candidate(report, cand.id)
    assert template == "depthwise_conv"
    assert (context["kernel_size"], context["stride"], context["padding"]) == ((3, 3), (2, 2), (1, 1))
    assert context["has_bias"] is False
    kernel = scaffold_candidate("runs/mobile", cand.id, tmp_path / "m", report=report).out / "kernel.py"
    text = kernel.read_text()
    assert _assign(text, "STRIDE") == (2, 2) and _assign(text, "HAS_BIAS") is False
    shapes = [ast.literal_eval(s["literal"]) for s in context["shapes"]]
    assert [s["x"] for s in shapes] == [(8, 32, 28, 28)] * 2 + [(8, 32, 27, 27)] * 2


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"dims": [[64, 96, 56, 56], [192, 48, 3, 3], [192], [], [], [], []]}, "grouped, not depthwise"),
        ({"dims": [[64, 96, 56, 56], [96, 96, 3, 3], [96], [], [], [], []]}, "a dense convolution"),
        ({"concrete": ["", "", "", "[1, 1]", "[3, 3]", "[2, 2]", "96"]}, "dilated"),
        ({"concrete": ["", "", "", "[1, 1]", "[3, 3]", "[1, 1]", "48"]}, "groups ≠ channels"),
        ({"dims": [[8, 16, 100], [16, 1, 7], [16], [], [], [], []], "name": "aten::conv1d"}, "1-D"),
    ],
)
def test_other_convolutions_keep_the_generic_starting_point(changes, why):
    op = _op(**changes)
    assert conv_params(op) is None, why
    cand = _candidate(op)
    template, _, messages = plan_candidate(_report(cand), cand.id)
    assert template == "generic", why
    assert "the depthwise_conv template does not model it" in messages[0]


def test_stride_and_padding_left_out_of_the_trace_are_assumed_and_said():
    found = conv_params(_op(concrete=[]))
    assert found is not None and not found["recorded"]
    assert (found["stride"], found["padding"]) == ((1, 1), (3, 3))
    cand = _candidate(_op(concrete=[]))
    _, context, _ = plan_candidate(_report(cand), cand.id)
    assert any("stride and padding are not in the trace" in n for n in context["notes"])
    same = conv_params(_op(concrete=["", "", "", "[1, 1]", "same", "[1, 1]", "96"]))
    assert same is not None and same["padding"] == (3, 3) and same["recorded"]


@pytest.mark.parametrize(
    ("kind", "kernel", "stride", "padding"),
    [
        ("depthwise_conv", (7, 7), (1, 1), (3, 3)),
        ("depthwise_conv3x3", (3, 3), (1, 1), (1, 1)),
        ("depthwise_conv5x3_stride2", (5, 3), (2, 2), (2, 1)),
    ],
)
def test_kind_mode_takes_kernel_size_and_stride(kind, kernel, stride, padding, tmp_path):
    assert for_kind(kind).name == "depthwise_conv"
    template, context, _ = plan_kind(kind, ["2x40x13x13"], "fp16")
    assert template == "depthwise_conv"
    assert (context["kernel_size"], context["stride"], context["padding"]) == (kernel, stride, padding)
    result = scaffold_kind(kind, ["2x40x13x13"], "fp16", tmp_path / "k")
    text = (result.out / "kernel.py").read_text()
    assert _assign(text, "KERNEL_SIZE") == kernel and _assign(text, "PADDING") == padding
    assert "torch.float16" in (result.out / "test_kernel.py").read_text()


def test_kind_mode_refuses_what_it_cannot_model():
    with pytest.raises(InputError, match="NxCxHxW"):
        plan_kind("depthwise_conv", ["64x1000"], "bf16")
    tiny = plan_kind("depthwise_conv7x7", ["1x8x2x2"], "bf16")[1]  # padding 3: a 2x2 output
    assert ast.literal_eval(tiny["shapes"][0]["literal"])["x"] == (1, 8, 2, 2)
    with pytest.raises(InputError, match="at least 1"):
        plan_kind("depthwise_conv0x3", ["1x8x9x9"], "bf16")
    assert for_kind("depthwise_conv3x3+gelu") is None
