"""Where every number came from: each stage's command line, as rebuilt from what its files recorded."""

from __future__ import annotations

import shlex
from pathlib import Path

from pipeline.report.tables import dagger


def provenance_section(variants: dict) -> list[str]:
    lines = ["## Where every number came from", ""]
    for name, v in variants.items():
        m = v["manifest"]
        lines += [
            f"### {name}{dagger(v)}",
            "",
            f"- quantize (`make quantize`): `{quantize_command(v)}`; {m.get('created')}, "
            f"commit {m.get('git_commit')}; on {_quantized_on(m.get('quantize') or {})}; "
            f"{_packages(m.get('packages'))}; vLLM smoke test: {(m.get('smoke') or {}).get('text')!r}",
        ]
        if v["eval_meta"]:
            e = v["eval_meta"]
            lines.append(
                f"- eval (`make eval`): `{eval_command(v)}`; {e.get('created')}, commit "
                f"{e.get('git_commit')}, {e.get('dtype')}; {_packages(e.get('packages'))}"
            )
        elif v["eval_meta_stale"]:
            lines.append(f"- eval: left out, {v['eval_meta_stale']}")
        else:
            lines.append("- eval: not run")
        if v["bench"]:
            b = v["bench"]
            mach = b.get("machine", {})
            where = mach.get("gpu") or f"{mach.get('cpu')}, {mach.get('cpus')} cores"
            command = shlex.join(["python", "-m", "pipeline.bench", "--profile", str(b["profile"]["file"]), v["dir"]])
            lines.append(
                f"- bench (`make bench`): `{command}`; "
                f"{b.get('created')}, commit {b.get('git_commit')}; {where}; {_packages(b.get('packages'))}"
            )
        elif "bench" in v["stale"]:
            lines.append(f"- bench: left out, {v['stale']['bench']}")
        else:
            lines.append("- bench: not run")
        lines.append("")
    return lines


def _quantized_on(run: dict) -> str:
    ranks = run.get("ranks", 1)
    return run.get("device", "cpu") + (f" x {ranks} (llm-compressor's distributed oneshot)" if ranks > 1 else "")


def quantize_command(variant: dict) -> str:
    """The command line that rebuilds this variant where it is: its source, recipe, calibration set, data
    folder (DATA_DIR) and output root (OUT, the folder above the model's), as the manifest recorded them."""
    m = variant["manifest"]
    recipe, calib = m.get("recipe") or {}, m.get("calibration") or {}
    cmd = [
        "python",
        "-m",
        "pipeline.quantize",
        "--model",
        str((m.get("source") or {}).get("path")),
        "--recipe",
        str(recipe.get("file")),
    ]
    if calib:
        cmd += ["--calib", str(calib.get("file"))]
        if calib.get("data_dir"):
            cmd += ["--data-dir", str(calib["data_dir"])]
    ranks = (m.get("quantize") or {}).get("ranks", 1)
    return shlex.join(
        cmd + ["--out", str(Path(variant["dir"]).parent.parent)] + (["--dp", str(ranks)] if ranks > 1 else [])
    )


def eval_command(variant: dict) -> str:
    """The command line that re-scores this variant: suites, data folder, limit, and any seed, greedy,
    reasoning or dtype setting, as its eval/results.json recorded them."""
    e = variant["eval_meta"]
    cmd = [
        "python",
        "-m",
        "pipeline.evaluate",
        "run",
        variant["dir"],
        "--suites",
        *(str(s["file"]) for s in e["suites"].values()),
    ]
    if e.get("data_dir"):
        cmd += ["--data-dir", str(e["data_dir"])]
    if e.get("limit"):
        cmd += ["--limit", str(e["limit"])]
    if e.get("seeds_override"):
        cmd += ["--seeds", *map(str, e["seeds_override"])]
    if e.get("greedy"):
        cmd.append("--greedy")
    if e.get("reasoning_flag") not in (None, "auto"):
        cmd += ["--reasoning", str(e["reasoning_flag"])]
    if e.get("dtype"):
        cmd += ["--dtype", str(e["dtype"])]
    return shlex.join(cmd)


def _packages(packages: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (packages or {}).items())
