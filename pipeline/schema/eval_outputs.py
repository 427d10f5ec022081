"""What the eval stage writes and compare reads: results.json (EvalRun), samples_<suite>.jsonl (Sample) and
eval-report.json (EvalReport); checked before writing and after reading, as every output (outputs.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.schema.outputs import EndpointInfo, EngineMode, Identity, Output, Record


class Accuracy(Output):
    """One accuracy figure of one variant in eval-report.json: its mean with a bootstrap CI, and against
    the baseline (absent for the baseline itself) the paired difference and McNemar's count."""

    mean: float
    ci95: tuple[float, float]
    std_across_seeds: float | None
    n: int
    seeds: int
    truncated: int
    no_answer: int | None  # None where the results do not count it
    delta: float | None = None
    delta_ci95: tuple[float, float] | None = None
    recovery: float | None = None  # mean / the baseline's mean (None where the baseline scores 0)
    mcnemar: dict | None = None
    significant: bool | None = None


class Fidelity(Output):
    """A fidelity suite's figures of one variant against the baseline (pipeline/evaluate/stats.py)."""

    kld_mean: float
    kld_ci95: tuple[float, float]
    kld_mass_covered: float
    top1_agreement: float
    top1_ci95: tuple[float, float]
    perplexity: float
    baseline_perplexity: float
    positions: int
    top_k: int


class SuiteRun(Record):
    """One suite's entry in a run's record: its file and metric, and the figures that metric's scorer
    writes (generation, fidelity and lm-eval suites write different ones)."""

    file: str
    metric: str
    # the hash of the suite's settings as eval read them (drift.settings_sha256): a suite edited since is
    # refused by compare and report; None in files written before it was recorded (nothing to compare)
    settings_sha256: str | None = None
    # an lm-eval suite's own server (the run's `engine` is the native suites'); None where not recorded
    engine: EngineMode | None = None


class EvalServing(Output):
    """What eval's vLLM OpenAI server was: its command's arguments, the version it reported, how long
    it took to be healthy."""

    command: list[str]
    vllm_version: str | None
    startup_s: float = Field(ge=0)


class EvalRun(Output):
    """The "pipeline" entry of artifacts/<model>/<variant>/eval/results.json (make eval; the rest of the
    file is lm-eval's shape). Read by eval's compare and by report, which rebuilds the command from it."""

    variant: str
    model: str
    reasoning_model: bool
    # None on an ENDPOINT, as enforce_eager, data_parallel, tensor_parallel and kv_cache_dtype: the
    # server's own settings, not known here
    dtype: str | None
    limit: int | None
    data_dir: str | None
    git_commit: str | None
    seeds_override: list[int] | None
    greedy: bool
    reasoning_flag: Literal["auto", "yes", "no"]
    checkpoint_sha256: str | None
    # what was measured; None where a file does not record it (readers take those as stale)
    identity: Identity | None = None
    random_weights: bool
    packages: dict[str, str]
    created: str
    load_s: float
    enforce_eager: bool | None
    # how vLLM ran the native suites: what their figures hold for; "unknown (endpoint)" on an ENDPOINT.
    # None in files written before it was recorded
    engine: EngineMode | None = None
    engine_in_process: bool
    # the vLLM OpenAI server the suites ran on; None where no native suite ran, or the file does not say
    serving: EvalServing | None = None
    data_parallel: int | None = Field(1, ge=1)  # the server's --data-parallel-size; 1 where the file does not say
    tensor_parallel: int | None = Field(1, ge=1)  # GPUs per data-parallel rank
    kv_cache_dtype: str | None = "auto"  # the recipe's (fp8: the KV cache, and so the scores, in FP8)
    max_tokens_cap: int | None
    # the server the suites ran against where it was not a variant's own (make eval ENDPOINT=...): no
    # checkpoint, identity or manifest of this pipeline's stands behind its figures
    endpoint: EndpointInfo | None = None
    generate_s: float
    generated_tokens: int
    tokens_per_s: float | None
    suites: dict[str, SuiteRun]


class Sample(Output):
    """One line of a variant's eval/samples_<suite>.jsonl (make eval): one item under one seed, what the
    model wrote and what it scored. Read by eval's compare and by make review."""

    doc_id: int = Field(ge=0)
    seed: int
    prompt: str
    prompt_tokens: int = Field(ge=0)
    output: str
    output_tokens: int = Field(ge=0)
    finish_reason: str | None
    truncated: bool
    no_answer: bool
    extracted: str | None
    gold: str | float | list[str] | None  # SQuAD: every accepted answer
    exact_match: float | None = Field(None, ge=0, le=1)
    f1: float | None = Field(None, ge=0, le=1)


class EvalReport(Output):
    """artifacts/<model>/eval-report.json (make eval): every variant's figures, keyed "<suite>:<metric>"
    for accuracy and "<suite>" for fidelity."""

    model: str
    baseline: str
    variants: dict[str, dict[str, Fidelity | Accuracy]]
    # each variant's identity as its eval/results.json recorded it (None: not recorded); a variant's
    # deltas are also the baseline's, so both must match the variants on disk. Absent in older files.
    identities: dict[str, Identity | None] = {}
    # the generation suites, hardest first: ascending by the baseline's mean on the suite's first figure
    suite_order: list[str] = []
    # of the variants, those that are running servers evaluated by URL (make eval ENDPOINT=...): what each
    # reported; their figures are paired with the baseline's like a variant's, with no checkpoint behind them
    endpoints: dict[str, EndpointInfo] = {}
