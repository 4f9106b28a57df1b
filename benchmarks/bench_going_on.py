"""Same-run A/B (not a test): what blocks that go on past completions and remote prefills' ends
buy, against blocks that stop at each of them (``Engine._absorb_setup`` returning None: the
engine's path before this shortcut; the same answers bit for bit, checked here).

DSpark and no speculation at 64 closed-loop users on remote prefill GPUs (bench_engine.py's
400-request scenario). The two ways take turns, best of ``--repeat`` runs each in each of
``--turns`` turns, so a slow spell of a shared machine falls on both.

    python benchmarks/bench_going_on.py [--requests 400] [--repeat 5] [--turns 4]
"""

from __future__ import annotations

import argparse

from bench_engine import best_of, same_answers, scenario

from memtp_sim.engine import Engine


def main() -> None:
    """Parse the options, time both ways of each policy in turns, print the ratios."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each way in a turn (best kept)")
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args()
    going_on = Engine._absorb_setup
    ways = {"going on": going_on, "stopping": lambda self: None}
    for policy in ("dspark", "no_spec"):
        scen = scenario({"name": policy}, 64, args.requests)
        best, answers = dict.fromkeys(ways, float("inf")), {}
        try:
            for _ in range(args.turns):
                for way, setup in ways.items():
                    Engine._absorb_setup = setup
                    wall, answers[way] = best_of(scen, args.repeat)
                    best[way] = min(best[way], wall)
        finally:
            Engine._absorb_setup = going_on
        same_answers(answers["going on"], answers["stopping"], f"{policy}: blocks going on past completions")
        print(f"{policy:8s} 64 users, {args.requests} requests: going on {best['going on'] * 1e3:.2f} ms, "
              f"stopping {best['stopping'] * 1e3:.2f} ms a run: x{best['stopping'] / best['going on']:.2f}")


if __name__ == "__main__":
    main()
