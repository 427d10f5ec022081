"""`python -m pipeline.quantize` (make quantize) and the console script pipeline-quantize: the command line
(see pipeline/quantize/__init__.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

import pipeline.quantize as package
from pipeline import exits
from pipeline.quiet import quiet
from pipeline.schema import ConfigError


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ddp-worker"]:  # one rank of --dp: ddp_quantize starts it through torchrun
        from pipeline.quantize.llmcompressor import ddp_worker

        quiet(quantizer=True)
        ddp_worker(Path(argv[1]))
        return 0
    args = parser().parse_args(argv)
    quiet(quantizer=True)  # make's default; VERBOSE=1: all of the libraries' output
    exits.doing(f"quantizing {args.model} with {args.recipe}")
    from pipeline.quantize.build import quantize

    try:
        quantize(args.model, args.recipe, args.calib, args.data_dir, args.out, args.force, args.dp)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    from pipeline.settings import ROOT

    p = argparse.ArgumentParser(
        prog="python -m pipeline.quantize",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="local checkpoint folder or hub id")
    # one recipe a process: peak RSS is a per-process figure, and memory is returned between variants
    p.add_argument("--recipe", type=Path, required=True, help="recipes/*.yaml")
    p.add_argument("--calib", type=Path, help="calib/*.yaml; needed by GPTQ and AWQ")
    p.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or None, help="local data folder (offline)")
    p.add_argument("--out", type=Path, default=ROOT / "artifacts")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--dp", type=int, default=1, help="GPUs for llm-compressor's distributed GPTQ/AWQ (torchrun)")
    return p


# an interrupted build leaves no variant folder of its own: pipeline.staging.staging_dir
INTACT = "an earlier build of it is untouched and nothing is half-written: a variant is moved in only when complete"


def entry() -> NoReturn:
    exits.run("quantize", main, INTACT)


if __name__ == "__main__":  # a process a library spawns re-imports the main module: only this runs the stage
    entry()
