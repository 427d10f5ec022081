"""pipeline/policy.py: which variant qualifies, how the objectives rank the ones that do, and policy files
and their names. The figures are made up: a test of the rules, not a measurement."""

from pathlib import Path

import pytest

from pipeline.policy import Measured, decide, policy_file_label
from pipeline.schema import Accuracy, ConfigError, Policy, load_policy
from pipeline.settings import ROOT


def policy(**kw) -> Policy:
    base = {
        "description": "test",
        "accuracy": {"max_drop": 0.01},
        "limits": {"weights_gib": {"max": 2.0}, "chat.c8.p90_tpot_ms": {"max": 30}},
        "objective": [{"minimize": "weights_gib"}],
    }
    return Policy.model_validate({**base, **kw})


def acc(delta, low, high, mean=0.5):
    return {
        "mean": mean + delta,
        "ci95": [mean + delta - 0.05, mean + delta + 0.05],
        "delta": delta,
        "delta_ci95": [low, high],
        "significant": low > 0 or high < 0,
    }


def entries(eval_entry: dict | None) -> dict[str, Accuracy] | None:
    """An eval-report.json entry: the counts a real run has (100 items, 1 seed, none cut off)."""
    neutral = {"std_across_seeds": None, "n": 100, "seeds": 1, "truncated": 0, "no_answer": 0}
    return None if eval_entry is None else {k: Accuracy.model_validate(neutral | v) for k, v in eval_entry.items()}


def variant(weights, tpot, eval_entry=None, device="cuda", random=False) -> Measured:
    figures = {"weights_gib": weights, "chat.c8.p90_tpot_ms": tpot}
    figures.update({k: v["mean"] for k, v in (eval_entry or {}).items()})
    return Measured(figures=figures, eval=entries(eval_entry), bench_device=device, random_weights=random)


BASE_EVAL = {"gsm8k:exact_match": {"mean": 0.5, "ci95": [0.45, 0.55]}}


# ------------------------------------------------------------------------------------------ policy
def test_policy_picks_the_smallest_variant_that_meets_every_constraint():
    variants = {
        "bf16": variant(3.45, 20, BASE_EVAL),
        "fp8": variant(2.18, 18, {"gsm8k:exact_match": acc(-0.002, -0.008, 0.004)}),  # too big
        "gptq": variant(1.58, 25, {"gsm8k:exact_match": acc(-0.004, -0.009, 0.001)}),  # qualifies
        "awq": variant(1.57, 24, {"gsm8k:exact_match": acc(-0.01, -0.03, 0.01)}),  # could lose 3 points
        "int4-slow": variant(1.50, 45, {"gsm8k:exact_match": acc(0.0, -0.005, 0.005)}),  # too slow
    }
    d = decide(policy(), variants)
    assert d.chosen == "gptq"
    v = d.verdicts
    assert "weights_gib: 3.45 > 2" in v["bf16"].why and "weights_gib: 2.18 > 2" in v["fp8"].why
    assert "gsm8k:exact_match: could drop 3.0 points" in v["awq"].why
    assert "chat.c8.p90_tpot_ms: 45 > 30" in v["int4-slow"].why
    assert v["gptq"].qualifies and "ranks first" in v["gptq"].why


def test_the_accuracy_rule_holds_the_ci_lower_end_to_max_drop_exactly():
    """max_drop 0.01: a paired CI whose lower end is -0.01 qualifies (floating-point noise included), one a
    tenth of a point lower does not, whatever its point estimate."""
    variants = {
        "bf16": variant(3.45, 20, BASE_EVAL),
        "at": variant(1.0, 20, {"gsm8k:exact_match": acc(-0.004, 0.3 - 0.31, 0.002)}),  # -0.01000000000000001
        "below": variant(0.9, 20, {"gsm8k:exact_match": acc(0.0, -0.011, 0.011)}),
    }
    d = decide(policy(limits={}), variants)
    assert d.verdicts["at"].qualifies and d.chosen == "at"
    assert not d.verdicts["below"].qualifies
    assert "gsm8k:exact_match: could drop 1.1 points vs bf16 at 95% confidence" in d.verdicts["below"].why


def qualifying(weights: float, throughput: float) -> Measured:
    """A variant within the limits of policy() and its accuracy rule, with a throughput figure."""
    v = variant(weights, 20, {"gsm8k:exact_match": acc(0.0, -0.005, 0.005)})
    v.figures["chat.c8.output_throughput"] = throughput
    return v


# names in another order than sizes and throughputs: only the objective can put the winner first
SEVERAL = {
    "bf16": variant(3.45, 20, BASE_EVAL),  # too big
    "a-big": qualifying(1.6, 300.0),
    "b-small": qualifying(0.9, 100.0),
    "c-mid": qualifying(1.2, 200.0),
}


