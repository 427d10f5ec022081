"""What an eval suite (eval/*.yaml) may say: a native suite with its generation settings, or an lm-eval task."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.schema.common import EACH_ONCE, Source, Strict, _validate, load_yaml_file


class Generation(Strict):
    """Sampling settings for one suite. temperature 0 is greedy (then one seed is enough).

    `samples` (k samples per problem, pass@1 their mean) sets the seeds to 0..k-1 on a GPU, and
    `samples_on_cpu` (unset: `samples`) on a CPU, where each sample costs far more; `make eval
    SAMPLES=k` overrides both."""

    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, gt=0, le=32_768)
    seeds: Annotated[list[int], EACH_ONCE] = Field([0], min_length=1)
    samples: int | None = Field(None, ge=1)
    samples_on_cpu: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _samples_or_seeds(self):
        if self.samples_on_cpu is not None and self.samples is None:
            raise ValueError("samples_on_cpu: set samples too (the number of samples on a GPU)")
        if self.samples is not None and "seeds" in self.model_fields_set:
            raise ValueError("seeds: give seeds or samples (seeds 0..samples-1), not both")
        return self


# DeepSeek's published protocol for R1 and its distills: sample at 0.6 / 0.95 (greedy loops), up to
# 32,768 tokens, no system prompt, answer in \boxed{}, several samples per item averaged. A shorter
# cap (make eval MAX_TOKENS=...) cuts long chains of thought off and counts them as truncated.
REASONING_GENERATION = Generation(temperature=0.6, top_p=0.95, max_tokens=32_768, seeds=[0, 1, 2])
REASONING_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


class Suite(Source):
    """An accuracy suite (eval/*.yaml): where the items come from, the prompt, how answers are
    extracted and scored, and how to generate. Adding a suite is a YAML file as long as its metric exists."""

    split: str = "test"
    generator: Literal["arithmetic-word-problems", "reading-passages"] | None = None
    num_items: int | None = Field(None, gt=0)  # generators: how many to make; data sets: all when unset
    seed: int = 1000  # generators; not 0, which the synthetic calibration set uses
    # `prompt` is a Python format string over the item's fields, e.g. "{question}"
    prompt: str
    system_prompt: str | None = None
    chat_template: bool = True
    gold_field: str | None = "answer"
    gold_after: str | None = None  # keep only the text after this marker (GSM8K's "####")
    metric: Literal["exact_match_numeric", "exact_match_math", "squad", "fidelity"]
    generation: Generation = Generation()
    # For models whose chat template thinks (<think>...</think>): DeepSeek's settings by default.
    reasoning_prompt_suffix: str = REASONING_SUFFIX
    reasoning_generation: Generation = REASONING_GENERATION
    # What closes a thinking model's reasoning: an output of a reasoning model without it was cut off
    # before answering, counted as truncated and scored as no answer (lm-eval's think_end_token)
    think_end_token: str = Field("</think>", min_length=1)
    top_logprobs: int = Field(20, ge=1, le=100)  # fidelity only: the top-k compared with the baseline
    # fidelity with chat_template: true: the assistant turn (a format string like `prompt`); the text scored
    # is the conversation as the model's chat template writes it, the format a served model sees
    response: str | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.generator and self.num_items is None:
            raise ValueError("num_items: a generator needs to know how many items to make")
        if self.metric == "fidelity" and self.chat_template and self.response is None:
            raise ValueError(
                "response: a fidelity suite in chat format needs the assistant turn's template (e.g. '{answer}'); "
                "or set chat_template: false to score the prompt as plain text"
            )
        if self.response is not None and not (self.metric == "fidelity" and self.chat_template):
            raise ValueError("response: only a fidelity suite with chat_template: true uses it; remove it")
        if self.metric != "fidelity" and not self.gold_field:
            raise ValueError(f"gold_field: metric {self.metric} needs the field that holds the reference answer")
        if self.local_file and not self.local_file.endswith((".jsonl", ".json")):
            raise ValueError(
                "local_file: suites read JSON Lines (.jsonl, one object a line) or SQuAD v1.1 JSON (.json); convert it"
            )
        for key in ("prompt", "response"):
            try:
                names = [
                    name for _, name, _, _ in string.Formatter().parse(getattr(self, key) or "") if name is not None
                ]
            except ValueError as e:
                raise ValueError(f"{key}: not a format string ({e}); a literal brace is written {{{{ or }}}}") from None
            if any(not re.match(r"[A-Za-z_]", name) for name in names):
                raise ValueError(f"{key}: every {{...}} names a field of the data, e.g. {{question}}")
        return self


def load_suite(path: str | Path) -> Suite:
    return _validate(Suite, Path(path))


class LmEvalSuite(Strict):
    """A suite that is an lm-eval task (eval/lmeval-*.yaml, `kind: lm-eval`): a task of the harness by
    name, or a task YAML of the user's (`task_file`, relative to the suite file; its relative
    `dataset_kwargs.data_files` are under DATA_DIR). pipeline/evaluate/lm_eval_suite.py runs it against the
    variant's vLLM server; each item's `metric` under `filter` becomes the record's `figure`."""

    kind: Literal["lm-eval"]
    description: str
    task: str | None = Field(None, min_length=1)
    task_file: str | None = Field(None, min_length=1)
    api: Literal["auto", "completions", "chat"] = "auto"  # auto: chat when the model has a chat template
    metric: str = "exact_match"  # lm-eval's name of the per-item metric
    filter: str = "none"  # lm-eval's filter whose answers are scored (a task's filter_list names)
    figure: Literal["exact_match", "f1"] = "exact_match"  # the per-item field of the project's records
    max_model_len: int = Field(4096, gt=0)  # the server's context, capped at the model's

    @model_validator(mode="after")
    def _one_task(self):
        if (self.task is None) == (self.task_file is None):
            raise ValueError("task: give either task (a task of lm-eval by name) or task_file (a task YAML)")
        return self


def is_lm_eval_suite(path: str | Path) -> bool:
    data = load_yaml_file(Path(path))
    return isinstance(data, dict) and data.get("kind") == "lm-eval"


def load_lm_eval_suite(path: str | Path) -> LmEvalSuite:
    return _validate(LmEvalSuite, Path(path))
