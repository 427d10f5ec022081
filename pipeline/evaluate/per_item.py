"""Per-item scores of a variant's samples_<suite>.jsonl, in item order: what compare pairs with another
variant's on the same items (the baseline's, and a technique step's base's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.artifacts import read_samples
from pipeline.evaluate.stats import cons_at_k
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
