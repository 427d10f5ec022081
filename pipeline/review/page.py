"""The Gradio page: the Report, Disagreements and Chat tabs."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts import read_eval_run
from pipeline.review.chat import ChatServer, chat_turn
from pipeline.review.disagreements import (
    TRUNCATION,
    counts,
    disagreements,
    evaluated_variants,
    figures,
    keep,
    sample_suites,
)
from pipeline.review.render import render_items
from pipeline.review.report_tab import eval_staleness, report_markdown
from pipeline.schema import ConfigError

# ----------------------------------------------------------------------------------------- page
CSS = """
pre { white-space: pre-wrap; word-break: break-word; max-height: 28em; overflow-y: auto; }
.item { border-top: 1px solid #ccc; padding: 0.5em 0; }
.item table { width: 100%; table-layout: fixed; }
.item td { vertical-align: top; width: 50%; }
.error { color: #b00020; }
"""


def build_page(model_dir: Path, baseline: str, sides: list[ChatServer], sampling: tuple[dict, str]):
    import gradio as gr

    report_md, plots = report_markdown(model_dir)
    with gr.Blocks(title=f"review: {model_dir.name}") as page:
        gr.Markdown(f"# {model_dir.name}: which variant to ship\n`{model_dir}`")
        with gr.Tab("Report", id="report"):
            gr.Markdown(report_md, elem_id="report-decision")
            for png in plots:
                gr.Image(str(png), label=png.stem, interactive=False, show_label=True, elem_classes="report-plot")
        with gr.Tab("Disagreements", id="disagreements"):
            disagreements_tab(gr, page, model_dir, baseline)
        with gr.Tab("Chat", id="chat"):
            chat_tab(gr, page, sides, sampling)
    return page


def disagreements_tab(gr, page, model_dir: Path, baseline: str) -> None:
    """Suite, variant, figure and truncation pickers over the items where the variant and bf16 differ."""
    evaluated = evaluated_variants(model_dir)
    variants = [v for v in evaluated if v != baseline]
    suites = sample_suites(model_dir / baseline) if baseline in evaluated else []
    runs = {v: read_eval_run(model_dir / v) for v in evaluated}
    reasoning = {v: bool(run and run.reasoning_model) for v, run in runs.items()}

    def show(suite, variant, figure, truncation):
        if not (suite and variant and figure):
            return "Pick a suite, a variant and a figure.", ""
        try:
            found, total = disagreements(model_dir, suite, variant, figure, baseline)
        except ConfigError as e:
            return f"**Cannot compare:** {e}", ""
        c = counts(found, total)
        shown = [d for d in found if keep(d, truncation)]
        stale = [line for line in (eval_staleness(model_dir, n) for n in (baseline, variant)) if line]
        summary = "".join(f"**Stale:** {line}\n\n" for line in stale) + (
            f"**{c['differ']}** of {c['items']} items of {suite} score differently on {figure}: "
            f"**{c['baseline_better']}** where {baseline} scores higher, **{c['variant_better']}** where "
            f"{variant} does; {c['cut_off']} of them cut off on either side. Shown ({truncation}): {len(shown)}."
        )
        names = (baseline, variant)
        return summary, render_items(shown, names, figure, (reasoning.get(baseline, False), reasoning.get(variant)))

    def pick_suite(suite, variant, truncation):
        path = model_dir / baseline / "eval" / f"samples_{suite}.jsonl"
        names = figures(path) if path.is_file() else []
        figure = names[0] if names else None
        return gr.update(choices=names, value=figure), *show(suite, variant, figure, truncation)

    if not variants or not suites:
        gr.Markdown(
            f"**Nothing to compare.** No eval results of {baseline} and another variant under "
            f"`{model_dir}` (found: {', '.join(evaluated) or 'none'}); run `make eval` first.",
            elem_id="disagreement-counts",
        )
        return
    with gr.Row():
        suite = gr.Dropdown(suites, value=suites[0], label="suite")
        variant = gr.Dropdown(variants, value=variants[0], label=f"variant (against {baseline})")
        figure = gr.Dropdown([], label="figure")
        truncation = gr.Radio(list(TRUNCATION), value=TRUNCATION[0], label="cut off by the token limit")
    summary = gr.Markdown(elem_id="disagreement-counts")
    items = gr.HTML(elem_id="disagreement-items")
    suite.change(pick_suite, [suite, variant, truncation], [figure, summary, items])
    for control in (variant, figure, truncation):
        control.change(show, [suite, variant, figure, truncation], [summary, items])
    page.load(pick_suite, [suite, variant, truncation], [figure, summary, items])


def chat_tab(gr, page, sides: list[ChatServer], sampling: tuple[dict, str]) -> None:
    """One prompt, both variants' streamed answers side by side with their timings."""
    values, source = sampling
    gr.Markdown(
        "The same prompt to both variants at once, each in its own vLLM server; one chat at a time. "
        f"Sampling: {', '.join(f'{k} {v}' for k, v in values.items()) or 'none set, so vLLM defaults'} "
        f"(from {source})."
    )
    prompt = gr.Textbox(label="prompt", lines=3, elem_id="chat-prompt")
    with gr.Row():
        limit = sides[0].max_model_len
        max_tokens = gr.Slider(16, limit, value=min(512, limit), step=16, label="max new tokens")
        send = gr.Button("Send to both", variant="primary", elem_id="chat-send")
    outputs = []
    with gr.Row():
        for i, side in enumerate(sides):
            with gr.Column():
                outputs += [
                    gr.Markdown(side.status(), elem_id=f"chat-status-{i}"),
                    gr.HTML(elem_id=f"chat-answer-{i}"),
                    gr.Markdown(elem_id=f"chat-stats-{i}"),
                ]

    def turn(text, limit):
        yield from chat_turn(sides, values, text, limit)

    send.click(turn, [prompt, max_tokens], outputs)
    prompt.submit(turn, [prompt, max_tokens], outputs)
    page.load(lambda: [s.status() for s in sides], None, outputs[0::3])
