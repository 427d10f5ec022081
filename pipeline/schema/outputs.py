"""What the stages write: the variant manifest, bench.json, report.json, and eval's results.json, samples_<suite>.jsonl
and eval-report.json; checked before writing and after reading."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.schema.capacity import Capacity
from pipeline.schema.output_base import Ordered, Output, Record, Spread
from pipeline.schema.policies import Policy
from pipeline.schema.profiles import Shape


class SourceRef(Output):
    path: str
    sha256: str
    origin: str
    random_weights: bool


class QuantizeRun(Output):
    wall_s: float
    peak_rss_bytes: int
    device: str = "cpu"  # the GPU's name where the quantizer ran on one
    peak_gpu_bytes: int | None = None  # over several ranks, the largest rank's
    ranks: int = Field(default=1, ge=1)  # GPUs of llm-compressor's distributed oneshot (make quantize DP=)


class LayerSensitivity(Output):
    layer: int = Field(ge=0)
    kld: float  # nats a token, when this layer alone is rounded to the recipe's grid
    params: int = Field(ge=0)  # weights of its quantized Linears


class MixedPrecisionPlan(Output):
    """What a recipe with size_budget > 1 measured and decided (quantize.mixed_precision_plan)."""

    method: str
    samples: int
    tokens: int
    seconds: float
    prefix: str  # the decoder layers' module path, e.g. model.layers
    size_budget: float
    sensitive_bits: Literal[8, 16]
    estimated_size_ratio: float
    kept: list[int]
    table: list[LayerSensitivity]


class Identity(Output):
    """What a figure was measured on: a variant as `make quantize` built it (identity.variant_identity
    derives it from the variant's manifest.json). A figure whose identity is not the variant's on disk is
    stale: report leaves it out (the variant cannot qualify), review marks it, publish refuses it."""

    checkpoint_sha256: str  # identity.tree_hash of the manifest's per-file sha256: the files as built
    recipe_sha256: str  # of the recipe as the manifest records it (its keys, less the file name)
    calibration_sha256: str | None  # the calibration token ids' (manifest calibration.token_ids_sha256)


class RecipeRecord(Record):
    """The manifest's recipe: its file and the keys its method uses (Recipe.used), in the recipe's order."""

    file: str
    description: str
    method: str
    backend: str
    kv_cache_dtype: str = "auto"  # recipes older than the key


class CalibrationRecord(Record):
    """The manifest's calibration: the set as read (schema.CalibSet), where from, the ids' count and hash."""

    file: str
    data_dir: str | None = None  # where a local data file was read from (DATA_DIR)
    samples: int
    tokens: int
    token_ids_sha256: str


class SmokeRecord(Record):
    """What the smoke test in vLLM answered (quantize.serve_env.smoke_check)."""

    text: str


class VariantManifest(Output):
    """artifacts/<model>/<variant>/manifest.json (make quantize)."""

    model: str
    variant: str
    banner: str | None = None
    random_weights: bool
    source: SourceRef
    recipe: RecipeRecord
    format: str
    backend: str
    calibration: CalibrationRecord | None
    build_key: str
    created: str
    git_commit: str | None
    packages: dict[str, str]
    serve_packages: dict[str, str] | None
    quantize: QuantizeRun
    mixed_precision: MixedPrecisionPlan | None = None  # size_budget > 1: the sensitivity table, the layers kept
    smoke: SmokeRecord
    size_bytes: int = Field(ge=0)
    sha256: str
    files: dict[str, str]


class EngineMode(Output):
    """How vLLM ran the model a figure came from: eager (--enforce-eager: PyTorch op by op) or compiled
    (torch.compile, with CUDA graphs on a GPU), and its version. Two numeric paths: one checkpoint's greedy
    outputs differ between them (docs/suites.md), so a figure holds for its mode. A running server eval
    did not start (make eval ENDPOINT=...) does not say which it runs: "unknown (endpoint)"."""

    mode: Literal["eager", "compiled", "unknown (endpoint)"]
    cuda_graphs: bool | None  # None where the mode is unknown
    vllm_version: str | None  # None where not known

    @classmethod
    def of(cls, eager: bool | None, gpu: bool, vllm_version: str | None) -> EngineMode:
        """eager: the server's --enforce-eager (None: not known, an endpoint's); gpu: whether it ran on one."""
        if eager is None:
            return cls(mode="unknown (endpoint)", cuda_graphs=None, vllm_version=vllm_version)
        return cls(mode="eager" if eager else "compiled", cuda_graphs=gpu and not eager, vllm_version=vllm_version)

    def text(self) -> str:
        mode = self.mode
        if mode == "compiled":
            mode = "compiled (torch.compile" + (", CUDA graphs)" if self.cuda_graphs else ")")
        return f"{mode}, vLLM {self.vllm_version or 'version not known'}"


class BenchLevel(Output):
    shape: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    runs: list[dict]  # vLLM's benchmark figures of each run, as it names them
    summary: dict[str, Spread]  # p50_ttft_ms ... output_throughput: median over runs


class BenchMemory(Record):
    """vLLM's own accounting from its log (bench.memory.LOG_PATTERNS; None where it logged no such line):
    the keys it logs differ by device and version (others kept as written)."""

    weights_gib: float | None
    weights_gib_from: str | None = None  # where vLLM logged no weights figure: what stands in
    weights_load_s: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency_at_max_model_len: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None
    init_engine_s: float | None = None
    peak_rss_gib: float | None = None  # sampled on a CPU; None on a GPU
    budget_gib: float
    max_concurrency_at_budget: dict[str, int | None]


class Machine(Record):
    """Where bench ran (bench.variant.machine)."""

    cpu: str | None = None
    cpus: int | None = None
    gpu: str | None = None
    instance: str | None = None  # which machine: its GPU's UUID, else the host's machine-id (capacity points carry it)


class BenchProfile(Record):
    """The bench profile as bench.json records it: the file and every setting of schema.Profile (not
    validated again as an input: a file written by an older version keeps the settings it ran with)."""

    file: str
    shapes: list[Shape]
    concurrency: list[int]
    capacity: CapacityRecord | None = None


class WorkloadRecord(Record):
    """A capacity workload as the profile states it (schema.Workload), kept as written."""

    name: str


class CapacityRecord(Record):
    """The profile's capacity section as bench.json records it (schema.CapacitySearch)."""

    workloads: list[WorkloadRecord]


