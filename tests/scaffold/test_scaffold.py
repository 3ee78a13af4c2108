"""kerneltriage scaffold: every template rendered from the shipped example run, linted, and its own
test suite run under Triton's interpreter; --kind mode; bad input through the CLI.

The generated suites run as subprocesses, all started at once by a module fixture (they are
CPU-bound numpy work, so two cores run two at a time), then each test waits for its own. A
subprocess imports the scaffold with ``kerneltriage`` blocked: the package must stand alone.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from kerneltriage.errors import InputError
from kerneltriage.scaffold import FILES, plan_candidate, scaffold_candidate, scaffold_kind
from kerneltriage.scaffold.identifiers import identifier
from kerneltriage.scaffold.writer import safe_target

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "runs" / "gpt-naive-h200"
HERE = Path(__file__).resolve().parent
# The project's lint selection (pyproject.toml); E741 (names like `l`) is ignored for templates.
PROJECT_RUFF = [
    "--isolated",
    "--select",
    "E,F,W,I,B,UP,SIM,RUF",
    "--ignore",
    "E501,E731,B905,RUF001,RUF002,RUF003",
    "--target-version",
    "py310",
]
# One candidate of the example per template: (template, the start of the candidate's name,
# public function, backward). Found by name: ids follow the time shares, which change with
# the analysis.
CASES = {
    "attention": ("attention (naive, causal)", "attention", True),
    "rownorm": ("residual add + RMSNorm", "add_rms_norm", True),
    "softmax": ("cross-entropy region", "cross_entropy", True),
    "gemm_epilogue": ("aten::linear(4x2048x1024, 32000x1024)", "linear", True),
    "elementwise": ("aten::gelu(", "gelu", True),
    "generic": ("aten::embedding(", "embedding_map_reduce", True),
}


def named(report, start: str) -> str:
    """The id of the example's one candidate whose name starts with ``start``."""
    (ident,) = [c.id for c in report.candidates if c.name.startswith(start)]
    return ident


KIND = ("rmsnorm", ["16384x4096"], "bf16")
# Runs the scaffold's pytest with kerneltriage unimportable and no bytecode/cache litter.
PYTEST = (
    "import sys; sys.modules['kerneltriage'] = None; import pytest; "
    "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-W', 'ignore::RuntimeWarning']))"
)


def _env() -> dict[str, str]:
    """The generated suites run natively on a GPU host (observed shapes), else in the interpreter."""
    import torch

    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
    env.pop("PYTHONPATH", None)
    return env


class Job:
    """A subprocess writing to a log file; ``result()`` waits for it."""

    def __init__(self, args: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None):
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env or _env()
            )

    def result(self, timeout: float = 600) -> tuple[int, str]:
        rc = self.proc.wait(timeout=timeout)
        return rc, self.log.read_text()


@pytest.fixture(scope="module")
def report():
    from kerneltriage.api import build_report

    return build_report(RUN)


@pytest.fixture(scope="module")
def scaffolds(report, tmp_path_factory):
    """Every template rendered from the example (plus one --kind scaffold); their test suites,
    and the sm_90 compile checks, started in the background."""
    base = tmp_path_factory.mktemp("scaffolds")
    out = {}
    for template, (start, fn, backward) in CASES.items():
        result = scaffold_candidate(RUN, named(report, start), base / template, report=report)
        out[template] = {"result": result, "function": fn, "backward": backward}
    kind_result = scaffold_kind(KIND[0], KIND[1], KIND[2], base / "kind")
    out["kind"] = {"result": kind_result, "function": "rms_norm", "backward": True}
    jobs = {}
    for key, item in out.items():
        d = item["result"].out
        jobs[key] = Job([sys.executable, "-c", PYTEST], d, base / f"{key}.pytest.log")
    for key in ("attention", "rownorm"):  # what the lead benchmarks on the GPU
        item = out[key]
        args = [sys.executable, str(HERE / "compile_check.py"), str(item["result"].out), item["function"]]
        env = dict(_env(), TRITON_INTERPRET="0")
        jobs[f"compile-{key}"] = Job([*args, "--backward"], base, base / f"{key}.compile.log", env)
    yield out, jobs
    for job in jobs.values():
        if job.proc.poll() is None:
            job.proc.kill()


