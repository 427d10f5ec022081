"""What per-request seeds cost vLLM's sampler, side by side on one server; and a second start of the same
server command (vLLM's compile cache warm).

    python bench/sampling_seed_cost.py MODEL_DIR --profile bench/h200.yaml --data-dir DATA \\
        [--limit 1024] [--max-tokens 1024] [--dummy] [--order seeded,unseeded,seeded,unseeded,greedy] \\
        [--out seed-cost.json]

Eval sends every sampled request with a seed of its own (the records repeat, whatever else is in the
batch). vLLM then samples those requests one by one (v1/sample/ops/topk_topp_sampler.py: random_sample
loops over the per-request generators, and FlashInfer's sampler is skipped where any request has one).
This runs the same GSM8K test prompts (eval/gsm8k.yaml's prompt in MODEL's chat template, temperature 0.6, top-p 0.95)
through eval's own client (pipeline.openai_client) on one server with the profile's settings, in the order
given: `seeded` (a seed a request, as eval sends them), `unseeded` (none: vLLM's batched sampler), `greedy`
(temperature 0). Prints tokens/s a pass and seeded/unseeded of the mean; then stops the server, starts the
identical command again and prints both start-up times. --dummy: vLLM's random weights (load-format
dummy; MODEL_DIR needs only config and tokenizer): speed, never accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def prompts(model: Path, data_dir: Path, limit: int) -> list[list[int]]:
    import yaml
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in (data_dir / "gsm8k/test.jsonl").read_text().splitlines()[:limit]]
    ask = yaml.safe_load((ROOT / "eval/gsm8k.yaml").read_text())["prompt"]
    chats = [[{"role": "user", "content": ask.format(question=r["question"])}] for r in rows]
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def requests(kind: str, ids: list[list[int]], max_tokens: int):
    from pipeline.openai_client import Request

    if kind == "greedy":
        return [Request(p, max_tokens) for p in ids]
    seeded = kind == "seeded"
    return [Request(p, max_tokens, 0.6, 0.95, seed=i if seeded else None) for i, p in enumerate(ids)]


def main() -> int:
    from pipeline.bench.variant import server_env
    from pipeline.openai_client import CompletionsClient
    from pipeline.schema import load_profile
    from pipeline.serving import Server, engine_flags, free_port, vllm_server_command

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, default=os.environ.get("DATA_DIR"))
    p.add_argument("--limit", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--dummy", action="store_true")
    p.add_argument("--order", default="seeded,unseeded,seeded,unseeded,greedy")
    p.add_argument("--out", type=Path, default=Path("seed-cost.json"))
    args = p.parse_args()
    profile = load_profile(args.profile)
    ids = prompts(args.model, args.data_dir, args.limit)
    port = free_port()
    cmd = (
        vllm_server_command(
            args.model,
            port,
            dtype=profile.dtype,
            max_model_len=profile.max_model_len,
            max_num_seqs=profile.max_num_seqs,
            gpu_memory_utilization=profile.gpu_memory_utilization,
            enforce_eager=profile.enforce_eager,
            tensor_parallel_size=profile.tensor_parallel_size,
        )
        + ["--seed", "0"]
        + engine_flags({"load_format": "dummy" if args.dummy else None, "generation_config": "vllm"})
    )
    env = server_env(profile)
    out = {"command": cmd, "prompts": len(ids), "max_tokens": args.max_tokens, "passes": [], "startup_s": []}
    log_dir = args.out.parent
    with Server(cmd, port, log_dir / "seed-cost.server-1.log", profile.startup_timeout_s, env) as server:
        out["startup_s"].append(round(server.wait_healthy(), 1))
        print(f"server up in {out['startup_s'][0]} s", flush=True)
        client = CompletionsClient(f"http://127.0.0.1:{port}", server.api_key, str(args.model), profile.max_num_seqs)
        for kind in args.order.split(","):
            t0 = time.time()
            done = client.complete(requests(kind, ids, args.max_tokens))
            wall = time.time() - t0
            tokens = sum(len(c.token_ids) for c in done)
            out["passes"].append({"kind": kind, "s": round(wall, 2), "tokens": tokens, "tok_s": round(tokens / wall)})
            print(f"{kind:<9} {tokens:>9} tokens in {wall:6.1f} s = {tokens / wall:8.0f} tok/s", flush=True)
    with Server(cmd, port, log_dir / "seed-cost.server-2.log", profile.startup_timeout_s, env) as server:
        out["startup_s"].append(round(server.wait_healthy(), 1))
    print(f"the same command again: up in {out['startup_s'][1]} s (first {out['startup_s'][0]} s)", flush=True)
    mean = {k: [x["tok_s"] for x in out["passes"] if x["kind"] == k] for k in ("seeded", "unseeded", "greedy")}
    mean = {k: sum(v) / len(v) for k, v in mean.items() if v}
    if "seeded" in mean and "unseeded" in mean:
        out["seeded_over_unseeded"] = round(mean["seeded"] / mean["unseeded"], 3)
        print(f"seeded / unseeded tok/s: {out['seeded_over_unseeded']}", flush=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
