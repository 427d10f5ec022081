"""A from_eval workload: the prompts eval sent the variant and as many output tokens as it wrote to each,
as vLLM's custom dataset, and the lengths it replays."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.artifacts import read_samples
from pipeline.schema import ConfigError, Workload, WorkloadLengths


def eval_dataset(variant: Path, workload: Workload, max_model_len: int, out: Path) -> WorkloadLengths:
    """Each prompt of the variant's eval/samples_<suite>.jsonl (one line per item and seed) with its output
    length (at least 2 tokens, at most what max_model_len leaves), written to `out`; a one-line ConfigError,
    before any server starts, where eval has not written them."""
    path = variant / "eval" / f"samples_{workload.from_eval}.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"capacity workload {workload.name}: from_eval {workload.from_eval}: no {path}; run make eval with that "
            "suite first, or give the workload input_len and output_len"
        )
    samples = [s for s in read_samples(path) if s.prompt_tokens < max_model_len - 2]
    if not samples:
        raise ConfigError(f"{path}: no prompt shorter than the profile's max_model_len {max_model_len}")
    rows = [(s.prompt, s.prompt_tokens, min(max(2, s.output_tokens), max_model_len - s.prompt_tokens)) for s in samples]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"prompt": p, "output_tokens": n}) + "\n" for p, _, n in rows))
    return WorkloadLengths(
        file=str(path),
        items=len(rows),
        prompt_tokens=_quantiles([t for _, t, _ in rows]),
        output_tokens=_quantiles([n for _, _, n in rows]),
    )


def _quantiles(values: list[int]) -> dict:
    ordered = sorted(values)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    mean = round(sum(ordered) / len(ordered), 1)
    return {"p10": at(0.1), "p50": at(0.5), "p90": at(0.9), "max": ordered[-1], "mean": mean}
