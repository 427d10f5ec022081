#!/usr/bin/env bash
# A make target on the lent H200 that outlives one device call (10 min), so that a capacity search keeps its
# servers and client processes for a whole lease instead of starting them again every call. Run from the
# repository root on the device, after the kit (bash .gpukit/unpack.sh with every part; bench/h200-env.sh):
#
#   bash bench/h200-lease.sh start SECONDS make-arguments...   # make detached (setsid), then `wait SECONDS`
#   bash bench/h200-lease.sh wait SECONDS                      # in each later call, chained within 30 s
#
# e.g. bash bench/h200-lease.sh start 540 bench BENCH_PROFILE=h200-reasoning-frontend RECIPES=fp8-dynamic DATA_DIR=
#        MODEL=artifacts/sources/deepseek-r1-distill-qwen-1.5b-random
# (make's settings from bench/h200-env.sh's $H200_MAKE come first; later ones override them). `wait` returns
# when make ends or SECONDS pass, prints make's lines since the last call, and leaves under $OUT (what
# comes back from the device) lease.tgz: make's log and MODEL's bench files (bench.json, the capacity
# journal, the servers' and clients' logs), so a lease that ends mid-search loses no finished point.
set -uo pipefail
log=/tmp/h200-lease.log
running() { [ -f /tmp/h200-lease.pid ] && kill -0 "$(cat /tmp/h200-lease.pid)" 2>/dev/null; }
case ${1:-} in
start)
  seconds=$2
  shift 2
  source bench/h200-env.sh >/dev/null || exit 1
  if running; then
    echo "h200-lease: the make started before is still running; waiting for it, not starting another" >&2
  else
    rm -f /tmp/h200-lease.shown
    # shellcheck disable=SC2086  # H200_MAKE is a list of settings
    setsid nohup make --no-print-directory $H200_MAKE "$@" >"$log" 2>&1 </dev/null &
    echo "$!" >/tmp/h200-lease.pid
    printf '%s\n' "$@" | sed -n 's/^MODEL=//p' >/tmp/h200-lease.model
  fi
  exec bash "$0" wait "$seconds"
  ;;
wait)
  end=$((SECONDS + $2))
  while running && [ $SECONDS -lt $end ]; do sleep 5; done
  shown=$(cat /tmp/h200-lease.shown 2>/dev/null || echo 0)
  tail -n +$((shown + 1)) "$log"
  wc -l <"$log" >/tmp/h200-lease.shown
  if running; then echo "h200-lease: make is still running (call wait again within 30 s)"; else echo "h200-lease: make has ended"; fi
  model=$(cat /tmp/h200-lease.model 2>/dev/null)
  dir=artifacts/$(basename "${model:-${MODEL:-artifacts/sources/deepseek-r1-distill-qwen-1.5b-random}}")
  [ -n "${OUT:-}" ] && tar -czf "$OUT/lease.tgz" "$log" "$dir"/.bench-* "$dir"/*/bench.json "$dir"/*/manifest.json 2>/dev/null
  exit 0
  ;;
*)
  sed -n '2,15p' "$0" >&2
  exit 2
  ;;
esac
