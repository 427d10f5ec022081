"""make eval ENDPOINT=...: the suites against a vLLM server that is already running (a deployment, another
team's), checked before any long work, its results in artifacts/<model>/endpoint-<name>/ beside the
variants': eval/ as a variant's, and endpoint.json (what the server reported, schema.EndpointInfo).

The prompts are built with MODEL's tokenizer and chat template (the source folder, or its hub id): the
token ids sent are those a variant of MODEL gets, which is what makes the records comparable item by item
with the variants'. A server of another model family would get prompts of the wrong vocabulary."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline.evaluate.endpoint_check import api_key_from_environment, connect, default_name
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import Plan, plan_suites
from pipeline.evaluate.run import generate_suites, score_and_write
from pipeline.evaluate.write import EngineRun
from pipeline.openai_client import ENDPOINT_PACE, CompletionsClient, ServerError
from pipeline.schema import ConfigError, EndpointInfo
from pipeline.setting_values import NAME
from pipeline.staging import staging_dir, write_json


def check_source(source: str) -> None:
    """MODEL as the tokenizer's home: a folder with a tokenizer in it, or a hub id (read from the hub)."""
    path = Path(source)
    if path.is_dir() and not (path / "tokenizer_config.json").is_file():
        raise ConfigError(f"MODEL={source}: no tokenizer_config.json; the prompts are built with MODEL's tokenizer")
    if not path.is_dir() and (source.startswith((".", "/")) or source.count("/") != 1):
        raise ConfigError(f"MODEL={source}: no such folder; the prompts are built with MODEL's tokenizer")


@dataclass(frozen=True)
class Endpoint:
    """The running server make eval ENDPOINT=... asks, as its settings name it."""

    url: str  # ENDPOINT: the server's base URL, http://host:port/v1
    concurrency: int  # ENDPOINT_CONCURRENCY: requests in flight (vLLM does not report its max-num-seqs)
    served_model: str | None = None  # ENDPOINT_MODEL; None: the only model it serves
    name: str | None = None  # ENDPOINT_NAME, the results' label; None: from the served model id


def plan_on_endpoint(model_dir: Path, source: str, endpoint: Endpoint, settings: EvalSettings) -> Plan:
    """Every check before the first request: the suites and their prompts, then the server (it answers,
    takes the key, serves the model and requests as long as the longest). The plan's variant is
    artifacts/<model>/endpoint-<name>, its endpoint what the server reported."""
    name = endpoint.name
    if name is not None and (not NAME.fullmatch(name) or name.startswith(".")):
        raise ConfigError(f"ENDPOINT_NAME={name}: only letters, digits, '.', '_' and '-', not starting with '.'")
    check_source(source)
    the_plan = plan_suites(Path(source), settings)
    if the_plan.lm_eval_tasks:
        names = ", ".join(t.name for t in the_plan.lm_eval_tasks)
        raise ConfigError(
            f"SUITES: {names} run through lm-eval on a server eval starts, not yet against an ENDPOINT; leave them out"
        )
    key, key_from = api_key_from_environment()
    info = connect(endpoint.url, key, endpoint.served_model, the_plan.longest, key_from)
    dest = model_dir / f"endpoint-{name or default_name(info.model)}"
    return dataclasses.replace(the_plan, variant=dest, endpoint=info)


def announce(plan: Plan) -> None:
    info: EndpointInfo = plan.endpoint
    print(
        f"{plan.variant.name}: {info.model} at {info.url} (vLLM {info.vllm_version or 'version not reported'}, "
        f"max_model_len {info.max_model_len}); prompts of {len(plan.suites)} suites need {plan.longest} tokens",
        flush=True,
    )


def evaluate_endpoint(model_dir: Path, source: str, endpoint: Endpoint, settings: EvalSettings) -> Path:
    """The suites on the server at the endpoint's URL, into artifacts/<model>/endpoint-<name>/: the client,
    runners and record of make eval's own server (run.py), pointed at the endpoint's URL, key and model,
    with at most its `concurrency` requests in flight."""
    the_plan = plan_on_endpoint(model_dir, source, endpoint, settings)
    announce(the_plan)
    info = the_plan.endpoint
    key = api_key_from_environment()[0] or ""  # a server without --api-key ignores the header
    client = CompletionsClient(info.url.removesuffix("/v1"), key, info.model, endpoint.concurrency, ENDPOINT_PACE)
    settings = dataclasses.replace(settings, dtype=None)  # the server's own, not known here (nor its engine's below)
    engine = EngineRun(args={}, eager=None, replicas=None, tp=None)
    with staging_dir(the_plan.variant) as tmp:  # endpoint.json and eval/ move in together
        (tmp / "eval").mkdir()
        try:
            outputs = generate_suites(client, the_plan, engine)
            score_and_write(client, the_plan, outputs, settings, engine, ({}, {}), tmp / "eval")
        except ServerError as e:
            raise ConfigError(f"ENDPOINT={info.url}: {e}; nothing was written") from None
        write_json(tmp / "endpoint.json", info.model_dump(mode="json"))
    return the_plan.variant
