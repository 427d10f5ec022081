"""make review: a local web page over one model's artifacts for the people who decide which variant
ships: the tradeoff, the items where a variant and bf16 disagree, and two variants answering one prompt.

    python -m pipeline.review artifacts/<model> [--port 7860] [--host 127.0.0.1] [--chat bf16 gptq-w4a16]
    REVIEW_USER=... REVIEW_PASSWORD=... python -m pipeline.review artifacts/<model> --host 0.0.0.0

Tabs:
  Report         report.json's decision, every variant's verdict, the plots of make report (no model runs)
  Disagreements  the items of a suite that bf16 and a variant score differently (eval/samples_<suite>.jsonl
                 of make eval), bf16 right / variant wrong first: the prompt, both outputs (think block
                 folded), extracted answers and gold; filters for suite, variant, figure and truncation
  Chat           one prompt to two variants, each behind vLLM's OpenAI server, streamed side by side with
                 time to first token, tokens/s and token counts; sampling as the published serve.yaml says
The page reads what the stages wrote and writes nothing under OUT. Its two vLLM servers start with it
(logs in a temporary folder) and stop when it exits (Ctrl-C or SIGTERM; Linux kills them if it is
killed). Gradio's request queue answers one chat at a time, so the figures under an answer are those of
one request, not of several users' requests sharing the engine. Runs in the serve environment.

Access: the page listens on 127.0.0.1 unless --host says otherwise; any other address (0.0.0.0, a LAN
address) is refused unless REVIEW_USER and REVIEW_PASSWORD are set in the environment, and then the
page and every one of its API routes ask for that login (Gradio's auth); set on 127.0.0.1 they are
asked for there too. Each chat server takes a random API key of its own (pipeline/serving.py: Server),
never the user's VLLM_API_KEY, and listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import ipaddress
import json
import os
import queue
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts import (
    RERUN,
    read_eval_run,
    read_report,
    read_samples,
    read_variant_manifest,
    serving_settings,
    stale_figures,
    variant_identity,
)
from pipeline.schema import ConfigError, load_yaml_file
from pipeline.serving import Server, free_port, is_reasoning_model, on_gpu, port_in_use, vllm_server_command

TRUNCATION = ("all items", "cut off (either side)", "not cut off")
SHOWN = 50  # items rendered at once; the counts above them are always of all
STARTUP_TIMEOUT_S = 600


# ------------------------------------------------------------------------------- disagreements
@dataclass(frozen=True)
class Answer:
    """One variant's answer to one item: the first seed's output, the figure averaged over seeds."""

    output: str
    extracted: str | None
    score: float
    truncated: bool  # under any seed
    seeds: int


@dataclass(frozen=True)
class Disagreement:
    doc_id: int
    prompt: str
    gold: object
    baseline: Answer
    variant: Answer


def evaluated_variants(model_dir: Path) -> list[str]:
    return sorted(p.parent.parent.name for p in model_dir.glob("*/eval/results.json"))


def sample_suites(variant_dir: Path) -> list[str]:
    return sorted(p.stem.removeprefix("samples_") for p in (variant_dir / "eval").glob("samples_*.jsonl"))


def answers(path: Path, figure: str) -> dict[int, tuple[str, object, Answer]]:
    """{doc_id: (prompt, gold, Answer)} from a samples_<suite>.jsonl."""
    by_item: dict[int, list] = {}
    for rec in sorted(read_samples(path), key=lambda r: (r.doc_id, r.seed)):
        by_item.setdefault(rec.doc_id, []).append(rec)
    out = {}
    for doc_id, recs in by_item.items():
        scores = [getattr(r, figure) for r in recs]
        if None in scores:
            raise ConfigError(f"{path}: item {doc_id} has no {figure!r} figure; pick one the suite's metric writes")
        first = recs[0]
        answer = Answer(
            first.output, first.extracted, sum(scores) / len(scores), any(r.truncated for r in recs), len(recs)
        )
        out[doc_id] = (first.prompt, first.gold, answer)
    return out


def figures(path: Path) -> list[str]:
    """The per-item figures a samples file holds (exact_match; SQuAD also f1), from its first record."""
    records = read_samples(path)
    return [f for f in ("exact_match", "f1") if records and getattr(records[0], f) is not None]


def disagreements(
    model_dir: Path, suite: str, variant: str, figure: str, baseline: str = "bf16"
) -> tuple[list[Disagreement], int]:
    """The items of `suite` where `variant` and `baseline` score differently on `figure` (the baseline's
    wins first, largest gap first, then the variant's, each in item order), and how many items there are."""
    files = [model_dir / v / "eval" / f"samples_{suite}.jsonl" for v in (baseline, variant)]
    for f in files:
        if not f.is_file():
            raise ConfigError(f"{f}: missing; run `make eval` with {suite} in SUITES")
    base, var = (answers(f, figure) for f in files)
    if base.keys() != var.keys():
        raise ConfigError(
            f"{files[1]}: not the same items as {files[0]} ({len(var)} vs {len(base)}; a different LIMIT?); "
            "run `make eval` again for both"
        )
    found = [
        Disagreement(i, base[i][0], base[i][1], base[i][2], var[i][2])
        for i in sorted(base)
        if base[i][2].score != var[i][2].score
    ]
    return sorted(found, key=lambda d: (d.variant.score - d.baseline.score, d.doc_id)), len(base)


def counts(found: list[Disagreement], total: int) -> dict[str, int]:
    return {
        "items": total,
        "differ": len(found),
        "baseline_better": sum(d.baseline.score > d.variant.score for d in found),
        "variant_better": sum(d.variant.score > d.baseline.score for d in found),
        "cut_off": sum(d.baseline.truncated or d.variant.truncated for d in found),
    }


def keep(d: Disagreement, truncation: str) -> bool:
    cut = d.baseline.truncated or d.variant.truncated
    return truncation == TRUNCATION[0] or cut == (truncation == TRUNCATION[1])


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


def on_disk(folder: Path) -> tuple[dict | None, str | None]:
    """(the variant_identity of the variant in `folder`, None) or, where its manifest does not hold up
    against its files (sizes only: the page decides nothing), (None, why)."""
    try:
        manifest = read_variant_manifest(folder)
    except ConfigError as e:
        return None, str(e)
    return (None if manifest is None else variant_identity(manifest)), None


def report_staleness(model_dir: Path, report: dict) -> dict[str, list[str]]:
    """Per variant of report.json, why what it says about that variant no longer holds for the variant on
    disk: rebuilt since the report, or figures the report used measured on another checkpoint."""
    out = {}
    for name, reported in report["variants"].items():
        folder = model_dir / name
        current, broken = on_disk(folder)
        if broken:
            out[name] = [broken]
        elif current is None:
            out[name] = [f"report.json was made from {name}, but {folder} has no manifest.json: run make report"]
        elif current["checkpoint_sha256"] != reported["checkpoint_sha256"]:
            was, now = (str(h)[:8] for h in (reported["checkpoint_sha256"], current["checkpoint_sha256"]))
            out[name] = [f"report.json was made from {name} {was}…, but {folder} is now {now}…: run make report"]
        elif reported.get("measured_on") is None:
            out[name] = [stale_figures("report.json", None, folder, current, "make report")]
        else:
            lines = [
                stale_figures(source, measured, folder, current, RERUN[source].format(name))
                for source, measured in reported["measured_on"].items()
            ]
            if lines := [line for line in lines if line]:
                out[name] = lines
    return out


def eval_staleness(model_dir: Path, name: str) -> str | None:
    """Why the eval/ of variant `name` does not describe the variant on disk, or None where it does."""
    folder = model_dir / name
    current, broken = on_disk(folder)
    measured = (read_eval_run(folder) or {}).get("identity")
    return broken or stale_figures(
        "eval/results.json", measured, folder, current, RERUN["eval/results.json"].format(name)
    )


def report_markdown(model_dir: Path) -> tuple[str, list[Path]]:
    """The decision and verdicts of report.json as Markdown, and the PNG plots of make report; a variant
    whose figures in the report are not of the checkpoint on disk is marked stale, with what to run."""
    try:
        report = read_report(model_dir)
    except ConfigError as e:
        return f"**No report to show.** {e}", []
    decision = report["decision"]
    stale = report_staleness(model_dir, report)
    lines = [
        f"**Decision** (policy `{report['policy'].get('file', '?')}`, {report['created']}): {decision['summary']}",
        "",
    ]
    if stale:
        lines += [
            "**Stale**: what this report says about these variants is not about the checkpoints on disk now:",
            "",
            *[f"- {line}" for problems in stale.values() for line in problems],
            "",
        ]
    lines += ["| variant | qualifies | why |", "|---|---|---|"]
    for name, verdict in decision["verdicts"].items():
        mark = "**chosen**" if name == decision["chosen"] else ("yes" if verdict["qualifies"] else "no")
        mark += " (**stale**)" if name in stale else ""
        lines.append(f"| {name} | {mark} | {verdict['why'].replace('|', '/')} |")
    lines += ["", f"Full report: `{model_dir / 'report.md'}` (and report.html)."]
    return "\n".join(lines), sorted((model_dir / "plots").glob("*.png"))


# ----------------------------------------------------------------------------------------- chat
class ChatServer:
    """One variant behind vLLM's OpenAI server on 127.0.0.1, started in the background: the page is up
    while it loads, and a variant that fails to load says why in its column."""

    def __init__(self, name: str, folder: Path, log_dir: Path, max_model_len: int, env: dict[str, str]):
        self.name, self.folder, self.max_model_len = name, folder, max_model_len
        self.log_path = log_dir / f"{name}.log"
        self.env = env
        self.port = free_port()
        self.server: Server | None = None
        self.ready = threading.Event()  # set when healthy or failed
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self.startup_s: float | None = None
        self.tokenizer = None
        self.reasoning = False

    def start(self, after: ChatServer | None = None) -> None:
        self.thread = threading.Thread(target=self._serve, args=(after,), daemon=True)
        self.thread.start()

    def _serve(self, after: ChatServer | None) -> None:
        """Start, wait until healthy, hold, stop: all in this one thread, because Linux's parent-death
        signal (die_with_parent) fires when the thread that started a child ends, not the process."""
        try:
            if not (self.folder / "config.json").is_file():
                raise ConfigError(f"{self.folder}: no checkpoint (config.json); run `make quantize` for {self.name}")
            from transformers import AutoTokenizer  # imported by main() first: two threads importing it race

            self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
            self.reasoning = is_reasoning_model(self.tokenizer)
            if after is not None:  # one GPU: vLLM sizes its share from the memory free when it starts
                after.ready.wait()
            cmd = vllm_server_command(
                self.folder,
                self.port,
                max_model_len=self.max_model_len,
                max_num_seqs=8,
                gpu_memory_utilization=0.4,  # two servers on one GPU
                **serving_settings(self.folder),
            )
            cmd += ["--served-model-name", self.name, "--generation-config", "vllm"]
            if self.reasoning:
                cmd += ["--reasoning-parser", "deepseek_r1"]
            with Server(cmd, self.port, self.log_path, STARTUP_TIMEOUT_S, env=self.env) as server:
                self.server = server
                self.startup_s = server.wait_healthy()
                self.ready.set()
                self.stopping.wait()
        except Exception as e:  # shown on the page, in this variant's column
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
        finally:
            self.ready.set()

    def status(self) -> str:
        if not self.ready.is_set():
            return f"**{self.name}**: vLLM server starting…"
        if self.error:
            return f"**{self.name}** failed to start: {self.error}"
        if self.server is not None and self.server.proc.poll() is not None:
            code, why = self.server.proc.returncode, self.server.last_error()
            return f"**{self.name}**: its vLLM server exited ({code}): {why}"
        return f"**{self.name}**: served by vLLM (up in {self.startup_s:.0f} s)"

    def prompt_tokens(self, prompt: str) -> int:
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return len(ids)

    def stop(self) -> None:
        self.stopping.set()
        # Still loading: vLLM's server does not act on SIGTERM before its engine is up, and there is
        # nothing to save; its whole process group goes at once.
        if self.server is not None and not self.ready.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.proc.pid, signal.SIGKILL)
        if self.thread is not None:
            self.thread.join(timeout=60)