def _ruff(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *map(str, args)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("template", [*CASES, "kind"])
def test_scaffold_renders_lints_and_passes_its_tests(scaffolds, template):
    out, jobs = scaffolds
    result = out[template]["result"]
    expected_template = "rownorm" if template == "kind" else template
    assert result.template == expected_template
    assert [p.name for p in result.files] == list(FILES)
    for path in result.files:
        assert path.parent == result.out and path.stat().st_size > 200
        if path.suffix == ".py":
            compile(path.read_text(), str(path), "exec")  # valid Python
    kernel = (result.out / "kernel.py").read_text()
    assert f"def {out[template]['function']}(" in kernel
    assert "@triton.autotune" in kernel and "torch.autograd.Function" in kernel
    # ruff-clean under the project's rules and under ruff's own defaults (no config file)
    py_files = [p for p in result.files if p.suffix == ".py"]
    project = _ruff("check", *PROJECT_RUFF, *py_files)
    assert project.returncode == 0, project.stdout + project.stderr
    default = _ruff("check", "--no-cache", *py_files)
    assert default.returncode == 0, default.stdout + default.stderr
    rc, log = jobs[template].result()
    assert rc == 0, log[-6000:]
    summary = log.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), log[-3000:]
    assert not re.search(r"failed|error|skipped", summary), log[-3000:]


def test_readme_carries_verdict_conditions_ceiling_and_ladder(scaffolds, report):
    out, _ = scaffolds
    cand = report.candidate(named(report, CASES["rownorm"][0]))
    readme = (out["rownorm"]["result"].out / "README.md").read_text()
    assert f"**{cand.verdict}**" in readme and cand.builtin in readme
    for name in ("headroom", "hotness", "stability"):
        assert f"| {name} |" in readme
    assert f"{cand.headroom:.3g}×" in readme
    ceiling_call = cand.roofline.ceiling_ms / cand.instances_per_step
    assert f"{ceiling_call * 1e3:.3g} µs" in readme or f"{ceiling_call:.3g} ms" in readme
    for rung in ("Coalescing", "Tiling", "Tensor cores", "Pipelining", "Autotuning"):
        assert f"**{rung}**" in readme
    assert "dram__" in readme  # profiler signatures
    # constants from the trace land in the kernel and the reference alike
    kernel = (out["rownorm"]["result"].out / "kernel.py").read_text()
    reference = (out["rownorm"]["result"].out / "reference.py").read_text()
    assert "EPS = 1e-06" in kernel and "EPS = 1e-06" in reference
    assert "aten::rsqrt" in reference and "bfloat16[4x2048x1024]" in reference
    test = (out["rownorm"]["result"].out / "test_kernel.py").read_text()
    assert '{"x": (4, 2048, 1024)}' in test
    assert '"residual": torch.bfloat16' in test and '"x": torch.float32' in test


def test_attention_constants_and_builtin(scaffolds):
    out, _ = scaffolds
    d = out["attention"]["result"].out
    kernel = (d / "kernel.py").read_text()
    assert "CAUSAL = True" in kernel and "SM_SCALE = None" in kernel and "SOFTCAP = None" in kernel
    bench = (d / "bench.py").read_text()
    assert "from kerneltriage.kernels import flash_attention" in bench
    assert "scaled_dot_product_attention" in bench


def test_cross_entropy_constants_from_concrete_inputs(scaffolds):
    out, _ = scaffolds
    kernel = (out["softmax"]["result"].out / "kernel.py").read_text()
    assert 'REDUCTION = "mean"' in kernel and "IGNORE_INDEX = -100" in kernel
    assert "LABEL_SMOOTHING = 0.0" in kernel
    reference = (out["softmax"]["result"].out / "reference.py").read_text()
    assert "logits.to(torch.float32)" in reference  # the region's aten::to, kept in the reference


def test_generated_kernels_compile_for_sm90(scaffolds):
    _, jobs = scaffolds
    for key in ("compile-attention", "compile-rownorm"):
        rc, log = jobs[key].result()
        assert rc == 0, log[-4000:]
        assert "compiled for sm_90" in log and "over the shared-memory limit" not in log


