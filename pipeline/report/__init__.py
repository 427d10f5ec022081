"""make report: one page with the accuracy / latency / memory tradeoff of every variant, and the choice
a policy makes from it.

    python -m pipeline.report artifacts/<model> --policy policies/default.yaml

Reads what the other stages wrote (nothing is measured here): each variant's manifest.json (quantize),
bench.json (bench), and artifacts/<model>/eval-report.json (eval). Writes, atomically, under
artifacts/<model>/:
  report.md     the tables, the decision and where every number came from
  report.html   the same page, self-contained (plots embedded)
  report.json   the flat figures of each variant and the decision: what `make publish` reads
  plots/        accuracy vs latency, accuracy vs memory (Pareto front marked, CI error bars), latency vs
                memory, throughput vs concurrency; PNG and SVG
Runs in the serve environment (matplotlib; markdown-it-py renders the HTML).

Modules: collect (what the stages wrote), plots, markdown (the page) with tables, provenance and suite_recovery
(hardest first, recovery) and cost (per request at the measured capacity), html_page, assemble (the files),
__main__ (the command line).
"""
