"""``kerneltriage.apply(run=...)``: the fixes ``verify`` verified on a run, applied in the user's
own process through verify's runner, each refused with its reason when its preconditions (recipe
``requires``, a GPU, packages) do not hold here. CPU: the built-in norms run in Triton's
interpreter (tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kerneltriage  # noqa: E402
from kerneltriage import ladder, rundir  # noqa: E402
from kerneltriage import verify_record as record  # noqa: E402
from kerneltriage.errors import InputError  # noqa: E402
from tests.helpers import tiny_llama  # noqa: E402

RUN = Path(__file__).resolve().parents[1] / "examples" / "runs" / "gpt-naive-h200"
NORM = {"kind": "norm-swap", "classes": ["LlamaRMSNorm"]}


def entry(cid, status, recipe_id, apply, predicted=0.1, realized=0.1):
    return {
        "id": cid,
        "name": f"candidate {cid}",
        "recipe_id": recipe_id,
        "how": f"runner: {apply['kind']}" if apply else "not applied",
        "apply": apply,
        "predicted_saving_share": predicted,
        "realized_saving_share": realized,
        "status": status,
    }


def make_run(tmp_path: Path, entries: list[dict]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RUN / rundir.MANIFEST, run / rundir.MANIFEST)
    data = record.VerifyFile.model_validate(
        {
            "schema": record.SCHEMA,
            "settings": {
                "repeats": 1,
                "warmup": 1,
                "steps": 3,
                "loss_steps": 2,
                "loss_rtol": 0.005,
                "seed": 0,
            },
            "candidates": entries,
        }
    )
    record.write(run, data)
    return run


VERIFIED = [
    entry("C4", "verified", "builtin-norm", NORM, 0.033, 0.035),
    entry(
        "C2",
        "verified",
        "liger-cross-entropy-hf",
        {"kind": "liger", "arch": "llama", "kernel": "cross_entropy"},
    ),
    entry("C1", "verified", "tf32", {"kind": "tf32"}),
    entry(
        "C6",
        "refuted",
        "compile-module-class",
        {"kind": "compile-module", "classes": ["LlamaMLP"], "mode": None},
    ),
]


@pytest.fixture
def handles():
    made = []
    yield made
    for h in made:
        h.remove()


def _cpu_only():
    if torch.cuda.is_available():
        pytest.skip("the refusals asserted here are those of a machine without a GPU")


def test_apply_swaps_the_verified_norms_at_the_first_forward_and_refuses_what_cannot_hold(tmp_path, handles):
    _cpu_only()
    ids = torch.randint(0, 64, (1, 8))
    before = tiny_llama()(input_ids=ids, labels=ids).loss.item()
    run = make_run(tmp_path, VERIFIED)
    h = kerneltriage.apply(run=run)
    handles.append(h)
    assert h.ids == ["C4"]  # the refuted C6 is not even considered
    refused = dict(h.refused)
    assert set(refused) == {"C1", "C2"}
    assert "CUDA GPU" in refused["C1"] and "CUDA GPU" in refused["C2"]
    assert not h.applied[0]["done"]  # a norm swap acts at the model's first forward
    model = tiny_llama()
    loss = model(input_ids=ids, labels=ids).loss
    assert loss.item() == pytest.approx(before, rel=1e-5)  # the model's loss is unchanged
    from kerneltriage.kernels import LlamaRMSNorm

    assert all(type(m) is LlamaRMSNorm for n, m in model.named_modules() if n.endswith("norm"))
    h.refresh()
    assert h.applied[0]["done"] and h.applied[0]["details"]["swapped"] == 5
    assert "C4" in str(h) and "refused  C1" in str(h)


def test_apply_with_the_model_applies_now(tmp_path, handles):
    from kerneltriage.kernels import LlamaRMSNorm

    run = make_run(tmp_path, VERIFIED[:1])
    model = tiny_llama()
    h = kerneltriage.apply(model, run=run)
    handles.append(h)
    assert h.applied[0]["done"] and h.applied[0]["details"]["root"] == "LlamaForCausalLM"
    assert type(model.model.norm) is LlamaRMSNorm


def test_a_recipe_whose_torch_requirement_fails_is_refused(tmp_path, handles, monkeypatch):
    run = make_run(tmp_path, VERIFIED[:1])
    monkeypatch.setattr(torch, "__version__", "1.13.1")  # builtin-norm requires torch >= 2.0
    h = kerneltriage.apply(run=run)
    handles.append(h)
    assert h.applied == [] and h.refused == [("C4", "recipe builtin-norm: PyTorch 1.13.1 (needs >=2.0)")]


def test_a_fix_that_finds_nothing_at_the_first_forward_is_refused_and_the_model_runs(tmp_path, handles):
    run = make_run(
        tmp_path, [entry("C5", "verified", None, {"kind": "norm-swap", "classes": ["GemmaRMSNorm"]})]
    )
    h = kerneltriage.apply(run=run)
    handles.append(h)
    assert h.ids == ["C5"]
    ids = torch.randint(0, 64, (1, 8))
    with pytest.warns(UserWarning, match="C5 .norm-swap. refused: norm-swap found no GemmaRMSNorm"):
        loss = tiny_llama()(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)
    assert h.ids == [] and h.refused[0][0] == "C5"


def test_only_picks_candidates_and_identical_fixes_are_installed_once(tmp_path, handles):
    run = make_run(tmp_path, [VERIFIED[0], entry("C5", "verified", "builtin-norm", NORM)])
    model = tiny_llama()
    h = kerneltriage.apply(model, run=run, only="c4,C5")
    handles.append(h)
    assert [a["ids"] for a in h.applied] == [["C4", "C5"]]  # one patch(model) for both


def test_no_verified_fix_is_one_line_saying_what_to_do(tmp_path):
    run = make_run(tmp_path, [VERIFIED[3]])
    with pytest.raises(InputError, match=r"kerneltriage verify .*C1,C3"):
        kerneltriage.apply(run=run)
    with pytest.raises(InputError, match="needs run="):
        kerneltriage.apply()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("runs/exp1", ("runs/exp1", None)), ("runs/exp1:C1,c3", ("runs/exp1", ["C1", "C3"]))],
)
def test_the_apply_spec_names_a_run_and_its_candidates(spec, expected):
    path, ids = ladder.parse_spec(spec)
    assert (str(path), ids) == expected


def test_importing_kerneltriage_does_not_import_torch_for_apply():
    import subprocess
    import sys

    code = "import sys, kerneltriage; f = kerneltriage.apply; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_identical_fixes_install_once_swaps_before_compiles_and_flags_first():
    from kerneltriage.profile.fix_install import grouped, label

    fixes = [
        {"id": "C6", "apply": {"kind": "compile-module", "classes": ["Block"], "mode": None}},
        {"id": "C2", "apply": NORM},
        {"id": "C9", "apply": {"kind": "tf32"}},
        {"id": "C4", "apply": dict(NORM)},
    ]
    order = grouped(fixes)
    assert [ids for ids, _ in order] == [["C9"], ["C2", "C4"], ["C6"]]
    assert label(*order[1]) == "C2+C4 (norm-swap)"


def test_tf32_is_refused_on_an_amd_gpu_without_tf32_units(tmp_path, handles, monkeypatch):
    """An MI250 (gfx90a) has bf16 matrix units and no TF32: the TF32 fix verified elsewhere is
    refused here with the reason; an MI300X (gfx942) takes it."""
    from types import SimpleNamespace

    for name, value in {
        "is_available": lambda: True,
        "current_device": lambda: 0,
        "get_device_capability": lambda i=0: (9, 0),
        "is_bf16_supported": lambda: True,
        "get_device_name": lambda i=0: "AMD Instinct MI250X / MI250",
        "get_device_properties": lambda i=0: SimpleNamespace(gcnArchName="gfx90a:sramecc+:xnack-"),
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch.version, "cuda", None)
    env = ladder._live_environment(torch)
    assert (env.vendor, env.tf32, env.bf16) == ("amd", False, True)
    run = make_run(tmp_path, [entry("C1", "verified", "tf32", {"kind": "tf32"})])
    h = kerneltriage.apply(run=run)
    handles.append(h)
    assert h.applied == [] and h.refused == [
        ("C1", "recipe tf32: AMD Instinct MI250X / MI250 has no TF32 tensor cores")
    ]
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(gcnArchName="gfx942")
    )
    assert ladder._live_environment(torch).tf32 is True
