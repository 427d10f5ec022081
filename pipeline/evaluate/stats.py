"""The statistics of the eval report: bootstrap CIs over items, the paired difference to the baseline
on the same items (paired bootstrap and exact McNemar), and fidelity (KL, top-1 agreement, perplexity)
from top-k log-probabilities.

Several samples of one item (seeds, or k samples per problem) are not independent: the clustered
variants resample items (clusters) with all their samples, pass@1 being the mean over samples, and
cons@k (majority vote) scores one answer per item."""

from __future__ import annotations

import math

import numpy as np

from pipeline.schema import ConfigError

BOOTSTRAP_RESAMPLES = 10_000


def bootstrap_ci(
    scores, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over items (resampling items with replacement)."""
    x = np.asarray(scores, dtype=float)
    if len(x) == 0:
        return (math.nan, math.nan)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def cluster_bootstrap_ci(
    table, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over samples when the samples come in clusters (one row of
    `table` per item, its samples in the row; rows may differ in length). Items are resampled with
    replacement, each with all of its samples; the statistic is the resampled total over the resampled
    count. With one sample per item this is `bootstrap_ci`, draw for draw."""
    sums = np.array([np.sum(np.asarray(row, float)) for row in table])
    counts = np.array([len(row) for row in table], float)
    if len(sums) == 0 or counts.sum() == 0:
        return (math.nan, math.nan)
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(resamples, len(sums)))
    means = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def pass_at_1(table) -> float:
    """DeepSeek's pass@1 over k samples: the mean over every sample of every item (rows: items; they may
    differ in length: the pooled total over the pooled count, the statistic `cluster_bootstrap_ci`
    resamples, not the mean of per-item means). Eval's suite figures take their pass@1 from here."""
    counts = sum(len(row) for row in table)
    return float(sum(np.sum(np.asarray(row, float)) for row in table) / counts) if counts else math.nan


def majority_vote(answers: list, scores: list[float]) -> float:
    """cons@k of one item: the score of the answer most of its samples gave (the first given among
    equally frequent ones); samples without an answer (None) do not vote, and no vote scores 0."""
    voted = [a for a in answers if a is not None]
    if not voted:
        return 0.0
    counts: dict = {}
    for a in voted:
        counts[a] = counts.get(a, 0) + 1
    winner = max(counts, key=counts.get)  # dicts keep first-seen order, and max keeps the first maximum
    return float(scores[answers.index(winner)])


def cons_at_k(answers, scores) -> np.ndarray:
    """Per-item cons@k (rows: items, each with its samples' extracted answers and their scores): the
    `majority_vote` of each item, in item order. Eval's suite entry and compare's paired table both take
    their votes from here."""
    if len(answers) != len(scores):
        raise ConfigError(f"cons@k: answers of {len(answers)} items against scores of {len(scores)}")
    return np.array([majority_vote(list(a), list(s)) for a, s in zip(answers, scores)], dtype=float)


def paired_cluster_bootstrap_ci(variant, baseline, **kw) -> tuple[float, float]:
    """CI of the mean per-item difference of two clustered tables on the same items (row i of each:
    item i's samples): each item's difference of its sample means, items resampled."""
    if len(variant) != len(baseline):
        raise ConfigError(f"paired: {len(variant)} items against {len(baseline)}; score both on the same items")
    diff = [np.mean(np.asarray(v, float)) - np.mean(np.asarray(b, float)) for v, b in zip(variant, baseline)]
    return bootstrap_ci(diff, **kw)


def paired_bootstrap_ci(variant, baseline, **kw) -> tuple[float, float]:
    """CI of mean(variant - baseline) on the same items: the item is the resampling unit, so the
    between-item variance that both share cancels, and small real drops become visible."""
    return bootstrap_ci(np.asarray(variant, float) - np.asarray(baseline, float), **kw)


