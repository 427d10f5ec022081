"""README.md of the published folder: a Hugging Face model card (YAML metadata with the accuracy figures
as a model-index), how to serve it, how it was made, every figure of report.json, why this variant."""

from __future__ import annotations

import yaml

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER
from pipeline.policy import policy_file_label
from pipeline.publish.deploy_files import API_KEY_SECRET, KEY_REQUIRED, dns_name
from pipeline.schema import Report, VariantManifest


def card_metadata(
    name: str, manifest: VariantManifest, figures: dict, base_model: str | None, license_: str | None
) -> dict:
    """The card's YAML front matter: base model, license, tags, and the accuracy figures (`suite:metric`)."""
    method = manifest.recipe.method
    accuracy = {k: v for k, v in figures.items() if ":" in k}
    return {
        **({"base_model": base_model} if base_model else {}),
        **({"base_model_relation": "quantized"} if base_model and method != "bf16" else {}),
        **({"license": license_} if license_ else {}),
        "library_name": "vllm",
        "pipeline_tag": "text-generation",
        "tags": [t for t in ("quantized" if method != "bf16" else None, method, manifest.format, "vllm") if t],
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "text-generation"},
                        "dataset": {"name": metric.split(":")[0], "type": metric.split(":")[0]},
                        "metrics": [{"type": metric.split(":")[1], "name": metric, "value": round(value, 4)}],
                    }
                    for metric, value in accuracy.items()
                ],
            }
        ],
    }


def serve_section(name: str, cfg: dict, capacity_line: str) -> list[str]:
    """## Serve: the commands (each refuses an empty key) and serve.yaml's settings in a sentence."""
    settings = (
        f"Serving settings (serve.yaml): {cfg['tensor-parallel-size']} GPU(s) (tensor-parallel-size), "
        f"max-model-len {cfg['max-model-len']}, max-num-seqs {cfg['max-num-seqs']}, "
        f"gpu-memory-utilization {cfg['gpu-memory-utilization']}"
        + (f", quantization {cfg['quantization']}" if "quantization" in cfg else "")
        + (f", reasoning parser {cfg['reasoning-parser']}" if "reasoning-parser" in cfg else "")
        + (f", generation defaults {cfg['override-generation-config']}" if "override-generation-config" in cfg else "")
        + "".join(
            f", {k} {cfg[k]}"
            for k in ("max-num-batched-tokens", "enable-chunked-prefill", "enable-prefix-caching")
            if k in cfg
        )
        + "."
    )
    return [
        "## Serve",
        "",
        "```bash",
        "export VLLM_API_KEY=...           # any non-empty key: the server refuses requests without it",
        f': "{KEY_REQUIRED}" && vllm serve --config serve.yaml   # from this folder; or:',
        "docker compose up                  # official vLLM OpenAI image, this folder mounted read-only",
        "kubectl create secret generic " + dns_name(name) + API_KEY_SECRET + ' --from-literal=api-key="$VLLM_API_KEY"',
        "kubectl apply -f k8s.yaml          # after copying this folder into the PVC " + dns_name(name),
        "sha256sum -c SHA256SUMS            # verify a pull",
        "```",
        "",
        "vLLM itself serves everyone when VLLM_API_KEY is empty or unset; each way above refuses to start "
        "then (the `:?` check, compose's interpolation, k8s.yaml's container command), so a running server "
        "answers only requests that carry the key (401 without it).",
        "",
        settings,
        "",
        *([capacity_line, ""] if capacity_line else []),
    ]


def made_section(manifest: VariantManifest) -> list[str]:
    """## How it was made: recipe, format, calibration, source, packages, commit."""
    recipe, calib, source = manifest.recipe, manifest.calibration, manifest.source
    calibration = (
        f"| calibration | {calib.file}: {calib.samples} samples, {calib.tokens} tokens, token ids sha256 "
        f"{calib.token_ids_sha256[:16]}… |"
        if calib
        else "| calibration | none |"
    )
    settings = recipe.model_dump(mode="json", exclude_unset=True, exclude={"file", "description", "method"})
    return [
        "## How it was made",
        "",
        "| | |",
        "|---|---|",
        f"| method | {recipe.method} ({', '.join(f'{k} {v}' for k, v in settings.items())}) |",
        f"| format | {manifest.format}, made by {manifest.backend} |",
        calibration,
        f"| source | {source.origin or source.path} (sha256 {source.sha256[:16]}…) |",
        f"| packages | {', '.join(f'{k} {v}' for k, v in manifest.packages.items())} |",
        f"| commit | {manifest.git_commit} |",
        "",
    ]


def results_section(report: Report, variant: str) -> list[str]:
    """## Results (every figure of report.json) and ## Why this variant (each verdict)."""
    figs = report.variants[variant].figures
    lines = [
        "## Results",
        "",
        "Measured by this project's pipeline (figures from `report.json`; 95% CIs and the "
        "comparison of every variant in the report):",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for key in sorted(figs):
        value = figs[key]
        lines.append(f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += [
        "",
        f"Bench device: {report.variants[variant].bench_device or 'not benched'}.",
        "",
        "## Why this variant",
        "",
    ]
    return lines + [f"- **{other}**: {v.why}" for other, v in report.decision.verdicts.items()]


def model_card(
    name: str,
    variant: str,
    manifest: VariantManifest,
    report: Report,
    cfg: dict,
    base_model: str | None,
    license_: str | None,
    capacity_line: str = "",
) -> str:
    meta = card_metadata(name, manifest, report.variants[variant].figures, base_model, license_)
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).rstrip(), "---", "", f"# {name}", ""]
    if manifest.random_weights:
        lines += [f"> **{RANDOM_WEIGHTS_BANNER}**", ""]
    lines += [
        manifest.recipe.description,
        "",
        f"Variant `{variant}` of `{manifest.model}`"
        + (f" ({base_model})" if base_model else "")
        + f", chosen by the policy `{policy_file_label(report.policy.file)}`: {report.decision.summary}",
        "",
        *serve_section(name, cfg, capacity_line),
        *made_section(manifest),
        *results_section(report, variant),
    ]
    return "\n".join(lines) + "\n"