class Bench(Output):
    """artifacts/<model>/<variant>/bench.json (make bench), a variant that was measured."""

    model: str | None
    variant: str
    banner: str | None = None
    random_weights: bool
    format: str | None
    backend: str | None
    checkpoint_sha256: str | None
    size_bytes: int | None
    profile: BenchProfile
    machine: Machine
    packages: dict[str, str]
    git_commit: str | None
    created: str
    device: Literal["cpu", "cuda"]
    tensor_parallel_size: int = Field(1, ge=1)  # GPUs the server spanned; its memory figures are per GPU
    kv_cache_dtype: str = "auto"  # the recipe's: fp8 halves KV bytes per token (the KV figures show it)
    # what was measured; None where a file does not record it (readers take those as stale)
    identity: Identity | None = None
    # how the engine ran every figure below (the profile's enforce_eager); None in files written before
    engine: EngineMode | None = None
    startup_s: float
    # make measure: the levels ran on the server eval had just used (peak RSS on a CPU includes eval's load)
    server_shared_with_eval: bool = False
    levels: list[BenchLevel]
    memory: BenchMemory
    hf_baseline: list[dict] | None = None
    capacity: Capacity | None = None  # the profile's capacity section, measured (pipeline/bench/capacity/)


BenchProfile.model_rebuild()
Bench.model_rebuild()


class BenchFailure(Output):
    """bench.json of a variant whose server or benchmark failed: the error instead of figures."""

    variant: str
    error: str


class Verdict(Output):
    qualifies: bool
    broken: list[str]
    why: str


class Decision(Output):
    chosen: str | None
    closest: str | None
    verdicts: dict[str, Verdict]
    summary: str


class ReportedVariant(Output):
    dir: str
    checkpoint_sha256: str | None
    # the identity of what each figure source the report used measured ("eval-report.json", "bench.json");
    # None where a report does not record it (publish refuses those)
    measured_on: dict[str, Identity] | None = None
    random_weights: bool
    bench_device: str | None
    figures: dict[str, int | float | None]  # the flat names of FIGURE_NAME (counts stay whole numbers)
    # how vLLM ran the figures of each source ("eval", "bench"), where its file records it
    engine: dict[str, EngineMode] = {}


class SuiteRecovery(Output):
    """One accuracy figure of report.json: the baseline's score and each other variant's recovery of it."""

    figure: str  # <suite>:<metric>
    baseline_score: float
    scores: dict[str, float]
    recovery: dict[str, float | None]  # variant score / baseline score; None where the baseline scores 0


class CostPerRequest(Output):
    """What 1,000 requests cost a variant at its measured capacity on one workload (report.json)."""

    workload: str
    variant: str
    rank: int  # 1: the cheapest of the workload; variants that held no rate are not ranked
    capacity_rps: float
    gpus: int  # per server (tensor parallel)
    device: str  # bench.json's device: cuda or cpu
    device_seconds_per_1k: float  # seconds of one server's GPUs (or CPU) per 1,000 requests
    usd_per_1k: float | None  # at the policy's gpu_hour_usd; None off a GPU


class ReportPolicy(Ordered, Policy):
    """The policy as report.json records it: its file and every setting (schema.Policy)."""

    file: str


class Report(Output):
    """artifacts/<model>/report.json (make report): the figures and the policy's decision, what make
    publish ships from."""

    model: str
    created: str
    git_commit: str | None
    policy: ReportPolicy
    decision: Decision
    variants: dict[str, ReportedVariant]
    suites: list[SuiteRecovery] = []  # the accuracy figures, hardest for the baseline first
    cost: list[CostPerRequest] = []  # per capacity workload, cheapest first
    endpoints: dict[
        str, EndpointInfo
    ] = {}  # running servers evaluated by URL, beside the variants: no choice among them


class EndpointInfo(Output):
    """A running OpenAI-compatible vLLM server that eval ran its suites against (make eval ENDPOINT=...):
    what it reported when checked. artifacts/<model>/endpoint-<name>/endpoint.json, and results.json's
    "endpoint". The key is never recorded."""

    url: str  # the base URL, .../v1
    model: str  # the served model id the requests named
    root: str | None  # what the server loaded (a path or a hub id), as /v1/models reports it
    max_model_len: int = Field(ge=1)
    served: list[str]  # every model id the server serves
    vllm_version: str | None  # GET /version; None where the server (or a proxy before it) does not answer it
    checked_at: str
