"""Shared builders for the core simulator tests (not a test module).

Two ways to get a run:

* :func:`scenario` builds a validated :class:`~memtp_sim.config.Scenario` on the shipped Azure
  conversation trace (absolute path, so the tests do not depend on the working directory);
* :func:`flat_profile` + :func:`run_engine` drive :class:`~memtp_sim.engine.Engine` directly with a
  hand-made hardware profile (flat SPS table, zero drafter cost, a KV cache of an exact number of
  blocks) and a hand-made workload, so that timings and memory can be worked out by hand.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from memtp_sim.acceptance import AcceptanceModel
from memtp_sim.config import Scenario
from memtp_sim.engine import Engine, EngineSettings, EngineState
from memtp_sim.hardware import DrafterCost, HardwareProfile, MemorySpec, SPSTable
from memtp_sim.policies import make_policy
from memtp_sim.workload import Workload

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"
MEBI = 1 << 20


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def scenario_doc(**sections: Any) -> dict[str, Any]:
    """A scenario mapping: closed loop on the Azure conversation trace, overridden per section."""
    base = {"workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 4, "num_requests": 50}}
    doc = _merge(base, sections)
    # a section given with a different mode must not inherit the closed-loop fields
    wl = doc["workload"]
    if wl.get("mode") != "closed_loop" and "concurrency" in wl and "concurrency" not in sections.get("workload", {}):
        del wl["concurrency"]
    return doc


def scenario(**sections: Any) -> Scenario:
    return Scenario.model_validate(scenario_doc(**sections))


# ---------------------------------------------------------------------------------------------
# hand-made hardware
# ---------------------------------------------------------------------------------------------


def zero_drafter(t_seq_s: float = 0.0, t_small_s: float = 0.0) -> DrafterCost:
    # t_large_s = 0: the parallel pass costs t_small_s whatever the batch (max(t_small, 0)).
    return DrafterCost(t_small_s=t_small_s, large_b=512, t_large_s=0.0, time_scale=1.0, t_seq_s=t_seq_s,
                       weights_gib=0.0, source="test: hand-made")


def flat_profile(*, pass_ms: float = 10.0, max_b: int = 64, kv_blocks: int = 1024, block_tokens: int = 16,
                 max_model_len: int = 1_000_000, drafter: DrafterCost | None = None,
                 sps: SPSTable | None = None) -> HardwareProfile:
    """A profile whose KV cache holds exactly ``kv_blocks`` blocks.

    KV bytes per token = 1 MiB, so a block of ``block_tokens`` tokens is block_tokens/1024 GiB (an
    exact binary fraction: 1/64 GiB for 16); the allocatable memory is kv_blocks times that and
    nothing else uses memory, hence kv_blocks blocks with or without a drafter.
    """
    table = sps if sps is not None else SPSTable(np.array([1, max_b]), np.array([pass_ms, pass_ms]),
                                                 source="test: flat")
    mem = MemorySpec(gpu_allocatable_gib=kv_blocks * block_tokens / 1024.0, weights_gib=0.0, drafter_weights_gib=0.0,
                     reserve_gib=0.0, kv_bytes_per_token=MEBI, kv_block_tokens=block_tokens,
                     max_model_len=max_model_len)
    return HardwareProfile(name="test-flat", description="hand-made", chip="none", sps=table,
                           drafter=drafter or zero_drafter(), memory=mem, path="<memory>")


def certain_acceptance(accept: bool) -> AcceptanceModel:
    """Acceptance probability 1 (logit +40 rounds to exactly 1.0) or 0 (logit -40), no noise."""
    mu = 40.0 if accept else -40.0
    return AcceptanceModel(("chat",), np.array([mu]), np.array([0.0]), 0.0, 0.0, name="certain")


def workload(prompt, output, arrival=None, *, concurrency=None, think_time_s=0.0) -> Workload:
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    n = prompt.size
    if concurrency is not None:
        arr = np.full(n, np.nan)
    else:
        arr = np.zeros(n) if arrival is None else np.asarray(arrival, dtype=np.float64)
    return Workload(arr, prompt, output, np.zeros(n, dtype=np.int64), concurrency=concurrency,
                    think_time_s=think_time_s)


def grid_tie_workload(offset: int) -> tuple[Workload, np.ndarray]:
    """Six requests whose arrivals (after the first, at 0) lie on the float grid 0 + 0.01 + 0.01 + ...
    on which 10 ms rounds end (``offset`` shifts which grid points): a workload whose arrivals tie
    with round ends. Returns ``(workload, arrival times)``."""
    grid = np.add.accumulate(np.full(400, 0.01))
    arrival = np.concatenate(([0.0], grid[[5 + offset, 9 + offset, 40 + offset, 41 + offset, 120 + offset]]))
    return workload(np.full(6, 8), np.array([60, 30, 20, 50, 10, 5]), arrival), arrival


def run_engine(profile: HardwareProfile, wl: Workload, policy: str = "no_spec", params: dict | None = None, *,
               acceptance: AcceptanceModel | None = None, seed: int = 0, **settings: Any) -> EngineState:
    st = {"max_batch_tokens": 64, "prefill_chunk_tokens": 32, "kv_watermark_frac": 0.0}
    st.update(settings)
    eng = Engine(profile, acceptance or AcceptanceModel.fixed(0.7), wl, make_policy(policy, params or {}),
                 EngineSettings(**st), np.random.default_rng(seed))
    return eng.run()


# ---------------------------------------------------------------------------------------------
# tuning
# ---------------------------------------------------------------------------------------------


def tiny_tune_doc(name: str = "t", **over: Any) -> dict[str, Any]:
    """A fast tune spec: 24 requests, 4 users, no STS fit (~0.05 s per run); ``over`` replaces
    top-level keys."""
    doc = {
        "name": name,
        "base": {
            "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 4, "num_requests": 24},
            "engine": {"prefill": "disaggregated", "prefill_gpus": 4},
            "confidence": {"sts": "none"},
            "policy": {"name": "dspark", "gamma": 4},
        },
        "search_space": {
            "confidence.temperature": {"type": "float", "low": 0.5, "high": 3.0, "log": True},
            "policy.gamma": {"type": "int", "low": 1, "high": 6},
        },
        "seeds": [0, 1],
        "n_trials": 6,
        "sampler": {"name": "tpe", "seed": 0, "n_startup_trials": 4},
        "validation": {"top_k": 2, "num_seeds": 3},
    }
    doc.update(copy.deepcopy(over))
    return doc


def tiny_study_doc(seeds: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """A fast study: gfx1151 Llama-3.1-8B, 30 requests, concurrency 1 and 4, mtp1 and DSpark."""
    return {
        "name": "tiny",
        "base": {
            "hardware": {"profile": "gfx1151-llama31-8b-q4km-vulkan"},
            "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
            "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 1, "num_requests": 30},
            "engine": {"prefill": "disaggregated", "prefill_gpus": 4},
            "policy": {"name": "dspark"},
        },
        "sweep": {"workload.concurrency": [1, 4]},
        "policies": [{"name": "mtp1"}, {"name": "dspark", "gamma": 7}],
        "seeds": list(seeds),
    }


def assert_same_state(a: EngineState, b: EngineState) -> None:
    """Two runs agree to the last bit: every request array, counter and round-log column."""
    for name, va in vars(a).items():
        vb = getattr(b, name)
        if name == "rounds":
            assert va.keys() == vb.keys()
            for f in va:
                assert va[f].dtype == vb[f].dtype, f
                assert np.array_equal(va[f], vb[f], equal_nan=va[f].dtype.kind == "f"), f"rounds.{f}"
        elif isinstance(va, np.ndarray):
            assert np.array_equal(va, vb, equal_nan=va.dtype.kind == "f"), name
        else:
            assert va == vb or (va != va and vb != vb), name
