"""The plots: accuracy vs latency and memory (Pareto front, CI bars), latency vs memory, throughput, capacity."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER
from pipeline.figure_names import level_figure, parse_level_figure
from pipeline.policy import accuracy_names
from pipeline.report.suite_recovery import baseline_eval_of
from pipeline.schema import Policy


# ------------------------------------------------------------------------------------------ plots
def latency_figure(policy: Policy, variants: dict) -> str | None:
    """The latency the plots use: the first per-level latency the policy names, else p50 TPOT at the
    lowest concurrency of the first shape measured."""
    named = list(policy.limits) + [o.figure for o in policy.objective]
    for name in named:
        if (level := parse_level_figure(name)) and level.is_latency:
            return name
    for v in variants.values():
        if v.bench and v.bench.levels:
            shape = v.bench.levels[0].shape
            conc = min(lv.concurrency for lv in v.bench.levels if lv.shape == shape)
            return level_figure(shape, conc, "p50_tpot_ms")
    return None


def _level_spread(variant, figure: str) -> tuple[float, float] | None:
    """min and max over repeated runs of a per-level figure (the x error bar)."""
    shape, conc, key = parse_level_figure(figure)
    for lv in variant.bench.levels if variant.bench else ():
        if lv.shape == shape and lv.concurrency == conc and key in lv.summary:
            return lv.summary[key].min, lv.summary[key].max
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

    made = []
    banner = any(v.random_weights for v in variants.values())
    metrics = accuracy_names(baseline_eval_of(variants, policy.baseline))
    lat = latency_figure(policy, variants)
    for stem, xfig, xlabel in (
        ("accuracy_vs_latency", lat, f"{lat} (ms; bars: min–max over runs)"),
        ("accuracy_vs_memory", "weights_gib", "weights GiB (vLLM's accounting)"),
    ):
        if metrics and xfig:
            fig = accuracy_figure(variants, metrics, xfig, xlabel, xfig == lat, chosen)
            _title(fig, f"{stem.replace('_', ' ')} — ringed: Pareto front; star: chosen", banner)
            made.append(_save(fig, out / stem))
    points = {  # the variants with both figures measured
        n: (v.figures["weights_gib"], -v.figures[lat])
        for n, v in variants.items()
        if lat and v.figures.get(lat) is not None and v.figures.get("weights_gib") is not None
    }
    if points:  # the tradeoff that needs no accuracy: what random-weight variants can still show
        fig = latency_memory_figure(points, lat, chosen)
        _title(fig, "latency vs memory — lower-left is better", banner)
        made.append(_save(fig, out / "latency_vs_memory"))
    benched = {n: v for n, v in variants.items() if v.bench}
    if any(v.bench.levels for v in benched.values()):
        fig = throughput_figure(benched)
        devices = sorted({v.bench_device for v in benched.values()})
        _title(fig, f"throughput vs concurrency ({', '.join(devices)})", banner)
        made.append(_save(fig, out / "throughput"))
    made += capacity_plots(benched, out, banner)
    plt.close("all")
    return made


def accuracy_figure(variants: dict, metrics: list[str], xfig: str, xlabel: str, spread: bool, chosen: str | None):
    """One panel per accuracy figure against `xfig`: CI bars, the min–max over runs where `spread`, the
    Pareto front ringed and joined, the chosen variant a star."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        points = {  # the variants with both figures measured
            n: (v.figures[xfig], v.figures[metric])
            for n, v in variants.items()
            if v.figures.get(xfig) is not None and v.figures.get(metric) is not None
        }
        for name, (x, y) in points.items():
            ci = variants[name].eval[metric].ci95
            runs = _level_spread(variants[name], xfig) if spread else None
            ax.errorbar(
                x,
                y,
                yerr=[[y - ci[0]], [ci[1] - y]],
                xerr=[[x - runs[0]], [runs[1] - x]] if runs else None,
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
    if axes[0][-1].get_legend_handles_labels()[0]:  # no variant with both figures: no legend (matplotlib warns)
        axes[0][-1].legend(fontsize=7, loc="best")
    return fig


def latency_memory_figure(points: dict[str, tuple[float, float]], lat: str, chosen: str | None):
    """Latency against weights (points hold minus the latency, so that the front's "higher" is faster)."""
    import matplotlib.pyplot as plt

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
    return fig


def throughput_figure(benched: dict):
    """Output tokens/s against concurrency, one panel per shape, bars: min–max over runs."""
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    shapes = list(dict.fromkeys(lv.shape for v in benched.values() for lv in v.bench.levels))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.2 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for name, v in benched.items():
            lv = [l for l in v.bench.levels if l.shape == shape]
            tp = [l.summary["output_throughput"] for l in lv]
            ax.errorbar(
                [l.concurrency for l in lv],
                [t.median for t in tp],
                capsize=3,
                marker="o",
                label=name,
                yerr=[[t.median - t.min for t in tp], [t.max - t.median for t in tp]],
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({l.concurrency for v in benched.values() for l in v.bench.levels}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(f"output tok/s, {shape} (bars: min–max)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    return fig


def capacity_plots(benched: dict, out: Path, banner: bool) -> list[str]:
    """Per capacity workload: each SLO target's percentile against the offered Poisson rate, one line per
    variant (its chosen config), its confirm runs (the same rates run again) as crosses, the target as a
    dashed line and the capacity (the knee) marked."""
    import matplotlib.pyplot as plt

    made = []
    sections = {n: v.bench.capacity for n, v in benched.items() if v.bench.capacity}
    workloads = {w.name: w for c in sections.values() for w in c.workloads}
    for wname, workload in workloads.items():
        targets = list(workload.slo.items())
        fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 4.2), squeeze=False)
        for ax, (key, target) in zip(axes[0], targets):
            for name, section in sections.items():
                choice = section.chosen.get(wname)  # a workload of another variant's section
                run = section.run_of(wname, choice.config) if choice else None
                points = sorted(
                    (p for p in (run.points if run else ()) if p.kind == "search" and key in p.latency_ms),
                    key=lambda p: p.request_rate,
                )
                if not points:
                    continue
                (line,) = ax.plot(
                    [p.request_rate for p in points], [p.latency_ms[key] for p in points], "o-", label=name
                )
                repeats = [p for p in run.points if p.kind == "confirm" and key in p.latency_ms]
                if repeats:  # the same rates run again: their spread, as crosses on the variant's line
                    ax.plot(
                        [p.request_rate for p in repeats],
                        [p.latency_ms[key] for p in repeats],
                        "x",
                        color=line.get_color(),
                        ms=8,
                        label=f"{name}: repeats",
                    )
                if run.capacity_rps is not None:
                    ax.axvline(run.capacity_rps, color=line.get_color(), ls=":", lw=1)
            ax.axhline(target, color="k", ls="--", lw=1, label=f"SLO {target:g} ms")
            ax.set_yscale("log")
            ax.set_xlabel("offered request rate (req/s, Poisson, sustained)")
            ax.set_ylabel(f"{key} (dotted: capacity)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7)
        devices = sorted({c.device_name for c in sections.values()})
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
    """PNG and SVG, the same bytes from the same figures: SVG's ids from a fixed salt, no date in it (by default
    matplotlib writes the time and random ids, so two reports of the same files would differ)."""
    import matplotlib.pyplot as plt

    fig.savefig(stem.with_suffix(".png"), dpi=110)
    with plt.rc_context({"svg.hashsalt": stem.name}):
        fig.savefig(stem.with_suffix(".svg"), metadata={"Date": None})
    return stem.name
