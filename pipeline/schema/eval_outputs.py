"""What the eval stage writes and compare reads: results.json (EvalRun), samples_<suite>.jsonl (Sample) and
eval-report.json (EvalReport); checked before writing and after reading, as every output (outputs.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from pipeline.schema.outputs import EndpointInfo, EngineMode, Identity, Output
from pipeline.schema.suites import Generation


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


class SuiteRun(Output):
    """What every suite's entry in a run's record holds: its file and metric, and how many items it had."""

    file: str
    metric: str
    n: int  # items run
    n_available: int | None = None  # items the suite has (LIMIT takes the first n); None where not recorded
    # the hash of the suite's settings as eval read them (drift.settings_sha256): a suite edited since is
    # refused by compare and report; None in files written before it was recorded (nothing to compare)
    settings_sha256: str | None = None


class FigureSummary(Output):
    """One figure of a generation suite over its items and seeds (evaluate/score.summarise)."""

    mean: float  # pass@1: per item the mean over its samples, then over items
    ci95: tuple[float, float]  # items resampled, each with all its samples
    stderr: float  # lm-eval's: the sample std of the per-item means / sqrt(n)
    per_seed: list[float]
    std_across_seeds: float
    mean_completed: float  # over the samples not cut off by max_tokens (NaN where none completed)


class ConsAtK(Output):
    """cons@k: per item the exact_match of the answer most of its k samples gave."""

    k: int
    mean: float
    ci95: tuple[float, float]


class LmEvalRef(Output):
    """Which lm-eval task, metric and filter an lm-eval suite's figure is."""

    task: str
    metric: str
    filter: str | None
    version: str | None = None  # lm-eval's


class GenerationSuiteRun(SuiteRun):
    """A suite scored on generated answers (evaluate/score.py), or an lm-eval suite in that shape (one seed)."""

    metrics: dict[str, FigureSummary]
    cons_at_k: ConsAtK | None = None  # exact-match suites run with more than one sample
    seeds: list[int]
    truncated: int  # samples cut off by max_tokens, over items x seeds
    truncated_items_any_seed: int
    no_answer: int | None = None  # samples without a final-answer marker; None where not counted
    no_answer_items_any_seed: int | None = None
    items_scored: int
    generated_tokens: int
    generate_s: float  # the wall time of the one generate call this suite shared with the others
    generation: Generation | None = None  # the sampling settings (a native suite's)
    lm_eval: LmEvalRef | None = None  # an lm-eval suite's task
    engine: EngineMode | None = None  # an lm-eval suite's own server (the run's `engine` is the native suites')


class FidelitySuiteRun(SuiteRun):
    """A fidelity suite: next-token log-probabilities of held-out text, kept in fidelity_<suite>.npz."""

    metric: Literal["fidelity"]
    positions: int
    perplexity: float
    top_k: int
    score_s: float


def _suite_kind(entry) -> str:
    metric = entry.get("metric") if isinstance(entry, dict) else getattr(entry, "metric", None)
    return "(fidelity)" if metric == "fidelity" else "(generation)"


# a suite's entry is read as the model of its kind, named by its metric (tags in parentheses are not keys of
# the file: check_data leaves them out of the key it names)
AnySuiteRun = Annotated[
    Annotated[FidelitySuiteRun, Tag("(fidelity)")] | Annotated[GenerationSuiteRun, Tag("(generation)")],
    Discriminator(_suite_kind),
]


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
    suites: dict[str, AnySuiteRun]


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


class StepFigure(Output):
    """One figure of a technique step (pipeline/evaluate/techniques.py): the variant's and its base's value and the
    paired difference, variant minus base, on the same items (fidelity: the same scored positions)."""

    base_value: float
    value: float
    delta: float
    delta_ci95: tuple[float, float]
    mcnemar: dict | None = None  # 0/1 scores only
    significant: bool


class TechniqueStep(Output):
    """What the keys one variant adds to its base's recipe bought, figure by figure: "<suite>:<metric>" for
    accuracy, "<suite>:kld" and "<suite>:top1" for fidelity to the baseline."""

    variant: str
    base: str
    added: dict[str, Any]  # the recipe keys, with the variant's values
    figures: dict[str, StepFigure]


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
    # each variant built from another's recipe with techniques added, against that base (absent in older files)
    techniques: list[TechniqueStep] = []
