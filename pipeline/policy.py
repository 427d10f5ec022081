"""Which variant to publish: a policy (policies/*.yaml) applied to the figures the stages wrote.

    figures(manifest, bench, eval_entry) -> {"weights_gib": 0.25, "chat.c8.p90_tpot_ms": 51.3, ...}
    decide(policy, variants)         -> schema.Decision: who qualifies, who broke what, who won and why

A variant qualifies when it meets every constraint: the accuracy rule (with 95% confidence it loses at
most `max_drop` on every accuracy figure: the lower end of the paired CI of its difference to the
baseline is >= -max_drop) and every limit. A figure that was not measured breaks the constraint that
needs it: a policy is a promise, and an unmeasured figure cannot keep one. Qualifying variants are
ranked by the objectives in order (the next objective breaks a tie; then the name, so the choice is
deterministic). If none qualifies, the closest (fewest broken constraints, then the objectives) is
named with what it broke, and nothing is published.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.figure_names import (
    CAPACITY_STATS,
    FIDELITY_FIGURES,
    FIXED_FIGURES,
    LEVEL_STATS,
    capacity_figure,
    level_figure,
)
from pipeline.gpu_memory import model_weights_gib
from pipeline.metrics import METRICS
from pipeline.schema import (
    Accuracy,
    Bench,
    Capacity,
    ConfigError,
    Decision,
    EvalRun,
    Fidelity,
    Policy,
    Profile,
    VariantManifest,
    Verdict,
    excerpt,
)
from pipeline.settings import ROOT

GIB = 2**30
# What each eval metric writes (one table: pipeline/metrics.py)
METRIC_FIGURES = {name: metric.figures for name, metric in METRICS.items()}


# ---------------------------------------------------------------------------------------- figures
@dataclass(kw_only=True)
class Measured:
    """What the stages wrote about one variant, as the policy reads it: its flat figures, its entry of
    eval-report.json, its eval/results.json record and bench.json (None: not run, or left out), and the
    figure sources left out as measured on another checkpoint (source -> the line saying so)."""

    figures: dict[str, float]
    eval: dict[str, Accuracy | Fidelity] | None = None
    eval_meta: EvalRun | None = None
    bench: Bench | None = None
    random_weights: bool = False
    bench_device: str | None = None
    stale: dict[str, str] = field(default_factory=dict)


def figures(manifest: VariantManifest, bench: Bench | None, eval_entry: dict | None) -> dict[str, float]:
    """One flat dict of every figure the stages measured for a variant (names: FIGURE_NAME in schema),
    from its manifest.json, bench.json (None: not benched) and eval-report.json entry."""
    out: dict[str, float] = {}
    if manifest.size_bytes:
        out["size_gib"] = manifest.size_bytes / GIB
    if bench:
        for key in ("kv_cache_tokens", "peak_rss_gib"):
            if (value := getattr(bench.memory, key)) is not None:
                out[key] = value
        if (weights := model_weights_gib(bench)) is not None:
            out["weights_gib"] = weights
        out["startup_s"] = bench.startup_s
        for shape, n in bench.memory.max_concurrency_at_budget.items():
            if n is not None:
                out[f"max_concurrency.{shape}"] = n
        for level in bench.levels:
            for key, stat in level.summary.items():
                if key in LEVEL_STATS:
                    out[level_figure(level.shape, level.concurrency, key)] = stat.median
        out |= capacity_figures(bench.capacity)
    for name, entry in (eval_entry or {}).items():
        if isinstance(entry, Fidelity):
            out[f"{name}.kld"] = entry.kld_mean
            out[f"{name}.top1"] = entry.top1_agreement
            out[f"{name}.perplexity"] = entry.perplexity
        else:
            out[name] = entry.mean
    return out


def capacity_figures(capacity: Capacity | None) -> dict[str, float]:
    """<workload>.capacity_rps and .saturation_rps of the config bench chose for each workload; a
    workload whose chosen config held no rate has capacity 0 (measured: nothing held)."""
    out = {}
    for workload, choice in capacity.chosen.items() if capacity else ():
        run = capacity.run_of(workload, choice.config)
        if run is None or run.error:
            continue
        out[capacity_figure(workload, "capacity_rps")] = run.capacity_rps or 0.0
        if run.saturation_rps is not None:
            out[capacity_figure(workload, "saturation_rps")] = run.saturation_rps
    return out


def accuracy_names(eval_entry: dict | None) -> list[str]:
    return [name for name, entry in (eval_entry or {}).items() if not isinstance(entry, Fidelity)]


def accuracy_rule_figures(rule, baseline_eval: dict) -> list[str]:
    """The accuracy figures a rule holds to a drop: with max_drop, every figure of the baseline's eval
    (or those `metrics` names); and every figure of each suite `suites` names."""
    every = accuracy_names(baseline_eval)
    wanted = [] if rule.max_drop is None else every if rule.metrics == "all" else list(rule.metrics)
    named = [name for name in every if name.split(":")[0] in rule.suites and name not in wanted]
    missing = [f"{suite}:*" for suite in rule.suites if not any(n.split(":")[0] == suite for n in every)]
    return wanted + named + missing  # a named suite the baseline lacks: "not measured"


# ---------------------------------------------------------------------------------------- decision
def violations(policy: Policy, name: str, variant: Measured, baseline: Measured | None) -> list[str]:
    """Every constraint `variant` breaks, one readable line each (`baseline`: the policy's baseline
    variant, for the accuracy rule and the bounds relative to it)."""
    baseline_eval = baseline.eval if baseline else None
    # figures measured on another checkpoint (report.collect left them out): never qualifies, whatever the policy
    stale = variant.stale
    broken = list(stale.values())
    figs = variant.figures
    if policy.accuracy is not None and "eval" not in stale:
        if variant.random_weights:
            broken.append("accuracy: random weights, so no accuracy figure means anything")
        elif baseline_eval is None:
            broken.append(f"accuracy: no eval of the baseline {policy.baseline} (run make eval)")
        else:
            rule, entries = policy.accuracy, variant.eval or {}
            for metric in accuracy_rule_figures(rule, baseline_eval):
                entry = entries.get(metric)  # a figure the variant's eval may lack
                if name == policy.baseline and entry is not None:
                    continue  # the baseline's difference to itself is exactly 0
                if entry is None or entry.delta_ci95 is None:
                    broken.append(f"{metric}: not measured (run make eval)")
                    continue
                low, drop = entry.delta_ci95[0], rule.allowed_drop(metric)
                if low < -drop - 1e-12:
                    broken.append(
                        f"{metric}: could drop {-low * 100:.1f} points vs {policy.baseline} at 95% confidence "
                        f"(Δ {entry.delta * 100:+.1f}, CI [{low * 100:+.1f}, {entry.delta_ci95[1] * 100:+.1f}]; "
                        f"limit {drop * 100:g})"
                    )
    unbenched = [
        m
        for m in [*policy.limits, *(o.figure for o in policy.objective)]
        if _from_bench(m) and variant.bench_device is None
    ]
    if unbenched and "bench" not in stale:  # one line, not one per figure: the cause is the same
        broken.append(
            f"not benched (no bench.json; run make bench): {', '.join(dict.fromkeys(unbenched))} not measured"
        )
    for metric, bound in policy.limits.items():
        value = figs.get(metric)
        if metric in unbenched:
            continue
        if value is None:
            broken.append(f"{metric}: not measured")
        elif policy.device and _from_bench(metric) and variant.bench_device != policy.device:
            broken.append(f"{metric}: measured on {variant.bench_device}, the policy is for {policy.device}")
        elif bound.max is not None and value > bound.max:
            broken.append(f"{metric}: {_fmt(value)} > {_fmt(bound.max)}")
        elif bound.min is not None and value < bound.min:
            broken.append(f"{metric}: {_fmt(value)} < {_fmt(bound.min)}")
        elif relative := _relative_break(policy, metric, bound, value, baseline):
            broken.append(relative)
    for objective in policy.objective:
        if (
            figs.get(objective.figure) is None
            and objective.figure not in unbenched
            and objective.figure not in policy.limits
        ):
            broken.append(f"{objective.figure}: not measured, so the objective cannot rank it")
    return broken


def _relative_break(policy: Policy, metric: str, bound, value: float, baseline: Measured | None) -> str | None:
    """The line for a bound relative to the baseline's figure that `value` breaks, else None."""
    if bound.max_vs_baseline is None and bound.min_vs_baseline is None:
        return None
    reference = baseline.figures.get(metric) if baseline else None
    if reference is None:
        return f"{metric}: not measured for the baseline {policy.baseline}, so its bound relative to it cannot hold"
    ratio = value / reference if reference else (1.0 if value == 0 else math.inf)
    if bound.max_vs_baseline is not None and ratio > bound.max_vs_baseline + 1e-12:
        return (
            f"{metric}: {_fmt(value)} is {ratio:.3g} x {policy.baseline}'s {_fmt(reference)} "
            f"> {bound.max_vs_baseline:g} x"
        )
    if bound.min_vs_baseline is not None and ratio < bound.min_vs_baseline - 1e-12:
        return (
            f"{metric}: {_fmt(value)} is {ratio:.3g} x {policy.baseline}'s {_fmt(reference)} "
            f"< {bound.min_vs_baseline:g} x"
        )
    return None


