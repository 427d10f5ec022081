"""verify-published's load test: the published config served at the capacity its folder states (the rate
bench measured at the SLO, with that workload), through vLLM's own `vllm bench serve` as make bench ran
it (pipeline/capacity.py): a warm-up at the workload's shapes, then one point at the stated rate. Where
the SLO does not hold it fails with one line saying by how much; on another device class than the one
that measured the capacity it reports what it saw and does not fail, since the capacity is the bench
device's."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from pipeline.artifacts import read_manifest
from pipeline.capacity import point_requests, run_point, slo_text
from pipeline.schema import CapacitySearch, Workload
from pipeline.serving import on_gpu


def stated_capacity(measured) -> dict | None:
    """What the published manifest.json states of the capacity serve.yaml was chosen by (serve_yaml's
    measured_capacity): the rate, its workload and SLO, the search settings a point is sized by, the
    device and vLLM that measured it. None where none was measured."""
    if measured is None:
        return None
    run, cap = measured.run, measured.capacity
    return {
        "capacity_rps": run.capacity_rps,
        "config": run.config,
        "workload": measured.workload.model_dump(mode="json", exclude_unset=True),
        "search": cap.search,
        "device_name": cap.device_name,
        "vllm_version": cap.vllm_version,
    }


def this_device() -> str:
    """This machine's device as bench names it: the GPU's name, else the CPU's model."""
    if on_gpu():
        import torch

        return torch.cuda.get_device_name(0)
    with contextlib.suppress(OSError):
        if found := re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()):
            return found.group(1)
    return "cpu"


def overshoot(workload: Workload, latency: dict[str, float]) -> list[str]:
    """Each SLO target a point missed, with the measured value and by how much: 'p90_ttft_ms 2412 > 2000 (+21%)'."""
    return [
        f"{key} {latency[key]:.0f} > {target:g} ms (+{latency[key] / target - 1:.0%})"
        for key, target in workload.slo.items()
        if key in latency and latency[key] > target
    ]


def load_test(folder: Path, base_url: str, api_key: str, served_name: str, tmp: Path, log: Path) -> str | None:
    """The stated capacity's load run against the running server; a sentence of what held, None where the
    folder states no capacity or its workload cannot be replayed from the folder. Raises RuntimeError
    (one line) where the SLO broke on the device class that measured it."""
    stated = (read_manifest(folder) or {}).get("stated_capacity")
    if not stated:
        print("load test: none (the folder states no capacity measured at an SLO)", flush=True)
        return None
    workload = Workload.model_validate({k: v for k, v in stated["workload"].items() if k != "lengths"})
    if workload.from_eval is not None:
        print(
            f"load test: not run: workload {workload.name} replays eval's {workload.from_eval} prompts, which the "
            "published folder does not carry (make bench measured it)",
            flush=True,
        )
        return None
    search = CapacitySearch.model_validate({**stated["search"], "workloads": [workload], "grid": [{"name": "serve"}]})
    rate, n = stated["capacity_rps"], point_requests(search, stated["capacity_rps"])
    common = {"timeout_s": search.point_timeout_s, "log": log, "api_key": api_key, "result_dir": tmp / "load"}
    run_point(
        base_url, served_name, str(folder), workload, None, search.warmup_requests, kind="warmup", seed=1, **common
    )
    point = run_point(base_url, served_name, str(folder), workload, rate, n, kind="search", seed=2, **common)
    what = f"{n} requests at the stated {rate:.3g} req/s, {slo_text(workload)}"
    broken = point["slo_broken"] and (overshoot(workload, point["latency_ms"]) or point["slo_broken"])
    device, measured_on = this_device(), stated["device_name"]
    if broken and device == measured_on:
        raise RuntimeError(f"{folder}: load test, {what}: the SLO did not hold on {device}: {'; '.join(broken)}")
    seen = ", ".join(f"{k} {point['latency_ms'][k]:.0f} ms" for k in workload.slo if k in point["latency_ms"])
    if device != measured_on:
        verdict = "broke" if broken else "held"
        line = (
            f"load test ({what}): the SLO {verdict} here ({seen}), but the capacity was measured on {measured_on}, "
            f"this is {device}: reported, not judged"
        )
    else:
        line = f"load test ({what}): the SLO held ({seen})"
    print(line, flush=True)
    return line
