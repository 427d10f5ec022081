"""How long a checkpoint takes into an S3 store and back: `make publish REGISTRY=` and the deployments' puller,
timed against a real SeaweedFS on 127.0.0.1 (the tests' server, tests/s3_store.py).

    .venv-serve/bin/python bench/registry_transfer.py artifacts/sources/deepseek-r1-distill-qwen-1.5b-random

The checkpoint folder (a `make source` / `make random-model` folder, or a variant) is laid out as `make
publish` lays out a published folder (pipeline.publish.publishing.write_folder: the weights, SHA256SUMS,
manifest.json), then uploaded as a new version, uploaded again (the no-op of an unchanged version), and
pulled back with the puller's code (pipeline/publish/puller/), every file hashed on the way. Prints one line
per step; the figures say what this machine's disk and loopback do, not a network's."""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from s3_store import seaweedfs, url_for  # noqa: E402

from pipeline.artifacts import read_manifest  # noqa: E402
from pipeline.checkpoint_files import size_on_disk  # noqa: E402
from pipeline.publish import registry  # noqa: E402
from pipeline.publish.publishing import write_folder  # noqa: E402
from pipeline.publish.puller.__main__ import pull  # noqa: E402


def timed(what: str, size: int, fn):
    t0 = time.time()
    out = fn()
    wall = time.time() - t0
    print(f"{what}: {wall:.1f} s ({size / 2**20 / max(wall, 1e-9):.0f} MiB/s)", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="a folder with manifest.json and its weights")
    args = p.parse_args()
    manifest = read_manifest(args.checkpoint)
    if manifest is None:
        sys.exit(f"{args.checkpoint}: no manifest.json; give a folder that make source, random-model or quantize wrote")
    with tempfile.TemporaryDirectory(prefix="registry-transfer-", dir=ROOT / "artifacts") as work:
        work = Path(work)
        folder = work / "published" / args.checkpoint.name
        folder.mkdir(parents=True)
        timed("lay out as a published folder", size_on_disk(args.checkpoint),
              lambda: write_folder(folder, args.checkpoint, manifest, {}, {"name": args.checkpoint.name}))  # fmt: skip
        size = size_on_disk(folder)
        print(f"{folder.name}: {size / 2**30:.2f} GiB in {sum(1 for f in folder.iterdir())} files", flush=True)
        (work / "s3").mkdir()
        with seaweedfs(work / "s3") as store:
            os.environ.update(store["env"])
            url = url_for("transfer")
            timed("upload, a new version", size, lambda: registry.upload(folder, url))
            timed("upload again, same content (no-op)", size, lambda: registry.upload(folder, url))
            timed("pull and verify", size, lambda: pull(url, "latest", into=work / "pulled"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
