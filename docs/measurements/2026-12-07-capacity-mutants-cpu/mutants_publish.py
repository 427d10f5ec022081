"""The second batch: what a capacity becomes in serve.yaml, the model card and replicas (see run_mutants.py)."""

M = [
    ("pipeline/bench/capacity/configs.py", '    "stream_interval",\n)', ")", "stream_interval not in serve.yaml"),
    (
        "pipeline/bench/capacity/configs.py",
        '    if kv != "auto":\n        settings["kv-cache-dtype"] = kv',
        '    if False:\n        settings["kv-cache-dtype"] = kv',
        "kv dtype dropped from settings",
    ),
    (
        "pipeline/bench/capacity/configs.py",
        "    if kv is not None and kv != recipe_kv_cache_dtype:",
        "    if False:",
        "kv config may ship",
    ),
    (
        "pipeline/bench/capacity/configs.py",
        '        "extra": {key: o[key] for key in EXTRA if key in o},',
        '        "extra": {},',
        "extra engine args dropped",
    ),
    (
        "pipeline/bench/capacity/configs.py",
        '        "max-num-seqs": o.get("max_num_seqs", profile.max_num_seqs),',
        '        "max-num-seqs": profile.max_num_seqs,',
        "max-num-seqs override ignored in settings",
    ),
    (
        "pipeline/publish/serve_yaml.py",
        "    n = max(1, math.ceil(d.traffic_rps * (1 + headroom) / cap))",
        "    n = max(1, round(d.traffic_rps * (1 + headroom) / cap))",
        "replicas rounded",
    ),
    (
        "pipeline/publish/serve_yaml.py",
        "    n = max(1, math.ceil(d.traffic_rps * (1 + headroom) / cap))",
        "    n = max(1, math.ceil(d.traffic_rps / cap))",
        "headroom ignored",
    ),
    (
        "pipeline/publish/serve_yaml.py",
        "    others = [r for r in section.runs if r.workload == workload.name and r.config != run.config and not r.error]",  # noqa: E501
        "    others = [r for r in section.runs if r.config != run.config and not r.error]",
        "others of any workload",
    ),
    (
        "pipeline/schema/capacity.py",
        '                if w.traffic == "reasoning":',
        '                if w.traffic == "chat":',
        "sizing by chat",
    ),
    (
        "pipeline/schema/capacity.py",
        "        if run is None or run.capacity_rps is None:",
        "        if run is None:",
        "chosen run without capacity",
    ),
    (
        "pipeline/publish/serve_yaml.py",
        "    if d.workload is not None and d.workload not in names:",
        "    if False:",
        "unknown workload accepted",
    ),
    (
        "pipeline/bench/capacity/choice.py",
        "    reference = measured[0].name",
        "    reference = measured[-1].name",
        "reference is the last config",
    ),
]
