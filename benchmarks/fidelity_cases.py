"""Reproduce the predicted columns of docs/fidelity.md: the simulator against public speculative-
decoding measurements on Strix Halo (gfx1151). Not a test.

Each case is one public end-to-end measurement: a model decoding with and without speculation
(MTP drafting, draft length k) on one Radeon 8060S, one request at a time, with the acceptance the
source reports. For each case the simulator runs the closest scenario it can express: closed loop,
concurrency 1, ``acceptance: {alpha: a}`` with ``a`` solved from the reported acceptance (below),
``policy: {name: static, k: k}`` with ``drafter: {kind: mtp}`` against ``policy: {name: no_spec}``,
so only the cost model differs from the source. The predicted speedup is the ratio of the two runs'
mean tok/s per user (decode only, as llama-server's ``predicted_per_second`` is).

Columns (profiles):

* ``hip32``: shipped ``gfx1151-qwen3-32b-q8-hip`` (dense 32B Q8_0, llama.cpp HIP, b5863, 2025);
* ``vk8``: shipped ``gfx1151-llama31-8b-q4km-vulkan`` (dense 8B Q4_K_M, Vulkan AMDVLK, b5863);
* ``moe``: for MoE targets, the shipped MoE curve of the source's backend with ~3B active
  parameters (HIP: Qwen3-30B-A3B Q4_K_XL b6077; Vulkan: gpt-oss-20b MXFP4 b6118), when shipped;
* ``closest``: dense targets: the shipped dense profile with the source's backend (HIP/ROCm ->
  hip32, Vulkan -> vk8); MoE targets: ``moe`` (else the dense rule);
* ``matched``: a profile of the source's own model and build from public llama-bench rows
  (``docs/fidelity/profiles/``, not shipped; see the YAML comments for what each one lacks).

Acceptance: llama.cpp reports ``accept_rate`` = accepted / drafted tokens. With full drafts of k
tokens and i.i.d. per-position acceptance ``a`` the expected rate is
``a (1 - a^k) / ((1 - a) k)`` (accepted prefix length over k; Leviathan et al. 2023), so ``a`` is
solved from it by bisection; the script prints the simulated rate next to the reported one.

    python benchmarks/fidelity_cases.py [--requests 45] [--seeds 0 1 2] [--csv out.csv]

Sources are named per case in ``CASES`` (URLs and the files the numbers were read from).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from memtp_sim.api import run
from memtp_sim.config import Scenario
from memtp_sim.hardware import list_profiles

REPO = Path(__file__).resolve().parents[1]
MATCHED = REPO / "docs" / "fidelity" / "profiles"
SHIPPED = {"hip32": "gfx1151-qwen3-32b-q8-hip", "vk8": "gfx1151-llama31-8b-q4km-vulkan"}
#: The closest shipped MoE curve per backend (3B-class active parameters), used when present: the
#: gfx1151 collection profiles (calibration/gfx1151/build_profiles.py) are being added while this is written.
SHIPPED_MOE = {"hip": "gfx1151-qwen3-30b-a3b-q4kxl-hip-rocwmma-hipblaslt-fa-b6077",
               "vulkan": "gfx1151-gpt-oss-20b-mxfp4-vulkan-amdvlk-b6118"}

KYUZ0 = ("https://github.com/kyuz0/amd-strix-halo-toolboxes/tree/main/benchmark/results-mtp (read at "
         "st3v0rr/amd-strix-halo-toolboxes@25af6b50 / @3f132ee9, docs/mtp-summary.json @35cab13a)")
HALO25 = "https://github.com/halo-box/strix-llama.cpp/issues/25 (comment of 2026-09-07, mainline d08c787)"


@dataclass(frozen=True)
class Case:
    """One public measurement.

    Attributes:
        key: short id.
        model: model and quant as the source names them.
        backend: ``hip`` or ``vulkan``.
        k: draft tokens per round (``--spec-draft-n-max``).
        base_tok_s: decode tok/s without speculation.
        spec_tok_s: decode tok/s with speculation.
        accept_rate: accepted / drafted draft tokens (llama.cpp's ``accept_rate``).
        tau: measured tokens per round incl. the bonus token, where the source gives the counts.
        matched: profile YAML under docs/fidelity/profiles for the ``matched`` column, or "".
        output_tokens: tokens generated per request in the source's runs.
        source: where the numbers are.
    """

    key: str
    model: str
    backend: str
    k: int
    base_tok_s: float
    spec_tok_s: float
    accept_rate: float
    tau: float
    matched: str
    output_tokens: int
    source: str


def _tau(predicted: int, requests: int, accepted: int) -> float:
    # every request's first token comes from prefill; each later round emits 1 + accepted tokens
    decoded = predicted - requests
    return decoded / (decoded - accepted)


# kyuz0 run_mtp_bench.py: llama-server -c 12288 -ngl 999 --no-mmap -fa 1 --jinja [--spec-type draft-mtp
# --spec-draft-n-max k -np 1], 9 prompts x 192 tokens (mtp-bench.py), Framework Desktop 128 GB, Fedora
# 43, kernel 6.19.12, 2026-05-15. tok/s = mean over the 9 prompts of predicted_per_second.
CASES = [
    Case("kyuz0-27b-rocm-k2", "Qwen3.6-27B UD-Q8_K_XL (dense)", "hip", 2, 6.5, 12.4, 0.7971,
         _tau(1728, 9, 1053), "qwen36-27b-q8kxl-rocm723.yaml", 192, KYUZ0),
    Case("kyuz0-27b-rocm-k3", "Qwen3.6-27B UD-Q8_K_XL (dense)", "hip", 3, 6.5, 13.5, 0.7440,
         _tau(1728, 9, 1183), "qwen36-27b-q8kxl-rocm723.yaml", 192, KYUZ0),
    Case("kyuz0-27b-vulkan-k2", "Qwen3.6-27B UD-Q8_K_XL (dense)", "vulkan", 2, 6.3, 11.7, 0.8024,
         _tau(1728, 9, 1056), "qwen36-27b-q8kxl-vulkan-radv.yaml", 192, KYUZ0),
    Case("kyuz0-27b-vulkan-k3", "Qwen3.6-27B UD-Q8_K_XL (dense)", "vulkan", 3, 6.3, 13.3, 0.7301,
         _tau(1728, 9, 1177), "qwen36-27b-q8kxl-vulkan-radv.yaml", 192, KYUZ0),
    Case("kyuz0-35b-rocm-k2", "Qwen3.6-35B-A3B UD-Q4_K_XL (MoE)", "hip", 2, 48.7, 64.5, 0.7958,
         _tau(1728, 9, 1052), "qwen36-35b-a3b-q4kxl-rocm723.yaml", 192, KYUZ0),
    Case("kyuz0-35b-rocm-k3", "Qwen3.6-35B-A3B UD-Q4_K_XL (MoE)", "hip", 3, 48.7, 68.3, 0.7386,
         _tau(1728, 9, 1178), "qwen36-35b-a3b-q4kxl-rocm723.yaml", 192, KYUZ0),
    Case("kyuz0-35b-vulkan-k2", "Qwen3.6-35B-A3B UD-Q4_K_XL (MoE)", "vulkan", 2, 58.7, 72.8, 0.7907,
         _tau(1728, 9, 1050), "qwen36-35b-a3b-q4kxl-vulkan-radv.yaml", 192, KYUZ0),
    Case("kyuz0-35b-vulkan-k3", "Qwen3.6-35B-A3B UD-Q4_K_XL (MoE)", "vulkan", 3, 58.7, 74.6, 0.7374,
         _tau(1728, 9, 1182), "qwen36-35b-a3b-q4kxl-vulkan-radv.yaml", 192, KYUZ0),
    # issue 25: llama-server -ngl 999 -c 8192 --flash-attn on --parallel 1 --spec-type draft-mtp
    # --spec-draft-n-max 4, 3-prompt translation workload, 3 runs: 24.0 / 24.2 / 24.6 tok/s; acceptance
    # 0.575, mean accepted length 3.30. No-speculation baseline: PR 27's pp1 on the same build
    # (ggml-org d08c787, Vulkan RADV): 11.9 t/s. Output length not stated: 192 assumed.
    Case("halo-box-25-27b-vulkan-k4", "Qwen3.8-27B UD-Q4_K_XL (dense)", "vulkan", 4, 11.9, 24.27, 0.575, 3.30,
         "qwen38-27b-q4kxl-vulkan-d08c787.yaml", 192,
         HALO25 + "; baseline https://github.com/halo-box/strix-llama.cpp/pull/27 (pp1, upstream d08c787)"),
]


def alpha_for(rate: float, k: int) -> float:
    """i.i.d. per-position acceptance ``a`` whose expected accepted / drafted over full drafts of k
    tokens is ``rate``: ``a (1 - a^k) / ((1 - a) k) = rate`` (increasing in ``a``; bisection)."""
    lo, hi = 1e-6, 1 - 1e-9
    for _ in range(100):
        a = (lo + hi) / 2
        r = a * (1 - a ** k) / ((1 - a) * k)
        lo, hi = (a, hi) if r < rate else (lo, a)
    return (lo + hi) / 2


def _trace(folder: Path, output_tokens: int) -> Path:
    """Nine requests of 100 prompt tokens and ``output_tokens`` generated (Azure 2023 CSV layout)."""
    p = folder / f"trace_{output_tokens}.csv"
    rows = "".join(f"2026-05-15 10:00:{i:02d}.0000000,100,{output_tokens}\n" for i in range(9))
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return p


def scenario(profile: str, trace: Path, alpha: float, k: int, requests: int) -> Scenario:
    """The case's scenario: one request at a time; k = 0 is the no-speculation run.

    The YAML equivalent (docs/fidelity.md)::

        hardware: {profile: gfx1151-qwen3-32b-q8-hip}
        acceptance: {alpha: 0.8787}
        workload: {trace: trace_192.csv, mode: closed_loop, concurrency: 1, num_requests: 45}
        engine: {max_batch_tokens: 512, prefill_chunk_tokens: 256}
        drafter: {kind: mtp}
        policy: {name: static, k: 2}        # or {name: no_spec} (then no drafter section)
    """
    top = 8 if "d08c787" in profile else 512  # the matched halo-box curve is measured up to B = 8
    doc = {"hardware": {"profile": profile}, "acceptance": {"alpha": alpha},
           "workload": {"trace": str(trace), "mode": "closed_loop", "concurrency": 1, "num_requests": requests},
           "engine": {"max_batch_tokens": top, "prefill_chunk_tokens": top // 2},
           "policy": {"name": "static", "k": k} if k else {"name": "no_spec"}}
    if k:
        doc["drafter"] = {"kind": "mtp"}
    return Scenario.model_validate(doc)


def predict(case: Case, profile: str, trace: Path, requests: int, seeds: list[int]) -> dict[str, float]:
    """Simulated speedup, tokens per round and acceptance rate of one case on one profile (seed means)."""
    a = alpha_for(case.accept_rate, case.k)
    base, spec, tau, acc = [], [], [], []
    for seed in seeds:
        base.append(run(scenario(profile, trace, a, 0, requests), seed=seed).metrics["tok_per_s_user_mean"])
        m = run(scenario(profile, trace, a, case.k, requests), seed=seed).metrics
        spec.append(m["tok_per_s_user_mean"])
        tau.append(m["tau"])
        acc.append(m["acceptance_rate"])
    speedup = float(np.mean(spec) / np.mean(base))
    return {"alpha": a, "speedup": speedup, "tau": float(np.mean(tau)), "accept_rate": float(np.mean(acc)),
            "round_cost": float(np.mean(tau)) / speedup}


def run_cases(requests: int, seeds: list[int]) -> pd.DataFrame:
    """Every case on every profile column; one row per case."""
    rows = []
    shipped = set(list_profiles())
    with tempfile.TemporaryDirectory() as tmp:
        for c in CASES:
            trace = _trace(Path(tmp), c.output_tokens)
            measured = c.spec_tok_s / c.base_tok_s
            row = {"case": c.key, "model": c.model, "backend": c.backend, "k": c.k, "accept_rate": c.accept_rate,
                   "measured_speedup": measured, "measured_tau": c.tau, "measured_round_cost": c.tau / measured}
            moe = SHIPPED_MOE[c.backend] if "MoE" in c.model and SHIPPED_MOE[c.backend] in shipped else ""
            for col, prof in (("hip32", SHIPPED["hip32"]), ("vk8", SHIPPED["vk8"]), ("moe", moe),
                              ("matched", str(MATCHED / c.matched) if c.matched else "")):
                if not prof:
                    continue
                p = predict(c, prof, trace, requests, seeds)
                row |= {f"{col}_speedup": p["speedup"], f"{col}_round_cost": p["round_cost"],
                        f"{col}_sim_accept_rate": p["accept_rate"]}
                row["alpha"] = p["alpha"]
            closest = "moe" if moe else "hip32" if c.backend == "hip" else "vk8"
            row |= {"closest": closest, "closest_speedup": row[f"{closest}_speedup"]}
            rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("hip32", "vk8", "moe", "closest", "matched"):
        if f"{col}_speedup" not in df:
            df[f"{col}_speedup"] = df[f"{col}_round_cost"] = np.nan
        df[f"{col}_ape"] = (df[f"{col}_speedup"] / df["measured_speedup"] - 1.0).abs()
    return df


def summary(df: pd.DataFrame) -> str:
    """The table and MAPEs docs/fidelity.md quotes."""
    cols = ["case", "k", "accept_rate", "alpha", "hip32_sim_accept_rate", "measured_speedup", "closest",
            "closest_speedup", "hip32_speedup", "vk8_speedup", "moe_speedup", "matched_speedup", "measured_round_cost",
            "hip32_round_cost", "vk8_round_cost", "moe_round_cost", "matched_round_cost"]
    lines = [df[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"), ""]
    dense = df["model"].str.contains("dense")
    for col in ("closest", "hip32", "vk8", "moe", "matched"):
        lines.append(f"MAPE {col:8}: all {df[f'{col}_ape'].mean() * 100:5.1f}%   dense {df.loc[dense, f'{col}_ape'].mean() * 100:5.1f}%"
                     f"   MoE {df.loc[~dense, f'{col}_ape'].mean() * 100:5.1f}%")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=45, help="requests per run (default 45: the 9 prompts x 5)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--csv", help="also write the full table here")
    args = ap.parse_args()
    df = run_cases(args.requests, args.seeds)
    pd.set_option("display.width", 250)
    print(summary(df))
    if args.csv:
        df.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
