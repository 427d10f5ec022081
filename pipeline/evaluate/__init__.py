"""make eval: accuracy of every variant, its fidelity to bf16, and whether a difference is real.

    python -m pipeline.evaluate run artifacts/MODEL/VARIANT --suites eval/synthetic-math.yaml ... \\
        [--limit N] [--seeds 0 1 2] [--greedy] [--data-dir ../shared/data]
    python -m pipeline.evaluate compare artifacts/MODEL [--baseline bf16]

`run` (serve environment, one process per variant) generates on a vLLM OpenAI server and writes
artifacts/MODEL/VARIANT/eval/: results.json in lm-eval's results format, samples_<suite>.jsonl (one
record per item and seed) and, for fidelity suites, fidelity_<suite>.npz (top-k next-token
log-probabilities). `compare` reads every variant's eval/ and writes artifacts/MODEL/eval-report.{json,md}:
95% bootstrap CIs, the paired difference to the baseline on the same items (paired bootstrap CI and
exact McNemar), and KL divergence, top-1 agreement and perplexity against the baseline.

The package, in the order a run goes: plan (every check before the server starts, its engine
arguments), generate (the variant's vLLM OpenAI server, every generation request in one batch),
score (records and figures per suite), write (results.json), run (the four in order, and the runner
of each suite kind); compare (the cross-variant report). Beside them: stats (bootstrap CIs, the paired
difference, McNemar, fidelity; pass@k and cons@k), lm_eval_suite (lm-eval tasks as suites), options
(the command line's settings), on_endpoint and endpoint_check (make eval ENDPOINT=: a running server).

Why lm-eval's results *format* for native suites: writing its results.json shape keeps our figures
comparable with anyone's `lm_eval` run, key for key ("exact_match,none", "..._stderr,none",
"n-samples", "configs"), while truncated answers are counted apart, per-item scores are paired across
variants and reasoning text is cut at </think>, which the tests pin down.
"""

from pipeline.serving import engine_children_die_with_parent

# At import, not in main(): vLLM's engine processes die with this one (a `kill -9` of the stage would
# otherwise orphan an EngineCore holding the model's memory). Forked engines inherit the at-fork hook;
# spawned ones re-import the main module (pipeline.evaluate.__main__), which imports this package first.
engine_children_die_with_parent()
