"""make eval, step 3: each output scored, one record per item and sample (samples_<suite>.jsonl), and
the suite's figures over them.

A record is a `Sample` (pipeline/schema.py); any runner of a suite kind writes these lines, one per
item and seed, and returns the dict `score_generation_suite` returns: compare, report and review read
nothing else."""

from __future__ import annotations

import json
import math

import numpy as np

from pipeline.data import gold_of
from pipeline.evaluate.generate import generate_all
from pipeline.metrics import METRICS, final_answer_marked, score
from pipeline.schema import Sample, check_data
from pipeline.stats import bootstrap_ci


def summarise(metric_names: list[str], per_seed: list[list[dict]], truncated: list[list[bool]]) -> dict:
    """Per metric: mean over seeds of the per-seed mean, std across seeds, bootstrap CI over items of
    the per-item mean across seeds, and stderr in lm-eval's sense (sample std / sqrt(n))."""
    out = {}
    for m in metric_names:
        grid = np.array([[r[m] for r in seed_rows] for seed_rows in per_seed])  # seeds x items
        item = grid.mean(axis=0)
        out[m] = {
            "mean": float(grid.mean()),
            "ci95": bootstrap_ci(item),
            "stderr": float(item.std(ddof=1) / math.sqrt(len(item))) if len(item) > 1 else math.nan,
            "per_seed": [float(x) for x in grid.mean(axis=1)],
            "std_across_seeds": float(grid.mean(axis=1).std(ddof=1)) if len(grid) > 1 else 0.0,
        }
        done = ~np.array(truncated)
        out[m]["mean_completed"] = float(grid[done].mean()) if done.any() else math.nan
    return out


def sample_record(suite, i: int, seed: int, text: str, prompt: list[int], out, gold, reasoning: bool) -> dict:
    """One output scored: the line of samples_<suite>.jsonl for item i under this seed."""
    answer, scores = score(suite.metric, out.text, gold, reasoning)
    return {
        "doc_id": i,
        "seed": seed,
        "prompt": text,
        "prompt_tokens": len(prompt),
        "output": out.text,
        "output_tokens": len(out.token_ids),
        "finish_reason": out.finish_reason,
        # Cut off by the token limit: counted and reported apart (it did not get to answer).
        "truncated": out.finish_reason == "length",
        # No final-answer marker (see final_answer_marked): counted apart too, so a score that
        # rests on the last-number fallback, or a 0 for "no answer", is visible as such.
        "no_answer": not final_answer_marked(suite.metric, out.text, reasoning),
        "extracted": answer,
        "gold": gold,
        **scores,
    }


def run_generation_suite(llm, suite, rows, texts, prompts, gen, reasoning, samples_path) -> dict:
    """One suite on its own (generate, then score); `evaluate` batches every suite through generate_all."""
    outputs, wall = generate_all(llm, {"suite": (prompts, gen)})
    return score_generation_suite(
        suite, rows, texts, prompts, gen, reasoning, outputs.get("suite", {}), wall, samples_path
    )


def score_generation_suite(suite, rows, texts, prompts, gen, reasoning, outputs_by_seed, wall, samples_path) -> dict:
    """Score a suite's outputs (per seed, in item order), write samples_<suite>.jsonl, summarise."""
    golds = [gold_of(suite, r) for r in rows]
    metric_names = list(METRICS[suite.metric].figures)
    per_seed, truncated, unmarked, gen_tokens = [], [], [], 0
    with samples_path.open("w") as f:
        for seed in gen.seeds:
            records = [
                sample_record(suite, i, seed, texts[i], prompts[i], out.outputs[0], gold, reasoning)
                for i, (out, gold) in enumerate(zip(outputs_by_seed[seed], golds))
            ]
            for record in records:
                check_data(Sample, record, samples_path)  # as compare and review will read it
                f.write(json.dumps(record) + "\n")
            gen_tokens += sum(r["output_tokens"] for r in records)
            per_seed.append([{m: r[m] for m in metric_names} for r in records])
            truncated.append([r["truncated"] for r in records])
            unmarked.append([r["no_answer"] for r in records])
    return {
        "metrics": summarise(metric_names, per_seed, truncated),
        "n": len(prompts),
        "seeds": gen.seeds,
        "truncated": int(np.sum(truncated)),
        "truncated_items_any_seed": int(np.any(truncated, axis=0).sum()),
        "no_answer": int(np.sum(unmarked)),
        "no_answer_items_any_seed": int(np.any(unmarked, axis=0).sum()),
        "items_scored": len(prompts),
        "generated_tokens": gen_tokens,
        # the wall time of the one generate call this suite shared with the others (see generate_all)
        "generate_s": round(wall, 2),
    }
