"""`python -m pipeline.publish` (make publish, make verify-published) and the console script
pipeline-publish: the command line (pipeline/publish/__init__.py says what each command does)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import pipeline.publish as package
from pipeline import exits
from pipeline.artifacts import read_report
from pipeline.schema import ConfigError
from pipeline.serving import engine_children_die_with_parent

# processes started from this one die with it: the server of `verify` runs through serving.Server, whose
# own process is set to die with this one
engine_children_die_with_parent()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.publish",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("publish", help="publish the variant report.json chose")
    a.add_argument("model_dir", type=Path, help="artifacts/<model>")
    a.add_argument("--out", type=Path, default=Path("artifacts/published"))
    a.add_argument(
        "--force",
        action="store_true",
        help="replace a published folder that has other content; with --registry, upload again the objects of "
        "its version that are not its bytes",
    )
    a.add_argument("--base-model", help="hub id of the model the variants were made from (model card metadata)")
    a.add_argument("--license", dest="license_", help="the base model's license (model card metadata)")
    a.add_argument(
        "--registry", help="s3://bucket/prefix or hf://org/name: upload the folder there too (publish/upload.py)"
    )
    v = sub.add_parser("verify", help="check files against manifest.json, then serve, ask once, load at its capacity")
    v.add_argument("folders", type=Path, nargs="+")
    v.add_argument("--files-only", action="store_true")
    v.add_argument("--no-load", action="store_true", help="skip the load test at the stated capacity")
    return p


def publish_command(args) -> int:
    from pipeline.publish.publishing import publish

    if args.registry:
        from pipeline.publish.upload import check_registry

        check_registry(args.registry)
    # publishing.publish writes through staging.staging_dir
    exits.doing(f"publishing the chosen variant of {args.model_dir}", f"{args.out}: {INTACT}")
    dest = publish(args.model_dir, args.out, args.force, args.base_model, args.license_)
    summary = read_report(args.model_dir).decision.summary
    if dest is None:
        print(f"publish: {summary}", file=sys.stderr)
        return 1
    if args.registry:
        from pipeline.publish.upload import publish_to_registry

        # registry.upload: objects first, the version's marker last; a rerun sends only what is not there
        exits.doing(
            f"uploading {dest} to {args.registry}",
            f"{dest} is published; an upload cut short is no version until its marker, written last, is there: "
            "make publish again sends only what is missing",
        )
        # --force also repairs: an existing version's objects that are not the folder's bytes are sent again
        publish_to_registry(dest, args.registry, args.out.parent / "deploy", repair=args.force)
    print(summary)
    return 0


def verify_command(args) -> int:
    from pipeline.publish.verify import published_api_key, verify_files, verify_serving

    api_key = None if args.files_only else published_api_key()
    failed = 0
    for folder in args.folders:
        exits.doing(
            f"verifying {folder}", "the published folders are as they were: it writes only its server's log, beside"
        )
        problems = verify_files(folder)
        for line in problems:
            print(f"verify: {line}", file=sys.stderr)
        if problems:
            failed += 1
            continue
        print(f"{folder}: every file matches manifest.json")
        if not args.files_only:
            verify_serving(folder, api_key, load=not args.no_load)
    return 1 if failed else 0


INTACT = "earlier published folders are untouched and nothing is half-written: a folder is moved in only when complete"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return publish_command(args) if args.cmd == "publish" else verify_command(args)
    except (ConfigError, RuntimeError) as e:  # RegistryError is a RuntimeError
        print(f"{args.cmd}: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1


def entry() -> NoReturn:
    # make's names; verify's load test runs vLLM's benchmark client in this process. What is intact is said
    # command by command (exits.doing above).
    stage = "verify-published" if sys.argv[1:2] == ["verify"] else "publish"
    exits.run(stage, main, "nothing is half-written", vllm_in_process=True)


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import the main module
    entry()
