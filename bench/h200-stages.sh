#!/usr/bin/env bash
# make targets on the lent H200, one after the other, each timed on one line (stages.txt), with its
# log and what it wrote (manifests, results.json, bench.json, the servers' logs) copied under $OUT,
# the device tool's folder that comes back. After `bash .gpukit/unpack.sh` with every kit part:
#
#   SUITES="gsm8k math500 squad fidelity-gsm8k" SEEDS=0 MAX_TOKENS=2048 BENCH_PROFILE=h200 \
#       bash bench/h200-stages.sh quantize-bf16 measure-bf16
#
# Settings come from the environment (make reads them there); MODEL defaults to the random-init
# R1-Distill-Qwen-1.5B that `make random-model` writes. Stops at the first target that fails.
set -uo pipefail
source bench/h200-env.sh >/dev/null || exit 1
export MODEL=${MODEL:-artifacts/sources/deepseek-r1-distill-qwen-1.5b-random}
out=${OUT:-/tmp/h200-stages}
model_dir=artifacts/$(basename "$MODEL")
mkdir -p "$out/logs"
keep() {  # what the stages wrote, small files only
  (cd "$model_dir" 2>/dev/null && find . -maxdepth 3 \( -name manifest.json -o -name results.json -o -name bench.json \
    -o -name '.eval-*.log' -o -name '.bench-*.log' -o -name journal.jsonl -o -name 'eval-report.*' \) -size -8M -print0 |
    xargs -0 -r cp --parents -t "$out/") 2>/dev/null
}
for target in "$@"; do
  t0=$EPOCHREALTIME
  # shellcheck disable=SC2086  # H200_MAKE is a list of settings
  # each line of the log stamped with the time it was printed: where a stage's minutes went
  make --no-print-directory "$target" $H200_MAKE 2>&1 |
    while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done >"$out/logs/$target.log"
  rc=${PIPESTATUS[0]}
  printf '%-26s %7.1f s  rc %d\n' "$target" "$(python3 -c "print($EPOCHREALTIME - $t0)")" "$rc" | tee -a "$out/stages.txt"
  keep
  if [ "$rc" -ne 0 ]; then tail -40 "$out/logs/$target.log"; exit "$rc"; fi
done
