"""python -m pipeline.bench: the command line of make bench."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeline import exits
from pipeline.artifacts import read_bench
from pipeline.bench.capacity.journal import TimeLimit
from pipeline.bench.table import table
from pipeline.bench.variant import bench_variant, write_result
from pipeline.quiet import quiet
from pipeline.schema import Bench, BenchFailure, ConfigError, load_profile, repeated
from pipeline.serving import parallel_plan
from pipeline.settings import environment_value


def read_result(variant: Path) -> Bench | BenchFailure:
    bench, error = read_bench(variant)
    return bench if bench is not None else BenchFailure(variant=variant.name, error=error)


def main(argv=None) -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    doc = sys.modules["pipeline.bench"].__doc__
    p = argparse.ArgumentParser(
        prog="python -m pipeline.bench", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("variants", nargs="+", type=Path, help="variant folders (or, with --table, model folders)")
    p.add_argument("--profile", type=Path, help="bench/*.yaml")
    p.add_argument("--port", type=int, default=environment_value("BENCH_PORT", int))
    p.add_argument("--table", action="store_true", help="only print the table of existing bench.json files")
    p.add_argument("--tp", type=int, help="GPUs per server (tensor parallel); unset: the profile's")
    p.add_argument(
        "--time-limit", type=float, help="seconds: no capacity point starts that would end later (the rest resumes)"
    )
    args = p.parse_args(argv)
    if args.table:
        try:
            found = [read_result(f.parent) for d in args.variants for f in sorted(d.glob("*/bench.json"))]
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(table(found))
        return 0
    try:
        # each run writes the variant's bench.json: a variant given twice is measured twice, the first thrown away
        if twice := repeated(v.resolve() for v in args.variants):
            raise ConfigError(f"BENCH_RECIPES: {twice[0].name} is given twice; give each variant once")
        profile = load_profile(args.profile)
        if args.tp is not None:
            profile = profile.model_copy(update={"tensor_parallel_size": args.tp})
        parallel_plan(1, profile.tensor_parallel_size)  # one-line error where TP is more than the GPUs there are
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results, failed = [], 0
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    for i, variant in enumerate(args.variants):
        exits.doing(f"benchmarking {variant}", interrupted_bench(args.variants[:i], profile.capacity is not None))
        print(f"{variant}: benchmarking with {args.profile}", flush=True)
        try:
            result = bench_variant(variant, profile, args.profile, args.port, deadline=deadline)
        except TimeLimit as e:  # what finished is journaled; nothing else is written
            print(f"error: {variant}: {e}", file=sys.stderr, flush=True)
            return 3
        except (ConfigError, RuntimeError, OSError, ValueError) as e:
            failed += 1
            print(f"error: {variant}: {e}", file=sys.stderr, flush=True)
            result = BenchFailure(variant=variant.name, error=str(e))
        write_result(variant, result)  # a failed run keeps an earlier good bench.json; its error is in the table
        results.append(result)
    print(table(results))
    return 1 if failed else 0


def interrupted_bench(done: list[Path], capacity: bool) -> str:
    """What a bench interrupted now leaves (variant.write_result writes bench.json atomically, once a
    variant's bench is over; journal.py appends each capacity point as it is measured)."""
    before = f"the bench.json of {', '.join(v.name for v in done)} written, " if done else ""
    journal = "; its capacity points measured so far are in its journal, where make bench continues" if capacity else ""
    return f"{before}its own earlier bench.json untouched: bench.json is written only when a bench is over{journal}"
