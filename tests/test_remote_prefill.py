"""Disaggregated prefill: a prompt computed in chunks on a prefill GPU is never faster than the
same prompt measured as one pass. Oracle: the H200 profile's measured whole-prompt prefill rows
(calibration/h200/costs.csv, read here independently of the profile loader)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from memtp_sim import run
from memtp_sim.config import Scenario

REPO = Path(__file__).resolve().parents[1]
MEASURED_MS = {int(r["batch_tokens"]): float(r["pass_ms"])
               for r in csv.DictReader((REPO / "calibration" / "h200" / "costs.csv").open())
               if r["kind"] == "prefill" and r["model"] == "llama31-8b"}


def _prefill_ms(tmp_path: Path, prompt: int, max_batch_tokens: int) -> float:
    """Time from arrival to first token of one request alone on one prefill GPU (no queue), ms."""
    trace = tmp_path / f"p{prompt}.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(f"2023-11-16 18:15:{i:02d}.000,{prompt},20\n" for i in range(3)))
    scen = Scenario.model_validate({
        "hardware": {"profile": "h200-llama31-8b-bf16"}, "acceptance": {"alpha": 0.8},
        "workload": {"trace": str(trace), "mode": "closed_loop", "concurrency": 1, "num_requests": 2},
        "engine": {"max_batch_tokens": max_batch_tokens, "prefill_chunk_tokens": max_batch_tokens // 2,
                   "prefill": "disaggregated", "prefill_gpus": 1},
        "policy": {"name": "no_spec"}})
    st = run(scen, seed=0).state
    waits = (st.first_token_at_s - st.arrival_at_s) * 1e3
    assert waits == pytest.approx(waits[0], rel=1e-12)  # one user: nothing queues
    return float(waits[0])


@pytest.mark.parametrize("prompt", sorted(p for p in MEASURED_MS if p >= 512))
@pytest.mark.parametrize("max_batch_tokens", [128, 256, 512])
def test_chunks_are_never_faster_than_the_measured_whole_prompt(tmp_path, prompt, max_batch_tokens):
    # the prefill curve is context-free (whole prompts from an empty cache): chunks priced alone
    # once summed to 121.6 ms for a 4096-token prompt measured at 142.9 ms
    assert _prefill_ms(tmp_path, prompt, max_batch_tokens) >= MEASURED_MS[prompt] * (1 - 1e-12)


def test_chunks_by_hand(tmp_path):
    t = MEASURED_MS
    # 1024 tokens in two chunks of 512: the second adds T(1024) - T(512) = 14.25 ms, less than a
    # 512-token pass alone (15.20 ms), so it costs the pass
    assert _prefill_ms(tmp_path, 1024, 512) == pytest.approx(t[512] + max(t[512], t[1024] - t[512]), rel=1e-12)
    # 4096 in two chunks of 2048: the second adds T(4096) - T(2048) = 80.59 ms > T(2048), and the
    # sum is the measured whole prompt
    assert _prefill_ms(tmp_path, 4096, 2048) == pytest.approx(t[4096], rel=1e-12)


def _trace_run(tmp_path: Path, rows: list[tuple[float, int]], prefill_gpus: int, name: str):
    """One trace (arrival s, prompt tokens), 20-token outputs, on the H200 profile, disaggregated."""
    trace = tmp_path / f"{name}.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{int(t // 60):02d}:{t % 60:06.3f},{p},20\n" for t, p in rows))
    scen = Scenario.model_validate({
        "hardware": {"profile": "h200-llama31-8b-bf16"}, "acceptance": {"alpha": 0.8},
        "workload": {"trace": str(trace), "mode": "trace", "num_requests": len(rows)},
        "engine": {"prefill": "disaggregated", "prefill_gpus": prefill_gpus},
        "policy": {"name": "no_spec"}})
    return run(scen, seed=0).state


@pytest.mark.parametrize("prefill_gpus", [1, 2, 3])
def test_prefill_gpus_serve_prompts_first_come_first_served(tmp_path, prefill_gpus):
    # Oracle: the FIFO multi-server recursion (each prompt starts when it has arrived and the
    # earliest-free GPU is free), with each prompt's service time measured alone on an idle GPU
    rng = np.random.default_rng(prefill_gpus)
    prompts = rng.choice([256, 1024, 2048, 4096], size=12).tolist()
    arrivals = np.round(np.cumsum(rng.exponential(0.02, size=12)), 3).tolist()  # bursts: prompts queue
    service = {p: float(_trace_run(tmp_path, [(0.0, p)], 1, f"alone{p}").first_token_at_s[0]) for p in set(prompts)}
    st = _trace_run(tmp_path, list(zip(arrivals, prompts)), prefill_gpus, "queue")
    free_at = [0.0] * prefill_gpus
    expected = []
    for t, p in zip(st.arrival_at_s.tolist(), prompts):  # the trace's order is arrival order
        g = min(range(prefill_gpus), key=free_at.__getitem__)
        free_at[g] = max(t, free_at[g]) + service[p]
        expected.append(free_at[g])
    assert st.first_token_at_s == pytest.approx(expected, rel=1e-9, abs=1e-12)
    waited = st.first_token_at_s - st.arrival_at_s - np.array([service[p] for p in prompts])
    assert waited.max() > 1e-3  # some prompt queued: the test checks the queue, not only the service
