"""Issue 13's numba route, measured (not a test): what a compiled Algorithm 1 saves on a call, and
what numba costs a fresh process before the first call, next to the Cython kernels memtp_sim uses.

The engine's kernels are Cython (``memtp_sim/_kernels.pyx``); this script is the evidence for not
choosing numba, rerunnable on any machine. It writes a small numba kernel (Algorithm 1's global
search on an (R, gamma) round, the engine's default path) to a temporary folder with
``cache=True``, and prints:

1. per call: the numba kernel against memtp_sim's scan (``policies.dspark._schedule``) with its
   Cython kernel and with the numpy code (``memtp_sim._compiled.ENABLED = False``) on the same
   round, with a check that all choose the same lengths and Theta;
2. what passing a numpy Generator to a compiled function costs a call (numba unboxes it each
   time), against a call with one array;
3. a fresh process (machine code already in numba's on-disk cache): bare interpreter, ``import
   numba``, defining the kernel, and its first call; the sum is what every study worker, tuning
   worker and dashboard job would pay before its first round, next to the 1 s budget of a cold
   what-if point; and, for comparison, a fresh process importing the Cython extension.

    pip install numba            # not a memtp_sim dependency
    python benchmarks/bench_numba_route.py [--requests 8] [--gamma 7]

Exit code 2 with one line when numba is not installed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KERNEL = '''
import numpy as np
from numba import njit


@njit(cache=True)
def scan(vals, times, overhead_s):
    """Algorithm 1, global search: lengths and Theta of the best prefix of candidates by decreasing
    joint survival (ties in row-major order, as a stable sort)."""
    num_req, width = vals.shape
    a = np.empty(num_req * width)
    for r in range(num_req):
        s = 1.0
        for j in range(width):
            s *= vals[r, j]
            a[r * width + j] = s
    order = np.argsort(-a, kind="mergesort")
    n = min(order.size, times.size - 1)
    best, best_theta, tau = 0, num_req / (overhead_s + times[0]), 0.0
    for t in range(n):
        tau += a[order[t]]
        theta = (tau + num_req) / (overhead_s + times[t + 1])
        if theta > best_theta:
            best, best_theta = t + 1, theta
    lengths = np.zeros(num_req, dtype=np.int64)
    for t in range(best):
        lengths[order[t] // width] += 1
    return lengths, best_theta


@njit(cache=True)
def first_with_rng(rng, x):
    """Nothing but a numpy Generator passed in: what its unboxing costs a call."""
    return x[0]


@njit(cache=True)
def first(x):
    return x[0]
'''

COLD = [
    ("bare python", "pass"),
    ("import numba", "import numba"),
    ("+ define the kernel", "import numba, kernel"),
    ("+ its first call (cached machine code)",
     "import numpy as np, kernel; kernel.scan(np.full((2, 3), 0.5), np.ones(7), 0.0)"),
]


def best_s(fn, number: int, repeat: int = 5) -> float:
    """Best mean seconds per call of ``fn`` over ``repeat`` batches of ``number`` calls."""
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        out = min(out, (time.perf_counter() - t0) / number)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--requests", type=int, default=8, help="decoding requests in the round (R)")
    ap.add_argument("--gamma", type=int, default=7, help="drafted positions per request")
    args = ap.parse_args()
    try:
        import numba
    except ImportError:
        print("error: numba is not installed (pip install numba); this script measures it", file=sys.stderr)
        sys.exit(2)

    from memtp_sim import _compiled
    from memtp_sim.hardware import load_profile
    from memtp_sim.policies.dspark import _schedule

    work = Path(tempfile.mkdtemp(prefix="memtp-numba-"))
    (work / "kernel.py").write_text(KERNEL)
    sys.path.insert(0, str(work))
    import kernel  # noqa: E402 - written just above

    table = load_profile(None).sps
    vals = np.random.default_rng(0).random((args.requests, args.gamma))
    base_b, cap = args.requests, args.requests * args.gamma
    times = table.pass_time_range_s(base_b, base_b + cap)
    overhead_s = 0.002
    ours = _schedule(vals, None, table, False, 0, base_b + cap, overhead_s, None)
    lengths, theta = kernel.scan(vals, times, overhead_s)  # compiles (and caches) here
    same = lengths.tolist() == ours.lengths.tolist() and abs(theta - ours.theta) <= 1e-9 * ours.theta
    def ours_s() -> float:
        return best_s(lambda: _schedule(vals, None, table, False, 0, base_b + cap, overhead_s, None), 2000)

    t_cython = ours_s() if _compiled.kernels is not None else float("nan")
    _compiled.ENABLED = False
    try:
        same = same and _schedule(vals, None, table, False, 0, base_b + cap, overhead_s, None).lengths.tolist() \
            == ours.lengths.tolist()
        t_numpy = ours_s()
    finally:
        _compiled.ENABLED = True
    t_kernel = best_s(lambda: kernel.scan(vals, times, overhead_s), 2000)
    print(f"numba {numba.__version__}, one round of {args.requests} requests x {args.gamma} positions "
          f"(same lengths and Theta: {'yes' if same else 'NO'})")
    print(f"  memtp_sim scan (numpy)    {t_numpy * 1e6:8.2f} us a call")
    print(f"  memtp_sim scan (Cython)   {t_cython * 1e6:8.2f} us a call   x{t_numpy / t_cython:.1f}  (the call "
          "includes pricing the round's B range)")
    print(f"  numba kernel              {t_kernel * 1e6:8.2f} us a call   x{t_numpy / t_kernel:.1f}")

    # the round's draws come from numpy Generators (bit-identical inside numba for random() and
    # normal()), but handing one to a compiled function unboxes it on every call
    x, rng = np.ones(3), np.random.default_rng(0)
    kernel.first_with_rng(rng, x), kernel.first(x)
    t_rng = best_s(lambda: kernel.first_with_rng(rng, x), 20000)
    t_bare = best_s(lambda: kernel.first(x), 20000)
    print(f"  a call that takes a Generator {t_rng * 1e6:8.2f} us (one array only: {t_bare * 1e6:.2f} us); a round "
          "uses two Generators, so a compiled round needs its random numbers drawn outside it")

    print("a fresh process, kernel machine code already cached (best of 3):")
    prev = 0.0
    for label, code in COLD:
        wall = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], cwd=work, check=True)
            wall = min(wall, time.perf_counter() - t0)
        print(f"  {label:<40} {wall:6.3f} s   (+{max(0.0, wall - prev):.3f} s)")
        prev = wall
    print("the numba start-up above is paid by every process before its first round; a cold what-if "
          "point has 1 s in all (bench_engine.py)")
    wall = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy, memtp_sim._kernels"], check=True)
        wall = min(wall, time.perf_counter() - t0)
    print(f"for comparison, a fresh process importing numpy and memtp_sim's Cython kernels: {wall:.3f} s")


if __name__ == "__main__":
    main()
