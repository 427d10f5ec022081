"""verify-published's load test: the published config served at the capacity its folder states (the rate
bench confirmed at the SLO, with that workload), as make bench measured it: a warm-up at the workload's
shapes, then one sustained point at the stated rate with the confirm runs' window (pipeline/load/steady.py:
the ramp excluded, the SLO and the achieved rate held over the window). Where it does not hold it fails
with one line naming the target and the figure; on another device class than the one that measured the
capacity it reports what it saw and does not fail, since the capacity is the bench device's."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from pipeline.artifacts import read_manifest
from pipeline.load.bench_serve import Target, run_point
from pipeline.load.steady import burst_plan, sustained_plan
from pipeline.schema import CapacitySearch, MeasuredWorkload
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
        "workload": measured.workload.model_dump(mode="json"),
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


def load_test(folder: Path, base_url: str, api_key: str, served_name: str, tmp: Path, log: Path) -> str | None:
    """The stated capacity's sustained run against the running server; a sentence of what held, None where
    the folder states no capacity or its workload cannot be replayed from the folder. Raises RuntimeError
    (one line) where it broke on the device class that measured it."""
    stated = (read_manifest(folder) or {}).get("stated_capacity")
    if not stated:
        print("load test: none (the folder states no capacity measured at an SLO)", flush=True)
        return None
    measured = MeasuredWorkload.model_validate(stated["workload"])
    workload = measured.as_input()
    if workload.from_eval is not None:
        print(
            f"load test: not run: workload {workload.name} replays eval's {workload.from_eval} prompts, which the "
            "published folder does not carry (make bench measured it)",
            flush=True,
        )
        return None
    search = CapacitySearch.model_validate({**stated["search"], "workloads": [workload], "grid": [{"name": "serve"}]})
    rate, e2e = stated["capacity_rps"], measured.e2e_bound_ms
    target = Target(base_url, served_name, str(folder), api_key, tmp / "load", log)
    warmup = run_point(target, workload, burst_plan("warmup", search.warmup_requests, e2e, 1), search)
    if warmup.timed_out:  # not a capacity that broke, on any device: a server that does not answer
        raise RuntimeError(
            f"{folder}: load test: the warm-up's {warmup.num_prompts} requests at once had not completed after "
            f"{warmup.timeout_s:g} s, their bound (60 s + 10 x the SLO's E2E of {e2e / 1000:g} s); see {log}"
        )
    plan = sustained_plan("verify", rate, search, e2e, 2, search.confirm_window)
    point = run_point(target, workload, plan, search)
    what = (
        f"{point.window_requests} requests over {point.window_s:.0f} s at the stated {rate:.3g} req/s "
        f"(after a {plan.ramp_s:.0f} s ramp), {measured.slo_text()}"
    )
    device, measured_on = this_device(), stated["device_name"]
    if point.slo_broken and device == measured_on:
        raise RuntimeError(f"{folder}: load test, {what}: did not hold on {device}: {'; '.join(point.slo_broken)}")
    seen = ", ".join(f"{k} {point.latency_ms[k]:.0f} ms" for k in workload.slo if k in point.latency_ms)
    seen += f", achieved {point.achieved_rps or 0:.3g} req/s"
    if device != measured_on:
        verdict = "broke" if point.slo_broken else "held"
        line = (
            f"load test ({what}): the SLO {verdict} here ({seen}), but the capacity was measured on {measured_on}, "
            f"this is {device}: reported, not judged"
        )
    else:
        line = f"load test ({what}): held ({seen})"
    print(line, flush=True)
    return line
