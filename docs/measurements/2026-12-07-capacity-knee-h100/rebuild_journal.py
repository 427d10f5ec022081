"""One-off, from the repository root: `PYTHONPATH=. python <this file> OUT.jsonl`. Rebuilds the fp8-dynamic
reasoning journal from the 2026-12-06 evening's bench.json (every point of both configs, judged by today's
rule) with today's journal identity, then prints the point the search asks for next with the profile's
confirm_rates (carried to the device as artifacts/<model>/.bench-fp8-dynamic.capacity/journal.jsonl)."""
import json, sys
from pathlib import Path
import yaml
from pipeline.bench.capacity.grid import journal_identity
from pipeline.bench.capacity.journal import Journal, Replay, NeedsServer
from pipeline.bench.capacity.search import search_capacity
from pipeline.load.steady import QueueRule
from pipeline.schema import CapacityPoint, Profile

src = Path("docs/measurements/2026-12-06-capacity-confirm-h100")
out = Path(sys.argv[1])
head = json.loads(Path("docs/measurements/2026-12-06-capacity-reasoning-h100/journal.jsonl").read_text().splitlines()[0])["identity"]
identity = {k: head[k] for k in ("checkpoint", "vllm", "device")}
profile = Profile.model_validate(yaml.safe_load(open("bench/h200-reasoning-frontend.yaml")))
then = profile.capacity.model_copy(update={"confirm_rates": 4})
out.unlink(missing_ok=True)
journal = Journal(out, journal_identity(profile, "auto", identity), QueueRule.of(profile.capacity))
bench = json.loads((src / "bench.json").read_text())
(spec,) = profile.capacity.workloads
e2e = spec.e2e_bound_ms(spec.output_len)
for run in bench["capacity"]["runs"]:
    points = iter(run["points"])
    def live(plan, points=points):
        p = CapacityPoint.model_validate(next(points))
        assert (p.kind, p.request_rate, p.num_prompts) == (plan.kind, plan.rate, plan.num_prompts), (p, plan)
        return p
    r = search_capacity(Replay(journal, run["config"], run["settings"], run["workload"], live), then, spec, e2e, run["config"], run["settings"])
    assert next(points, None) is None
    print(run["config"], "replayed: capacity", r.capacity_rps, "points", len(r.points))
journal = Journal(out, journal_identity(profile, "auto", identity), QueueRule.of(profile.capacity))
for run in bench["capacity"]["runs"]:
    def ask(plan):
        print(f"  {run['config']}: next live point: {plan.kind} at {plan.rate:.2f} req/s, {plan.num_prompts} requests, window {plan.window_s:.1f} s")
        raise NeedsServer
    try:
        r = search_capacity(Replay(journal, run["config"], run["settings"], run["workload"], ask), profile.capacity, spec, e2e, run["config"], run["settings"])
        print(run["config"], "complete with confirm_rates", profile.capacity.confirm_rates, ": capacity", r.capacity_rps)
    except NeedsServer:
        pass
