"""serve.yaml: the settings of the config bench measured the highest capacity with at the policy's SLO,
or, where no capacity was measured, memory arithmetic (pipeline/gpu_memory.py); the replica count from traffic; the
model card's capacity line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pipeline.gpu_memory import memory_settings
from pipeline.schema import Bench, Capacity, CapacityRun, ConfigError, Deployment, MeasuredWorkload, VariantManifest
from pipeline.serving import is_reasoning_model


@dataclass(frozen=True)
class MeasuredCapacity:
    """The capacity bench measured for the deployment's workload: the run of the config it chose, the
    section it is in, and the other configs' runs of that workload that did not fail."""

    workload: MeasuredWorkload
    run: CapacityRun
    capacity: Capacity
    others: list[CapacityRun]


def measured_capacity(bench: Bench | None, d: Deployment, folder: Path) -> MeasuredCapacity | None:
    """The capacity bench measured for the deployment's workload, with the config it chose; the workload
    unset: for a reasoning model (folder's chat template) its first reasoning workload, else the first.
    None where none was measured or no rate held. A workload the policy names that bench did not measure
    is a one-line error."""
    section = bench.capacity if bench else None
    if not section:
        return None
    names = [w.name for w in section.workloads]
    if d.workload is not None and d.workload not in names:
        raise ConfigError(
            f"deployment.workload: {d.workload!r} was not measured by make bench (its workloads: {', '.join(names)}); "
            "name one of those or add it to the bench profile's capacity section"
        )
    found = section.chosen_run(d.workload or section.sizing_workload(reasoning_checkpoint(folder)))
    if found is None:
        return None
    workload, run = found
    others = [r for r in section.runs if r.workload == workload.name and r.config != run.config and not r.error]
    return MeasuredCapacity(workload, run, section, others)


def reasoning_checkpoint(folder: Path) -> bool:
    from transformers import AutoTokenizer

    return is_reasoning_model(AutoTokenizer.from_pretrained(folder))


def replica_count(measured: MeasuredCapacity | None, d: Deployment, variant: str) -> tuple[int, str]:
    """(replicas, why): ceil(traffic x (1 + headroom) / capacity) with a traffic target, else the policy's."""
    if d.traffic_rps is None:
        return d.replicas or 1, "the policy's deployment.replicas" if d.replicas else "one (the policy names none)"
    if measured is None:
        raise ConfigError(
            f"deployment.traffic_rps: {variant} has no capacity measured at an SLO, so replicas cannot follow "
            "from traffic; run make bench with a profile that has a capacity section (bench/h200-capacity.yaml), "
            "or give deployment.replicas instead"
        )
    cap = measured.run.capacity_rps
    headroom = d.traffic_headroom
    n = max(1, math.ceil(d.traffic_rps * (1 + headroom) / cap))
    return n, f"ceil({d.traffic_rps:g} req/s x (1 + headroom {headroom:g}) / {cap:.3g} req/s a replica)"


def capacity_sentence(measured: MeasuredCapacity | None) -> str:
    """The model card's line: only from a measurement."""
    if measured is None:
        return (
            "Capacity: not measured (no capacity at an SLO in this variant's bench.json); serve.yaml's settings "
            "are derived from memory arithmetic, not from a load test."
        )
    run, cap = measured.run, measured.capacity
    return (
        f"Capacity: holds {run.capacity_rps:.3g} req/s ({run.spread_text() or 'one run at that rate'}) at "
        f"{measured.workload.slo_text()} on {cap.device_name} "
        f"(one replica, vLLM {cap.vllm_version}, serve.yaml's settings: config `{run.config}` of the bench "
        f"grid; saturation {run.saturation_rps:.3g} req/s). Measured on one machine: another of the same model "
        "can hold less (two H100s differed by a fifth in TPOT at one load), so leave headroom."
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
    if reasoning_checkpoint(folder):  # the test eval uses: R1-style think blocks
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
    name: str, manifest: VariantManifest, config: dict, folder: Path, d: Deployment, measured: MeasuredCapacity
) -> tuple[dict, str]:
    """serve.yaml from the bench grid's chosen config: the settings that held the most traffic at the SLO."""
    run, cap = measured.run, measured.capacity
    cfg = {"model": ".", "served-model-name": name, "host": d.host, "port": d.port, "dtype": "auto"}
    cfg |= {"tensor-parallel-size": cap.tensor_parallel_size, **run.settings}
    notes = model_keys(cfg, config, folder, manifest.recipe.kv_cache_dtype)
    others = "; ".join(
        f"{r.config} {'none' if r.capacity_rps is None else format(r.capacity_rps, '.3g')}"
        + (" (not held in every run)" if r.unstable else "")
        for r in measured.others
    )
    header = [
        f"# vLLM server for {name}: `vllm serve --config serve.yaml` from this folder (model: . is this folder).",
        "# The API key is read from the VLLM_API_KEY environment variable (never written here).",
        f"# Serving settings measured, not derived: config {run.config} of the bench grid "
        f"({', '.join(f'{k} {v}' for k, v in run.settings.items())}),",
        f"#   measured capacity {run.capacity_rps:.3g} req/s (saturation {run.saturation_rps:.3g} req/s; "
        f"{run.spread_text() or 'one run at that rate: not confirmed'}) at",
        f"#   {measured.workload.slo_text()},",
        f"#   chosen: {cap.chosen[measured.workload.name].why},",
        f"#   on {cap.device_name} with vLLM {cap.vllm_version}"
        + (f"; the other configs held (req/s): {others}." if others else "."),
        f"# Measured on that device: on another card (the policy's deployment.gpu_memory_gib {d.gpu_memory_gib:g} GiB)",
        "#   the capacity differs; make bench there measures it.",
        *[f"# {n}" for n in notes],
        "# host 127.0.0.1: reachable from this machine only; the container files override it with 0.0.0.0.",
    ]
    return cfg, "\n".join(header) + "\n"


def serve_config(
    folder: Path, name: str, manifest: VariantManifest, bench: Bench | None, d: Deployment
) -> tuple[dict, str]:
    """serve.yaml's keys (vLLM's CLI flags) and a comment block saying where each value came from: the
    config bench measured the highest capacity with where it measured one, else memory arithmetic."""
    config = json.loads((folder / "config.json").read_text())
    kv = manifest.recipe.kv_cache_dtype
    measured = measured_capacity(bench, d, folder)
    if measured is not None:
        return measured_serve_config(name, manifest, config, folder, d, measured)
    mem = memory_settings(config, bench, manifest.size_bytes, d, kv)
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
