"""Whether a capacity point measures the server or its load generator: on one server, the same sustained
Poisson points (the capacity search's rule, pipeline/load/steady.py, and its load path,
pipeline/load/bench_serve.run_point) from one client process and from as many as the token stream needs,
interleaved, side by side in one run. Where one client breaks a rate that several hold, one client was
what the point measured.

    python bench/load_clients_ab.py VARIANT --profile bench/h200-capacity.yaml --workload reasoning \\
        --config graphs-to-max-seqs --points 18:1,18:auto,24:auto [--out ab.jsonl]

--points: RATE:CLIENTS, in the order they run; CLIENTS a number or auto (as many as the token stream needs,
as the search runs them).

Prints one line a point (offered and achieved req/s, p90 TTFT and TPOT, held, clients, the busiest client's
share of a core) and appends each CapacityPoint to --out as it finishes."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import exits  # noqa: E402
from pipeline.bench.levels import server_command  # noqa: E402
from pipeline.bench.variant import server_env  # noqa: E402
from pipeline.load.bench_serve import Target, run_point  # noqa: E402
from pipeline.load.steady import burst_plan, sustained_plan  # noqa: E402
from pipeline.schema.profiles import load_profile  # noqa: E402
from pipeline.serving import Server, free_port  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--config", required=True, help="a config of the profile's capacity grid")
    ap.add_argument("--points", required=True, help="RATE:CLIENTS,...; CLIENTS a number or auto")
    ap.add_argument("--out", type=Path, default=Path("load-clients-ab.jsonl"))
    a = ap.parse_args()
    profile = load_profile(a.profile)
    search = profile.capacity
    spec = next(w for w in search.workloads if w.name == a.workload)
    config = next(c for c in search.grid if c.name == a.config)
    e2e_ms = spec.e2e_bound_ms(spec.output_len)
    port = free_port()
    work = a.out.parent / ".load-clients-ab"
    work.mkdir(parents=True, exist_ok=True)
    command = server_command(a.variant, profile, port, config)
    with Server(command, port, work / "server.log", profile.startup_timeout_s, server_env(profile)) as server:
        print(f"server up in {server.wait_healthy():.0f} s: {' '.join(command[3:])}", flush=True)
        target = Target(
            f"http://127.0.0.1:{port}", str(a.variant), str(a.variant), server.api_key, work, work / "client.log"
        )
        run_point(target, spec, burst_plan("warmup", search.warmup_requests, e2e_ms, 0), search)
        for seed, pair in enumerate(a.points.split(","), start=1):
            rate, clients = pair.split(":")
            plan = sustained_plan("search", float(rate), search, e2e_ms, seed)
            cap = None if clients == "auto" else int(clients)
            point = run_point(dataclasses.replace(target, max_clients=cap), spec, plan, search)
            p90 = point.latency_ms
            print(
                f"{rate} req/s, {point.clients} clients (busiest {point.client_cpu or 0:.0%} of a core): "
                f"sent {point.sent_rps or 0:.2f} achieved {point.achieved_rps or 0:.2f} req/s, "
                f"p90 TTFT {p90.get('p90_ttft_ms', 0):.0f} ms, p90 TPOT {p90.get('p90_tpot_ms', 0):.1f} ms, "
                f"{'held' if point.held else 'broke: ' + '; '.join(point.slo_broken)}",
                flush=True,
            )
            with a.out.open("a") as f:
                f.write(point.model_dump_json() + "\n")
    return 0


if __name__ == "__main__":
    # a SIGTERM (`timeout`) stops the server on the way out: on the H200 (gVisor) an engine core outlived
    # its killed parent and held the GPU's memory into the next call
    exits.run("load_clients_ab", main, "the points appended to --out so far are whole", vllm_in_process=True)