def _from_bench(metric: str) -> bool:
    return metric != "size_gib" and ":" not in metric and not metric.endswith((".kld", ".top1", ".perplexity"))


def rank_key(policy: Policy, figs: dict, name: str) -> tuple:
    """Sort key: objectives in order (maximised ones negated), unmeasured last, then the name."""
    key = []
    for objective in policy.objective:
        value = figs.get(objective.figure)
        key.append(math.inf if value is None else (value if objective.minimize else -value))
    return (*key, name)


def decide(policy: Policy, variants: dict[str, Measured]) -> Decision:
    """Apply the policy: who qualifies, who broke what and why; `chosen` is None when no variant qualifies."""
    baseline = variants.get(policy.baseline)  # check_policy_names holds it to a variant
    broken = {name: violations(policy, name, v, baseline) for name, v in variants.items()}
    qualified = sorted((n for n in variants if not broken[n]), key=lambda n: rank_key(policy, variants[n].figures, n))
    why = {n: "broke " + "; ".join(broken[n]) for n in variants if broken[n]}
    if not qualified:
        closest = (
            min(variants, key=lambda n: (len(broken[n]), rank_key(policy, variants[n].figures, n)))
            if variants
            else None
        )
        summary = "No variant satisfies the policy, so nothing is published." + (
            f" Closest: {closest}, which broke {'; '.join(broken[closest])}." if closest else ""
        )
        return _decision(None, closest, broken, why, summary)
    chosen = qualified[0]
    winner = variants[chosen].figures
    for n in variants:
        if not broken[n] and n != chosen:
            why[n] = _lost_on(policy, variants[n].figures, winner, n, chosen)
    objectives = ", then ".join(f"{'minimise' if o.minimize else 'maximise'} {o.figure}" for o in policy.objective)
    first = policy.objective[0].figure
    why[chosen] = f"meets every constraint and ranks first ({objectives}): {first} = {_fmt(winner[first])}"
    summary = (
        f"Publish {chosen}: the only variant that meets every constraint ({first} = {_fmt(winner[first])})."
        if len(qualified) == 1
        else f"Publish {chosen}: of the {len(qualified)} variants that meet every constraint ({', '.join(qualified)}), "
        f"it ranks first by {objectives} ({first} = {_fmt(winner[first])})."
    )
    return _decision(chosen, chosen, broken, why, summary)


