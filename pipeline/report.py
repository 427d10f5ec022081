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
"""

from __future__ import annotations

import argparse
import base64
import re
import shlex
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from pipeline.artifacts import (
    RANDOM_WEIGHTS_BANNER,
    RERUN,
    git_commit,
    read_bench,
    read_eval_report,
    read_eval_run,
    read_variant_manifest,
    staging_dir,
    stale_figures,
    variant_identity,
    write_json,
)
from pipeline.capacity import run_of_chosen_config, slo_text
from pipeline.policy import (
    accuracy_names,
    check_policy_names,
    decide,
    figures,
    policy_file_label,
)
from pipeline.schema import ConfigError, Policy, Report, check_data, load_policy

MIB = 2**20


# ---------------------------------------------------------------------------------------- collect
def collect(model_dir: Path, baseline: str) -> dict[str, dict]:
    """Everything the stages wrote about each variant of one model, baseline first."""
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such folder; run `make quantize` first")
    eval_path = model_dir / "eval-report.json"
    eval_report = read_eval_report(model_dir) or {}
    dirs = [d for d in sorted(model_dir.iterdir()) if not d.name.startswith(".") and (d / "manifest.json").is_file()]
    if not dirs:
        raise ConfigError(f"{model_dir}: no variants (folders with manifest.json); run `make quantize` first")
    dirs.sort(key=lambda d: d.name != baseline)
    measured_on = eval_report.get("identities", {})
    variants = {}
    for d in dirs:
        manifest = read_variant_manifest(d, verify="hashes")  # the decision rests on the files being these
        identity = variant_identity(manifest)
        bench, bench_error = read_bench(d)
        ev = eval_report.get("variants", {}).get(d.name)
        eval_meta = read_eval_run(d)
        # Figures measured on another checkpoint than the one on disk (a rebuild since, an edited manifest)
        # are left out, and the variant cannot qualify: the line says which stage to run again.
        stale, used = {}, {}
        if ev is not None:
            stale["eval"] = stale_figures(
                eval_path.name, measured_on.get(d.name), d, identity, RERUN[eval_path.name].format(d.name)
            )
            if d.name != baseline and baseline in variants and not stale["eval"]:  # its deltas are the baseline's too
                stale["eval"] = stale_figures(
                    f"{eval_path.name} (the deltas against {baseline})",
                    measured_on.get(baseline),
                    model_dir / baseline,
                    variants[baseline]["identity"],
                    RERUN[eval_path.name].format(baseline),
                )
            if stale["eval"]:
                ev = None
            else:
                used[eval_path.name] = measured_on[d.name]
        if bench is not None:
            stale["bench"] = stale_figures(
                "bench.json", bench.get("identity"), d, identity, RERUN["bench.json"].format(d.name)
            )
            if stale["bench"]:
                bench = None
            else:
                used["bench.json"] = bench["identity"]
        eval_meta_stale = eval_meta and stale_figures(
            "eval/results.json", eval_meta.get("identity"), d, identity, RERUN["eval/results.json"].format(d.name)
        )
        variants[d.name] = {
            "dir": str(d),
            "manifest": manifest,
            "identity": identity,
            "bench": bench,
            "eval": ev,
            "eval_meta": None if eval_meta_stale else eval_meta,
            "eval_meta_stale": eval_meta_stale,
            "bench_error": bench_error,
            "stale": {k: line for k, line in stale.items() if line},
            "measured_on": used,
            "figures": figures(manifest, bench, ev),
            "random_weights": bool(manifest.get("random_weights")),
            "bench_device": (bench or {}).get("device"),
        }
    return variants


# ------------------------------------------------------------------------------------------ plots
def latency_figure(policy: Policy, variants: dict) -> str | None:
    """The latency the plots use: the first per-level latency the policy names, else p50 TPOT at the
    lowest concurrency of the first shape measured."""
    named = list(policy.limits) + [o.figure for o in policy.objective]
    for name in named:
        if re.fullmatch(r"[\w-]+\.c\d+\.p\d+_\w+_ms", name):
            return name
    for v in variants.values():
        if v["bench"] and v["bench"]["levels"]:
            shape = v["bench"]["levels"][0]["shape"]
            conc = min(l["concurrency"] for l in v["bench"]["levels"] if l["shape"] == shape)
            return f"{shape}.c{conc}.p50_tpot_ms"
    return None


def _level_spread(variant: dict, figure: str) -> tuple[float, float] | None:
    """min and max over repeated runs of a per-level figure (the x error bar)."""
    shape, conc, key = figure.split(".", 2)
    for lv in (variant["bench"] or {}).get("levels", []):
        if lv["shape"] == shape and f"c{lv['concurrency']}" == conc and key in lv["summary"]:
            return lv["summary"][key]["min"], lv["summary"][key]["max"]
    return None


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Names of the points no other point beats: lower or equal x (cost) and higher or equal y
    (accuracy), better in one. Sorted by x."""
    front = [
        n
        for n, (x, y) in points.items()
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for m, (x2, y2) in points.items() if m != n)
    ]
    return sorted(front, key=lambda n: points[n])


