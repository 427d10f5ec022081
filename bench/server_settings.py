"""Eval's requests on vLLM servers that differ in one setting, side by side in one run; and a second start of
the first server's command (vLLM's compile cache warm or not).

    python bench/server_settings.py MODEL_DIR --profile bench/h200.yaml --data-dir DATA \\
        [--server NAME:SETTING=VALUE,...]... [--passes seeded,greedy] [--limit 1024] [--max-tokens 1024] \\
        [--dummy] [--restart] [--out server-settings.json]

Each `--server` is the profile's server (bench's settings and environment, `--generation-config vllm`, as
make measure starts it) with engine arguments added or replaced, EngineArgs names: e.g.
`graphs1024:max_cudagraph_capture_size=1024`; none given: the profile's server alone, named `profile`.
On each server, one after the other, the passes run the same GSM8K test prompts (eval/gsm8k.yaml's wording in
MODEL's chat template, planned by pipeline.evaluate.plan) through eval's own client (pipeline.openai_client), all
at once, at most max-num-seqs in flight: `seeded` (the suite's temperature and top-p, a seed a request, as eval),
`unseeded` (the same, no seeds: vLLM's batched sampler), `greedy` (temperature 0). Prints tokens/s a pass,
and a server's start-up as its log tells it (weights, torch.compile and its cache folder, CUDA graphs, KV
cache, the most requests it ran at once). --restart: then the first server's command once more, started
only. --dummy: vLLM's random weights (load-format dummy; MODEL_DIR needs only config and tokenizer):
speed, never accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# what a start-up spent, from vLLM's own log lines (0.26): the figure, or the last match of the group
STARTUP_LINES = {
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds",
    "compile_s": r"torch\.compile took ([\d.]+) s in total",
    "compile_cache": r"Using cache directory: \S*torch_compile_cache/(\w+)/",
    "compile_cache_hit": r"(Directly load the compiled graph|Directly load AOT compilation)",
    "graphs_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "kv_tokens": r"GPU KV cache size: ([\d,]+) tokens",
}
RUNNING = re.compile(r"Running: (\d+) reqs")


def gsm8k_plan(model: Path, data_dir: str | None, limit: int, max_tokens: int):
    """eval/gsm8k.yaml's prompts in MODEL's chat template and its sampling settings, as the eval stage plans them
    (its checks too: a missing data folder is its one line)."""
    from pipeline.evaluate.options import EvalSettings
    from pipeline.evaluate.plan import plan_suites
    from pipeline.schema.common import ConfigError

    try:
        settings = EvalSettings(
            [ROOT / "eval/gsm8k.yaml"], data_dir=data_dir, limit=limit, seeds=[0], max_tokens=max_tokens
        )
        the_plan = plan_suites(model, settings)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    return the_plan.prompts["gsm8k"], the_plan.gens["gsm8k"]


def requests(kind: str, ids: list[list[int]], gen):
    """One pass's requests: the suite's sampling with a seed a request (`seeded`, as eval sends them), without
    seeds (`unseeded`), or greedy."""
    from pipeline.openai_client import Request

    if kind == "greedy":
        return [Request(p, gen.max_tokens) for p in ids]
    if kind not in ("seeded", "unseeded"):
        raise SystemExit(f"--passes: {kind!r} is none of seeded, unseeded, greedy")
    seeds = range(len(ids)) if kind == "seeded" else [None] * len(ids)
    return [Request(p, gen.max_tokens, gen.temperature, gen.top_p, seed=s) for p, s in zip(ids, seeds)]


def parse_server(spec: str) -> tuple[str, dict]:
    """`NAME:SETTING=VALUE,...` -> (NAME, {SETTING: VALUE}); a bare NAME adds nothing."""
    name, _, settings = spec.partition(":")
    pairs = [s.split("=", 1) for s in settings.split(",") if s]
    if not name or any(len(p) != 2 or not p[0] for p in pairs):
        raise SystemExit(f"--server {spec!r}: expected NAME or NAME:SETTING=VALUE,... (EngineArgs names)")
    return name, dict(pairs)


def startup_facts(log: Path) -> dict:
    text = log.read_text(errors="replace")
    facts: dict = {}
    for key, pattern in STARTUP_LINES.items():
        found = re.findall(pattern, text)
        if found:  # figures as logged, thousands separators dropped (the KV cache's tokens)
            facts[key] = True if key == "compile_cache_hit" else found[-1].replace(",", "")
    running = [int(n) for n in RUNNING.findall(text)]
    facts["most_running"] = max(running, default=None)
    return facts


def main() -> int:
    from pipeline.bench.variant import server_env
    from pipeline.openai_client import CompletionsClient
    from pipeline.schema import load_profile
    from pipeline.serving import Server, engine_flags, free_port, vllm_server_command

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--data-dir", default=os.environ.get("DATA_DIR"))
    p.add_argument("--server", action="append", default=[], help="NAME:SETTING=VALUE,... (repeatable)")
    p.add_argument("--passes", default="seeded,greedy")
    p.add_argument("--limit", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--dummy", action="store_true")
    p.add_argument("--restart", action="store_true")
    p.add_argument("--out", type=Path, default=Path("server-settings.json"))
    args = p.parse_args()
    if args.data_dir is None:  # a benchmark's prompts come from a local copy, never from the hub
        raise SystemExit("--data-dir: not set; point it (or DATA_DIR) at the folder that holds gsm8k/test.jsonl")
    servers = [parse_server(s) for s in args.server] or [("profile", {})]
    profile = load_profile(args.profile)
    ids, gen = gsm8k_plan(args.model, args.data_dir, args.limit, args.max_tokens)
    env = server_env(profile)

    def command(port: int, settings: dict) -> list[str]:
        base = vllm_server_command(
            args.model,
            port,
            dtype=profile.dtype,
            max_model_len=profile.max_model_len,
            max_num_seqs=int(settings.pop("max_num_seqs", profile.max_num_seqs)),
            gpu_memory_utilization=profile.gpu_memory_utilization,
            enforce_eager=profile.enforce_eager,
            tensor_parallel_size=profile.tensor_parallel_size,
        )
        added = {"load_format": "dummy" if args.dummy else None, "generation_config": "vllm", **settings}
        return base + ["--seed", "0"] + engine_flags(added)

    out: dict = {"prompts": len(ids), "max_tokens": args.max_tokens, "servers": []}
    first_cmd = None
    for name, settings in servers:
        port = free_port()
        cmd = command(port, dict(settings))
        first_cmd = first_cmd or (cmd, port)
        concurrency = int(settings.get("max_num_seqs", profile.max_num_seqs))
        log = args.out.parent / f"server-settings.{name}.log"
        run: dict = {"name": name, "settings": settings, "command": cmd, "passes": []}
        with Server(cmd, port, log, profile.startup_timeout_s, env) as server:
            run["startup_s"] = round(server.wait_healthy(), 1)
            print(f"[{name}] up in {run['startup_s']} s", flush=True)
            client = CompletionsClient(f"http://127.0.0.1:{port}", server.api_key, str(args.model), concurrency)
            for kind in args.passes.split(","):
                t0 = time.time()
                done = client.complete(requests(kind, ids, gen))
                wall = time.time() - t0
                tokens = sum(len(c.token_ids) for c in done)
                run["passes"].append(
                    {"kind": kind, "s": round(wall, 2), "tokens": tokens, "tok_s": round(tokens / wall)}
                )
                print(
                    f"[{name}] {kind:<9} {tokens:>9} tokens in {wall:6.1f} s = {tokens / wall:8.0f} tok/s", flush=True
                )
        run["startup"] = startup_facts(log)
        print(f"[{name}] start-up: {run['startup']}", flush=True)
        out["servers"].append(run)
        args.out.write_text(json.dumps(out, indent=1))
    if args.restart:
        cmd, port = first_cmd
        log = args.out.parent / "server-settings.restart.log"
        with Server(cmd, port, log, profile.startup_timeout_s, env) as server:
            out["restart"] = {"startup_s": round(server.wait_healthy(), 1)}
        out["restart"]["startup"] = startup_facts(log)
        print(f"[{servers[0][0]} again] up in {out['restart']['startup_s']} s: {out['restart']['startup']}", flush=True)
    for run in out["servers"]:
        for kind in dict.fromkeys(x["kind"] for x in run["passes"]):
            rates = [x["tok_s"] for x in run["passes"] if x["kind"] == kind]
            base = [x["tok_s"] for x in out["servers"][0]["passes"] if x["kind"] == kind]
            ratio = f", {sum(rates) / sum(base):.3f}x {out['servers'][0]['name']}" if base else ""
            print(f"{run['name']:<12} {kind:<9} {sum(rates) / len(rates):8.0f} tok/s{ratio}", flush=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
