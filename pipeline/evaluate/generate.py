"""make eval, step 2: the variant's vLLM OpenAI server, and what it generates (sampled text, or prompt
log-probabilities) through pipeline.openai_client."""

from __future__ import annotations

import contextlib
import math
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.openai_client import CPU_PACE, GPU_PACE, Completion, CompletionsClient, Request, ServerError
from pipeline.schema import Generation
from pipeline.serving import Server, free_port, on_gpu, start_wait, vllm_server_command
from pipeline.settings import tool_env

# the arguments vllm_server_command takes by name; every other engine argument goes in as a flag
NAMED = (
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "gpu_memory_utilization",
    "enforce_eager",
    "tensor_parallel_size",
    "data_parallel_size",
)


@dataclass
class Served:
    """A healthy server of one variant and the client of this run."""

    client: CompletionsClient
    command: list[str]  # the server's arguments (python -m pipeline.vllm_server ...)
    startup_s: float
    version: str | None  # as the server reports it (GET /version)


def server_command(args: dict, port: int, name: str) -> list[str]:
    """eval's engine arguments (plan.engine_args) as the server's command, serving the model as `name`.
    --generation-config vllm: vLLM's sampling defaults, not the model's generation_config.json, as the
    offline engine with explicit SamplingParams has them (pipeline/openai_client.py)."""
    rest = {k: v for k, v in args.items() if k not in (*NAMED, "model", "kv_cache_dtype")}
    cmd = vllm_server_command(
        Path(args["model"]),
        port,
        **{k: args[k] for k in NAMED if k in args},
        kv_cache_dtype=args.get("kv_cache_dtype", "auto"),
        extra=rest | {"generation_config": "vllm", "served_model_name": name},
    )
    return cmd


def server_version(port: int, api_key: str) -> str | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/version", headers={"Authorization": f"Bearer {api_key}"})
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(request, timeout=10) as r:
        import json

        return json.loads(r.read()).get("version")
    return None


@contextlib.contextmanager
def serve(args: dict, name: str, log_path: Path):
    """The variant's server, healthy (a `Served`), stopped with every process under it on the way out."""
    port = free_port()
    cmd = server_command(args, port, name)
    # the CPU backend's KV cache size, as every server of the stages gets it
    env = {"VLLM_CPU_KVCACHE_SPACE": tool_env("VLLM_CPU_KVCACHE_SPACE")}
    with Server(cmd, port, log_path, start_wait(Path(args["model"])), env) as server:
        try:
            yield served_by(server, args, name)
        except ServerError as e:  # a request it did not answer, or answered with an error: where it said why
            raise ServerError(f"{e}; its log: {log_path}") from None


def served_by(server: Server, args: dict, name: str) -> Served:
    """eval's client of a server started with `args` (eval's engine arguments) that serves the model as
    `name`, once the server is healthy."""
    startup_s = server.wait_healthy()
    concurrency = args["max_num_seqs"] * args.get("data_parallel_size", 1)  # more would queue in the server
    pace = GPU_PACE if on_gpu() else CPU_PACE  # how slowly this machine may answer and still be alive
    client = CompletionsClient(f"http://127.0.0.1:{server.port}", server.api_key, name, concurrency, pace)
    cmd = server.cmd
    return Served(client, cmd[cmd.index("--model") :], startup_s, server_version(server.port, server.api_key))


def generate_all(
    client, jobs: dict[str, tuple[list[list[int]], Generation]]
) -> tuple[dict[str, dict[int, list]], float]:
    """Every seed of every generation suite in one batch, each request with its own seed.

    One batch keeps the engine full from the first request to the last; a batch per suite and seed
    drains it at every boundary, where the long tail of a few long outputs runs nearly alone.
    Returns {suite: {seed: completions in item order}} and the wall time of the batch."""
    requests, keys = [], []
    for name, (prompts, gen) in jobs.items():
        for seed in gen.seeds:
            requests += [
                Request(p, gen.max_tokens, temperature=gen.temperature, top_p=gen.top_p, seed=seed) for p in prompts
            ]
            keys += [(name, seed)] * len(prompts)
    t0 = time.time()
    outputs: list[Completion] = client.complete(requests)
    wall = time.time() - t0
    by_suite: dict[str, dict[int, list]] = {}
    for (name, seed), out in zip(keys, outputs):  # the client returns completions in request order
        by_suite.setdefault(name, {}).setdefault(seed, []).append(out)
    return by_suite, wall


def run_fidelity_suite(client, suite, prompts, npz_path) -> dict:
    """Next-token log-probabilities of the held-out text (vLLM prompt_logprobs: the served kernels,
    the same engine that generates, for every format; an HF forward could not load the classic
    gptq/awq or FP8 checkpoints in this environment)."""
    k = suite.top_logprobs
    t0 = time.time()
    outputs = client.complete([Request(p, 1, temperature=0.0, prompt_logprobs=k) for p in prompts])
    wall = time.time() - t0
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
