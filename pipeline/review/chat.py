"""The Chat tab: two variants, each behind its own vLLM server, answering one prompt side by side."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
import time
from pathlib import Path

from pipeline.artifacts import serving_settings
from pipeline.review.render import esc
from pipeline.schema import ConfigError, Decision, load_yaml_file
from pipeline.serving import Server, free_port, is_reasoning_model, start_wait, vllm_server_command

# one streamed answer: the longest its client waits for the next chunk (a first token included)
STREAM_READ_TIMEOUT_S = 600


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
            with Server(cmd, self.port, self.log_path, start_wait(self.folder), env=self.env) as server:
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
        client = OpenAI(base_url=url, api_key=side.server.api_key, timeout=STREAM_READ_TIMEOUT_S)
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


def chat_pair(model_dir: Path, decision: Decision | None, baseline: str) -> list[str]:
    """The default pair: the baseline and the variant the policy chose, or where it chose the baseline
    (or nothing), the variant closest to qualifying, else the first other variant."""
    others = sorted(p.parent.name for p in model_dir.glob("*/manifest.json") if p.parent.name != baseline)
    chosen = (decision.chosen, decision.closest) if decision else ()
    for name in (*chosen, *others):
        if name and name != baseline:
            return [baseline, name]
    return [baseline, baseline]
