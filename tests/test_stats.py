"""pipeline/stats.py on known cases: bootstrap CIs, the paired difference, McNemar, and the fidelity
figures (KL over the top-k tokens and one bucket for all others, top-1 agreement, perplexity)."""

import numpy as np
import pytest

from pipeline.stats import bootstrap_ci, fidelity_stats, mcnemar_exact, paired_bootstrap_ci


# ------------------------------------------------------------------------------------- statistics
def test_bootstrap_ci_on_known_cases():
    assert bootstrap_ci([1.0] * 30) == (1.0, 1.0)
    lo, hi = bootstrap_ci([0.0, 1.0] * 100)  # p = 0.5, n = 200: normal CI is 0.5 +- 1.96 * 0.0354
    assert lo == pytest.approx(0.5 - 0.0693, abs=0.01) and hi == pytest.approx(0.5 + 0.0693, abs=0.01)
    assert bootstrap_ci([0.0, 1.0] * 100) == (lo, hi)  # seeded: the same figures every run


def test_paired_bootstrap_sees_a_consistent_drop_that_unpaired_cis_hide():
    rng = np.random.default_rng(1)
    base = (rng.random(300) < 0.6).astype(float)
    variant = base.copy()
    variant[np.flatnonzero(base)[:15]] = 0  # loses 15 items, gains none: a real 5-point drop
    lo_b, hi_b = bootstrap_ci(base)
    lo_v, hi_v = bootstrap_ci(variant)
    assert lo_b < hi_v  # the two marginal CIs overlap...
    lo, hi = paired_bootstrap_ci(variant, base)
    assert hi < 0 and lo == pytest.approx(-0.05, abs=0.04)  # ...the paired CI excludes zero
    assert paired_bootstrap_ci(base, base) == (0.0, 0.0)


def test_mcnemar_exact_p_values():
    # 5 lost, 0 gained: p = 2 * 0.5**5
    assert mcnemar_exact([0] * 5 + [1] * 5, [1] * 10) == {"lost": 5, "gained": 0, "p_value": 0.0625}
    # 1 lost, 9 gained: p = 2 * (1 + 10) / 2**10
    assert mcnemar_exact([1] * 9 + [0], [0] * 9 + [1])["p_value"] == pytest.approx(0.021484375)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1])["p_value"] == 1.0


def test_fidelity_stats_identical_and_shifted_distributions():
    ids = np.array([[3, 1, 2], [0, 2, 1]])
    p = np.log(np.array([[0.7, 0.2, 0.05], [0.5, 0.3, 0.1]]))
    ref = {"token_ids": np.array([3, 2]), "logprob": p[[0, 1], [0, 1]], "top_ids": ids, "top_logprobs": p}
    same = fidelity_stats(ref, ref)
    assert same["kld_mean"] == pytest.approx(0, abs=1e-12) and same["top1_agreement"] == 1.0
    assert same["perplexity"] == same["baseline_perplexity"]
    q = np.log(np.array([[0.7, 0.2, 0.05], [0.5, 0.3, 0.1]]))
    var = {**ref, "top_ids": np.array([[1, 3, 2], [0, 2, 1]]), "top_logprobs": q, "logprob": np.log([0.2, 0.3])}
    got = fidelity_stats(ref, var)  # position 0: tokens 3 and 1 swap places (.7 <-> .2), the rest as before
    assert got["kld_mean"] == pytest.approx((0.7 * np.log(0.7 / 0.2) + 0.2 * np.log(0.2 / 0.7)) / 2)
    assert got["top1_agreement"] == 0.5 and got["perplexity"] == pytest.approx(np.exp(-np.log([0.2, 0.3]).mean()))
    q2 = np.log(np.array([[0.6, 0.3, 0.05], [0.5, 0.3, 0.1]]))
    got2 = fidelity_stats(ref, {**ref, "top_logprobs": q2})
    exact0 = 0.7 * np.log(0.7 / 0.6) + 0.2 * np.log(0.2 / 0.3) + 0.05 * np.log(1) + 0.05 * np.log(0.05 / 0.05)
    assert got2["kld_mean"] == pytest.approx(exact0 / 2)


def test_fidelity_kl_counts_the_mass_outside_the_shared_top_k():
    # position 0: the variant's top-3 lacks the reference's token 7 (and has 8 instead); the tokens in
    # both lists are 5 and 6, everything else is one bucket: 1 - 0.9 for the reference, 1 - 0.8 for the variant
    ref = {
        "token_ids": np.array([5, 1]),
        "logprob": np.log([0.6, 0.5]),
        "top_ids": np.array([[5, 6, 7], [1, 2, 3]]),
        "top_logprobs": np.log([[0.6, 0.3, 0.05], [0.5, 0.3, 0.1]]),
    }
    var = {
        **ref,
        "logprob": np.log([0.5, 0.5]),
        "top_ids": np.array([[5, 6, 8], [1, 2, 3]]),
        "top_logprobs": np.log([[0.5, 0.3, 0.15], [0.5, 0.3, 0.1]]),
    }
    got = fidelity_stats(ref, var)
    rest = 0.1 * np.log(0.1 / 0.2)  # negative: the variant puts more mass outside the shared tokens
    assert got["kld_mean"] == pytest.approx((0.6 * np.log(0.6 / 0.5) + 0.3 * np.log(0.3 / 0.3) + rest) / 2)
    assert got["kld_mass_covered"] == pytest.approx((0.9 + 0.9) / 2)
    assert got["top1_agreement"] == 1.0
    # KL(reference || variant), not the reverse: swapped, the same two files give another figure
    assert fidelity_stats(var, ref)["kld_mean"] != pytest.approx(got["kld_mean"])
