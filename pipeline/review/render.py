"""The Disagreements tab's items as HTML: prompt, both outputs (think block folded), answers and gold."""

from __future__ import annotations

import html

from pipeline.review.disagreements import SHOWN, Disagreement


# ------------------------------------------------------------------------------------ rendering
def esc(text) -> str:
    return html.escape(str(text))


def folded(output: str, reasoning: bool) -> str:
    """An output as HTML, its think block folded: R1-style templates open <think> in the prompt, so an
    output holds only its closing tag; a reasoning model's output without one never left its thoughts."""
    if "</think>" in output:
        think, answer = output.rsplit("</think>", 1)
        think = think.replace("<think>", "", 1)
        return (
            f"<details><summary>think block ({len(think.split())} words)</summary><pre>{esc(think.strip())}</pre>"
            f"</details><pre>{esc(answer.strip())}</pre>"
        )
    if reasoning or "<think>" in output:
        return (
            f"<details><summary>think block, never closed ({len(output.split())} words)</summary>"
            f"<pre>{esc(output.replace('<think>', '', 1).strip())}</pre></details><p><em>no answer</em></p>"
        )
    return f"<pre>{esc(output)}</pre>"


def render_items(found: list[Disagreement], names: tuple[str, str], figure: str, reasoning: tuple[bool, bool]) -> str:
    if not found:
        return "<p>No item matches.</p>"
    cards = []
    for d in found[:SHOWN]:
        cells = []
        for name, answer, think in zip(names, (d.baseline, d.variant), reasoning):
            cut = " · <strong>cut off</strong> at the token limit" if answer.truncated else ""
            seeds = f" (mean of {answer.seeds} seeds; output of the first)" if answer.seeds > 1 else ""
            cells.append(
                f"<td><p><strong>{esc(name)}</strong>: {figure} {answer.score:.2f}{seeds}{cut}<br>"
                f"extracted: <code>{esc(answer.extracted)}</code></p>{folded(answer.output, think)}</td>"
            )
        prompt = d.prompt if len(d.prompt) < 90 else d.prompt[:90] + "…"
        cards.append(
            f'<div class="item" data-doc-id="{d.doc_id}"><p><strong>item {d.doc_id}</strong> · gold: '
            f"<code>{esc(d.gold)}</code></p><details><summary>prompt: {esc(prompt)}</summary>"
            f"<pre>{esc(d.prompt)}</pre></details><table><tr>{''.join(cells)}</tr></table></div>"
        )
    more = f"<p>Showing the first {SHOWN} of {len(found)}.</p>" if len(found) > SHOWN else ""
    return more + "".join(cards)