def test_bench_smoke_writes_json(scaffolds, report, tmp_path):
    out, _ = scaffolds
    d = out["rownorm"]["result"].out
    target = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "bench.py", "--smoke", "--json", str(target)],
        cwd=d,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "% roof" in proc.stdout and "ceiling" in proc.stdout
    data = json.loads(target.read_text())
    assert data["schema"] == "kerneltriage.bench/1" and data["op"] == "add_rms_norm"
    impls = {(r["impl"], r["mode"]) for r in data["rows"] if r.get("ms")}
    assert {("kernel", "fwd"), ("reference", "fwd"), ("kernel", "fwd+bwd")} <= impls
    cand = report.candidate(named(report, CASES["rownorm"][0]))
    assert data["report"]["ceiling_ms_per_call"] == pytest.approx(
        cand.roofline.ceiling_ms / cand.instances_per_step, rel=1e-4
    )


def test_kind_mode_uses_the_given_shape_and_dtype(scaffolds):
    out, _ = scaffolds
    d = out["kind"]["result"].out
    test = (d / "test_kernel.py").read_text()
    assert '{"x": (16384, 4096)}' in test and '{"x": torch.bfloat16, "weight": torch.bfloat16}' in test
    readme = (d / "README.md").read_text()
    assert "No run: the three conditions" in readme and "--kind rmsnorm" in readme


@pytest.mark.parametrize(
    ("kind", "template", "function"),
    [
        ("layernorm", "rownorm", "layer_norm"),
        ("add_rmsnorm", "rownorm", "add_rms_norm"),
        ("log_softmax", "softmax", "log_softmax"),
        ("cross_entropy", "softmax", "cross_entropy"),
        ("attention", "attention", "attention"),
        ("gemm+bias+gelu", "gemm_epilogue", "linear_bias_gelu"),
        ("mul+silu", "elementwise", "mul_silu"),
        ("generic", "generic", "generic_map_reduce"),
    ],
)
def test_kind_mode_picks_the_template(tmp_path, kind, template, function):
    shape = {"attention": "2x4x256x64", "gemm+bias+gelu": "64x96x80"}.get(kind, "64x1000")
    result = scaffold_kind(kind, [shape], "fp16", tmp_path / "k")
    assert result.template == template and result.name == function
    kernel = (result.out / "kernel.py").read_text()
    assert f"def {function}(" in kernel
    assert "torch.float16" in (result.out / "test_kernel.py").read_text()


# --- bad input through the CLI ------------------------------------------------------------


def test_cli_unknown_candidate_lists_valid_ids(report, tmp_path):
    out = tmp_path / "x"
    res = CliRunner().invoke(main, ["scaffold", str(RUN), "C99", "--out", str(out)])
    assert res.exit_code == 2, res.output
    valid = ", ".join(c.id for c in report.candidates)  # in the report's order
    assert "no candidate 'C99'" in res.output and f"valid ids: {valid}\n" in res.output
    assert not out.exists()


def test_cli_refuses_non_empty_out_unless_force(report, tmp_path):
    out = tmp_path / "kernels" / "norm"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    args = ["scaffold", str(RUN), named(report, CASES["rownorm"][0]), "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "not empty" in res.output, res.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    res = CliRunner().invoke(main, [*args, "--force"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "rownorm template" in res.output
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, "notes.txt"])
    assert (out / "notes.txt").read_text() == "mine"


def test_cli_kind_mode_and_its_errors(tmp_path):
    runner = CliRunner()
    out = tmp_path / "norm"
    ok = runner.invoke(
        main, ["scaffold", "--kind", "rmsnorm", "--shape", "16384x4096", "--dtype", "bf16", "--out", str(out)]
    )
    assert ok.exit_code == 0, ok.output
    assert (out / "kernel.py").is_file()
    bad = [
        (["--kind", "nosuchop", "--shape", "8x8"], "unknown --kind"),
        (["--kind", "rmsnorm"], "--shape"),
        (["--kind", "rmsnorm", "--shape", "8xfoo"], "bad --shape"),
        (["--kind", "rmsnorm", "--shape", "8x8", "--dtype", "int4"], "unknown --dtype"),
        (["--kind", "attention", "--shape", "8x8"], "BxHxSxD"),
        ([str(RUN), "C3", "--kind", "rmsnorm", "--shape", "8x8"], "not both"),
        ([str(RUN)], "expected RUN and CANDIDATE"),
    ]
    for args, message in bad:
        res = runner.invoke(main, ["scaffold", *args, "--out", str(tmp_path / "bad")])
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output, (args, res.output)
    assert not (tmp_path / "bad").exists()