def _decision(chosen: str | None, closest: str | None, broken: dict, why: dict, summary: str) -> Decision:
    verdicts = {n: Verdict(qualifies=not lines, broken=lines, why=why[n]) for n, lines in broken.items()}
    return Decision(chosen=chosen, closest=closest, verdicts=verdicts, summary=summary)


def _lost_on(policy: Policy, figs: dict, winner: dict, name: str, chosen: str) -> str:
    for objective in policy.objective:
        mine, best = figs[objective.figure], winner[objective.figure]
        if mine != best:
            verb = "lower" if objective.minimize else "higher"
            return f"qualifies, but lost on {objective.figure}: {_fmt(mine)} vs {chosen}'s {_fmt(best)} ({verb} wins)"
    return f"qualifies, tied with {chosen} on every objective; the tie is broken by name"


def _fmt(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


# ------------------------------------------------------------------------------- names in a policy
def policy_file_label(path: str | Path, root: Path = ROOT) -> str:
    """How a policy file is named in what is written and published: relative to the repository when it
    lies inside it, else its file name alone, never an absolute path of this machine."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return path.name


def known_figures(variants: dict[str, Measured], root: Path = ROOT) -> set[str]:
    """Every figure name the stages can write for this model: the fixed ones; per eval suite (a stem of
    root/eval/*.yaml, or a suite in eval-report.json or in a variant's eval/results.json) what its
    metric writes; per bench shape and concurrency level (of root/bench/*.yaml, or of a bench.json
    present) the per-level statistics and max_concurrency.<shape>."""
    from pipeline.schema import load_profile, load_suite

    names = set(FIXED_FIGURES)
    suites: dict[str, str] = {}  # suite -> metric
    for path in sorted((root / "eval").glob("*.yaml")):
        try:
            suites[path.stem] = load_suite(path).metric
        except ConfigError:
            continue  # a broken suite file is make eval's error to report, not the policy's
    for v in variants.values():
        for suite, info in v.eval_meta.suites.items() if v.eval_meta else ():
            suites.setdefault(suite, info.metric)
        for key, entry in (v.eval or {}).items():  # eval-report.json: 'suite:metric' or fidelity 'suite'
            if ":" in key:
                names.add(key)
            elif isinstance(entry, Fidelity):
                suites.setdefault(key, "fidelity")
    for suite, metric in suites.items():
        if metric == "fidelity":
            names.update(f"{suite}.{f}" for f in FIDELITY_FIGURES)
        else:
            names.update(f"{suite}:{m}" for m in METRIC_FIGURES.get(metric, ()))  # a metric of another version
    levels: set[tuple[str, int]] = set()
    shapes: set[str] = set()
    profiles: list[Profile] = []
    for path in sorted((root / "bench").glob("*.yaml")):
        try:
            profiles.append(load_profile(path))
        except ConfigError:
            continue
    for bench in (v.bench for v in variants.values() if v.bench):
        profiles.append(bench.profile)
        levels.update((lv.shape, lv.concurrency) for lv in bench.levels)
        shapes.update(bench.memory.max_concurrency_at_budget)
    for profile in profiles:
        for shape in profile.shapes:
            levels.update((shape.name, n) for n in profile.concurrency)
        for workload in profile.capacity.workloads if profile.capacity else ():
            names.update(capacity_figure(workload.name, stat) for stat in CAPACITY_STATS)
    shapes.update(shape for shape, _ in levels)
    names.update(f"max_concurrency.{shape}" for shape in shapes)
    names.update(level_figure(shape, n, stat) for shape, n in levels for stat in LEVEL_STATS)
    return names


def check_policy_names(
    policy: Policy, policy_path: Path, model_dir: Path, variants: dict[str, dict], root: Path = ROOT
) -> None:
    """Every name in the policy is one the stages can write for this model, and the baseline is one of
    its variants. A typo that fits the figure pattern (synthetic-rcc:f1, baseline bf61) would otherwise
    read as "not measured" and decide the report; here it is one line with the nearest valid name."""
    if policy.baseline not in variants:
        raise ConfigError(
            f"{policy_path}: baseline: {excerpt(policy.baseline)} is not a variant of {model_dir} "
            f"(it has {', '.join(sorted(variants))}){_nearest(policy.baseline, variants)}"
        )
    valid = known_figures(variants, root)
    named = [("limits", name) for name in policy.limits]
    named += [
        (f"objective.{i}.{'minimize' if o.minimize else 'maximize'}", o.figure) for i, o in enumerate(policy.objective)
    ]
    if policy.accuracy is not None and policy.accuracy.metrics != "all":
        named += [("accuracy.metrics", name) for name in policy.accuracy.metrics]
    suites = {name.split(":")[0] for name in valid if ":" in name}
    for suite in [] if policy.accuracy is None else policy.accuracy.suites:
        if suite not in suites:
            raise ConfigError(
                f"{policy_path}: accuracy.suites: {excerpt(suite)} is not a suite the stages write"
                f"{_nearest(suite, suites) or '; valid suites include ' + ', '.join(sorted(suites)[:6])}"
            )
    for key, name in named:
        if name not in valid:
            # suggest within the same family (accuracy suite:metric, or the rest), else what the same
            # suite or shape does write (gsm8k:f1 -> gsm8k:exact_match)
            family = sorted(n for n in valid if (":" in n) == (":" in name))
            prefix = name.split(":")[0] + ":" if ":" in name else name.split(".")[0] + "."
            same = [n for n in family if n.startswith(prefix)] or family
            hint = _nearest(name, family) or f"; valid names include {', '.join(same[:6])}"
            raise ConfigError(f"{policy_path}: {key}: {excerpt(name)} is not a figure the stages write{hint}")


def _nearest(name: str, valid) -> str:
    close = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
