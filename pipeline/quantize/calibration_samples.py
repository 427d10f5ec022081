"""Calibration: the token ids GPTQ and AWQ are fed, a fixed seeded sample of the recipe's calibration
set, tokenized once and hashed (the hash is part of the build key), and where they were read from."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import tempfile
from pathlib import Path
from typing import NamedTuple

from pipeline.artifacts import read_json
from pipeline.checkpoint_files import sha256_file
from pipeline.data import load_records, text_fields, word_problems
from pipeline.process_failure import failure_cause
from pipeline.quantize.serve_env import run_in_serve_env, vllm_run_wait
from pipeline.schema import CalibSet, ConfigError
from pipeline.staging import write_json


class AnswersFrom(NamedTuple):
    """With responses: model, which model writes the answers, and where they are cached."""

    model_dir: Path
    source_sha256: str
    cache: Path


def calibration_texts(calib: CalibSet, data_dir: str | None, what: str) -> tuple[list[tuple[str, str | None]], dict]:
    """(prompt, response) pairs, a fixed seeded sample of the set, and where they were read from (with
    the data file's sha256 when it is a local file, so the manifest says which bytes were used)."""
    answer = calib.response_field if calib.responses == "data" else None  # responses: model writes its own
    fields = [f for f in (calib.prompt_field, answer) if f]
    if calib.generator:
        rows = word_problems(calib.num_samples, calib.seed)
        origin = {"read_from": f"generator:{calib.generator}"}
    else:
        rows, places = load_records(calib, data_dir, what)
        if data_dir:
            path = Path(data_dir) / calib.local_file
            origin = {
                "read_from": f"DATA_DIR/{calib.local_file}",
                "data_dir": str(data_dir),
                "data_file_sha256": sha256_file(path),
            }
        else:
            origin = {"read_from": f"hub:{calib.hub_id}", "split": calib.split}
        text_fields(rows, places, fields, what)  # all rows, so the error names the file and line
        if len(rows) < calib.num_samples:
            raise ConfigError(
                f"{what}: num_samples: {calib.num_samples} asked, "
                f"{path if data_dir else f'{calib.hub_id} ({calib.split})'} has {len(rows)} rows"
            )
        rows = [rows[i] for i in sorted(random.Random(calib.seed).sample(range(len(rows)), calib.num_samples))]
    return [(r[calib.prompt_field], r[answer] if answer else None) for r in rows], origin


def check_chat_template(calib: CalibSet, tokenizer, what: str) -> None:
    if calib.chat_template and not tokenizer.chat_template:
        raise ConfigError(
            f"{what}: chat_template: true but the model's tokenizer has no chat template; set it to false"
        )


def calibration_samples(
    calib: CalibSet, tokenizer, data_dir: str | None, what: str, answers_from: AnswersFrom | None = None
) -> tuple[list[list[int]], dict]:
    """Token ids fed to the quantizer, one list per sample, at most max_seq_len long, and their origin.
    With responses: model, the source model's own answers (model_answers, from `answers_from`)."""
    samples = []
    pairs, origin = calibration_texts(calib, data_dir, what)
    if calib.responses == "model":
        return model_answers(calib, tokenizer, [prompt for prompt, _ in pairs], origin, what, answers_from)
    for prompt, response in pairs:
        if calib.chat_template:
            check_chat_template(calib, tokenizer, what)
            messages = [{"role": "user", "content": prompt}]
            if response is not None:
                messages.append({"role": "assistant", "content": response})
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template has them already
        else:
            ids = tokenizer(prompt + ("\n" + response if response else ""))["input_ids"]
        samples.append(ids[: calib.max_seq_len])
    return samples, origin


def prompt_token_ids(calib: CalibSet, tokenizer, prompts: list[str]) -> list[list[int]]:
    """Each prompt as the model sees it before answering: through the chat template, generation prompt
    included, where the set says so."""
    if not calib.chat_template:
        return [tokenizer(p)["input_ids"] for p in prompts]
    return [
        tokenizer(
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        for p in prompts
    ]


def model_answers(
    calib: CalibSet, tokenizer, prompts: list[str], origin: dict, what: str, answers_from: AnswersFrom
) -> tuple[list[list[int]], dict]:
    """Calibration samples whose answers the source model wrote: each prompt followed by the token ids
    vLLM generated for it, as the model produced them (no re-tokenization; the think block of R1-style
    models stays, which their chat template would strip from an assistant message). Generated once per
    source weights, prompts and settings, and cached."""
    check_chat_template(calib, tokenizer, what)
    prompt_ids = prompt_token_ids(calib, tokenizer, prompts)
    inputs = {
        "source": answers_from.source_sha256,
        "prompts": prompt_ids,
        "max_new_tokens": calib.max_new_tokens,
        "seed": calib.seed,
    }
    key = hashlib.sha256(json.dumps(inputs, separators=(",", ":")).encode()).hexdigest()
    path = answers_from.cache / f"answers-{key[:16]}.json"
    cached = None
    with contextlib.suppress(ConfigError):  # a cache file cut short or edited is made again
        cached = read_json(path, "make quantize")
    if cached is None:
        print(f"{what}: generating the model's own answers to {len(prompts)} prompts with vLLM", flush=True)
        answers = generate_answers(calib, answers_from, prompt_ids, what)
        write_json(path, {"inputs_sha256": key, **inputs, **answers})
    answers = read_json(path, "make quantize")
    outputs = answers["output_ids"]
    samples = [(p + o)[: calib.max_seq_len] for p, o in zip(prompt_ids, outputs)]
    return samples, {
        **origin,
        "responses": "model",
        "answers_file": str(path),
        "answers_sha256": sha256_file(path),
        "answer_sampling": answers["sampling"],
        "answer_tokens": sum(map(len, outputs)),
        "answers_cut_at_max_new_tokens": sum(r == "length" for r in answers["finish_reasons"]),
    }


def generate_answers(calib: CalibSet, answers_from: AnswersFrom, prompt_ids: list[list[int]], what: str) -> dict:
    """pipeline.quantize.traces in the serve environment: vLLM's greedy answers to the prompts, as token ids."""
    answers_from.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=answers_from.cache, prefix=".tmp-answers-") as tmp:
        (Path(tmp) / "prompts.json").write_text(json.dumps(prompt_ids))
        args = [str(answers_from.model_dir), f"{tmp}/prompts.json", f"{tmp}/answers.json"]
        wait = vllm_run_wait(answers_from.model_dir, [len(p) for p in prompt_ids], calib.max_new_tokens)
        flags = ["--max-tokens", str(calib.max_new_tokens), "--seed", str(calib.seed)]
        proc = run_in_serve_env("pipeline.quantize.traces", *args, *flags, wait=wait)
        if proc.returncode:
            cause = failure_cause(proc.stderr or proc.stdout)
            raise RuntimeError(f"{what}: vLLM could not generate the model's answers (exit {proc.returncode}): {cause}")
        return json.loads((Path(tmp) / "answers.json").read_text())


def token_hash(samples: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(samples, separators=(",", ":")).encode()).hexdigest()