def plot(variants: dict, policy: Policy, chosen: str | None, out: Path) -> list[str]:
    """Write the plots (PNG + SVG); returns their stems."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    made = []
    banner = any(v["random_weights"] for v in variants.values())
    metrics = accuracy_names((variants.get(policy.baseline) or {}).get("eval"))
    lat = latency_figure(policy, variants)
    for stem, xfig, xlabel in (
        ("accuracy_vs_latency", lat, f"{lat} (ms; bars: min–max over runs)"),
        ("accuracy_vs_memory", "weights_gib", "weights GiB (vLLM's accounting)"),
    ):
        if not metrics or not xfig:
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
        for ax, metric in zip(axes[0], metrics):
            points = {
                n: (v["figures"][xfig], v["figures"][metric])
                for n, v in variants.items()
                if v["figures"].get(xfig) is not None and v["figures"].get(metric) is not None
            }
            for name, (x, y) in points.items():
                ci = variants[name]["eval"][metric]["ci95"]
                spread = _level_spread(variants[name], xfig) if xfig == lat else None
                xerr = [[x - spread[0]], [spread[1] - x]] if spread else None
                ax.errorbar(
                    x,
                    y,
                    yerr=[[y - ci[0]], [ci[1] - y]],
                    xerr=xerr,
                    fmt="*" if name == chosen else "o",
                    markersize=14 if name == chosen else 7,
                    capsize=3,
                    label=name,
                )
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
            front = pareto_front(points)
            if len(front) > 1:
                ax.plot([points[n][0] for n in front], [points[n][1] for n in front], "k--", lw=1, label="Pareto front")
            for n in front:
                ax.scatter(*points[n], s=220, facecolors="none", edgecolors="k", lw=1)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel(f"{metric} (95% CI)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="best")
        _title(fig, f"{stem.replace('_', ' ')} — ringed: Pareto front; star: chosen", banner)
        made.append(_save(fig, out / stem))
    points = {
        n: (v["figures"]["weights_gib"], -v["figures"][lat])
        for n, v in variants.items()
        if lat and v["figures"].get(lat) is not None and v["figures"].get("weights_gib") is not None
    }
    if points:  # the tradeoff that needs no accuracy: what random-weight variants can still show
        fig, ax = plt.subplots(figsize=(5.8, 4.2))
        front = pareto_front(points)
        for name, (x, y) in points.items():
            ax.plot(x, -y, "*" if name == chosen else "o", markersize=14 if name == chosen else 7, label=name)
            ax.annotate(name, (x, -y), textcoords="offset points", xytext=(6, 6), fontsize=8)
        ax.plot([points[n][0] for n in front], [-points[n][1] for n in front], "k--", lw=1, label="Pareto front")
        ax.set_xlabel("weights GiB (vLLM's accounting)", fontsize=8)
        ax.set_ylabel(f"{lat} (ms)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        _title(fig, "latency vs memory — lower-left is better", banner)
        made.append(_save(fig, out / "latency_vs_memory"))
    benched = {n: v for n, v in variants.items() if v["bench"]}
    shapes = list(dict.fromkeys(lv["shape"] for v in benched.values() for lv in v["bench"]["levels"]))
    if shapes:
        fig, axes = plt.subplots(1, len(shapes), figsize=(5.2 * len(shapes), 4.2), squeeze=False)
        for ax, shape in zip(axes[0], shapes):
            for name, v in benched.items():
                lv = [l for l in v["bench"]["levels"] if l["shape"] == shape]
                tp = [l["summary"]["output_throughput"] for l in lv]
                ax.errorbar(
                    [l["concurrency"] for l in lv],
                    [t["median"] for t in tp],
                    capsize=3,
                    marker="o",
                    label=name,
                    yerr=[[t["median"] - t["min"] for t in tp], [t["max"] - t["median"] for t in tp]],
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({l["concurrency"] for v in benched.values() for l in v["bench"]["levels"]}))
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("concurrency")
            ax.set_ylabel(f"output tok/s, {shape} (bars: min–max)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7)
        devices = sorted({v["bench_device"] for v in benched.values()})
        _title(fig, f"throughput vs concurrency ({', '.join(devices)})", banner)
        made.append(_save(fig, out / "throughput"))
    made += capacity_plots(benched, out, banner)
    plt.close("all")
    return made


def capacity_plots(benched: dict, out: Path, banner: bool) -> list[str]:
    """Per capacity workload: each SLO target's percentile against the offered Poisson rate, one line per
    variant (its chosen config), the target as a dashed line and the capacity (the knee) marked."""
    import matplotlib.pyplot as plt

    made = []
    sections = {n: v["bench"]["capacity"] for n, v in benched.items() if v["bench"].get("capacity")}
    workloads = {w["name"]: w for c in sections.values() for w in c["workloads"]}
    for wname, workload in workloads.items():
        targets = list(workload["slo"].items())
        fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 4.2), squeeze=False)
        for ax, (key, target) in zip(axes[0], targets):
            for name, section in sections.items():
                run = run_of_chosen_config(section, wname)
                points = sorted(
                    (p for p in (run or {}).get("points", []) if p["kind"] == "search" and key in p["latency_ms"]),
                    key=lambda p: p["request_rate"],
                )
                if not points:
                    continue
                (line,) = ax.plot(
                    [p["request_rate"] for p in points], [p["latency_ms"][key] for p in points], "o-", label=name
                )
                if run["capacity_rps"] is not None:
                    ax.axvline(run["capacity_rps"], color=line.get_color(), ls=":", lw=1)
            ax.axhline(target, color="k", ls="--", lw=1, label=f"SLO {target:g} ms")
            ax.set_yscale("log")
            ax.set_xlabel("offered request rate (req/s, Poisson)")
            ax.set_ylabel(f"{key} (dotted: capacity)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7)
        devices = sorted({c["device_name"] for c in sections.values()})
        _title(fig, f"{wname}: latency vs request rate ({', '.join(devices)})", banner)
        made.append(_save(fig, out / f"capacity_{wname}"))
    return made


def _title(fig, text: str, banner: bool) -> None:
    fig.suptitle(text, fontsize=10)
    if banner:  # on the figure itself, so it survives being copied out of the report
        fig.text(
            0.5, 0.005, RANDOM_WEIGHTS_BANNER.upper(), ha="center", va="bottom", color="red", fontsize=12, weight="bold"
        )
    fig.tight_layout(rect=(0, 0.04 if banner else 0, 1, 0.95))


def _save(fig, stem: Path) -> str:
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    fig.savefig(stem.with_suffix(".svg"))
    return stem.name


# --------------------------------------------------------------------------------------- markdown
def _f(value, spec=".3f", missing="—") -> str:
    return missing if value is None else format(value, spec)


def render_markdown(
    model_dir: Path, variants: dict, policy: Policy, policy_path: Path, decision: dict, plots: list[str]
) -> str:
    model = model_dir.name
    base = policy.baseline
    metrics = accuracy_names((variants.get(base) or {}).get("eval"))
    fidelity = [s for s, e in ((variants.get(base) or {}).get("eval") or {}).items() if "kld_mean" in e]
    lines = [f"# {model}: which variant to deploy", ""]
    if any(v["random_weights"] for v in variants.values()):
        lines += [
            f"> **{RANDOM_WEIGHTS_BANNER}**: variants marked † come from random-init weights; their latency and "
            "memory are real, their accuracy figures mean nothing.",
            "",
        ]
    left_out = [line for v in variants.values() for line in v["stale"].values()]
    if left_out:
        lines += [
            "> **Stale figures, left out**: measured on another checkpoint than the one on disk; these variants "
            "cannot qualify until the stage named is run again.",
            ">",
            *[f"> - {line}" for line in left_out],
            "",
        ]
    lines += [
        f"Made by `make report` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from `{model_dir}/` "
        f"(commit {git_commit()}), policy `{policy_file_label(policy_path)}`. Every figure below was read from "
        "a file a stage wrote; "
        "where it came from is at the end.",
        "",
    ]

    lines += ["## Decision", "", f"**{decision['summary']}**", "", f"Policy ({policy.description.strip()}):", ""]
    if policy.accuracy:
        which = "every accuracy figure" if policy.accuracy.metrics == "all" else ", ".join(policy.accuracy.metrics)
        lines.append(
            f"- accuracy: on {which}, with 95% confidence at most {policy.accuracy.max_drop * 100:g} points below "
            f"{base} (lower end of the paired bootstrap CI of the difference >= -{policy.accuracy.max_drop:g})"
        )
    for name, bound in policy.limits.items():
        parts = ([f">= {bound.min:g}"] if bound.min is not None else []) + (
            [f"<= {bound.max:g}"] if bound.max is not None else []
        )
        lines.append(f"- {name} {' and '.join(parts)}" + (f" (measured on {policy.device})" if policy.device else ""))
    lines.append(
        "- then " + ", then ".join(f"{'minimise' if o.minimize else 'maximise'} {o.figure}" for o in policy.objective)
    )
    lines += ["", "| variant | verdict |", "|---|---|"]
    for name, verdict in decision["verdicts"].items():
        mark = "**chosen**: " if name == decision["chosen"] else ""
        lines.append(f"| {name}{_dagger(variants[name])} | {mark}{verdict['why']} |")

    lines += ["", "## Summary", ""]
    lat = latency_figure(policy, variants)
    head = [
        "variant",
        "format / made by",
        "size MiB",
        *[f"{m} [95% CI]" for m in metrics],
        *[f"{s} KLD / top-1" for s in fidelity],
        "weights GiB",
        "KV tokens",
        *([lat] if lat else []),
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in variants.items():
        m, figs, ev = v["manifest"], v["figures"], v["eval"] or {}
        row = [
            f"{name}{_dagger(v)}",
            f"{m.get('format')} / {m.get('backend')}",
            _f((m.get("size_bytes") or 0) / MIB, ".1f"),
        ]
        for metric in metrics:
            e = ev.get(metric)
            if e is None:
                row.append("not measured")
                continue
            cell = f"{e['mean']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]"
            if "delta" in e:
                cell += f" Δ {e['delta'] * 100:+.1f} pt" + (" **(significant)**" if e.get("significant") else "")
                cell += f", {e['recovery']:.1%} of {policy.baseline}" if e.get("recovery") is not None else ""
            row.append(cell)
        for s in fidelity:
            e = ev.get(s)
            row.append(f"{e['kld_mean']:.4f} / {e['top1_agreement']:.3f}" if e else "not measured")
        row += [_f(figs.get("weights_gib")), _f(figs.get("kv_cache_tokens"), ",", "—")]
        if lat:
            row.append(_f(figs.get(lat), ".1f"))
        lines.append("| " + " | ".join(row) + " |")
    lines += [""] + (
        []
        if not metrics
        else [
            "Δ: difference to " + base + " in points; significant: its paired 95% CI excludes 0 (and McNemar's "
            "exact p < 0.05 for 0/1 scores). KLD: KL(" + base + " ‖ variant) over the top-100 tokens plus a rest "
            "bucket, a lower bound. Full accuracy detail: `eval-report.md`.",
            "",
        ]
    )

    for name in plots:
        lines += [f"![{name}](plots/{name}.png)", ""]
    lines += _latency_tables(variants) + _capacity_table(variants) + _memory_table(variants)
    lines += _mixed_precision(variants) + _provenance(variants)
    return "\n".join(lines) + "\n"


def _capacity_table(variants: dict) -> list[str]:
    """Capacity at each workload's SLO, for every config of the grid, the chosen one in bold."""
    sections = {n: v["bench"]["capacity"] for n, v in variants.items() if v["bench"] and v["bench"].get("capacity")}
    if not sections:
        return []
    lines = ["## Capacity at an SLO", ""]
    workloads = {w["name"]: w for c in sections.values() for w in c["workloads"]}
    for wname, workload in workloads.items():
        lines += [
            f"**{wname}**: {slo_text(workload)}.",
            "",
            "| variant | config | settings | capacity req/s | broke at req/s | saturation req/s | goodput at capacity "
            "| runs | search s | device |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, section in sections.items():
            for run in (r for r in section["runs"] if r["workload"] == wname):
                chosen = section["chosen"].get(wname) == run["config"]
                at = next((p for p in run["points"] if p["request_rate"] == run["capacity_rps"]), None)
                config = f"**{run['config']}**" if chosen else run["config"]
                settings = ", ".join(f"{k} {v}" for k, v in run["settings"].items())
                lines.append(
                    f"| {name}{_dagger(variants[name])} | {config} | {settings} | "
                    + (
                        f"error: {run['error']} ||||||"
                        if run["error"]
                        else f"{_f(run['capacity_rps'], '.3g', 'none held')} | {_f(run['broke_at_rps'], '.3g')} | "
                        f"{_f(run['saturation_rps'], '.3g')} | {_f((at or {}).get('request_goodput'), '.3g')} | "
                        f"{len(run['points'])} | {run['wall_s']:.0f} | {section['device_name']} |"
                    )
                )
        lines.append("")
    lines += [
        "Capacity: the highest Poisson rate measured at which every target held (vLLM's `vllm bench serve`, "
        "random prompts, EOS ignored); broke at: the lowest at which one did not; bold: the config chosen (the "
        "grid's first unless another holds more by more than the search tolerance), which publish writes "
        "into serve.yaml. Every point is in each variant's bench.json (capacity.runs).",
        "",
    ]
    return lines


def _dagger(v: dict) -> str:
    return " †" if v["random_weights"] else ""


def _latency_tables(variants: dict) -> list[str]:
    benched = {n: v for n, v in variants.items() if v["bench"]}
    lines = ["## Latency and throughput", ""]
    for name, v in variants.items():
        if "bench" in v["stale"]:
            lines.append(f"- {name}: left out, {v['stale']['bench']}")
        elif not v["bench"]:
            lines.append(
                f"- {name}: not benched" + (f" ({v['bench_error']})" if v["bench_error"] else " (no bench.json)")
            )
    shapes = list(
        dict.fromkeys(
            (lv["shape"], lv["input_len"], lv["output_len"]) for v in benched.values() for lv in v["bench"]["levels"]
        )
    )
    for shape, n_in, n_out in shapes:
        lines += [
            "",
            f"### {shape}: {n_in} tokens in, {n_out} out (fixed lengths)",
            "",
            "| variant | device | conc | TTFT ms p50 / p90 / p99 | TPOT ms p50 / p90 / p99 | E2E s p50 / p90 / p99 | "
            "output tok/s [min–max] |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, v in benched.items():
            for lv in v["bench"]["levels"]:
                if lv["shape"] != shape:
                    continue
                s = lv["summary"]
                trio = lambda key, scale=1.0, spec=".1f", s=s: " / ".join(
                    format(s[f"p{p}_{key}"]["median"] * scale, spec) for p in (50, 90, 99)
                )
                tp = s["output_throughput"]
                gpus = v["bench"].get("tensor_parallel_size", 1)
                device = f"{v['bench_device']} x {gpus} (TP)" if gpus > 1 else v["bench_device"]
                lines.append(
                    f"| {name}{_dagger(v)} | {device} | {lv['concurrency']} | {trio('ttft_ms')} | "
                    f"{trio('tpot_ms', spec='.2f')} | {trio('e2el_ms', 1e-3, '.3f')} | "
                    f"{tp['median']:.1f} [{tp['min']:.1f}–{tp['max']:.1f}] |"
                )
    if benched:
        lines += [
            "",
            "Each figure is the median over the profile's repeated runs of that run's percentile, from vLLM's "
            "own serving benchmark against its OpenAI server; warm-up excluded.",
            "",
        ]
    return lines


def _memory_table(variants: dict) -> list[str]:
    benched = {n: v for n, v in variants.items() if v["bench"]}
    if not benched:
        return []
    shapes = list(
        dict.fromkeys(
            s for v in benched.values() for s in (v["bench"]["memory"].get("max_concurrency_at_budget") or {})
        )
    )
    lines = [
        "## Memory",
        "",
        "| variant | weights GiB | peak activation GiB | CUDA graphs GiB | KV cache GiB | KV tokens | "
        + " | ".join(f"max concurrency at budget, {s}" for s in shapes)
        + " | start-up s | peak RSS GiB |",
        "|" + "---|" * (8 + len(shapes)),
    ]
    for name, v in benched.items():
        m = v["bench"]["memory"]
        conc = m.get("max_concurrency_at_budget") or {}
        tp = v["bench"].get("tensor_parallel_size", 1)
        kv = v["bench"].get("kv_cache_dtype", "auto")
        label = (
            f"{name}{_dagger(v)}{f' (TP {tp}: per GPU)' if tp > 1 else ''}{f' (KV cache {kv})' if kv != 'auto' else ''}"
        )
        lines.append(
            f"| {label} | "
            f"{_f(m.get('weights_gib'))} | "
            f"{_f(m.get('peak_activation_gib'), '.2f')} | "
            f"{_f(m.get('cuda_graph_gib'), '.2f')} | {_f(m.get('kv_cache_gib'), '.2f')} | "
            f"{_f(m.get('kv_cache_tokens'), ',')} | "
            + " | ".join(f"{_f(conc.get(s), ',')} (of {m.get('budget_gib')} GiB)" for s in shapes)
            + f" | {_f(v['bench'].get('startup_s'), '.1f')} | {_f(m.get('peak_rss_gib'), '.2f')} |"
        )
    lines += [
        "",
        "vLLM's own accounting from its start-up log; on CPU vLLM logs no weights figure and the checkpoint's "
        "size stands in, and the KV cache is the fixed VLLM_CPU_KVCACHE_SPACE.",
        "",
    ]
    return lines


def _mixed_precision(variants: dict) -> list[str]:
    """The sensitivity table of every mixed-precision variant (its manifest's), most sensitive first."""
    lines = []
    for name, v in variants.items():
        plan = v["manifest"].get("mixed_precision")
        if not plan:
            continue
        kept = set(plan["kept"])
        lines += [
            f"## Mixed precision: {name}",
            "",
            f"Layers kept at {plan['sensitive_bits']} bits: {', '.join(map(str, plan['kept'])) or 'none'} "
            f"(estimated size {plan['estimated_size_ratio']:.3f}x the all-INT checkpoint, budget "
            f"{plan['size_budget']:g}x). Sensitivity: {plan['method']}, {plan['samples']} calibration samples, "
            f"{plan['tokens']} tokens, {plan['seconds']} s.",
            "",
            "| layer | KLD alone | weights | kept |",
            "|---|---|---|---|",
        ]
        for row in sorted(plan["table"], key=lambda r: -r["kld"]):
            lines.append(
                f"| {row['layer']} | {row['kld']:.5f} | {row['params']:,} | {'yes' if row['layer'] in kept else ''} |"
            )
        lines.append("")
    return lines


def _provenance(variants: dict) -> list[str]:
    lines = ["## Where every number came from", ""]
    for name, v in variants.items():
        m = v["manifest"]
        lines += [
            f"### {name}{_dagger(v)}",
            "",
            f"- quantize (`make quantize`): `{quantize_command(v)}`; {m.get('created')}, "
            f"commit {m.get('git_commit')}; on {_quantized_on(m.get('quantize') or {})}; "
            f"{_packages(m.get('packages'))}; vLLM smoke test: {(m.get('smoke') or {}).get('text')!r}",
        ]
        if v["eval_meta"]:
            e = v["eval_meta"]
            lines.append(
                f"- eval (`make eval`): `{eval_command(v)}`; {e.get('created')}, commit "
                f"{e.get('git_commit')}, {e.get('dtype')}; {_packages(e.get('packages'))}"
            )
        elif v["eval_meta_stale"]:
            lines.append(f"- eval: left out, {v['eval_meta_stale']}")
        else:
            lines.append("- eval: not run")
        if v["bench"]:
            b = v["bench"]
            mach = b.get("machine", {})
            where = mach.get("gpu") or f"{mach.get('cpu')}, {mach.get('cpus')} cores"
            command = shlex.join(["python", "-m", "pipeline.bench", "--profile", str(b["profile"]["file"]), v["dir"]])
            lines.append(
                f"- bench (`make bench`): `{command}`; "
                f"{b.get('created')}, commit {b.get('git_commit')}; {where}; {_packages(b.get('packages'))}"
            )
        elif "bench" in v["stale"]:
            lines.append(f"- bench: left out, {v['stale']['bench']}")
        else:
            lines.append("- bench: not run")
        lines.append("")
    return lines


def _quantized_on(run: dict) -> str:
    ranks = run.get("ranks", 1)
    return run.get("device", "cpu") + (f" x {ranks} (llm-compressor's distributed oneshot)" if ranks > 1 else "")


def quantize_command(variant: dict) -> str:
    """The command line that rebuilds this variant where it is: its source, recipe, calibration set, data
    folder (DATA_DIR) and output root (OUT, the folder above the model's), as the manifest recorded them."""
    m = variant["manifest"]
    recipe, calib = m.get("recipe") or {}, m.get("calibration") or {}
    cmd = [
        "python",
        "-m",
        "pipeline.quantize",
        "--model",
        str((m.get("source") or {}).get("path")),
        "--recipe",
        str(recipe.get("file")),
    ]
    if calib:
        cmd += ["--calib", str(calib.get("file"))]
        if calib.get("data_dir"):
            cmd += ["--data-dir", str(calib["data_dir"])]
    ranks = (m.get("quantize") or {}).get("ranks", 1)
    return shlex.join(
        cmd + ["--out", str(Path(variant["dir"]).parent.parent)] + (["--dp", str(ranks)] if ranks > 1 else [])
    )


def eval_command(variant: dict) -> str:
    """The command line that re-scores this variant: suites, data folder, limit, and any seed, greedy,
    reasoning or dtype setting, as its eval/results.json recorded them."""
    e = variant["eval_meta"]
    cmd = [
        "python",
        "-m",
        "pipeline.evaluate",
        "run",
        variant["dir"],
        "--suites",
        *(str(s["file"]) for s in e["suites"].values()),
    ]
    if e.get("data_dir"):
        cmd += ["--data-dir", str(e["data_dir"])]
    if e.get("limit"):
        cmd += ["--limit", str(e["limit"])]
    if e.get("seeds_override"):
        cmd += ["--seeds", *map(str, e["seeds_override"])]
    if e.get("greedy"):
        cmd.append("--greedy")
    if e.get("reasoning_flag") not in (None, "auto"):
        cmd += ["--reasoning", str(e["reasoning_flag"])]
    if e.get("dtype"):
        cmd += ["--dtype", str(e["dtype"])]
    return shlex.join(cmd)


def _packages(packages: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (packages or {}).items())


def render_html(markdown: str, title: str, folder: Path) -> str:
    """The markdown as one HTML file with every plot inlined, so it can be mailed or attached as is."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)

    def inline(match: re.Match) -> str:
        data = base64.b64encode((folder / match.group(1)).read_bytes()).decode()
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="(plots/[\w-]+\.png)"', inline, body)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;line-height:1.4}"
        "table{border-collapse:collapse;font-size:0.85em;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px}"
        "th{background:#f3f3f3}img{max-width:100%}blockquote{border-left:4px solid #c00;margin:0;padding:0 "
        "1em;color:#900}"
        "code{background:#f5f5f5;padding:0 3px}"
    )
    head = f"<meta charset='utf-8'><title>{title}</title><style>{style}</style>"
    return f"<!doctype html>\n<html><head>{head}</head>\n<body>\n{body}</body></html>\n"


# ------------------------------------------------------------------------------------------- main
def report(model_dir: Path, policy_path: Path) -> dict:
    policy = load_policy(policy_path)
    variants = collect(model_dir, policy.baseline)
    # before anything is written: a typo in a figure name would otherwise read as "not measured"
    check_policy_names(policy, policy_path, model_dir, variants)
    decision = decide(policy, variants)
    # Files are built in a staging folder and moved into place together: a reader never sees a
    # report.md from this run beside plots from the last one.
    with staging_dir(model_dir / ".report") as tmp:
        (tmp / "plots").mkdir()
        plots = plot(variants, policy, decision["chosen"], tmp / "plots")
        md = render_markdown(model_dir, variants, policy, policy_path, decision, plots)
        (tmp / "report.md").write_text(md)
        (tmp / "report.html").write_text(render_html(md, f"{model_dir.name}: which variant to deploy", tmp))
        report_file = {
            "model": model_dir.name,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "policy": {"file": policy_file_label(policy_path), **policy.model_dump()},
            "decision": decision,
            "variants": {
                n: {
                    "dir": v["dir"],
                    "checkpoint_sha256": v["identity"]["checkpoint_sha256"],
                    "measured_on": v["measured_on"],
                    "random_weights": v["random_weights"],
                    "bench_device": v["bench_device"],
                    "figures": v["figures"],
                }
                for n, v in variants.items()
            },
        }
        check_data(Report, report_file, model_dir / "report.json")  # as publish will read it
        write_json(tmp / "report.json", report_file)
    for item in (model_dir / ".report").iterdir():  # into place, next to the variants
        dest = model_dir / item.name
        if dest.is_dir():
            shutil.rmtree(dest)
        item.replace(dest)
    (model_dir / ".report").rmdir()
    return decision


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path, help="artifacts/<model>")
    p.add_argument("--policy", type=Path, default=Path("policies/default.yaml"))
    args = p.parse_args(argv)
    try:
        decision = report(args.model_dir, args.policy)
    except ConfigError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.model_dir}/report.md, report.html, report.json, plots/")
    print(decision["summary"])
    for name, verdict in decision["verdicts"].items():
        print(f"  {name}: {verdict['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
