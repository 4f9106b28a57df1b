"""Expected numbers for the dashboard tests, computed without the dashboard (not a test module).

:func:`tiny_scenario` writes out, by hand, the scenario the what-if page documents for a tiny
link (the tuning study's base: gfx1151 Llama-3.1-8B, dspark-qwen3 chat acceptance, 512-token passes,
256-token prefill chunks, disaggregated prefill on 4 GPUs, Azure conversation trace) and
:func:`run_metrics` runs it through :func:`memtp_sim.run`, so a test compares the page's numbers with
an independent run.
"""

from __future__ import annotations

import copy
from typing import Any

from _sim_helpers import TRACE

import memtp_sim
from memtp_sim.config import Scenario

#: The link every tiny what-if test starts from: 24 requests, 4 users, no STS fit, one seed.
TINY_QUERY = "workload.num_requests=24&workload.concurrency=4&confidence.sts=none&seeds=0"


def tiny_doc(**over: Any) -> dict[str, Any]:
    """The scenario of :data:`TINY_QUERY`, with per-section overrides (``policy={"gamma": 3}``; a
    policy override that names another policy replaces the policy's parameters)."""
    doc = {
        "hardware": {"profile": "gfx1151-llama31-8b-q4km-vulkan"},
        "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
        "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 4, "num_requests": 24},
        "engine": {"max_batch_tokens": 512, "prefill_chunk_tokens": 256, "prefill": "disaggregated",
                   "prefill_gpus": 4},
        "confidence": {"temperature": 1.0, "sts": "none"},
        "policy": {"name": "dspark", "gamma": 7},  # its other parameters: the library's defaults
    }
    for section, fields in over.items():
        if section == "policy" and fields.get("name", "dspark") != "dspark":
            doc[section] = dict(fields)
        else:
            doc[section] = {**copy.deepcopy(doc.get(section, {})), **fields}
    return doc


def tiny_scenario(**over: Any) -> Scenario:
    """:func:`tiny_doc`, validated."""
    return Scenario.model_validate(tiny_doc(**over))


def run_metrics(scenario: Scenario, seed: int = 0) -> dict[str, Any]:
    """The metrics :func:`memtp_sim.run` returns for (scenario, seed)."""
    return memtp_sim.run(scenario, seed=seed).metrics


def kpi_value(page: Any, metric: str, side: str = "current") -> float:
    """The exact number behind a KPI cell of the what-if page (its ``data-value``)."""
    return float(page.locator(f"#kpi-{metric}-{side}").get_attribute("data-value"))


def wait_kpi(page: Any, metric: str, expected: float, side: str = "current", timeout_s: float = 20.0) -> float:
    """Wait until the KPI cell shows ``expected`` (relative 1e-12), return what it shows."""
    import time

    deadline = time.monotonic() + timeout_s
    got = float("nan")
    while time.monotonic() < deadline:
        loc = page.locator(f"#kpi-{metric}-{side}")
        if loc.count():
            got = float(loc.get_attribute("data-value"))
            if abs(got - expected) <= 1e-12 * max(1.0, abs(expected)):
                return got
        time.sleep(0.1)
    raise AssertionError(f"KPI {metric} ({side}) shows {got!r}, expected {expected!r}")


_INFRASTRUCTURE = ("multiprocess.forkserver", "multiprocess.resource_tracker")


def job_processes(server: Any) -> list[Any]:
    """The live processes under the dashboard ``server`` (a psutil.Process) other than the job
    fork server and multiprocess's resource tracker (its direct children started by ``-c``):
    background jobs, which the fork server forks, and their pool workers."""
    import psutil

    out = []
    for p in server.children(recursive=True):
        try:
            infra = p.ppid() == server.pid and any(m in " ".join(p.cmdline()) for m in _INFRASTRUCTURE)
            if not infra and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