def test_class_without_template_says_so_and_writes_generic(report, tmp_path):
    adamw = named(report, "aten::_fused_adamw_(")
    res = CliRunner().invoke(main, ["scaffold", str(RUN), adamw, "--out", str(tmp_path / "opt")])
    assert res.exit_code == 0, res.output
    assert "no template for its op class (optimizer)" in res.output and "generic" in res.output
    kernel = (tmp_path / "opt" / "kernel.py").read_text()
    assert "def fused_adamw_map_reduce(" in kernel
    assert f"No template fits {adamw}" in kernel  # said in the docstring too


# --- names from traces, paths ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("aten::_fused_adamw_", "fused_adamw"),
        ("../../etc/passwd", "etc_passwd"),
        ("1x_kernel", "op_1x_kernel"),
        ("class", "class_"),
        ("torch", "torch_"),
        ("aten::weird-op!\"');import os#", "weird_op_import_os"),
        ("", "op"),
        ("∑∆", "op"),
    ],
)
def test_identifier(raw, expected):
    ident = identifier(raw)
    assert ident == expected and ident.isidentifier()


def test_hostile_trace_names_stay_inert(report, tmp_path):
    """A candidate whose op names and shapes text try to break out of comments, strings and paths."""
    rep = copy.deepcopy(report)
    embedding = named(rep, CASES["generic"][0])
    cand = rep.candidate(embedding)
    evil = 'aten::x"""\n__import__("os").system("echo pwned")#/../../evil'
    cand.name = evil
    cand.example[0]["name"] = evil
    cand.example[0]["concrete"] = ['"""; raise SystemExit', "\n\nimport os"]
    cand.reason = 'x"""\nraise SystemExit'
    template, context, _ = plan_candidate(rep, embedding, run_ref="../../run", out=str(tmp_path))
    assert template == "generic"
    assert context["name"].isidentifier() and context["name"].startswith("x_import_os_system")
    result = scaffold_candidate(RUN, embedding, tmp_path / "evil", report=rep)
    files = {p.name: p.read_text() for p in result.files}
    assert sorted(files) == sorted(FILES)
    assert all(p.parent == tmp_path / "evil" for p in result.files)
    for name, text in files.items():
        if not name.endswith(".py"):
            continue
        tree = ast.parse(text)  # trace text may only sit in comments and string constants
        attrs = {
            n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "system" not in attrs and "__import__" not in names, name
        assert "SystemExit" not in names, name
    assert "pwned" in files["reference.py"]  # the text is there, inert, as documentation
    lint = _ruff("check", *PROJECT_RUFF, *(tmp_path / "evil" / n for n in files if n.endswith(".py")))
    assert lint.returncode == 0, lint.stdout
    assert not (tmp_path / "evil.py").exists() and not (tmp_path.parent / "evil").exists()


def test_no_path_escapes_out(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("../x.py", "/etc/x.py", "a/b.py", "..", ""):
        with pytest.raises(InputError):
            safe_target(out, name)
    assert safe_target(out, "kernel.py") == out / "kernel.py"
    # a symlink planted in --out must not be written through, even with --force
    outside = tmp_path / "outside.py"
    outside.write_text("keep")
    (out / "kernel.py").symlink_to(outside)
    with pytest.raises(InputError, match="symlink"):
        scaffold_kind("gelu", ["8x8"], "fp32", out, force=True)
    assert outside.read_text() == "keep"
    assert sorted(p.name for p in out.iterdir()) == ["kernel.py"]  # nothing written at all


def test_readme_saving_agrees_with_the_verdict_note(report, tmp_path):
    """A skip below its ceiling (low-headroom) counts no saving, and its note says what fixing it
    could take: the README gives that same figure, and says the report does not count it."""
    cand = next(c for c in report.candidates if c.reason == "low-headroom")
    up_to = re.search(r"up to (\d+\.\d)% of the step", cand.note).group(1)
    readme = (scaffold_candidate(RUN, cand.id, tmp_path / "c", report=report).out / "README.md").read_text()
    saving = re.search(r"Expected saving if the kernel reaches its ceiling: (.*)\n", readme).group(1)
    assert saving.startswith(f"up to {up_to}% of step time") and "0.0%" not in saving
    assert "does not count" in saving and "low-headroom" in saving