def sampling_defaults(model_dir: Path, chat: list[ChatServer]) -> tuple[dict, str]:
    """The sampling the published serve.yaml sets (override-generation-config), else the first chat
    variant's generation_config.json: what a user of the deployment would get."""
    for folder in sorted((model_dir.parent / "published").glob(f"{model_dir.name}-*/serve.yaml")):
        cfg = load_yaml_file(folder) or {}
        if "override-generation-config" in cfg:
            return dict(cfg["override-generation-config"]), str(folder)
    path = chat[0].folder / "generation_config.json"
    if path.is_file():
        config = json.loads(path.read_text())
        return {k: config[k] for k in ("temperature", "top_p", "top_k") if k in config}, str(path)
    return {}, "vLLM's defaults (no serve.yaml or generation_config.json sets any)"


def stream_reply(side: ChatServer, prompt: str, max_tokens: int, sampling: dict, out: queue.Queue, i: int) -> None:
    """Stream one answer, putting (i, field, value) on `out`: text, reasoning, stats or error."""
    from openai import OpenAI

    try:
        url = f"http://127.0.0.1:{side.port}/v1"
        client = OpenAI(base_url=url, api_key=side.server.api_key, timeout=STARTUP_TIMEOUT_S)
        t0 = time.perf_counter()
        first = None
        usage = None
        stream = client.chat.completions.create(
            model=side.name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **{k: v for k, v in sampling.items() if k in ("temperature", "top_p")},
            extra_body={k: v for k, v in sampling.items() if k == "top_k"},
        )
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                reasoning = getattr(choice.delta, "reasoning", None) or getattr(choice.delta, "reasoning_content", None)
                for field, value in (("reasoning", reasoning), ("text", choice.delta.content)):
                    if value:
                        first = first or time.perf_counter()
                        out.put((i, field, value))
        end = time.perf_counter()
        tokens = usage.completion_tokens if usage else 0
        decode = (tokens - 1) / (end - first) if first and tokens > 1 and end > first else None
        out.put(
            (
                i,
                "stats",
                f"time to first token {((first or end) - t0):.2f} s · "
                + (f"{decode:.1f} tokens/s after it · " if decode else "")
                + f"{usage.prompt_tokens if usage else '?'} prompt + {tokens} completion tokens · {end - t0:.1f} s",
            )
        )
    except Exception as e:  # the server's refusal (a prompt it will not take) or a dead server: on the page
        out.put((i, "error", str(e).splitlines()[0][:500]))
    finally:
        out.put((i, "done", None))


