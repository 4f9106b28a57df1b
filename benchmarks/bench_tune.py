"""Tuning speed benchmark (not a test): how many trials of the shipped tune study run per minute.

Runs ``N`` trials (default 100) of ``studies/tune.yaml`` into a fresh SQLite study in a temporary
folder, with ``--workers`` local worker processes (default 2, the CI machine's cores), and prints
the wall time and trials per minute. The fresh-seed validation and the report are timed
separately (``--with-validation``); the target is 100 trials in under 10 minutes on 2 cores.

    python benchmarks/bench_tune.py [--trials 100] [--workers 2] [--with-validation]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import optuna

from memtp_sim.tuning import load_tune_spec, run_tune, top_trials, validate_trials, write_tune_report

SPEC = Path(__file__).resolve().parents[1] / "studies" / "tune.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--with-validation", action="store_true", help="also time the fresh-seed validation and report")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_tune_spec(args.spec)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        out = run_tune(spec, n_trials=args.trials, workers=args.workers, out_dir=tmp, validate=False, report=False)
        wall = time.perf_counter() - t0
        print(f"{spec.name}: {out.complete} trials x {len(spec.seeds)} replicates, {args.workers} worker(s), "
              f"{os.cpu_count()} CPU(s): {wall:.1f} s wall = {out.complete / wall * 60:.1f} trials/minute")
        if args.with_validation:
            study = optuna.load_study(study_name=spec.name, storage=f"sqlite:///{Path(tmp) / spec.name / 'optuna.db'}")
            t1 = time.perf_counter()
            chosen = [t.number for t in top_trials(study, spec, spec.validation.top_k)]
            validate_trials(study, spec, chosen, out_dir=tmp)
            t2 = time.perf_counter()
            write_tune_report(study, spec, Path(tmp) / "report.html")
            t3 = time.perf_counter()
            print(f"validation of {len(chosen)} trials x {len(spec.fresh_seeds)} fresh seeds: {t2 - t1:.1f} s; "
                  f"report: {t3 - t2:.1f} s")


if __name__ == "__main__":
    main()
