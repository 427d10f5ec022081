"""make eval for one variant: plan -> generate -> score -> write.

The variant runs on one vLLM OpenAI server (generate.serve), which every native suite's requests go
to through pipeline.openai_client. Each suite's kind has one runner (RUNNERS below): it gets the
client, the suite's plan and the server's outputs, writes its files into the staging folder and
returns the suite's entry of results.json. A generation runner writes samples_<suite>.jsonl as
`Sample` lines (see score.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.drift import suite_sha256
from pipeline.evaluate import lm_eval_suite
from pipeline.evaluate.generate import Served, generate_all, run_fidelity_suite, serve
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import Plan, default_eager, engine_args, plan
from pipeline.evaluate.score import ScoredSuite, score_generation_suite
from pipeline.evaluate.write import EngineRun, lm_eval_results, run_meta
from pipeline.schema import EvalRun, EvalServing, FidelitySuiteRun, GenerationSuiteRun, check_data
from pipeline.serving import parallel_plan
from pipeline.staging import staging_dir, write_json


def run_fidelity(client, plan: Plan, name: str, outputs: dict, generate_s: float, tmp: Path) -> dict:
    return run_fidelity_suite(client, plan.suites[name], plan.prompts[name], tmp / f"fidelity_{name}.npz")


def run_generation(client, plan: Plan, name: str, outputs: dict, generate_s: float, tmp: Path) -> dict:
    rows, _ = plan.items[name]
    scored = ScoredSuite(plan.suites[name], rows, plan.texts[name], plan.prompts[name], plan.gens[name], plan.reasoning)
    r = score_generation_suite(scored, outputs[name], generate_s, tmp / f"samples_{name}.jsonl")
    r["generation"] = plan.gens[name].model_dump(exclude={"samples", "samples_on_cpu"})  # the seeds say k
    return r


def suite_kind(suite) -> str:
    """Which runner a suite takes: the one place a new kind of suite plugs in (a suite model with a
    `kind` of its own, e.g. lm-eval's, is dispatched by it: RUNNERS then holds that kind's runner)."""
    kind = getattr(suite, "kind", None)
    if kind is not None:
        return kind
    return "fidelity" if suite.metric == "fidelity" else "generation"


RUNNERS = {"fidelity": run_fidelity, "generation": run_generation}
SUITE_RECORDS = {"fidelity": FidelitySuiteRun, "generation": GenerationSuiteRun}  # what each runner's entry is


def generates(suite) -> bool:
    """Whether the suite's requests go into the one batched generate call (generate_all)."""
    return suite_kind(suite) == "generation"


def describe(variant: str, name: str, r: FidelitySuiteRun | GenerationSuiteRun) -> str:
    if isinstance(r, FidelitySuiteRun):
        return f"{variant} {name}: ppl {r.perplexity:.3f} over {r.positions} tokens"
    figures = ", ".join(f"{m} {s.mean:.3f} [{s.ci95[0]:.3f}, {s.ci95[1]:.3f}]" for m, s in r.metrics.items())
    return (
        f"{variant} {name}: {figures} (n={r.n}, seeds={len(r.seeds)}, truncated {r.truncated}, "
        f"no answer {r.no_answer}, {r.generated_tokens} tokens)"
    )


def announce_engine(plan: Plan, engine: EngineRun) -> None:
    args = engine.args
    parallel = f", DP {engine.replicas} x TP {engine.tp}" if engine.replicas * engine.tp > 1 else ""
    print(
        f"{plan.variant.name}: server up in {engine.load_s:.1f} s "
        f"({'eager' if engine.eager else 'CUDA graphs'}, dtype {args['dtype']}"
        f"{', KV cache ' + args['kv_cache_dtype'] if 'kv_cache_dtype' in args else ''}{parallel}, "
        f"max-num-seqs {args['max_num_seqs']})",
        flush=True,
    )


def generate_suites(client, plan: Plan, engine: EngineRun) -> dict:
    """Every generating suite's requests in one batch; its wall time and token count go into `engine`."""
    generation = {n: (plan.prompts[n], plan.gens[n]) for n, suite in plan.suites.items() if generates(suite)}
    outputs, generate_s = generate_all(client, generation)
    generated = sum(len(o.token_ids) for by_seed in outputs.values() for outs in by_seed.values() for o in outs)
    engine.generate_s, engine.generated = generate_s, generated
    if generation:
        print(
            f"{plan.variant.name}: {sum(len(p) * len(g.seeds) for p, g in generation.values())} generations, "
            f"{generated} tokens in {generate_s:.1f} s = {generated / max(generate_s, 1e-9):.0f} tok/s "
            "(one batch over every suite and seed)",
            flush=True,
        )
    return outputs


