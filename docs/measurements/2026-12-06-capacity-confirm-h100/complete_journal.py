"""One-off: the 2026-12-06 H100 journal (first session's points) completed with the second session's confirm
points from bench.json, in the journal format with the queue rule on its own line (max_backlog_z inf: the
rule that judged them then). The search replays it and asks for each of bench.json's points in turn; the
script checks each is the plan the search asks for."""
import json, math, sys
from pathlib import Path
import yaml
from pipeline.bench.capacity.journal import Journal, Replay
from pipeline.bench.capacity.search import search_capacity
from pipeline.load.steady import QueueRule
from pipeline.schema import CapacityPoint, Profile

src = Path("docs/measurements/2026-12-06-capacity-reasoning-h100")
out = Path(sys.argv[1])
lines = (src / "journal.jsonl").read_text().splitlines()
identity = json.loads(lines[0])["identity"]
shortfall = identity.pop("max_shortfall")
rule = QueueRule(shortfall, math.inf)
out.write_text("".join(l + "\n" for l in [json.dumps({"identity": identity, "rule": {"max_shortfall": shortfall, "max_backlog_z": math.inf}}), *lines[1:]]))
profile = Profile.model_validate(yaml.safe_load(open("bench/h200-reasoning-frontend.yaml")))
search = profile.capacity.model_copy(update={"max_backlog_z": math.inf})
bench = json.loads((src / "bench.json").read_text())
journal = Journal(out, identity, rule)
(spec,) = search.workloads
e2e = spec.e2e_bound_ms(spec.output_len)
for run in bench["capacity"]["runs"]:
    points = iter(run["points"][len(journal.recorded(run["config"], run["settings"], run["workload"])):])
    def live(plan, points=points):
        p = CapacityPoint.model_validate(next(points))
        assert (p.kind, p.request_rate) == (plan.kind, plan.rate) and p.num_prompts == plan.num_prompts, (p.kind, p.request_rate, plan)
        print("  appended", run["config"], plan.kind, round(plan.rate, 2))
        return p
    result = search_capacity(Replay(journal, run["config"], run["settings"], run["workload"], live), search, spec, e2e, run["config"], run["settings"])
    assert next(points, None) is None
    print(run["config"], "capacity", result.capacity_rps, "points", len(result.points))
