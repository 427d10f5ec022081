"""One variant's capacity: each config of the profile's grid on a server of its own (the profile's own
settings on the latency levels' server), each workload it measures searched (search.py) through the
journal (journal.py), and bench.json's capacity section."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.bench.capacity.choice import choose
from pipeline.bench.capacity.configs import not_chosen_because, server_settings
from pipeline.bench.capacity.eval_workload import eval_dataset
from pipeline.bench.capacity.journal import Journal, NeedsServer, Replay
from pipeline.bench.capacity.search import search_capacity
from pipeline.bench.levels import server_command
from pipeline.load.bench_serve import ClientPool, Target, run_point
from pipeline.load.steady import QueueRule, burst_plan
from pipeline.schema import Capacity, CapacityConfig, CapacityRun, MeasuredWorkload, Profile, ServingConfig
from pipeline.serving import Server, free_port


def capacity_dir(variant: Path) -> Path:
    """Where a variant's capacity runs keep their files: the journal, from_eval datasets, client results."""
    return variant.parent / f".bench-{variant.name}.capacity"


def journal_path(variant: Path) -> Path:
    return capacity_dir(variant) / "journal.jsonl"


@dataclass
class VariantCapacity:
    """What every capacity run of one variant shares."""

    variant: Path
    profile: Profile
    kv_cache_dtype: str  # the recipe's
    workloads: list[MeasuredWorkload]
    datasets: dict[str, Path]  # from_eval workloads' request files, by workload name
    journal: Journal
    env: dict  # the servers' environment
    deadline: float | None = None  # time.time() after which no point ends (make bench's BENCH_TIME_LIMIT)
    machine: str | None = None  # the instance its live points run on (bench.json's machine.instance)

    @property
    def search(self):
        return self.profile.capacity


def prepare(
    variant: Path, profile: Profile, kv_cache_dtype: str, env: dict, identity: dict, deadline: float | None = None
) -> VariantCapacity:
    """The workloads with their lengths and E2E bounds, and the journal; a one-line ConfigError before any
    server starts where eval has not written what a from_eval workload replays. identity: what the
    journal's points are of (checkpoint, vLLM, device)."""
    datasets, workloads = {}, []
    for w in profile.capacity.workloads:
        lengths = None
        if w.from_eval is not None:
            datasets[w.name] = capacity_dir(variant) / f"{w.name}.jsonl"
            lengths = eval_dataset(variant, w, profile.max_model_len, datasets[w.name])
        mean_out = lengths.output_tokens.mean if lengths else w.output_len
        record = w.model_dump(mode="json") | {"lengths": lengths, "e2e_bound_ms": w.e2e_bound_ms(mean_out)}
        workloads.append(MeasuredWorkload.model_validate(record))
    rule = QueueRule.of(profile.capacity)
    journal = Journal(journal_path(variant), journal_identity(profile, kv_cache_dtype, identity), rule)
    return VariantCapacity(variant, profile, kv_cache_dtype, workloads, datasets, journal, env, deadline)


def journal_identity(profile: Profile, kv_cache_dtype: str, identity: dict) -> dict:
    """What every journaled point of a variant is of, besides its config's settings and its plan:
    identity (the checkpoint, vLLM, the device), the server's profile settings, the recipe's KV cache, the
    workloads with their SLOs, the clients' share of a core. The queue rule is the journal's own line: a
    point is re-judged by a new one, not measured again."""
    server = ("dtype", "max_model_len", "max_num_seqs", "gpu_memory_utilization", "enforce_eager")
    server += ("tensor_parallel_size", "cpu_kv_cache_gib", "max_cudagraph_capture_size")
    return identity | {
        "server": {key: getattr(profile, key) for key in server},
        "kv": kv_cache_dtype,
        "workloads": [w.model_dump(mode="json") for w in profile.capacity.workloads],
        "client_tokens_per_s": profile.capacity.client_tokens_per_s,
    }


def measure_config(vc: VariantCapacity, config: ServingConfig, server: Server | None = None) -> tuple:
    """One config of the grid: on `server` (running with these settings already), else on a server of its
    own, started here only where the journal does not hold every point it needs. (CapacityConfig, its
    CapacityRuns); a server that fails is that config's error, not the variant's."""
    settings = server_settings(config, vc.profile, vc.kv_cache_dtype)
    workloads = [w for w in vc.workloads if config.measures(w.name)]
    entry = {"name": config.name, "overrides": config.overrides(), "settings": settings, "startup_s": None}
    entry |= {"workloads": [w.name for w in workloads], "why": config.why}
    entry["not_chosen_because"] = not_chosen_because(config, vc.kv_cache_dtype)
    if server is not None:
        return CapacityConfig(**entry), [run_workload(vc, config, w, settings, server) for w in workloads]
    try:
        return CapacityConfig(**entry), [run_workload(vc, config, w, settings, None) for w in workloads]
    except NeedsServer:
        pass
    port = free_port()
    log_path = vc.variant.parent / f".bench-{vc.variant.name}.{config.name}.log"
    command = server_command(vc.variant, vc.profile, port, config)
    try:
        with Server(command, port, log_path, vc.profile.startup_timeout_s, vc.env) as s:
            entry["startup_s"] = round(s.wait_healthy(), 1)
            return CapacityConfig(**entry), [run_workload(vc, config, w, settings, s) for w in workloads]
    except (RuntimeError, OSError) as e:
        print(f"error: {vc.variant}: capacity config {config.name}: {e}", file=sys.stderr, flush=True)
        return CapacityConfig(**entry, error=str(e)), [
            failed_run(w.name, config.name, settings, str(e)) for w in workloads
        ]


