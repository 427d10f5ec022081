"""Hand-made bugs of the capacity code: (file, text replaced, its replacement, a name); see run_mutants.py."""

M = [
    # search.py
    (
        "pipeline/bench/capacity/search.py",
        "rate = 2 * held if broke is None",
        "rate = 1.5 * held if broke is None",
        "double -> 1.5x",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "held = rate if held is None else max(held, rate)",
        "held = rate",
        "held not max",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "broke = rate if broke is None else min(broke, rate)",
        "broke = rate",
        "broke not min",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "if spent >= search.budget_s:",
        "if spent > 2 * search.budget_s:",
        "budget doubled",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "    return hi / lo - 1 <= tolerance + 1e-9",
        "    return hi / lo - 1 < tolerance - 1e-9",
        "within strict",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "        return hi / (1 + tolerance)\n    floor",
        "        return hi / (1 + 2 * tolerance)\n    floor",
        "first break step 2x",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "        if all(p.held for p in runs):",
        "        if any(p.held for p in runs):",
        "confirm any held",
    ),
    (
        "pipeline/bench/capacity/search.py",
        "            if (held is None or given > held) and (broke is None or given < broke):",
        "            if True:",
        "first rates never skipped",
    ),
    ("pipeline/bench/capacity/search.py", "unstable=capacity != held,", "unstable=False,", "unstable never"),
    (
        "pipeline/bench/capacity/search.py",
        "broke_at = min([r for r in (broke, broke_in_confirm) if r is not None], default=None)",
        "broke_at = broke",
        "broke_at ignores confirm",
    ),
    (
        "pipeline/bench/capacity/search.py",
        'runs = [p for p in points if p.kind == "search" and p.request_rate == rate]',
        "runs = []",
        "confirm ignores search run",
    ),
    # choice.py
    (
        "pipeline/bench/capacity/choice.py",
        "beyond = ref.broke_at_rps is not None and best.capacity_rps >= ref.broke_at_rps",
        "beyond = ref.broke_at_rps is None or best.capacity_rps >= ref.broke_at_rps",
        "beyond when ref unbroken",
    ),
    (
        "pipeline/bench/capacity/choice.py",
        "if beyond and ratio > 1 + tolerance:",
        "if beyond and ratio > 1:",
        "no tolerance",
    ),
    (
        "pipeline/bench/capacity/choice.py",
        "if len(machines) != 1 or None in machines:",
        "if len(machines) > 1:",
        "None machine ok",
    ),
    (
        "pipeline/bench/capacity/choice.py",
        "shippable = {c.name for c in measured if c.not_chosen_because is None and c.name != reference}",
        "shippable = {c.name for c in measured if c.name != reference}",
        "not_chosen ignored",
    ),
    (
        "pipeline/bench/capacity/choice.py",
        "and ((p.request_rate == run.capacity_rps and p.held) or (p.request_rate == run.broke_at_rps and not p.held))",
        "and p.request_rate == run.capacity_rps and p.held",
        "break machine ignored",
    ),
    # steady.py
    (
        "pipeline/load/steady.py",
        "if sent and achieved < (1 - self.max_shortfall) * sent:",
        "if sent and achieved < (1 - 2 * self.max_shortfall) * sent:",
        "shortfall doubled",
    ),
    (
        "pipeline/load/steady.py",
        "if z is not None and z > self.max_backlog_z:",
        "if z is not None and z > 2 * self.max_backlog_z:",
        "z doubled",
    ),
    ("pipeline/load/steady.py", "        start += plan.ramp_s\n", "", "ramp not excluded"),
    (
        "pipeline/load/steady.py",
        "window = max(search.window_min_s, search.window_e2e * e2e, search.min_requests / rate) * window_x",
        "window = max(search.window_min_s, search.window_e2e * e2e) * window_x",
        "min_requests ignored",
    ),
    (
        "pipeline/load/steady.py",
        "    variance = 2 * sent * service_s / burstiness",
        "    variance = 2 * sent * service_s",
        "burstiness ignored",
    ),
    (
        "pipeline/load/steady.py",
        "    return max(first.values(), default=0.0), min(last.values(), default=0.0)",
        "    return min(first.values(), default=0.0), max(last.values(), default=0.0)",
        "together widened",
    ),
    (
        "pipeline/load/steady.py",
        "        if metric in per_request and per_request[metric] * 1000 > target:",
        "        if metric in per_request and per_request[metric] * 1000 > 2 * target:",
        "goodput lax",
    ),
    ("pipeline/load/steady.py", "        elif value > target:", "        elif value > 1.05 * target:", "slo 5% lax"),
    (
        "pipeline/load/steady.py",
        "timeout_s=round(ramp + window + max(30.0, 4 * e2e), 1),",
        "timeout_s=round(ramp + window + 30.0, 1),",
        "timeout no 4E",
    ),
    # journal.py
    (
        "pipeline/bench/capacity/journal.py",
        '        return e["config"] == config and e["settings"] == settings and e["workload"] == workload',
        '        return e["config"] == config and e["workload"] == workload',
        "settings ignored in replay",
    ),
    (
        "pipeline/bench/capacity/journal.py",
        'if not self.warmed and self.used and plan.kind != "warmup" and self.warm_up is not None:',
        "if False:",
        "no warm-up on resume",
    ),
    (
        "pipeline/bench/capacity/journal.py",
        '            if head.get("identity") == identity:',
        "            if True:",
        "identity ignored",
    ),
    (
        "pipeline/bench/capacity/journal.py",
        'PLAN_KEYS = ("kind", "rate", "num_prompts", "ramp_s", "window_s", "seed")',
        'PLAN_KEYS = ("kind", "rate", "num_prompts", "ramp_s", "window_s")',
        "seed not in plan key",
    ),
    (
        "pipeline/bench/capacity/journal.py",
        "        longest = plan.timeout_s + self.journal.slowest_start_s()",
        "        longest = plan.window_s",
        "deadline by window",
    ),
]
