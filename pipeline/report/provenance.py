"""Where every number came from: each stage's command line, as rebuilt from what its files recorded."""

from __future__ import annotations

import shlex
from pathlib import Path

from pipeline.report.collect import Collected
from pipeline.report.tables import dagger
from pipeline.schema import QuantizeRun


def provenance_section(variants: dict[str, Collected]) -> list[str]:
    lines = ["## Where every number came from", ""]
    for name, v in variants.items():
        m = v.manifest
        lines += [
            f"### {name}{dagger(v)}",
            "",
            f"- quantize (`make quantize`): `{quantize_command(v)}`; {m.created}, "
            f"commit {m.git_commit}; on {_quantized_on(m.quantize)}; "
            f"{_packages(m.packages)}; vLLM smoke test: {m.smoke.text!r}",
        ]
        if e := v.eval_meta:
            lines.append(
                f"- eval (`make eval`): `{eval_command(v)}`; {e.created}, commit "
                f"{e.git_commit}, {e.dtype}; {_packages(e.packages)}"
            )
        elif v.eval_meta_stale:
            lines.append(f"- eval: left out, {v.eval_meta_stale}")
        else:
            lines.append("- eval: not run")
        if b := v.bench:
            where = b.machine.gpu or f"{b.machine.cpu}, {b.machine.cpus} cores"
            command = shlex.join(["python", "-m", "pipeline.bench", "--profile", b.profile.file, v.dir])
            lines.append(
                f"- bench (`make bench`): `{command}`; "
                f"{b.created}, commit {b.git_commit}; {where}; {_packages(b.packages)}"
            )
        elif "bench" in v.stale:
            lines.append(f"- bench: left out, {v.stale['bench']}")
        else:
            lines.append("- bench: not run")
        lines.append("")
    return lines


def _quantized_on(run: QuantizeRun) -> str:
    ranks = run.ranks
    return run.device + (f" x {ranks} (llm-compressor's distributed oneshot)" if ranks > 1 else "")


def quantize_command(variant: Collected) -> str:
    """The command line that rebuilds this variant where it is: its source, recipe, calibration set, data
    folder (DATA_DIR) and output root (OUT, the folder above the model's), as the manifest recorded them."""
    m = variant.manifest
    cmd = ["python", "-m", "pipeline.quantize", "--model", m.source.path, "--recipe", m.recipe.file]
    if calib := m.calibration:
        cmd += ["--calib", calib.file]
        if calib.data_dir:
            cmd += ["--data-dir", calib.data_dir]
    ranks = m.quantize.ranks
    return shlex.join(
        cmd + ["--out", str(Path(variant.dir).parent.parent)] + (["--dp", str(ranks)] if ranks > 1 else [])
    )


def eval_command(variant: Collected) -> str:
    """The command line that re-scores this variant: suites, data folder, limit, and any seed, greedy,
    reasoning or dtype setting, as its eval/results.json recorded them."""
    e = variant.eval_meta
    cmd = ["python", "-m", "pipeline.evaluate", "run", variant.dir, "--suites", *(s.file for s in e.suites.values())]
    if e.data_dir:
        cmd += ["--data-dir", e.data_dir]
    if e.limit:
        cmd += ["--limit", str(e.limit)]
    if e.seeds_override:
        cmd += ["--seeds", *map(str, e.seeds_override)]
    if e.greedy:
        cmd.append("--greedy")
    if e.reasoning_flag != "auto":
        cmd += ["--reasoning", e.reasoning_flag]
    if e.dtype:
        cmd += ["--dtype", e.dtype]
    return shlex.join(cmd)


def _packages(packages: dict[str, str] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (packages or {}).items())
