"""python -m pipeline.evaluate run|compare: the command line of make eval (see the package's docstring)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pipeline.evaluate as package
from pipeline.evaluate.compare import compare, markdown_table
from pipeline.evaluate.on_endpoint import evaluate_endpoint
from pipeline.evaluate.run import evaluate
from pipeline.quiet import quiet
from pipeline.schema import ConfigError
from pipeline.serving import cpu_dtype, exit_without_teardown, on_gpu
from pipeline.settings import BY_NAME


def suite_settings(parser: argparse.ArgumentParser) -> None:
    """What `run` and `endpoint` share: the suites and how they are sampled."""
    parser.add_argument("--suites", type=Path, nargs="+", required=True, help="eval/*.yaml")
    parser.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or None, help="local data folder (offline)")
    parser.add_argument("--limit", type=int, help="score only the first N items of each suite")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the suites' seeds (sampled runs)")
    parser.add_argument("--samples", type=int, help="k samples per item (seeds 0..k-1), instead of the suites' k")
    parser.add_argument("--greedy", action="store_true", help="temperature 0 for every suite")
    parser.add_argument("--reasoning", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument(
        "--dp", type=int, help="the server's data-parallel size (default: as many ranks as the visible GPUs hold)"
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per data-parallel rank")
    parser.add_argument(
        "--max-tokens", type=int, help="cap every suite's max_tokens (outputs cut off are counted as truncated)"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate one variant")
    r.add_argument("variant", type=Path, help="artifacts/<model>/<variant>")
    suite_settings(r)
    # as served: bf16 on a CPU with bf16 instructions, else float16 (see pipeline/serving.py: cpu_dtype)
    r.add_argument("--dtype", default=os.environ.get("EVAL_DTYPE") or ("auto" if on_gpu() else cpu_dtype()))
    e = sub.add_parser("endpoint", help="the suites against a running vLLM server (make eval ENDPOINT=...)")
    e.add_argument("model_dir", type=Path, help="artifacts/<model>: the results go to endpoint-<name>/ in it")
    e.add_argument("--source", required=True, help="MODEL: the folder (or hub id) whose tokenizer builds the prompts")
    e.add_argument("--url", required=True, help="ENDPOINT: the server's base URL, http://host:port/v1")
    e.add_argument("--served-model", help="ENDPOINT_MODEL: the served model id (unset: the only one served)")
    e.add_argument("--name", help="ENDPOINT_NAME: the results' label (unset: from the served model id)")
    concurrency = int(BY_NAME["ENDPOINT_CONCURRENCY"].default)
    e.add_argument("--concurrency", type=int, default=concurrency, help="ENDPOINT_CONCURRENCY: requests in flight")
    suite_settings(e)
    c = sub.add_parser("compare", help="every variant vs the baseline")
    c.add_argument("model_dir", type=Path, help="artifacts/<model>")
    c.add_argument("--baseline", default="bf16")
    return p


def check_numbers(args) -> None:
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"LIMIT={args.limit}: must be a positive number of items")
    if args.samples is not None and args.samples < 1:
        raise ConfigError(f"SAMPLES={args.samples}: must be at least 1 sample per item")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"MAX_TOKENS={args.max_tokens}: must be a positive number of tokens")


def run_settings(args) -> dict:
    return dict(
        data_dir=args.data_dir, limit=args.limit, seeds=args.seeds, greedy=args.greedy,
        reasoning_flag=args.reasoning, max_tokens=args.max_tokens, samples=args.samples,
    )  # fmt: skip


def main(argv=None) -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    args = parser().parse_args(argv)
    try:
        if args.cmd == "compare":
            print(markdown_table(compare(args.model_dir, args.baseline)), end="")
            return 0
        check_numbers(args)
        if args.cmd == "endpoint":
            if args.dp is not None or args.tp != 1:
                raise ConfigError("DP, TP: the server at ENDPOINT runs as it was started; leave them unset")
            if args.concurrency < 1:
                raise ConfigError(f"ENDPOINT_CONCURRENCY={args.concurrency}: must be at least 1 request in flight")
            s = run_settings(args)
            dest = evaluate_endpoint(
                args.model_dir, args.source, args.suites, args.url, args.served_model, args.name, args.concurrency, **s
            )
        else:
            s = run_settings(args)
            dest = evaluate(
                args.variant, args.suites, s["data_dir"], s["limit"], s["seeds"], s["greedy"], args.dtype,
                s["reasoning_flag"], s["max_tokens"], dp=args.dp, tp=args.tp, samples=s["samples"],
            )  # fmt: skip
        print(f"{dest}: written")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import this module
    exit_without_teardown(main())
