"""Sustained load on a running vLLM server, shared by make bench's capacity search
(pipeline/bench/capacity/) and make verify-published's replay of a stated capacity (pipeline/publish/verify.py).

Modules: steady (the rule of a sustained point: how long it runs, which requests it excludes as the ramp,
when it holds; pure arithmetic over the requests as the client saw them), bench_serve (one point through
vLLM's own `vllm bench serve`, its per-request results read back).
"""
