#!/usr/bin/env bash
# An independent check of a capacity bench.json states: vLLM's own CLI, none of the pipeline's code on the
# load path. Starts `vllm serve` with the settings of the config bench chose for WORKLOAD, warms it up
# with one burst at the workload's shapes, then runs `vllm bench serve` at the stated rate for SECONDS of
# Poisson arrivals, from as many client processes as the token stream needs, and prints each one's
# summary (percentiles over every request it sent, the first ones included).
#
#   bash bench/sustained-check.sh artifacts/<model>/<variant> reasoning 60 [RATE]
#
# RATE: the rate to offer (unset: the stated capacity). CONFIG: another config of the grid, to run side by
# side at the same rate (unset: the chosen one). EXTRA: server flags added after the config's (of two equal
# flags the later wins), to try a setting the grid has not measured yet. PYTHON: the interpreter with vLLM
# (python3).
set -euo pipefail
variant=$1 workload=$2 seconds=${3:-60}
py=${PYTHON:-python3}
read -r rate flags input output ratio < <("$py" - "$variant" "$workload" "${4:-}" <<'PY'
import json, os, sys
bench = json.load(open(f"{sys.argv[1]}/bench.json"))
cap, name = bench["capacity"], sys.argv[2]
choice = os.environ.get("CONFIG") or cap["chosen"][name]["config"]
run = next(r for r in cap["runs"] if r["workload"] == name and r["config"] == choice)
w = next(w for w in cap["workloads"] if w["name"] == name)
flags = ",".join(f"--{k}={v}" for k, v in run["settings"].items())
rate = float(sys.argv[3]) if sys.argv[3] else run["capacity_rps"]
print(rate, flags, w["input_len"], w["output_len"], w["range_ratio"])
PY
)
port=8765 log=$(mktemp)
echo "sustained-check: $variant $workload ${CONFIG:-chosen config}: $rate req/s for $seconds s, server flags ${flags//,/ } ${EXTRA:-}"
# shellcheck disable=SC2086
"$py" -m vllm.entrypoints.cli.main serve "$variant" --port $port --seed 0 ${flags//,/ } ${EXTRA:-} >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
common=(--backend vllm --base-url "http://127.0.0.1:$port" --model "$variant" --dataset-name random
  --random-input-len "$input" --random-output-len "$output" --random-range-ratio "$ratio" --ignore-eos
  --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,90,99 --disable-tqdm)
"$py" -m vllm.entrypoints.cli.main bench serve "${common[@]}" --num-prompts 256 --request-rate inf --seed 100 >/dev/null
# one client process streams at most ~5,000 tokens a second without being the limit (docs/bench.md): k of
# them, each Poisson at rate/k with its own seed, together Poisson at the rate; each prints its summary
read -r k n < <("$py" -c "import math; k = max(1, math.ceil($rate * $output / 5000)); print(k, math.ceil($rate * $seconds / k))")
share=$("$py" -c "print($rate / $k)")
echo "sustained-check: $k client processes at $share req/s each"
pids=()
for i in $(seq 0 $((k - 1))); do
  "$py" -m vllm.entrypoints.cli.main bench serve "${common[@]}" --num-prompts "$n" --request-rate "$share" \
    --seed $((101 + i)) >"$log.client-$i" 2>&1 &
  pids+=($!)
done
for i in $(seq 0 $((k - 1))); do
  wait "${pids[$i]}" || echo "sustained-check: client $i failed: $log.client-$i"
  echo "client $i:"
  sed -n '/Serving Benchmark Result/,$p' "$log.client-$i"
done