def run_workload(
    vc: VariantCapacity, config: ServingConfig, workload: MeasuredWorkload, settings: dict, server: Server | None
) -> CapacityRun:
    """The search for one workload on `server`, its points replayed from the journal first (server None:
    from the journal only, NeedsServer where it holds too few); its load clients are one pool for all its
    points, started at the first point that runs live."""
    search = vc.search
    spec = next(w for w in search.workloads if w.name == workload.name)
    live = warm_up = None
    with contextlib.ExitStack() as stack:
        if server is not None:
            log = vc.variant.parent / f".bench-{vc.variant.name}.client.log"
            result_dir = capacity_dir(vc.variant) / config.name
            target = Target(
                base_url=f"http://127.0.0.1:{server.port}",
                model=str(vc.variant),
                tokenizer=str(vc.variant),
                api_key=server.api_key,
                result_dir=result_dir,
                log=log,
                pool=stack.enter_context(ClientPool(log, result_dir)),
            )
            live, warm_up = _live_points(vc, config, workload, spec, target)
        replay = Replay(vc.journal, config.name, settings, workload.name, live, warm_up, vc.deadline)
        run = search_capacity(replay, search, spec, workload.e2e_bound_ms, config.name, settings)
    cap = "none" if run.capacity_rps is None else f"{run.capacity_rps:.3g}"
    broke = "" if run.broke_at_rps is None else f", broke at {run.broke_at_rps:.3g}"
    confirmed = f" ({text})" if (text := run.spread_text()) else ""
    print(
        f"  {vc.variant.name} {config.name} {workload.name}: capacity {cap} req/s at its SLO{confirmed}{broke}, "
        f"saturation {run.saturation_rps or 0:.3g} req/s ({len(run.points)} points, {run.wall_s:.0f} s, "
        f"stopped by {run.stopped_by})",
        flush=True,
    )
    return run


def _live_points(vc: VariantCapacity, config: ServingConfig, workload: MeasuredWorkload, spec, target: Target):
    """(live, warm_up): a point run on the target's server, and the warm-up a search resumed from the
    journal runs before its first live point."""
    search = vc.search
    tokens = workload.lengths.output_tokens.mean if workload.lengths else workload.output_len

    def live(plan):
        point = run_point(target, spec, plan, search, vc.datasets.get(workload.name), tokens)
        point = point.model_copy(update={"machine": vc.machine})
        rate = "at once" if plan.rate is None else f"{plan.rate:.3g} req/s"
        held = "held" if point.held else "broke: " + "; ".join(point.slo_broken)
        cpu = "" if point.client_cpu is None else f", busiest at {point.client_cpu:.0%} of a core"
        print(f"    {config.name} {workload.name} {plan.kind} {rate}: {held} ({point.clients} clients{cpu})")
        return point

    def warm_up():
        print(f"  {vc.variant.name} {config.name} {workload.name}: resumed from {vc.journal.path}", flush=True)
        live(burst_plan("warmup", search.warmup_requests, workload.e2e_bound_ms, 0))

    return live, warm_up


def failed_run(workload: str, config: str, settings: dict, error: str) -> CapacityRun:
    return CapacityRun(
        workload=workload,
        config=config,
        settings=settings,
        capacity_rps=None,
        broke_at_rps=None,
        saturation_rps=None,
        stopped_by="error",
        points=[],
        wall_s=0.0,
        error=error,
    )


def capacity_section(vc: VariantCapacity, measured: dict, device_name: str, vllm: str | None, t0: float) -> Capacity:
    """Every config of the grid measured (`measured`: those done on the latency levels' server already),
    in the profile's order, as bench.json's capacity section."""
    search = vc.search
    for config in search.grid:
        if config.name not in measured:
            measured[config.name] = measure_config(vc, config)
    grid = [measured[c.name][0] for c in search.grid]
    runs = [run for c in search.grid for run in measured[c.name][1]]
    return Capacity(
        workloads=vc.workloads,
        search=search.model_dump(mode="json", exclude={"workloads", "grid"}),
        grid=grid,
        runs=runs,
        chosen={w.name: choose(runs, grid, w.name, search.tolerance) for w in vc.workloads},
        device_name=device_name,
        vllm_version=vllm,
        max_model_len=vc.profile.max_model_len,
        tensor_parallel_size=vc.profile.tensor_parallel_size,
        wall_s=round(time.time() - t0, 1),
    )