def test_of_several_qualifying_variants_the_objective_decides_minimised():
    d = decide(policy(), SEVERAL)
    assert d.chosen == "b-small"
    assert "of the 3 variants that meet every constraint (b-small, c-mid, a-big)" in d.summary
    assert d.verdicts["a-big"].why == "qualifies, but lost on weights_gib: 1.6 vs b-small's 0.9 (lower wins)"


def test_of_several_qualifying_variants_the_objective_decides_maximised():
    d = decide(policy(objective=[{"maximize": "chat.c8.output_throughput"}]), SEVERAL)
    assert d.chosen == "a-big"
    assert "(a-big, c-mid, b-small)" in d.summary and "maximise chat.c8.output_throughput" in d.summary
    assert d.verdicts["c-mid"].why == (
        "qualifies, but lost on chat.c8.output_throughput: 200 vs a-big's 300 (higher wins)"
    )


def test_a_minimum_limit_excludes_the_variant_that_would_otherwise_win():
    limits = {"weights_gib": {"max": 2.0}, "chat.c8.output_throughput": {"min": 150}}
    d = decide(policy(limits=limits), SEVERAL)
    assert d.chosen == "c-mid"  # b-small is smaller, and too slow
    assert d.verdicts["b-small"].broken == ["chat.c8.output_throughput: 100 < 150"]
    assert d.verdicts["a-big"].qualifies and not d.verdicts["b-small"].qualifies


def test_a_bound_relative_to_the_baseline_decides_the_same_on_a_slow_host_as_on_a_fast_one():
    """The shipped CPU policy bounds chat TPOT relative to bf16's, so a host 40% slower (every latency
    x 1.4) publishes the same variant; its bound in ms (100) published on one host and nothing on the other."""
    same = {"gsm8k:exact_match": acc(0.0, -0.005, 0.005)}

    def host(speed: float) -> dict[str, Measured]:  # speed 1.4: every latency 1.4 x as long
        variants = {
            "bf16": variant(0.25, 90 * speed, BASE_EVAL, device="cpu"),
            "int4": variant(0.10, 99 * speed, same, device="cpu"),  # 1.1 x bf16's
            "int4-slow": variant(0.08, 135 * speed, same, device="cpu"),  # 1.5 x bf16's
        }
        for v in variants.values():
            v.figures["chat.c8.output_throughput"] = 8000 / v.figures["chat.c8.p90_tpot_ms"]
        return variants

    fast, slow = host(1.0), host(1.4)
    relative = load_policy(ROOT / "policies/default.yaml")
    absolute = policy(device="cpu", limits={"chat.c8.p90_tpot_ms": {"max": 100}})
    assert decide(relative, fast).chosen == decide(relative, slow).chosen == "int4"
    assert decide(absolute, fast).chosen == "int4" and decide(absolute, slow).chosen is None
    why = decide(relative, slow).verdicts["int4-slow"].why
    assert "chat.c8.p90_tpot_ms: 189 is 1.5 x bf16's 126 > 1.25 x" in why
    # bf16 alone (a CPU that serves no INT4 fast) qualifies against itself on any host
    assert decide(relative, {"bf16": slow["bf16"]}).chosen == "bf16"


def test_a_relative_bound_breaks_where_the_baseline_lacks_the_figure():
    """A ratio to nothing is no promise: a bench of the baseline that lacks the level breaks the bound for all."""
    p = policy(limits={"chat.c8.p90_tpot_ms": {"max_vs_baseline": 1.25}})
    base = Measured(figures={"weights_gib": 0.25}, eval=entries(BASE_EVAL), bench_device="cuda")
    d = decide(p, {"bf16": base, "int4": variant(0.1, 20, {"gsm8k:exact_match": acc(0, 0, 0)})})
    assert d.chosen is None
    assert "not measured for the baseline bf16" in d.verdicts["int4"].why
    with pytest.raises(ValueError, match="max_vs_baseline"):
        policy(limits={"chat.c8.p90_tpot_ms": {"max_vs_baseline": 0}})


def test_nothing_qualifies_names_the_closest_variant_and_what_it_broke():
    variants = {
        "bf16": variant(3.45, 20, BASE_EVAL),
        "gptq": variant(1.58, 35, {"gsm8k:exact_match": acc(-0.004, -0.009, 0.001)}),
        "awq": variant(1.57, 40, {"gsm8k:exact_match": acc(-0.05, -0.08, -0.02)}),
    }
    d = decide(policy(), variants)
    assert d.chosen is None
    assert d.closest == "gptq"  # one broken constraint; awq broke two, bf16 one but ranks after gptq
    assert "nothing is published" in d.summary and "gptq" in d.summary and "chat.c8.p90_tpot_ms: 35 > 30" in d.summary


