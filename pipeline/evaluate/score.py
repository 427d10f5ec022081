"""make eval, step 3: each output scored, one record per item and sample (samples_<suite>.jsonl), and
the suite's figures over them.

A record is a `Sample` (pipeline/schema/eval_outputs.py); any runner of a suite kind writes these lines, one per
item and seed, and returns the dict `score_generation_suite` returns: compare, report and review read
nothing else."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from pipeline.data import gold_of
from pipeline.evaluate.generate import generate_all
from pipeline.evaluate.stats import bootstrap_ci, cluster_bootstrap_ci, cons_at_k, pass_at_1
from pipeline.metrics import METRICS, final_answer_marked, score
from pipeline.openai_client import Completion
from pipeline.schema import Generation, Sample, Suite, check_data


@dataclass(frozen=True)
class ScoredSuite:
    """A generation suite as its outputs are scored: the suite, its items in order (the rows, the prompts'
    texts and token ids), its sampling (the seeds are the k samples), and whether the model reasons first."""

    suite: Suite
    rows: list[dict]
    texts: list[str]
    prompts: list[list[int]]
    gen: Generation
    reasoning: bool


def summarise(metric_names: list[str], per_seed: list[list[dict]], truncated: list[list[bool]]) -> dict:
    """Per metric: mean over seeds of the per-seed mean (pass@1 over k samples), std across seeds, the
    clustered bootstrap CI (items resampled with all their samples), and stderr in lm-eval's sense
    (sample std of the per-item means / sqrt(n))."""
    out = {}
    for m in metric_names:
        grid = np.array([[r[m] for r in seed_rows] for seed_rows in per_seed])  # seeds x items
        item = grid.mean(axis=0)
        out[m] = {
            "mean": pass_at_1(grid.T),  # pass@1 over the k samples of each item
            "ci95": cluster_bootstrap_ci(grid.T),  # items resampled, each with all its samples
            "stderr": float(item.std(ddof=1) / math.sqrt(len(item))) if len(item) > 1 else math.nan,
            "per_seed": [float(x) for x in grid.mean(axis=1)],
            "std_across_seeds": float(grid.mean(axis=1).std(ddof=1)) if len(grid) > 1 else 0.0,
        }
        done = ~np.array(truncated)  # seeds x items; the completed samples of an item are a ragged row
        completed = [item_row[done_row] for item_row, done_row in zip(grid.T, done.T)]
        out[m]["mean_completed"] = pass_at_1(completed) if done.any() else math.nan
    return out


def consensus(metric_names: list[str], per_seed: list[list[dict]], answers: list[list]) -> dict:
    """cons@k beside pass@1: per item, the exact_match of the answer most of its k samples gave; only
    for suites scored by exact match and run with more than one sample."""
    if len(per_seed) < 2 or "exact_match" not in metric_names:
        return {}
    per_item_answers = list(zip(*answers))  # seeds x items -> items x seeds
    per_item_scores = list(zip(*[[r["exact_match"] for r in seed_rows] for seed_rows in per_seed]))
    votes = cons_at_k(per_item_answers, per_item_scores)
    return {"cons_at_k": {"k": len(per_seed), "mean": float(np.mean(votes)), "ci95": bootstrap_ci(votes)}}


def sample_record(scored: ScoredSuite, i: int, seed: int, out: Completion, gold) -> dict:
    """One completion scored: the line of samples_<suite>.jsonl for item i under this seed."""
    suite, reasoning = scored.suite, scored.reasoning
    think_end = suite.think_end_token
    answer, scores = score(suite.metric, out.text, gold, reasoning, think_end)
    # a thinking model cut off before closing its reasoning did not get to answer, whatever stopped it
    unfinished_thought = reasoning and think_end not in out.text
    return {
        "doc_id": i,
        "seed": seed,
        "prompt": scored.texts[i],
        "prompt_tokens": len(scored.prompts[i]),
        "output": out.text,
        "output_tokens": len(out.token_ids),
        "finish_reason": out.finish_reason,
        # Cut off by the token limit: counted and reported apart (it did not get to answer).
        "truncated": out.finish_reason == "length" or unfinished_thought,
        # No final-answer marker (see final_answer_marked): counted apart too, so a score that
        # rests on the last-number fallback, or a 0 for "no answer", is visible as such.
        "no_answer": not final_answer_marked(suite.metric, out.text, reasoning, think_end),
        "extracted": answer,
        "gold": gold,
        **scores,
    }


def run_generation_suite(client, scored: ScoredSuite, samples_path) -> dict:
    """One suite on its own (generate, then score); `evaluate` batches every suite through generate_all."""
    outputs, wall = generate_all(client, {"suite": (scored.prompts, scored.gen)})
    return score_generation_suite(scored, outputs.get("suite", {}), wall, samples_path)


def score_generation_suite(scored: ScoredSuite, outputs_by_seed: dict, wall: float, samples_path) -> dict:
    """Score a suite's completions (per seed, in item order), write samples_<suite>.jsonl, summarise."""
    golds = [gold_of(scored.suite, r) for r in scored.rows]
    metric_names = list(METRICS[scored.suite.metric].figures)
    gen = scored.gen
    per_seed, truncated, unmarked, answers, gen_tokens = [], [], [], [], 0
    with samples_path.open("w") as f:
        for seed in gen.seeds:
            records = [
                sample_record(scored, i, seed, out, gold)
                for i, (out, gold) in enumerate(zip(outputs_by_seed[seed], golds))
            ]
            for record in records:
                check_data(Sample, record, samples_path)  # as compare and review will read it
                f.write(json.dumps(record) + "\n")
            gen_tokens += sum(r["output_tokens"] for r in records)
            per_seed.append([{m: r[m] for m in metric_names} for r in records])
            answers.append([r["extracted"] for r in records])
            truncated.append([r["truncated"] for r in records])
            unmarked.append([r["no_answer"] for r in records])
    return {
        "metrics": summarise(metric_names, per_seed, truncated),
        **consensus(metric_names, per_seed, answers),
        "n": len(scored.prompts),
        "seeds": gen.seeds,
        "truncated": int(np.sum(truncated)),
        "truncated_items_any_seed": int(np.any(truncated, axis=0).sum()),
        "no_answer": int(np.sum(unmarked)),
        "no_answer_items_any_seed": int(np.any(unmarked, axis=0).sum()),
        "items_scored": len(scored.prompts),
        "generated_tokens": gen_tokens,
        # the wall time of the one generate call this suite shared with the others (see generate_all)
        "generate_s": round(wall, 2),
    }