def answer_html(side: ChatServer, parts: dict) -> str:
    body = ""
    if parts.get("reasoning"):
        body += f"<details><summary>think block ({len(parts['reasoning'].split())} words)</summary>"
        body += f"<pre>{esc(parts['reasoning'].strip())}</pre></details>"
    if parts.get("text"):
        body += f"<pre>{esc(parts['text'])}</pre>"
    if parts.get("error"):
        body += f'<p class="error">{esc(side.name)}: {esc(parts["error"])}</p>'
    return body


def chat_turn(sides: list[ChatServer], sampling: dict, prompt: str, max_tokens: int):
    """The same prompt to both variants at once; yields (status, answer, stats) of each as tokens arrive."""
    columns = [{"status": s.status(), "parts": {}, "stats": ""} for s in sides]

    def view():
        return [v for c, s in zip(columns, sides) for v in (c["status"], answer_html(s, c["parts"]), c["stats"])]

    if not prompt or not prompt.strip():
        for c in columns:
            c["parts"]["error"] = "the prompt is empty: type a question first"
        yield view()
        return
    for c, side in zip(columns, sides):  # a server still starting: wait for it on the page
        if not side.ready.is_set():
            yield view()
            side.ready.wait()
        c["status"] = side.status()
    out: queue.Queue = queue.Queue()
    running = 0
    for i, side in enumerate(sides):
        if side.error:
            continue
        n = side.prompt_tokens(prompt)
        if n >= side.max_model_len:
            columns[i]["parts"]["error"] = (
                f"the prompt is {n} tokens with the chat template; this server takes at most "
                f"{side.max_model_len} (max-model-len) including the answer: shorten it"
            )
            continue
        budget = min(int(max_tokens), side.max_model_len - n)
        threading.Thread(target=stream_reply, args=(side, prompt, budget, sampling, out, i), daemon=True).start()
        running += 1
    yield view()
    last = time.monotonic()
    while running:
        try:
            i, field, value = out.get(timeout=0.2)
        except queue.Empty:
            continue
        if field == "done":
            running -= 1
        elif field == "stats":
            columns[i]["stats"] = value
        else:
            parts = columns[i]["parts"]
            parts[field] = parts.get(field, "") + value
        if time.monotonic() - last > 0.1 or not running:  # a page update per 0.1 s, not per token
            last = time.monotonic()
            yield view()
    yield view()