def test_ties_go_to_the_next_objective_then_to_the_name():
    p = policy(limits={}, accuracy=None, objective=[{"minimize": "weights_gib"}, {"minimize": "chat.c8.p90_tpot_ms"}])
    d = decide(p, {"b": variant(1.5, 20), "a": variant(1.5, 25), "c": variant(1.5, 20)})
    assert d.chosen == "b"  # b and c tie on both objectives: the name decides, and says so
    assert "lost on chat.c8.p90_tpot_ms" in d.verdicts["a"].why
    assert "tied with b on every objective" in d.verdicts["c"].why


def test_unmeasured_figures_random_weights_and_other_devices_never_qualify():
    p = policy(device="cuda")
    variants = {
        "bf16": variant(1.0, 20, BASE_EVAL),
        "no-eval": variant(1.0, 20, None),
        "no-bench": Measured(
            figures={"gsm8k:exact_match": 0.5}, eval=entries({"gsm8k:exact_match": acc(0, 0, 0)}), bench_device=None
        ),
        "cpu-bench": variant(1.0, 20, {"gsm8k:exact_match": acc(0, 0, 0)}, device="cpu"),
        "random": variant(0.5, 10, {"gsm8k:exact_match": acc(0, 0, 0)}, random=True),
    }
    d = decide(p, variants)
    assert d.chosen == "bf16"
    why = {n: v.why for n, v in d.verdicts.items()}
    assert "gsm8k:exact_match: not measured" in why["no-eval"]
    assert "not benched" in why["no-bench"]
    assert "measured on cpu, the policy is for cuda" in why["cpu-bench"]
    assert "random weights" in why["random"]


def test_policy_files_validate_and_bad_ones_fail_in_one_line(tmp_path):
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        load_policy(path)
    bad = tmp_path / "p.yaml"
    bad.write_text("description: x\nobjective: [{minimize: weights}]\n")
    with pytest.raises(ConfigError, match=r"p.yaml: objective.0: 'weights' is not a figure") as e:
        load_policy(bad)
    assert "\n" not in str(e.value)
    bad.write_text("description: x\nobjective: [{minimize: weights_gib}]\nlimts: {}\n")
    with pytest.raises(ConfigError, match=r"p.yaml: limts: unknown key"):
        load_policy(bad)


def test_policy_file_is_shown_relative_to_the_repository_or_by_its_name(tmp_path, monkeypatch):
    assert policy_file_label(ROOT / "policies/default.yaml") == "policies/default.yaml"
    monkeypatch.chdir(ROOT)
    assert policy_file_label(Path("policies/default.yaml")) == "policies/default.yaml"
    assert policy_file_label(tmp_path / "private/mine.yaml") == "mine.yaml"  # outside: never a local absolute path


# ----------------------------------------------------------------------------- drops named per suite
def test_a_suite_named_in_the_policy_gets_its_own_allowed_drop():
    rule = {"max_drop": 0.01, "suites": {"aime24": 0.05}}
    base = BASE_EVAL | {"aime24:exact_match": {"mean": 0.3, "ci95": [0.2, 0.4]}}
    loses_4_on_aime = {"gsm8k:exact_match": acc(0.0, -0.005, 0.005), "aime24:exact_match": acc(-0.02, -0.04, 0.0)}
    variants = {"bf16": variant(1.0, 20, base), "int4": variant(0.5, 20, loses_4_on_aime)}
    assert decide(policy(accuracy=rule), variants).chosen == "int4"
    strict = decide(policy(accuracy={"max_drop": 0.01, "suites": {"aime24": 0.03}}), variants)
    assert "aime24:exact_match: could drop 4.0 points" in strict.verdicts["int4"].why
    assert "limit 3)" in strict.verdicts["int4"].why
    # only the named suites: gsm8k is held to nothing, aime24 to its own drop
    only = decide(policy(accuracy={"suites": {"aime24": 0.05}}), variants)
    assert only.chosen == "int4"


def test_a_named_suite_the_baseline_did_not_run_is_not_measured():
    rule = {"max_drop": 0.01, "suites": {"amc23": 0.03}}
    variants = {"bf16": variant(1.0, 20, BASE_EVAL), "int4": variant(0.5, 20, {"gsm8k:exact_match": acc(0, 0, 0)})}
    d = decide(policy(accuracy=rule), variants)
    assert "amc23:*: not measured" in d.verdicts["int4"].why and d.chosen is None


def test_a_rule_without_a_drop_is_a_one_line_error():
    with pytest.raises(Exception, match="max_drop: give max_drop"):
        policy(accuracy={"metrics": "all"})
    with pytest.raises(Exception, match="metrics: the figures it names are held to max_drop"):
        policy(accuracy={"metrics": ["gsm8k:exact_match"], "suites": {"aime24": 0.03}})


def test_the_shipped_r1_policy_holds_aime_and_amc_to_their_own_drop():
    rule = load_policy(ROOT / "policies/r1-distill-gpu.yaml").accuracy
    assert rule.allowed_drop("aime24:exact_match") == rule.allowed_drop("amc23:cons_at_k") == 0.03
    assert rule.allowed_drop("gsm8k:exact_match") == 0.01
