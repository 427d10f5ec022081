"""Per-item scores of a variant's samples_<suite>.jsonl, in item order, and per-position fidelity against
the baseline: what compare pairs with another variant's on the same items and positions (the baseline's,
and a technique step's base's)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from pipeline.artifacts import read_fidelity, read_samples
from pipeline.evaluate.stats import cons_at_k, fidelity_positions
from pipeline.metrics import METRICS

ITEM_FIGURES = sorted({figure for metric in METRICS.values() for figure in metric.figures})  # what a record scores


def item_scores(path: Path) -> dict[str, np.ndarray]:
    """Per-item scores of a samples_<suite>.jsonl, averaged over seeds, in item order."""
    by_metric: dict[str, dict[int, list[float]]] = {}
    for rec in read_samples(path):
        for m in ITEM_FIGURES:
            if (value := getattr(rec, m)) is not None:
                by_metric.setdefault(m, {}).setdefault(rec.doc_id, []).append(value)
    return {m: np.array([np.mean(v[i]) for i in sorted(v)]) for m, v in by_metric.items()}


def consensus_scores(path: Path) -> np.ndarray:
    """Per-item cons@k of a samples_<suite>.jsonl: the exact_match of the majority answer, item order."""
    by_item: dict[int, tuple[list, list]] = {}
    for rec in read_samples(path):
        answers, scores = by_item.setdefault(rec.doc_id, ([], []))
        answers.append(rec.extracted)
        scores.append(rec.exact_match)
    return cons_at_k([by_item[i][0] for i in sorted(by_item)], [by_item[i][1] for i in sorted(by_item)])


class EvalFiles:
    """The per-item and per-position figures of each variant's eval/ under model_dir, keyed (variant, suite):
    each file read and each figure computed once, however many comparisons pair it (every variant against
    the baseline, each technique step's variant against its base). The arrays are shared: not to be changed."""

    def __init__(self, model_dir: Path, baseline: str):
        self.model_dir, self.baseline = model_dir, baseline
        self.npz = functools.cache(lambda name, suite: read_fidelity(self._file(name, f"fidelity_{suite}.npz")))
        # KLD to the baseline and top-1 agreement with it, per scored position (stats.fidelity_positions)
        self.positions = functools.cache(
            lambda name, suite: fidelity_positions(self.npz(baseline, suite), self.npz(name, suite))
        )
        self.scores = functools.cache(lambda name, suite: item_scores(self._file(name, f"samples_{suite}.jsonl")))
        self.consensus = functools.cache(
            lambda name, suite: consensus_scores(self._file(name, f"samples_{suite}.jsonl"))
        )

    def _file(self, name: str, file: str) -> Path:
        return self.model_dir / name / "eval" / file
