"""A continuous-batching server simulated in virtual time, for the capacity search's tests: it answers a
PointPlan with the requests as vLLM's benchmark client would have seen them, and the same steady-state
rule (pipeline/load/steady.py) turns them into a CapacityPoint. No figure depends on a clock or on how busy
the cores are.

The engine runs in steps, as vLLM's scheduler does: each step admits waiting requests up to max_num_seqs,
then every running sequence gets one token; a step takes step_ms + per_seq_ms x (sequences in it) +
prefill_ms_per_token x (prompt tokens admitted in it). So TPOT grows with the batch, and past
max_num_seqs requests wait (TTFT grows). In a steady state at rate L with N output tokens a request, the
batch is b = L x N x step, step = step_ms + per_seq_ms x b, so step = step_ms / (1 - L x N x per_seq_ms):
tpot_knee() is the rate at which the steady TPOT reaches a target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.load.steady import PointPlan, QueueRule, Request, summarize
from pipeline.schema import CapacityPoint, Workload


@dataclass
class SimServer:
    max_num_seqs: int = 64
    step_ms: float = 5.0
    per_seq_ms: float = 0.2
    prefill_ms_per_token: float = 0.0
    input_len: int = 32
    output_len: int = 16
    slowdown: dict | None = None  # plan kind -> step time multiplier (a server slower in some runs)
    max_shortfall: float = 0.1
    max_backlog_z: float = 4.0

    def requests(self, plan: PointPlan) -> list[Request]:
        rng = np.random.default_rng(plan.seed)
        if plan.rate is None:
            arrivals = np.zeros(plan.num_prompts)
        else:
            arrivals = np.cumsum(rng.exponential(1 / plan.rate, plan.num_prompts))
            arrivals -= arrivals[0]
        scale = (self.slowdown or {}).get(plan.kind, 1.0)
        waiting = list(arrivals)  # in arrival order
        nxt = 0
        running: list[list] = []  # [index, tokens left, first token time, last token time, gaps]
        out: dict[int, Request] = {}
        now = 0.0
        while nxt < len(waiting) or running:
            if not running and nxt < len(waiting) and waiting[nxt] > now:
                now = waiting[nxt]  # idle until the next arrival
            admitted = 0
            while nxt < len(waiting) and waiting[nxt] <= now and len(running) < self.max_num_seqs:
                running.append([nxt, self.output_len, None, None, []])
                nxt += 1
                admitted += 1
            step = self.step_ms + self.per_seq_ms * len(running) + self.prefill_ms_per_token * self.input_len * admitted
            now += scale * step / 1000
            done = []
            for seq in running:
                if seq[2] is None:
                    seq[2] = now
                else:
                    seq[4].append(now - seq[3])
                seq[3] = now
                seq[1] -= 1
                if seq[1] == 0:
                    done.append(seq)
            for seq in done:
                running.remove(seq)
                i = seq[0]
                sent = float(arrivals[i])
                out[i] = Request(sent, True, seq[2] - sent, seq[3] - sent, self.output_len, seq[4])
            if plan.timeout_s and now > plan.timeout_s + float(arrivals[-1]):
                break
        return [out.get(i, Request(float(arrivals[i]), False)) for i in range(len(arrivals))]

    def measure(self, workload: Workload):
        """The search's measure function: plan -> CapacityPoint, wall_s the point's virtual duration."""

        def measure(plan: PointPlan) -> CapacityPoint:
            requests = self.requests(plan)
            wall = max((r.done_s for r in requests if r.ok), default=plan.timeout_s)
            return summarize(plan, requests, workload, QueueRule(self.max_shortfall, self.max_backlog_z), wall)

        return measure

    def tpot_knee(self, tpot_ms: float) -> float:
        """The Poisson rate at which the steady batch's step time reaches tpot_ms."""
        return (1 - self.step_ms / tpot_ms) / (self.output_len * self.per_seq_ms / 1000)
