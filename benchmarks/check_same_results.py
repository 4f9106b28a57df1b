"""Check that a study gives the same runs.csv as a saved reference (a refactoring must not change results).

Usage:
    python benchmarks/check_same_results.py save    studies/load.yaml REF.csv   # before the change
    python benchmarks/check_same_results.py compare studies/load.yaml REF.csv   # after it

Runs are matched by their labels (sweep values, policy) and seed, not by run id or row order; every
numeric metric must agree to a relative 1e-9 (bit-for-bit in practice: same seeds, same random
streams). Exits 1 and lists the first differences otherwise; exits 2 with one line on bad input (a
study the loader refuses, a missing reference), as `python -m memtp_sim run` does.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from memtp_sim.config import load_study
from memtp_sim.errors import CalibrationError, ConfigError
from memtp_sim.study import run_study


def _runs(study_path: str) -> pd.DataFrame:
    study = load_study(study_path)
    with tempfile.TemporaryDirectory() as tmp:
        table = run_study(study, out_dir=tmp, source=study_path).table
    return table


def _key_columns(df: pd.DataFrame, study_path: str) -> list[str]:
    return [k for k in load_study(study_path).label_keys] + ["policy", "seed"]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("save", "compare"):
        print(__doc__)
        return 2
    mode, study_path, ref = argv
    if mode == "compare" and not Path(ref).is_file():  # before the runs: they take minutes
        print(f"error: {ref}: reference not found (make it with: save {study_path} {ref})", file=sys.stderr)
        return 2
    try:
        table = _runs(study_path)
    except (ConfigError, CalibrationError) as e:  # bad input, one line, not "different" (exit 1)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if mode == "save":
        table.to_csv(ref, index=False)
        print(f"saved {len(table)} runs to {ref}")
        return 0
    old = pd.read_csv(ref)
    new = pd.read_csv(pd.io.common.StringIO(table.to_csv(index=False)))  # same dtypes as a CSV round trip
    keys = _key_columns(new, study_path)
    old, new = old.set_index(keys).sort_index(), new.set_index(keys).sort_index()
    problems = []
    if set(old.index) != set(new.index):
        problems.append(f"different runs: only before {sorted(set(old.index) - set(new.index))[:5]}, "
                        f"only after {sorted(set(new.index) - set(old.index))[:5]}")
    cols = [c for c in old.columns if c != "run_id" and c in new.columns]
    missing = [c for c in old.columns if c != "run_id" and c not in new.columns]
    if missing:
        problems.append(f"metrics missing after: {missing}")
    common = old.index.intersection(new.index)
    for c in cols:
        a, b = old.loc[common, c], new.loc[common, c]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            bad = ~np.isclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-9, atol=0.0, equal_nan=True)
        else:
            bad = (a.astype(str) != b.astype(str)).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            was, now = (x.item() if isinstance(x, np.generic) else x for x in (a.iloc[i], b.iloc[i]))  # 20, not np.int64(20)
            problems.append(f"{c}: {int(bad.sum())} runs differ, e.g. {common[i]}: {was!r} -> {now!r}")
    if problems:
        print("DIFFERENT:\n  " + "\n  ".join(problems))
        return 1
    print(f"same: {len(common)} runs, {len(cols)} columns agree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
