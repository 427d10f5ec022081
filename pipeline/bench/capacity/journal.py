"""The points a capacity search has finished, written as each ends, so that a make bench stopped part-way
(a GPU lease of half an hour, a Ctrl-C) continues where it stopped: the search is deterministic given its
points, so replaying the journal's points in order brings it back to the first one it had not run.

One JSON line a point: {"config", "settings", "workload", "plan", "point"}, after a first line with what
every point is of (grid.journal_identity: the checkpoint, vLLM, the device, the server's profile settings,
the workloads and their SLOs) and the queue rule that judged them: a journal of anything else is
discarded, with a line saying so; one judged by another rule keeps its points, each re-judged by today's
(steady.rejudged: a verdict follows from a point's figures, so a tighter rule costs no GPU time). A point
replays where its config's settings and its plan (PLAN_KEYS: the rate, the requests, the ramp, the
window, the seed) are what the search asks for now, so a search with more points or another tolerance
reuses what it can. make bench removes the journal once bench.json is written.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from pipeline.load.steady import PointPlan, QueueRule, rejudged
from pipeline.schema import CapacityPoint

# what a point's figures depend on, of its plan (its timeout does not change them)
PLAN_KEYS = ("kind", "rate", "num_prompts", "ramp_s", "window_s", "seed")


def plan_key(plan: dict) -> dict:
    return {k: plan[k] for k in PLAN_KEYS}


class NeedsServer(Exception):
    """A replay reached a point the journal does not hold: a server must run it."""


class TimeLimit(Exception):
    """The next point would end past make bench's time limit (BENCH_TIME_LIMIT): stopped before it."""


class Journal:
    def __init__(self, path: Path, identity: dict, rule: QueueRule):
        self.path = path
        self.identity = identity
        self.rule = json.loads(json.dumps(dataclasses.asdict(rule)))  # as a journal's head reads back
        self.entries: list[dict] = []
        if path.is_file():
            lines = path.read_text().splitlines()
            head = json.loads(lines[0]) if lines else {}
            if head.get("identity") == identity:
                # a line cut off by a kill mid-write is the last one, and the point it held is run again
                for line in lines[1:]:
                    try:
                        self.entries.append(json.loads(line))
                    except json.JSONDecodeError:
                        break
                if self.entries and head.get("rule") != self.rule:
                    self._rejudge(rule, head.get("rule"))
            else:
                print(f"  {path}: from another checkpoint, profile or vLLM; starting the search afresh", flush=True)
        self._rewrite()

    def _rejudge(self, rule: QueueRule, was: dict | None) -> None:
        changed = 0
        for e in self.entries:
            point = CapacityPoint.model_validate(e["point"])
            judged = rejudged(point, rule)
            changed += judged.held != point.held
            e["point"] = judged.model_dump(mode="json")
        print(
            f"  {self.path}: {len(self.entries)} points re-judged by {_rule_text(self.rule)} (judged before by "
            f"{_rule_text(was)}): {changed} of them changed verdict",
            flush=True,
        )

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        head = {"identity": self.identity, "rule": self.rule}
        tmp.write_text("".join(json.dumps(e) + "\n" for e in [head, *self.entries]))
        tmp.replace(self.path)

    def _mine(self, e: dict, config: str, settings: dict, workload: str) -> bool:
        return e["config"] == config and e["settings"] == settings and e["workload"] == workload

    def recorded(self, config: str, settings: dict, workload: str) -> list[tuple[dict, CapacityPoint]]:
        return [
            (plan_key(e["plan"]), CapacityPoint.model_validate(e["point"]))
            for e in self.entries
            if self._mine(e, config, settings, workload)
        ]

    def append(self, config: str, settings: dict, workload: str, plan: PointPlan, point: CapacityPoint) -> None:
        entry = {"config": config, "settings": settings, "workload": workload, "plan": dataclasses.asdict(plan)}
        entry["point"] = point.model_dump(mode="json")
        self.entries.append(entry)
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def slowest_start_s(self) -> float:
        """The longest its points' client processes took to start (0 before any)."""
        return max((e["point"].get("start_s", 0.0) for e in self.entries), default=0.0)

    def forget(self, config: str, settings: dict, workload: str, keep: int) -> None:
        """Drop that run's points after its first `keep`: the search asked for another plan there."""
        mine = [i for i, e in enumerate(self.entries) if self._mine(e, config, settings, workload)]
        drop = set(mine[keep:])
        self.entries = [e for i, e in enumerate(self.entries) if i not in drop]
        self._rewrite()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class Replay:
    """A search's measure function: the journal's points of one config and workload while the search asks
    for the plans they were run with, then `live` (None: raise NeedsServer), each new point journaled.
    Before the first live point after replayed ones (a fresh server), one warm-up runs (`warm_up`).
    deadline (time.time()): no live point starts that could run past it (its timeout: an overloaded point
    runs to it), TimeLimit instead."""

    def __init__(
        self, journal: Journal, config: str, settings: dict, workload: str, live=None, warm_up=None, deadline=None
    ):
        self.journal, self.config, self.settings, self.workload = journal, config, settings, workload
        self.deadline = deadline
        self.recorded = journal.recorded(config, settings, workload)
        self.used = 0
        self.live, self.warm_up = live, warm_up
        self.warmed = False

    def __call__(self, plan: PointPlan) -> CapacityPoint:
        if self.used < len(self.recorded):
            recorded_plan, point = self.recorded[self.used]
            if recorded_plan == plan_key(dataclasses.asdict(plan)):
                self.used += 1
                return point
            self.journal.forget(self.config, self.settings, self.workload, self.used)
            self.recorded = self.recorded[: self.used]
        if self.live is None:
            raise NeedsServer(f"{self.config} {self.workload}")
        # a point takes its clients' start, then up to its timeout: the slowest start journaled so far
        longest = plan.timeout_s + self.journal.slowest_start_s()
        if self.deadline is not None and time.time() + longest > self.deadline:
            raise TimeLimit(
                f"stopped at the time limit before a {plan.kind} point of {self.config} {self.workload} "
                f"(up to {longest:.0f} s); {_points(len(self.journal.entries))} in {self.journal.path}: "
                "make bench again continues from there"
            )
        if not self.warmed and self.used and plan.kind != "warmup" and self.warm_up is not None:
            # a fresh server, after points the journal replayed (another server warmed up for them); a search
            # that starts here warms its server with its own first point, the saturation burst
            self.warm_up()
        self.warmed = True
        point = self.live(plan)
        self.journal.append(self.config, self.settings, self.workload, plan, point)
        return point


def _rule_text(rule: dict | None) -> str:
    if not rule:
        return "no rule recorded"
    return ", ".join(f"{k} {'/'.join(v) if isinstance(v, list) else format(v, 'g')}" for k, v in rule.items())


def _points(n: int) -> str:
    return "1 point is" if n == 1 else f"{n} points are"