def chat_pair(model_dir: Path, report: dict | None, baseline: str) -> list[str]:
    """The default pair: the baseline and the variant the policy chose, or where it chose the baseline
    (or nothing), the variant closest to qualifying, else the first other variant."""
    others = sorted(p.parent.name for p in model_dir.glob("*/manifest.json") if p.parent.name != baseline)
    decision = (report or {}).get("decision", {})
    for name in (decision.get("chosen"), decision.get("closest"), *others):
        if name and name != baseline:
            return [baseline, name]
    return [baseline, baseline]


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
    evaluated = evaluated_variants(model_dir)
    variants = [v for v in evaluated if v != baseline]
    suites = sample_suites(model_dir / baseline) if baseline in evaluated else []
    reasoning = {v: bool((read_eval_run(model_dir / v) or {}).get("reasoning_model")) for v in evaluated}

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

    with gr.Blocks(title=f"review: {model_dir.name}") as page:
        gr.Markdown(f"# {model_dir.name}: which variant to ship\n`{model_dir}`")
        with gr.Tab("Report", id="report"):
            gr.Markdown(report_md, elem_id="report-decision")
            for png in plots:
                gr.Image(str(png), label=png.stem, interactive=False, show_label=True, elem_classes="report-plot")
        with gr.Tab("Disagreements", id="disagreements"):
            if not variants or not suites:
                gr.Markdown(
                    f"**Nothing to compare.** No eval results of {baseline} and another variant under "
                    f"`{model_dir}` (found: {', '.join(evaluated) or 'none'}); run `make eval` first.",
                    elem_id="disagreement-counts",
                )
            else:
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
        with gr.Tab("Chat", id="chat"):
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
    return page


