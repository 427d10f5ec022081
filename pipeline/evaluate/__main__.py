"""python -m pipeline.evaluate run|compare: the command line of make eval (see the package's docstring)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pipeline.evaluate as package
from pipeline.evaluate.compare import compare, markdown_table
from pipeline.evaluate.run import evaluate
from pipeline.quiet import quiet
from pipeline.schema import ConfigError
from pipeline.serving import cpu_dtype, exit_without_teardown, on_gpu


def main(argv=None) -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    p = argparse.ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate one variant")
    r.add_argument("variant", type=Path, help="artifacts/<model>/<variant>")
    r.add_argument("--suites", type=Path, nargs="+", required=True, help="eval/*.yaml")
    r.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or None, help="local data folder (offline)")
    r.add_argument("--limit", type=int, help="score only the first N items of each suite")
    r.add_argument("--seeds", type=int, nargs="+", help="override the suites' seeds (sampled runs)")
    r.add_argument("--samples", type=int, help="k samples per item (seeds 0..k-1), instead of the suites' k")
    r.add_argument("--greedy", action="store_true", help="temperature 0 for every suite")
    # as served: bf16 on a CPU with bf16 instructions, else float16 (see pipeline/serving.py: cpu_dtype)
    r.add_argument("--dtype", default=os.environ.get("EVAL_DTYPE") or ("auto" if on_gpu() else cpu_dtype()))
    r.add_argument("--reasoning", choices=("auto", "yes", "no"), default="auto")
    r.add_argument(
        "--dp", type=int, help="the server's data-parallel size (default: as many ranks as the visible GPUs hold)"
    )
    r.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per data-parallel rank")
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
            if args.samples is not None and args.samples < 1:
                raise ConfigError(f"SAMPLES={args.samples}: must be at least 1 sample per item")
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
                samples=args.samples,
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
