"""make bench: vLLM latency, throughput and memory of each variant, measured as vLLM's users measure a
deployment.

    python -m pipeline.bench --profile bench/cpu.yaml artifacts/<model>/<variant> [...]
    python -m pipeline.bench --table artifacts/<model>          # print the table of existing results

For each variant, in turn:
  1. start vLLM's OpenAI server on 127.0.0.1 (a free port) and time it until /health answers
  2. for each shape and concurrency level, run vLLM's own serving benchmark (vllm.benchmarks.serve:
     random prompts of fixed length, ignore_eos) `repeats` times, after one warm-up
  3. stop the server (always), and read vLLM's own memory accounting from its log
  4. for the bf16 variant only: the same shapes through HF transformers generate(), the baseline
Writes artifacts/<model>/<variant>/bench.json and prints a table. A variant that fails (does not
start, never gets healthy, runs out of memory) gets one error line and an `error` in its bench.json;
the other variants are still measured.

Runs in the serve environment.

Modules: levels (the latency levels), memory (vLLM's accounting from its log), capacity/ (capacity at an
SLO under sustained load per serving config: the search, its journal, the choice), hf_baseline, variant (one
variant, start to bench.json), table, cli.
"""

# what callers outside the package import from it (tests of other stages, the registry)
from pipeline.bench.levels import LevelRun, run_serve_benchmark, server_command
from pipeline.bench.variant import bench_variant
from pipeline.serving import Server

__all__ = ["LevelRun", "Server", "bench_variant", "run_serve_benchmark", "server_command"]
