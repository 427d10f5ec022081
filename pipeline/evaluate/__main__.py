"""`python -m pipeline.evaluate run|endpoint|compare` (make eval) and the console script pipeline-evaluate: the
command line (see the package's docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import pipeline.evaluate as package
from pipeline import exits
from pipeline.evaluate.compare import compare, markdown_table
from pipeline.evaluate.on_endpoint import Endpoint, evaluate_endpoint
from pipeline.evaluate.options import EvalSettings, suite_settings
from pipeline.evaluate.run import evaluate
from pipeline.quiet import quiet
from pipeline.schema import ConfigError
from pipeline.serving import cpu_dtype, on_gpu
from pipeline.settings import BY_NAME, environment_value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate one variant")
    r.add_argument("variant", type=Path, help="artifacts/<model>/<variant>")
    suite_settings(r)
    # as served: bf16 on a CPU with bf16 instructions, else float32 (see pipeline/serving.py: cpu_dtype)
    r.add_argument("--dtype", default=environment_value("EVAL_DTYPE") or ("auto" if on_gpu() else cpu_dtype()))
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


def main(argv=None) -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    args = parser().parse_args(argv)
    try:
        if args.cmd == "compare":
            exits.doing(f"comparing the variants of {args.model_dir}", "eval-report.json and .md are as they were")
            print(markdown_table(compare(args.model_dir, args.baseline)), end="")
            return 0
        settings = EvalSettings.from_args(args)
        if args.cmd == "endpoint":
            if args.dp is not None or args.tp != 1:
                raise ConfigError("DP, TP: the server at ENDPOINT runs as it was started; leave them unset")
            if args.concurrency < 1:
                raise ConfigError(f"ENDPOINT_CONCURRENCY={args.concurrency}: must be at least 1 request in flight")
            endpoint = Endpoint(args.url, args.concurrency, args.served_model, args.name)
            exits.doing(f"evaluating {args.url}", INTACT.format(folder="endpoint-<name>/"))
            dest = evaluate_endpoint(args.model_dir, args.source, endpoint, settings)
        else:
            exits.doing(f"evaluating {args.variant}", INTACT.format(folder="eval/"))
            dest = evaluate(args.variant, settings)
        print(f"{dest}: written")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as e:  # a server that did not start or answer: its one line, nothing written
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


# what an interrupted run leaves: evaluate_job and evaluate_endpoint write through staging.staging_dir
INTACT = "its earlier {folder} is untouched and nothing is half-written: {folder} is moved in only when complete"


def entry() -> NoReturn:
    exits.run("eval", main, "nothing is half-written", vllm_in_process=True)


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import this module
    entry()
