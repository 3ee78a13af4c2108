"""Right on model families the shipped runs did not cover: over every real trace of
``../shared/external-traces`` (and the shipped runs), the hottest ops are always judged, and
every printed fix is one its runner can apply to the classes in the trace, or says it is
applied by hand.

- no op of 5% or more of its rank's step is `skip (no-ceiling)` or `skip (library-kernel)`
  while its FLOPs or its bytes are known: a first-principles ceiling places it;
- every `compile` fix names only ops Inductor generates (no cuDNN convolution, no library
  attention; a library GEMM only through max-autotune's GEMM templates);
- no fix wraps `model` in a serving engine's trace (SGLang, vLLM);
- `patch(model)` only for norm classes patch() swaps (torch's, hf_norms.yaml's, or a
  *RMSNorm / *LayerNorm whose math it checks);
- a verdict that names the fused residual add + RMSNorm has a fix that fuses the add.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.analysis.fixes.fix_choice import hf_norm_classes
from kerneltriage.analysis.fixes.fix_recipes import load_recipes
from kerneltriage.cli import main
from tests.helpers import EXTERNAL, corpus

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted(EXTERNAL.glob("*/*.json.gz")) + sorted(
    p for p in (ROOT / "examples" / "runs").iterdir() if p.is_dir()
)
RECIPES = {r.id: r for r in load_recipes()}
HOT = 0.05

pytestmark = [pytest.mark.slow, corpus]


def _id(path: Path) -> str:
    return path.parent.name if path.suffix == ".gz" else f"runs/{path.name}"


@cache
def _reports(path: Path) -> tuple[dict, ...]:
    result = CliRunner().invoke(main, ["report", str(path), "--format", "json"])
    assert result.exit_code == 0, f"{_id(path)}: exit {result.exit_code}: {result.output[-400:]}"
    data = json.loads(result.output)
    if "candidates" in data:
        return (data,)
    reps = data.get("ranks") or data.get("reports")
    return tuple(reps.values() if isinstance(reps, dict) else reps)


def _candidates(path: Path):
    for rep in _reports(path):
        yield from rep["candidates"]


def _is_server(path: Path) -> bool:
    ops = {op for c in _candidates(path) for op in c["ops"]}
    return any(re.search(r"^(sglang\w*|sgl_kernel|vllm)::", op) for op in ops)


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_a_hot_op_is_judged_whenever_its_work_is_known(path):
    for c in _candidates(path):
        if c["time_share"] < HOT or c["reason"] not in ("no-ceiling", "library-kernel"):
            continue
        r = c["roofline"]
        assert r["flops"] is None and r["bytes"] is None, (
            f"{c['id']} {c['name']}: {c['time_share']:.1%} of the step, {c['reason']} with "
            f"{r['flops']} FLOPs and {r['bytes']} bytes known"
        )


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_first_principles_ceilings_say_what_they_rest_on(path):
    for c in _candidates(path):
        if c["roofline"]["source"] != "first principles":
            continue
        basis = c["attrs"]["headroom_basis"]
        fp = basis["first_principles"]
        assert basis["kind"] == "first-principles ceiling" and fp["tflops"] > 0, (c["id"], basis)
        assert c["roofline"]["flops"] and c["roofline"]["bytes"], c["id"]
        assert "first principles" in c["conditions"]["headroom"]["detail"], c["id"]
        if c["kind"] == "attention" and not fp.get("math_path"):
            # Fused library attention: the share of the tensor-core rate fused kernels reach,
            # never the GEMM ceiling itself.
            assert fp["fused_fraction"] < 1.0, (c["id"], fp)
            ceiling = rep_ceiling(path, fp["unit"])
            assert fp["tflops"] == pytest.approx(fp["fused_fraction"] * ceiling, rel=1e-2), (c["id"], fp)


def rep_ceiling(path: Path, unit: str) -> float:
    return next(rep["gpu"]["ceiling_tflops"][unit] for rep in _reports(path) if rep["gpu"])


#: Kinds whose ops Inductor generates when their module or model is compiled.
_INDUCTOR_KINDS = {"elementwise", "reduction", "softmax", "norm", "cross-entropy", "optimizer", "other"}


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_compile_fixes_name_only_ops_inductor_generates(path):
    for c in _candidates(path):
        recipe = c.get("recipe") or {}
        rid = recipe.get("id") or ""
        if not c.get("fix") or not (rid.startswith("compile") or rid == "inductor-search"):
            continue
        assert c["kind"] != "convolution", f"{c['id']}: {rid} on a cuDNN convolution"
        if c["kind"] == "attention":
            assert c["attrs"].get("written") == "naive", f"{c['id']}: {rid} on library attention"
        if rid in ("compile-model", "compile-module-class"):
            assert c["kind"] in _INDUCTOR_KINDS or c["attrs"].get("written") == "naive", (c["id"], c["kind"])
        if c["kind"] == "gemm":
            # A library GEMM: only max-autotune's Triton GEMM templates (or CUDA graphs for its launches).
            assert rid in ("compile-max-autotune", "compile-cuda-graphs", "compiled-cuda-graphs"), (
                c["id"],
                rid,
            )


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_no_fix_wraps_model_in_a_serving_engine(path):
    if not _is_server(path):
        return
    for c in _candidates(path):
        fix = c.get("fix") or ""
        assert "torch.compile(model" not in fix and "model.modules()" not in fix, (c["id"], fix)
        if c["verdict"] == "compile" and fix:
            assert c["recipe"]["apply"] is None and "by hand" in c["recipe"]["apply_why_not"], c["id"]


def _norm_swappable(cls: str) -> bool:
    return (
        cls in ("RMSNorm", "LayerNorm") or cls in hf_norm_classes() or cls.endswith(("RMSNorm", "LayerNorm"))
    )


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_patch_model_only_for_classes_patch_swaps(path):
    for c in _candidates(path):
        fix = c.get("fix") or ""
        if "patch(model)" not in fix:
            continue
        cls = (c["module"] or "").partition(" (")[2].rstrip(")")
        assert cls and _norm_swappable(cls), f"{c['id']}: patch(model) for {cls or 'no class'}"
        assert c["recipe"]["apply"] == {"kind": "norm-swap", "classes": [cls]}


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_a_fused_add_verdict_has_a_fix_that_fuses_the_add(path):
    for c in _candidates(path):
        if not c.get("fix") or "fused_add_rms_norm" not in (c["builtin"] or ""):
            continue
        assert RECIPES[c["recipe"]["id"]].fuses_residual_add, (c["id"], c["recipe"]["id"])
        assert "fused_add_rms_norm" in c["fix"], c["id"]


def test_qwen_sdpa_at_559_is_placed_from_first_principles():
    # FlashAttention-2 at S=559 on an H100: below the S=1024–8192 rows, judged all the same.
    (rep,) = _reports(EXTERNAL / "tracelens-qwen05b-h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    c = next(c for c in rep["candidates"] if c["name"].startswith("aten::scaled_dot_product_attention"))
    assert c["roofline"]["source"] == "first principles" and c["headroom"] > 2.0
    assert "S=559 lies outside" in c["conditions"]["headroom"]["detail"]
    # cuDNN is faster than FlashAttention at every length the H100 table measured: the switch.
    assert c["verdict"] == "use-builtin" and "CUDNN_ATTENTION" in c["builtin"]
    assert c["recipe"]["id"] == "sdpa-backend" and c["expected_saving_share"] > 0
    assert 80 < c["roofline"]["achieved_tflops"] < 100


def test_sglang_qk_norm_is_compiled_at_the_module_by_hand():
    (rep,) = _reports(EXTERNAL / "tracelens-sglang-qwen3-8b-mi300x" / "sglang_Qwen3-8B_prefilldecode.json.gz")
    c = next(c for c in rep["candidates"] if "apply_qk_norm" in c["name"])
    assert c["verdict"] == "compile" and c["recipe"]["id"] == "compile-in-server"
    assert "sglang --enable-torch-compile" in c["fix"]