def page_login(host: str, environ=os.environ) -> tuple[str, str] | None:
    """The (user, password) the page asks for, from REVIEW_USER and REVIEW_PASSWORD, or None for no
    login. A host that is not this machine's loopback only with both: a one-line error otherwise."""
    user, password = (environ.get("REVIEW_USER") or "").strip(), environ.get("REVIEW_PASSWORD") or ""
    if bool(user) != bool(password):
        missing = "REVIEW_PASSWORD" if user else "REVIEW_USER"
        raise ConfigError(f"{missing}: unset or empty while the other is set; set both (the page's login) or neither")
    if not host:
        raise ConfigError("REVIEW_HOST: empty; leave it unset for 127.0.0.1 (this machine only)")
    if not (user or is_loopback(host)):
        raise ConfigError(
            f"REVIEW_HOST={host}: reachable from other machines, and the page and its API would answer anyone; "
            "set REVIEW_USER and REVIEW_PASSWORD in the environment (the page's login), or leave REVIEW_HOST unset"
        )
    return (user, password) if user else None


def is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is this machine's loopback (0.0.0.0 and :: are every
    interface, so not)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"REVIEW_HOST={host}: not an address or a name this machine resolves ({e})") from None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_listenable(host: str) -> None:
    """A one-line error, before anything starts, where nothing can listen on `host` (not an address of
    this machine: a typo, another machine's LAN address)."""
    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(address)
    except OSError as e:
        raise ConfigError(
            f"REVIEW_HOST={host}: cannot listen there ({e.strerror}); use an address of this machine "
            "(0.0.0.0: all of them)"
        ) from None


