"""The Disagreements tab's data: the items of a suite that bf16 and a variant score differently, from eval's samples."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts import read_samples
from pipeline.schema import ConfigError

TRUNCATION = ("all items", "cut off (either side)", "not cut off")
SHOWN = 50  # items rendered at once; the counts above them are always of all


# ------------------------------------------------------------------------------- disagreements
@dataclass(frozen=True)
class Answer:
    """One variant's answer to one item: the first seed's output, the figure averaged over seeds."""

    output: str
    extracted: str | None
    score: float
    truncated: bool  # under any seed
    seeds: int


@dataclass(frozen=True)
class Disagreement:
    doc_id: int
    prompt: str
    gold: object
    baseline: Answer
    variant: Answer


def evaluated_variants(model_dir: Path) -> list[str]:
    return sorted(p.parent.parent.name for p in model_dir.glob("*/eval/results.json"))


def sample_suites(variant_dir: Path) -> list[str]:
    return sorted(p.stem.removeprefix("samples_") for p in (variant_dir / "eval").glob("samples_*.jsonl"))


def answers(path: Path, figure: str) -> dict[int, tuple[str, object, Answer]]:
    """{doc_id: (prompt, gold, Answer)} from a samples_<suite>.jsonl."""
    by_item: dict[int, list] = {}
    for rec in sorted(read_samples(path), key=lambda r: (r.doc_id, r.seed)):
        by_item.setdefault(rec.doc_id, []).append(rec)
    out = {}
    for doc_id, recs in by_item.items():
        scores = [getattr(r, figure) for r in recs]
        if None in scores:
            raise ConfigError(f"{path}: item {doc_id} has no {figure!r} figure; pick one the suite's metric writes")
        first = recs[0]
        answer = Answer(
            first.output, first.extracted, sum(scores) / len(scores), any(r.truncated for r in recs), len(recs)
        )
        out[doc_id] = (first.prompt, first.gold, answer)
    return out


def figures(path: Path) -> list[str]:
    """The per-item figures a samples file holds (exact_match; SQuAD also f1), from its first record."""
    records = read_samples(path)
    return [f for f in ("exact_match", "f1") if records and getattr(records[0], f) is not None]


def disagreements(
    model_dir: Path, suite: str, variant: str, figure: str, baseline: str = "bf16"
) -> tuple[list[Disagreement], int]:
    """The items of `suite` where `variant` and `baseline` score differently on `figure` (the baseline's
    wins first, largest gap first, then the variant's, each in item order), and how many items there are."""
    files = [model_dir / v / "eval" / f"samples_{suite}.jsonl" for v in (baseline, variant)]
    for f in files:
        if not f.is_file():
            raise ConfigError(f"{f}: missing; run `make eval` with {suite} in SUITES")
    base, var = (answers(f, figure) for f in files)
    if base.keys() != var.keys():
        raise ConfigError(
            f"{files[1]}: not the same items as {files[0]} ({len(var)} vs {len(base)}; a different LIMIT?); "
            "run `make eval` again for both"
        )
    found = [
        Disagreement(i, base[i][0], base[i][1], base[i][2], var[i][2])
        for i in sorted(base)
        if base[i][2].score != var[i][2].score
    ]
    return sorted(found, key=lambda d: (d.variant.score - d.baseline.score, d.doc_id)), len(base)


def counts(found: list[Disagreement], total: int) -> dict[str, int]:
    return {
        "items": total,
        "differ": len(found),
        "baseline_better": sum(d.baseline.score > d.variant.score for d in found),
        "variant_better": sum(d.variant.score > d.baseline.score for d in found),
        "cut_off": sum(d.baseline.truncated or d.variant.truncated for d in found),
    }


def keep(d: Disagreement, truncation: str) -> bool:
    cut = d.baseline.truncated or d.variant.truncated
    return truncation == TRUNCATION[0] or cut == (truncation == TRUNCATION[1])