def run_lm_eval_tasks(plan: Plan, limit: int | None, out_dir: Path) -> tuple[dict, dict]:
    """Each lm-eval suite on a server of its own, before eval's engine takes the device: (results.json
    entries, lm-eval's own outputs), with samples_<suite>.jsonl written into out_dir."""
    results, outputs = {}, {}
    for task in plan.lm_eval_tasks:
        results[task.name], outputs[task.name] = lm_eval_suite.run(task, plan.variant, out_dir, limit)
        results[task.name]["settings_sha256"] = suite_sha256(task.suite)  # as compare and report hold the file to
    return results, outputs


def score_and_write(
    client, plan: Plan, outputs: dict, settings: EvalSettings, engine: EngineRun, lm_eval: tuple, tmp: Path
) -> None:
    """Every native suite's files and figures into the staging folder `tmp`, beside the lm-eval suites'
    (run before the engine: (results.json entries, lm-eval's own outputs)), then results.json."""
    lm_eval_entries, lm_eval_outputs = lm_eval
    results = dict(lm_eval_entries)
    for path in plan.suite_paths:
        name, suite = path.stem, plan.suites[path.stem]
        r = RUNNERS[suite_kind(suite)](client, plan, name, outputs, engine.generate_s, tmp)
        r.update(file=str(path), n_available=plan.items[name][1], metric=suite.metric)
        r["settings_sha256"] = suite_sha256(suite)  # as planned: what compare and report hold the file to
        results[name] = r
        record = check_data(SUITE_RECORDS[suite_kind(suite)], r, plan.variant / "eval/results.json")
        print(describe(plan.variant.name, name, record), flush=True)
    meta = run_meta(plan, settings, engine)
    check_data(EvalRun, meta | {"suites": results}, plan.variant / "eval/results.json")  # as compare and report read it
    doc = lm_eval_results(plan.variant, plan.suites, {n: r for n, r in results.items() if n in plan.suites}, meta)
    doc["pipeline"]["suites"] = results
    lm_eval_suite.add_to_results_json(doc, lm_eval_outputs)
    write_json(tmp / "results.json", doc)


@dataclass
class EvalJob:
    """One variant's eval, planned and checked: the command line's settings, and what its server runs
    with (`engine.args`) and, filled in as it runs, what the engine did."""

    plan: Plan
    settings: EvalSettings
    engine: EngineRun
    dest: Path


def prepare(variant: Path, settings: EvalSettings, eager: bool | None = None) -> EvalJob:
    """Every check that can fail, before a server starts."""
    replicas = parallel_plan(settings.dp, settings.tp)
    the_plan = plan(variant, settings)
    eager = default_eager() if eager is None else eager
    args = engine_args(the_plan, settings.dtype, eager, settings.tp, replicas)
    engine = EngineRun(args, eager, replicas, settings.tp)
    return EvalJob(the_plan, settings, engine, variant / "eval")


def evaluate(variant: Path, settings: EvalSettings) -> Path:
    """make eval for one variant, on a server of its own."""
    return evaluate_job(prepare(variant, settings))


def evaluate_job(job: EvalJob) -> Path:
    variant = job.plan.variant
    with staging_dir(job.dest) as tmp:
        lm_eval = run_lm_eval_tasks(job.plan, job.settings.limit, tmp)  # before eval's server: each on its own
        if not job.plan.suite_paths:  # lm-eval suites only: no server of eval's own
            score_and_write(None, job.plan, {}, job.settings, job.engine, lm_eval, tmp)
            return job.dest
        # the server's log beside the variant, as bench's: kept, for what a failed or slow start said
        with serve(job.engine.args, variant.name, variant.parent / f".eval-{variant.name}.log") as served:
            run_on(job, served, lm_eval, tmp)
    return job.dest


def run_on(job: EvalJob, served: Served, lm_eval: tuple, tmp: Path) -> None:
    """The native suites on a healthy server (generate, score), their files and results.json into `tmp`."""
    job.engine.load_s = served.startup_s
    job.engine.serving = EvalServing(
        command=served.command, vllm_version=served.version, startup_s=round(served.startup_s, 1)
    )
    announce_engine(job.plan, job.engine)
    outputs = generate_suites(served.client, job.plan, job.engine)
    score_and_write(served.client, job.plan, outputs, job.settings, job.engine, lm_eval, tmp)