def mcnemar_exact(variant, baseline) -> dict:
    """Exact (binomial) McNemar test on paired 0/1 scores: only items where the two disagree count, the
    lost ones a Binomial(lost + gained, 1/2) under no difference (scipy's two-sided binomtest)."""
    from scipy.stats import binomtest  # the serve environment's (make eval); lm-eval pins the same scipy

    v, b = np.asarray(variant), np.asarray(baseline)
    lost, gained = int(((b == 1) & (v == 0)).sum()), int(((b == 0) & (v == 1)).sum())
    p = 1.0 if lost + gained == 0 else float(binomtest(lost, lost + gained, 0.5).pvalue)
    return {"lost": lost, "gained": gained, "p_value": p}


def paired_difference(variant, baseline) -> dict:
    """mean(variant - baseline) on the same items with its paired CI, McNemar's count for 0/1 scores, and
    whether the difference is real: the CI excludes 0 (and, for 0/1 scores, McNemar agrees at 5%)."""
    v, b = np.asarray(variant, float), np.asarray(baseline, float)
    diff_ci = paired_bootstrap_ci(v, b)
    binary = set(np.unique(np.concatenate([v, b]))) <= {0.0, 1.0}
    mcnemar = mcnemar_exact(v, b) if binary else None
    significant = (diff_ci[0] > 0 or diff_ci[1] < 0) and (mcnemar is None or mcnemar["p_value"] < 0.05)
    return {
        "delta": float(v.mean() - b.mean()),
        "delta_ci95": diff_ci,
        "mcnemar": mcnemar,
        "significant": bool(significant),
    }


def fidelity_positions(ref: dict, var: dict) -> dict[str, np.ndarray]:
    """Per scored position: KL(baseline || variant) (`kld`), the probability mass it covers (`covered`) and
    top-1 agreement (`top1`, 0/1), from top-k prompt log-probabilities.

    KLD is not full-vocabulary: vLLM returns the top-k per position. Per position we coarse-grain the
    vocabulary into the tokens in *both* top-k lists (each its own outcome) plus one bucket for all
    others, whose probabilities both sides know exactly (1 - covered mass). KL of a coarse-graining is
    a lower bound of the full KL (data-processing inequality) and converges to it as the covered mass
    goes to 1; `kld_mass_covered` reports that mass so the reader sees how tight the bound is.
    """
    if not np.array_equal(ref["token_ids"], var["token_ids"]):
        raise ConfigError(
            "fidelity: the variant and the baseline scored different token ids; they must share the tokenizer"
        )
    kl = np.zeros(len(ref["token_ids"]))
    covered = np.zeros_like(kl)
    for i, (ri, rl, vi, vl) in enumerate(zip(ref["top_ids"], ref["top_logprobs"], var["top_ids"], var["top_logprobs"])):
        vmap = dict(zip(vi.tolist(), vl.tolist()))
        both = [(math.exp(l), math.exp(vmap[t])) for t, l in zip(ri.tolist(), rl.tolist()) if t in vmap and t >= 0]
        p, q = (np.array(x) for x in zip(*both)) if both else (np.zeros(0), np.zeros(0))
        p_rest, q_rest = max(1 - p.sum(), 0.0), max(1 - q.sum(), 0.0)
        kl[i] = float(np.sum(p * (np.log(p) - np.log(q))))
        if p_rest > 1e-12:
            kl[i] += p_rest * (math.log(p_rest) - math.log(max(q_rest, 1e-12)))
        covered[i] = p.sum()
    return {"kld": kl, "covered": covered, "top1": (ref["top_ids"][:, 0] == var["top_ids"][:, 0]).astype(float)}


def fidelity_stats(ref: dict, var: dict, at: dict[str, np.ndarray] | None = None) -> dict:
    """KL(baseline || variant), top-1 agreement and perplexity, with bootstrap CIs; at: their
    fidelity_positions, where the caller has them already."""
    at = fidelity_positions(ref, var) if at is None else at
    return {
        "kld_mean": float(at["kld"].mean()),
        "kld_ci95": bootstrap_ci(at["kld"]),
        "kld_mass_covered": float(at["covered"].mean()),
        "top1_agreement": float(at["top1"].mean()),
        "top1_ci95": bootstrap_ci(at["top1"]),
        "perplexity": float(np.exp(-var["logprob"].mean())),
        "baseline_perplexity": float(np.exp(-ref["logprob"].mean())),
        "positions": int(len(at["kld"])),
        "top_k": int(ref["top_ids"].shape[1]),
    }
