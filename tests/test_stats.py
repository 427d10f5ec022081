"""pipeline/evaluate/stats.py on known cases: bootstrap CIs, the paired difference, McNemar, and the fidelity
figures (KL over the top-k tokens and one bucket for all others, top-1 agreement, perplexity)."""

import numpy as np
import pytest

from pipeline.evaluate.stats import bootstrap_ci, fidelity_stats, mcnemar_exact, paired_bootstrap_ci


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
    pytest.importorskip("scipy")  # scipy.stats.binomtest: the serve environment
    # 5 lost, 0 gained: p = 2 * 0.5**5
    assert mcnemar_exact([0] * 5 + [1] * 5, [1] * 10) == {"lost": 5, "gained": 0, "p_value": 0.0625}
    # 1 lost, 9 gained: p = 2 * (1 + 10) / 2**10
    assert mcnemar_exact([1] * 9 + [0], [0] * 9 + [1])["p_value"] == pytest.approx(0.021484375)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1])["p_value"] == 1.0


def exact_mcnemar_p(lost: int, gained: int) -> float:
    """The two-sided exact McNemar p-value in integers: 2 P(X <= min(lost, gained)), X ~ Binomial(n, 1/2)."""
    n, tail, comb = lost + gained, 0, 1
    for i in range(min(lost, gained) + 1):  # comb = C(n, i)
        tail, comb = tail + comb, comb * (n - i) // (i + 1)
    return 1.0 if n == 0 else min(1.0, 2 * tail / 2**n)


def test_mcnemar_is_the_exact_binomial_p_value_for_every_split():
    """scipy's binomtest gives the integer computation's p-value (what compare computed before it used scipy)
    to floating-point rounding, for every split of up to 40 disagreements and for suites of thousands;
    only below ~1e-250, past a float's range for its tail sums, does scipy give 0.0 (still significant)."""
    pytest.importorskip("scipy")
    splits = [(lost, n - lost) for n in range(41) for lost in range(n + 1)]
    splits += [(lost, n - lost) for n in (500, 1000, 5000) for lost in range(0, n + 1, n // 50)]
    for lost, gained in splits:
        got = mcnemar_exact([0] * lost + [1] * gained, [1] * lost + [0] * gained)
        assert got["lost"] == lost and got["gained"] == gained
        want = exact_mcnemar_p(lost, gained)
        if want > 1e-250:
            assert got["p_value"] == pytest.approx(want, rel=1e-9, abs=0), (lost, gained)
            assert format(got["p_value"], ".3g") == format(want, ".3g"), (lost, gained)  # as eval-report.md shows it
        else:
            assert got["p_value"] < 1e-250, (lost, gained)


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


# ----------------------------------------------------------------------- clustered: k samples an item
def exact_cluster_bootstrap(table, level=0.95):
    """Every one of the n^n resamples of n items, each with all its samples: the bootstrap
    distribution that cluster_bootstrap_ci approximates by drawing, and its percentiles."""
    import itertools

    n = len(table)
    stats = [
        sum(sum(table[i]) for i in pick) / sum(len(table[i]) for i in pick)
        for pick in itertools.product(range(n), repeat=n)
    ]
    tail = (1 - level) / 2 * 100
    return np.percentile(stats, tail), np.percentile(stats, 100 - tail)


def test_the_clustered_ci_matches_the_brute_force_bootstrap_on_a_small_table():
    from pipeline.evaluate.stats import cluster_bootstrap_ci

    table = [[1, 1, 1, 0], [0, 0], [1, 0, 0], [0, 0, 0, 0], [1, 1, 1]]  # 5 problems, unequal k
    lo, hi = cluster_bootstrap_ci(table, resamples=200_000)
    exact_lo, exact_hi = exact_cluster_bootstrap(table)
    assert lo == pytest.approx(exact_lo, abs=0.01) and hi == pytest.approx(exact_hi, abs=0.01)


def test_the_clustered_ci_is_wider_than_one_that_treats_samples_as_independent():
    from pipeline.evaluate.stats import cluster_bootstrap_ci

    # each problem either always solved or never: 16 samples say no more than one
    table = [[1.0] * 16 if i % 2 else [0.0] * 16 for i in range(20)]
    lo, hi = cluster_bootstrap_ci(table)
    flat_lo, flat_hi = bootstrap_ci([x for row in table for x in row])
    assert (hi - lo) > 3 * (flat_hi - flat_lo)
    one_each = [[x] for x in [0.0, 1.0] * 100]
    assert cluster_bootstrap_ci(one_each) == bootstrap_ci([0.0, 1.0] * 100)  # k = 1: the plain bootstrap


def test_pass_at_1_and_cons_at_k_on_hand_made_samples():
    from pipeline.evaluate.stats import majority_vote, pass_at_1

    # problem 1: 3 of 4 right; problem 2: 1 of 4 right, the majority wrong; problem 3: no answer twice
    scores = [[1, 1, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0]]
    answers = [["7", "7", "8", "7"], ["3", "5", "3", "4"], [None, None, "9", "2"]]
    assert pass_at_1(scores) == pytest.approx(5 / 12)
    cons = [majority_vote(a, s) for a, s in zip(answers, scores)]
    assert cons == [1.0, 0.0, 1.0]  # problem 3: "9" and "2" tie, the first given wins
    assert majority_vote([None, None], [0, 0]) == 0.0


def test_pass_at_1_pools_samples_when_items_have_unequal_k():
    from pipeline.evaluate.stats import cluster_bootstrap_ci, cons_at_k, pass_at_1

    # 5 samples, 4 right: 0.8; the mean of the two items' means (1.0 and 0.0) would say 0.5
    assert pass_at_1([[1, 1, 1, 1], [0]]) == pytest.approx(0.8)
    assert pass_at_1([]) != pass_at_1([])  # nan: no samples, no figure
    lo, hi = cluster_bootstrap_ci([[1, 1, 1, 1], [0]], resamples=2000)
    assert lo <= pass_at_1([[1, 1, 1, 1], [0]]) <= hi  # the CI is of the same statistic
    answers = [["7", "7", "8"], ["3"], [None]]
    assert cons_at_k(answers, [[1, 1, 0], [0], [0]]).tolist() == [1.0, 0.0, 0.0]


def test_the_paired_clustered_difference_resamples_problems():
    from pipeline.evaluate.stats import paired_cluster_bootstrap_ci

    base = [[1, 1, 1, 1]] * 10 + [[0, 0, 0, 0]] * 10
    variant = [[1, 1, 0, 0]] * 10 + [[0, 0, 0, 0]] * 10  # loses half its samples on every solved problem
    lo, hi = paired_cluster_bootstrap_ci(variant, base)
    assert hi < 0 and lo < -0.25 < hi
    assert paired_cluster_bootstrap_ci(base, base) == (0.0, 0.0)
    with pytest.raises(Exception, match="same items"):
        paired_cluster_bootstrap_ci(base[:3], base)
