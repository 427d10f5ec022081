"""The names of the figures the stages write, built and parsed here only.

    latency_key("tpot", 90)                -> "p90_tpot_ms"          (bench.json, an SLO target)
    level_figure("chat", 8, "p90_tpot_ms") -> "chat.c8.p90_tpot_ms"  (one flat figure of a bench level)
    parse_level_figure("chat.c8.p90_tpot_ms") -> LevelFigure("chat", 8, "p90_tpot_ms")
    capacity_figure("chat", "capacity_rps") -> "chat.capacity_rps"

The flat namespace a policy names (pipeline/policy.py builds the values, pipeline/schema/ checks names):
  size_gib, weights_gib, kv_cache_tokens, startup_s, peak_rss_gib, max_concurrency.<shape>  (manifest, bench)
  <shape>.c<N>.p50_tpot_ms ... p99_e2el_ms, <shape>.c<N>.output_throughput                (bench, per level)
  <suite>:<metric>, e.g. synthetic-rc:f1                                                   (eval: accuracy)
  <suite>.kld, <suite>.top1, <suite>.perplexity                                            (eval: fidelity)
  <workload>.capacity_rps, <workload>.saturation_rps               (bench: capacity at the workload's SLO)
"""

from __future__ import annotations

import re
from typing import NamedTuple

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
# vLLM's own labels of LATENCY_METRICS, as its benchmark prints them
LATENCY_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E"}
FIXED_FIGURES = ("size_gib", "weights_gib", "kv_cache_tokens", "startup_s", "peak_rss_gib")
FIDELITY_FIGURES = ("kld", "top1", "perplexity")
CAPACITY_STATS = ("capacity_rps", "saturation_rps")

_METRIC = "|".join(LATENCY_METRICS)
_PERCENTILE = "|".join(map(str, PERCENTILES))
# p90_tpot_ms: one latency percentile, as vLLM's benchmark result and an SLO name it
LATENCY_KEY = re.compile(rf"p({_PERCENTILE})_({_METRIC})_ms")
_LEVEL = re.compile(rf"([\w-]+)\.c(\d+)\.({LATENCY_KEY.pattern}|output_throughput)")


def latency_key(metric: str, percentile: int) -> str:
    return f"p{percentile}_{metric}_ms"


def parse_latency_key(key: str) -> tuple[int, str] | None:
    """(percentile, metric) of p90_tpot_ms; None for any other name."""
    match = LATENCY_KEY.fullmatch(key)
    return (int(match.group(1)), match.group(2)) if match else None


# Per bench level: every percentile of every latency metric, and the output token throughput
LATENCY_KEYS = tuple(latency_key(m, p) for m in LATENCY_METRICS for p in PERCENTILES)
LEVEL_STATS = (*LATENCY_KEYS, "output_throughput")


class LevelFigure(NamedTuple):
    shape: str
    concurrency: int
    stat: str  # one of LEVEL_STATS

    @property
    def is_latency(self) -> bool:
        return self.stat != "output_throughput"


def level_figure(shape: str, concurrency: int, stat: str) -> str:
    return f"{shape}.c{concurrency}.{stat}"


def parse_level_figure(name: str) -> LevelFigure | None:
    """The shape, concurrency and statistic of a per-level figure; None for any other name."""
    match = _LEVEL.fullmatch(name)
    return LevelFigure(match.group(1), int(match.group(2)), match.group(3)) if match else None


def capacity_figure(workload: str, stat: str) -> str:
    return f"{workload}.{stat}"


FIGURE_NAME = re.compile(
    rf"({'|'.join(FIXED_FIGURES)}|max_concurrency\.[\w-]+"
    rf"|[\w-]+\.c\d+\.(?:p(?:{_PERCENTILE})_(?:{_METRIC})_ms|output_throughput)"
    rf"|[\w-]+\.({'|'.join(CAPACITY_STATS)})"
    rf"|[\w-]+:\w+|[\w-]+\.({'|'.join(FIDELITY_FIGURES)}))"
)
