"""Capacity at an SLO: for each serving config of a bench profile's grid and each workload, the highest
request rate one server holds under sustained load while every target of the workload's SLO is met, and
the config that holds most (make bench, where the profile has a `capacity:` section: schema.CapacitySearch).

Per config and workload (search.py):
  1. a saturation run (saturation_requests at once): its request throughput S, the first guess; it is also
     the warm-up, so the compilation and allocation spikes of a server's first load are behind every
     sustained point (a search resumed on a fresh server runs a warm-up burst of warmup_requests first)
  2. sustained Poisson points (pipeline/load/steady.py: a ramp excluded, a window measured, held only where
     the SLO holds and the window's requests completed as fast as they arrived): the config's first_rates
     for the workload (an earlier run's bracket; one a point here has decided is skipped), then S, doubled while it
     holds and nothing broke (a burst's throughput is no bound on a sustained rate's), halved while the SLO
     breaks and nothing held, then bisection between the highest rate that held and the lowest that broke,
     until they are within `tolerance`, or max_points or budget_s are spent
  3. the rate found runs again with a longer window (confirm_window) and new seeds, confirm_repeats
     times; where one breaks, the confirm goes on below it (a tolerance step down, then bisection towards
     the highest rate that held), at most confirm_rates rates. The stated capacity is a rate that held in
     every run of it, or none.
Then per workload (choice.py) the grid's first config measured on it, the reference, ships unless
another's confirmed capacity held at a rate where the reference broke, by more than `tolerance`.

Every finished point is written to a journal as it ends (journal.py): a run stopped by a short GPU lease
continues where it stopped at the next make bench. Load comes from vLLM's own `vllm bench serve`
(pipeline/load/bench_serve.py), one point a run.

Modules: configs (a grid config's vLLM flags), search, choice, journal, eval_workload (a workload replayed
from eval's samples), grid (one variant: each config's server, the journal, bench.json's section).
"""
