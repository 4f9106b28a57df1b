"""Engine speed benchmark (not a test): how fast memtp_sim simulates serving traffic.

For DSpark at closed-loop concurrency 1, 16 and 64 (gfx1151 default profile, Azure 2023
conversation trace, disaggregated prefill as in studies/load.yaml) it prints simulated output
tokens per wall second, engine rounds per wall second and simulated seconds per wall second. The
baseline, measured in the same run on the same workload, is the no-speculation policy: the ratio
says what DSpark's per-round work (drafting confidences, Algorithm 1, acceptance sampling) costs on
top of the bare engine loop.

    python benchmarks/bench_engine.py [--requests 400] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from memtp_sim import run
from memtp_sim.config import Scenario

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure2023_conv.csv"


def scenario(policy: dict, concurrency: int, requests: int) -> Scenario:
    return Scenario.model_validate({
        "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": concurrency,
                     "num_requests": requests},
        "engine": {"prefill": "disaggregated", "prefill_gpus": 4},
        "policy": policy,
    })


def best_of(scen: Scenario, repeat: int) -> tuple[float, dict]:
    best, metrics = float("inf"), {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = run(scen, seed=0)
        wall = time.perf_counter() - t0
        if wall < best:
            best, metrics = wall, res.metrics
    return best, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3, help="best of N wall times")
    args = ap.parse_args()
    run(scenario({"name": "dspark"}, 4, 20), seed=0)  # warm caches (profile, trace, STS fit)
    print(f"{'conc':>5} {'policy':>8} {'wall_s':>7} {'sim_s':>8} {'sim_x_real':>10} {'out_tok/wall_s':>15} "
          f"{'rounds/wall_s':>14} {'us/round':>9} {'cost/round vs no_spec':>22}")
    for conc in (1, 16, 64):
        base_wall, base = best_of(scenario({"name": "no_spec"}, conc, args.requests), args.repeat)
        wall, m = best_of(scenario({"name": "dspark"}, conc, args.requests), args.repeat)
        for name, w, mm in (("no_spec", base_wall, base), ("dspark", wall, m)):
            us = w / mm["num_rounds"] * 1e6
            ratio = us / (base_wall / base["num_rounds"] * 1e6)
            print(f"{conc:>5} {name:>8} {w:7.2f} {mm['makespan_s']:8.0f} {mm['makespan_s'] / w:10.0f} "
                  f"{mm['output_tokens_total'] / w:15.0f} {mm['num_rounds'] / w:14.0f} {us:9.0f} {ratio:22.2f}")


if __name__ == "__main__":
    main()
