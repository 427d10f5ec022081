"""`python -m pipeline.review` (make review) and the console script pipeline-review: the command line,
and the servers' lifetime (it stops them itself on Ctrl-C and SIGTERM)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from pipeline import exits
from pipeline.artifacts import read_eval_run, read_report
from pipeline.review.access import check_listenable, check_model_dir, is_loopback, page_login
from pipeline.review.chat import ChatServer, chat_pair, sampling_defaults
from pipeline.review.disagreements import evaluated_variants
from pipeline.review.page import CSS, build_page
from pipeline.schema import ConfigError, load_yaml_file
from pipeline.serving import on_gpu, port_in_use


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.review", description=sys.modules["pipeline.review"].__doc__.split("\n\n")[0]
    )
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
        names = args.chat or chat_pair(args.model_dir, report and report.decision, args.baseline)
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
    return serve_page(args, login, names, max_model_len)


def serve_page(args, login: tuple[str, str] | None, names: list[str], max_model_len: int) -> int:
    """Start both chat servers, then the page; on Ctrl-C or SIGTERM stop all of them, whole."""
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


def entry() -> NoReturn:
    exits.started()  # its Ctrl-C stops its servers (serve_page); the imports' one is exits.guard_start's
    sys.exit(main())


if __name__ == "__main__":
    entry()
