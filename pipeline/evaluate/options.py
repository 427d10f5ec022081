"""The command-line settings that eval's `run` and `endpoint` share with make measure (pipeline/measure.py),
declared once (suite_settings) and carried through the stage as one object (EvalSettings)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from pipeline.schema import ConfigError, repeated


def suite_settings(parser: argparse.ArgumentParser) -> None:
    """What `run` and `endpoint` share: the suites and how they are sampled."""
    parser.add_argument("--suites", type=Path, nargs="+", required=True, help="eval/*.yaml")
    parser.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or None, help="local data folder (offline)")
    parser.add_argument("--limit", type=int, help="score only the first N items of each suite")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the suites' seeds (sampled runs)")
    parser.add_argument("--samples", type=int, help="k samples per item (seeds 0..k-1), instead of the suites' k")
    parser.add_argument("--greedy", action="store_true", help="temperature 0 for every suite")
    parser.add_argument("--reasoning", dest="reasoning_flag", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument(
        "--dp", type=int, help="the server's data-parallel size (default: as many ranks as the visible GPUs hold)"
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per data-parallel rank")
    parser.add_argument(
        "--max-tokens", type=int, help="cap every suite's max_tokens (outputs cut off are counted as truncated)"
    )


@dataclass(frozen=True)
class EvalSettings:
    """What one eval run was asked for on the command line, from the plan to results.json's record of it
    (write.run_meta). None or the default: the suites' own settings."""

    suites: list[Path] = field(default_factory=list)
    data_dir: str | None = None
    limit: int | None = None  # the first N items of each suite
    seeds: list[int] | None = None  # explicit seeds win over the suites' and over `samples`
    samples: int | None = None  # k samples per item: the seeds 0..k-1
    greedy: bool = False
    reasoning_flag: str = "auto"  # auto, yes, no: whether the model is prompted and read as a reasoning model
    max_tokens: int | None = None  # a cap: what it cuts off is counted as truncated
    dtype: str | None = None  # the server's; None on an ENDPOINT, whose dtype is its own
    dp: int | None = None  # None: as many data-parallel ranks as the visible GPUs hold
    tp: int = 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EvalSettings:
        """The settings of suite_settings' parser (and its --dtype where it has one), checked; a field the
        parser lacks keeps its default."""
        check_numbers(args)
        check_lists(args)
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def check_numbers(args) -> None:
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"LIMIT={args.limit}: must be a positive number of items")
    if args.samples is not None and args.samples < 1:
        raise ConfigError(f"SAMPLES={args.samples}: must be at least 1 sample per item")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"MAX_TOKENS={args.max_tokens}: must be a positive number of tokens")


def check_lists(args) -> None:
    """SEEDS and SUITES each member once: a seed given twice is generated and counted twice (seeds=2 for one
    seed's samples), and two suites of one name write one results entry, samples_<suite>.jsonl and all."""
    if twice := repeated(args.seeds or []):
        raise ConfigError(f"SEEDS={' '.join(map(str, args.seeds))}: {twice[0]} is given twice; give each seed once")
    if twice := repeated(p.stem for p in args.suites):
        paths = ", ".join(str(p) for p in args.suites if p.stem == twice[0])
        raise ConfigError(f"SUITES: {twice[0]} is given twice ({paths}); give each suite once")