def check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such folder; point MODEL (or the argument) at a model made by `make all`")
    if not any(model_dir.glob("*/manifest.json")):
        raise ConfigError(f"{model_dir}: no variants (*/manifest.json); run `make quantize` first")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="artifacts/<model>")
    ap.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: this machine only; others need a login)"
    )
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--baseline", default="bf16")
    ap.add_argument("--chat", nargs=2, metavar="VARIANT", help="the two variants of the Chat tab")
    ap.add_argument("--max-model-len", type=int, help="of the chat servers (default: the published serve.yaml's)")
    args = ap.parse_args(argv)
    try:
        login = page_login(args.host)
        remote = not is_loopback(args.host)
        check_listenable(args.host)
        check_model_dir(args.model_dir)
        if port_in_use(args.port):
            raise ConfigError(f"REVIEW_PORT={args.port}: already in use on {args.host}; pick another")
        # No report yet is normal (the Report tab says so); a report.json or eval results.json that cannot
        # be read is one line here, before two vLLM servers start, as the page would show it only in part.
        report = read_report(args.model_dir) if (args.model_dir / "report.json").exists() else None
        for variant in evaluated_variants(args.model_dir):
            read_eval_run(args.model_dir / variant)
        names = args.chat or chat_pair(args.model_dir, report, args.baseline)
        max_model_len = args.max_model_len or default_max_model_len(args.model_dir, names)
    except ConfigError as e:
        print(f"review: {e}", file=sys.stderr)
        return 2
    if remote:
        print(
            f"review: warning: REVIEW_HOST={args.host}: the page is reachable from other machines, behind the "
            f"login of REVIEW_USER={login[0]}; plain HTTP, so the password crosses the network unencrypted",
            file=sys.stderr,
            flush=True,
        )
    # On a CPU each server gets half the cores: two engines on the same cores only take turns, and the
    # figures under each answer would measure the other one's work too.
    cores = os.cpu_count() or 1
    binds = [f"0-{cores // 2 - 1}", f"{cores // 2}-{cores - 1}"] if cores >= 2 and not on_gpu() else [None, None]
    import transformers

    transformers.AutoTokenizer  # noqa: B018 - resolve the lazy import here, not in two server threads at once
    with tempfile.TemporaryDirectory(prefix="review-logs-") as logs:
        sides = []
        for name, bind in zip(names, binds):
            env = {"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else {}
            sides.append(ChatServer(name, args.model_dir / name, Path(logs), max_model_len, env))
        for i, side in enumerate(sides):
            side.start(after=sides[i - 1] if i and on_gpu() else None)
        signal.signal(signal.SIGTERM, stop_like_ctrl_c)
        page = None
        try:
            page = build_page(args.model_dir, args.baseline, sides, sampling_defaults(args.model_dir, sides))
            page.queue(default_concurrency_limit=1).launch(
                server_name=args.host,
                server_port=args.port,
                prevent_thread_lock=True,
                auth=login,  # every route but the login page's own asks for it (Gradio's login_check)
                auth_message="make review: the login of REVIEW_USER and REVIEW_PASSWORD" if login else None,
                quiet=True,
                css=CSS,
                allowed_paths=[str(args.model_dir.resolve())],  # the plots; Gradio serves nothing else from disk
            )
            print(f"review: http://{args.host}:{args.port}/ (Ctrl-C stops it and its vLLM servers)", flush=True)
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        except ConfigError as e:  # a published serve.yaml that cannot be read (sampling_defaults)
            print(f"review: {e}", file=sys.stderr)
            return 2
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Ctrl-C, then make's SIGTERM: stop once, whole
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for side in sides:  # both servers stop side by side
                side.stopping.set()
            for side in sides:
                side.stop()
            if page is not None:
                page.close()
            print("review: stopped, and its vLLM servers", flush=True)
    return 0


def stop_like_ctrl_c(signum, frame):
    """SIGTERM (make's, a test's) takes Ctrl-C's way out, servers stopped. Once: make passes a signal on
    to its child, so a second one arrives while the servers stop, and must not cut that short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def default_max_model_len(model_dir: Path, names: list[str]) -> int:
    """The published serve.yaml's max-model-len (what the deployment takes), else 4,096 within the
    model's context."""
    for path in sorted((model_dir.parent / "published").glob(f"{model_dir.name}-*/serve.yaml")):
        if value := (load_yaml_file(path) or {}).get("max-model-len"):
            return int(value)
    config = model_dir / names[0] / "config.json"
    context = json.loads(config.read_text()).get("max_position_embeddings", 4096) if config.is_file() else 4096
    return min(4096, int(context))


if __name__ == "__main__":
    sys.exit(main())
