"""Rules are data: loading, merging, validation errors."""

from __future__ import annotations

import pytest

from kerneltriage.analysis.rules import THRESHOLDS, default_rules_path, default_thresholds, load_rules
from kerneltriage.errors import RulesError


def test_default_rules_classify_real_names():
    r = load_rules()
    assert str(default_rules_path()).endswith("data/rules/default.yaml")
    assert r.classify("aten::linear", "nvjet_sm90_tst_256x128") == "gemm"
    assert r.classify("aten::scaled_dot_product_attention", None) == "attention"
    assert r.classify(None, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert r.classify(None, "triton_poi_fused_add_mul_0") == "elementwise"
    assert r.classify(None, "triton_red_fused_sum_1") == "reduction"
    assert r.classify("aten::copy_", "Memcpy DtoD", activity="memcpy") == "memcpy"
    assert r.classify_op("aten::native_layer_norm") == "norm"
    assert r.is_library_op("aten::linear") and not r.is_library_op("aten::pow")


def test_user_file_merges_over_the_defaults(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text(
        "schema: kerneltriage.rules/1\n"
        "thresholds: {min_headroom: 3.5}\n"
        "recommendations:\n  gemm: {verdict: skip, reason: library-at-roof}\n"
    )
    r = load_rules(user, overrides={"min_share": 0.2})
    assert r.thresholds.min_headroom == 3.5
    assert r.thresholds.min_share == 0.2
    assert r.thresholds.max_shapes == 4  # untouched default
    assert r.recommendation("gemm")["verdict"] == "skip"
    assert r.recommendation("norm", "rmsnorm")["builtin"] == "kerneltriage.kernels.rms_norm"
    assert r.sources[-1] == str(user)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("thresholds: {min_headroom: banana}", "must be a number"),
        ("thresholds: {min_headrom: 2}", "unknown threshold"),
        ("thresholds: {min_headroom: 0.5}", "at least 1"),
        ("op_classes: [{kind: x, ops: ['(unclosed']}]", "bad regular expression"),
        ("recommendations: {gemm: {verdict: maybe}}", "verdict must be one of"),
        ("recommendations: {gemm: {verdict: skip}}", "needs a 'reason'"),
        ("schema: kerneltriage.rules/9", "schema"),
        ("- just\n- a list", "YAML mapping"),
        ("thresholds: {min_headroom: [", "not valid YAML"),
    ],
)
def test_bad_rules_are_one_line_errors(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(RulesError, match=message) as err:
        load_rules(f)
    assert str(f) in str(err.value) or "regular expression" in str(err.value)


def test_missing_rules_file(tmp_path):
    with pytest.raises(RulesError, match="no such rules file"):
        load_rules(tmp_path / "none.yaml")


def test_thresholds_are_typed_and_come_from_the_file():
    import yaml

    shipped = yaml.safe_load(default_rules_path().read_text())["thresholds"]
    t = default_thresholds()
    assert t == load_rules().thresholds
    assert t.to_json() == {name: kind(shipped[name]) for name, kind in THRESHOLDS.items()}
    assert list(t.to_json()) == list(THRESHOLDS)  # the report's JSON order
    assert isinstance(t.max_shapes, int) and isinstance(t.gap_us, float)
    with pytest.raises(AttributeError):
        t.min_share = 0.5  # frozen


def test_a_bad_override_names_its_flag():
    with pytest.raises(RulesError, match=r"^--min-headroom: min_headroom .* at least 1"):
        load_rules(overrides={"min_headroom": 0.5})
    assert load_rules(overrides={"min_headroom": 1.0, "min_share": None}).thresholds.min_headroom == 1.0


@pytest.mark.parametrize(
    ("text", "key", "closest"),
    [("threshold:\n  min_share: 0.05\n", "threshold", "thresholds"), ("ops: 5\n", "ops", "op_classes")],
)
def test_unknown_keys_are_warned_with_the_closest_known_key(tmp_path, text, key, closest):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    rules = load_rules(path)  # still accepted: a newer file may carry keys this one does not read
    assert len(rules.warnings) == 1
    assert (
        f"unknown key {key!r}" in rules.warnings[0]
        and f"closest known key is {closest!r}" in rules.warnings[0]
    )
    assert load_rules().warnings == []


def test_a_users_pattern_is_compiled_once_at_load_and_matched_from_the_model(tmp_path, monkeypatch):
    import re2

    compiled: list[str] = []
    real = re2.compile

    def counting(pattern, *args):
        compiled.append(pattern)
        return real(pattern, *args)

    monkeypatch.setattr(re2, "compile", counting)
    user = tmp_path / "mine.yaml"
    user.write_text("regions:\n  attention:\n    softcap_ops: ['^aten::(tanh|softcap_kt_test)$']\n")
    rules = load_rules(user)
    assert compiled == ["^aten::(tanh|softcap_kt_test)$"]  # checked with its file, compiled once
    (pattern,) = rules.regions.attention.softcap_ops
    assert pattern.search("aten::softcap_kt_test") and not pattern.search("aten::tanh_")
    for name in ("aten::tanh", "aten::softcap_kt_test", "aten::mul", "aten::tanh"):
        rules.match(name, "attention", "softcap_ops")
    assert rules.match("aten::softcap_kt_test", "attention", "softcap_ops")
    assert len(compiled) == 1  # matching never compiles again
    load_rules(user)
    assert len(compiled) == 1  # nor does loading the same file again


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("regions:\n  norms: [{variant: rmsnorm, any_of: ['(a)\\1']}]\n", "regions.norms.0.any_of.0"),
        ("recommendations:\n  norm: {already: ['(?=x)']}\n", "recommendations.norm.already.0"),
        ("op_classes: [{kind: gemm, kernels: ['[unclosed']}]\n", "op_classes.0.kernels.0"),
    ],
)
def test_a_bad_pattern_fails_at_load_naming_its_file_and_key(tmp_path, text, key):
    user = tmp_path / "bad.yaml"
    user.write_text(text)
    with pytest.raises(RulesError) as err:
        load_rules(user)
    message = str(err.value)
    assert message.startswith(f"{user}: {key}: ") and len(message.splitlines()) == 1, message


def test_the_cutoffs_come_from_the_shipped_rules_file_only(tmp_path):
    import yaml

    from kerneltriage.analysis.rules import CUTOFF_RANGES

    shipped = yaml.safe_load(default_rules_path().read_text())["thresholds"]
    assert set(CUTOFF_RANGES) <= set(shipped)  # every figure is default.yaml's
    user = tmp_path / "mine.yaml"
    user.write_text("schema: kerneltriage.rules/1\nthresholds: {switch_ratio: 1.5}\n")
    cut = load_rules(user).cutoffs
    assert cut.switch_ratio == 1.5 and cut.near_floor == shipped["near_floor"]
    user.write_text("schema: kerneltriage.rules/1\nthresholds: {near_floor: null}\n")
    with pytest.raises(RulesError, match="expected a number"):
        load_rules(user)
