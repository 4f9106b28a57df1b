"""Request workloads from real traces: replay, Poisson arrivals, closed loop.

A workload is a set of arrays (one entry per request). Three arrival modes:

* ``trace``: replay the trace's own arrival times, divided by ``rate_scale`` (0.1 = a tenth of
  the original rate; the raw Azure conversation trace, 5.5 req/s, is far beyond one Strix Halo).
* ``poisson``: exponential inter-arrival times at ``rate_per_s``; prompt/output lengths drawn
  (with replacement) from the trace rows.
* ``closed_loop``: ``concurrency`` users, each submitting its next request ``think_time_s``
  after the previous one completes (the DSpark paper's Fig. 8 x-axis); lengths drawn from the
  trace. Arrival times are then decided by the engine.

Traces are CSV files: Azure LLM inference 2023 (``TIMESTAMP, ContextTokens, GeneratedTokens``)
or Mooncake FAST'25 (``timestamp`` in ms, ``input_length``, ``output_length``). Mooncake
timestamps are effectively whole seconds; requests sharing one are replayed as a same-instant
batch (their order kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from ._io import MAX_EXACT_COUNT, disk_cached_arrays, file_digest, not_a_file
from .errors import ConfigError

__all__ = ["Trace", "Workload", "load_trace", "trace_replay_start", "build_workload"]


@dataclass(frozen=True)
class Trace:
    """A request trace, sorted by arrival: arrival offsets (s, from the earliest request, whatever
    the file's row order), prompt and output tokens (whole numbers >= 1).

    Attributes:
        path: the CSV file, resolved.
        arrival_s: ``(n,)`` float64 arrival offsets, seconds, non-decreasing.
        prompt_tokens: ``(n,)`` int64 prompt lengths, tokens.
        output_tokens: ``(n,)`` int64 generated lengths, tokens.
        format: ``"azure2023"`` or ``"mooncake"``.

    Source:
        Azure LLM inference trace 2023 (released with Splitwise, Patel et al. 2024, ISCA);
        Mooncake trace (Qin et al., FAST '25). DESIGN.md section 3 (workload row).
    """

    path: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    format: str

    def __len__(self) -> int:
        return int(self.arrival_s.size)


@dataclass(frozen=True)
class Workload:
    """Requests of one run (arrays of shape (n,)).

    Attributes:
        arrival_s: arrival time of each request, seconds from the start (NaN in closed loop).
        prompt_tokens: prompt length, tokens.
        output_tokens: tokens to generate (the request's max_tokens; generation stops there).
        domain: index into the acceptance model's domains.
        concurrency: closed-loop users (None for open loop).
        think_time_s: closed-loop pause between a completion and the user's next request.
        description: one line for reports.
        num_not_arrived: requests asked for (``num_requests``) that never arrived because a
            rate schedule ended first; counted so that no request disappears without a reason.

    Source:
        docs/model.md section 3 (replay with a rate scale, Poisson with trace lengths, closed
        loop of N users) and section 4 (conservation: ``num_not_arrived`` is reported).
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    domain: np.ndarray
    concurrency: int | None = None
    think_time_s: float = 0.0
    description: str = ""
    num_not_arrived: int = 0

    @property
    def num_requests(self) -> int:
        """Requests that arrive in this run (the arrays' length)."""
        return int(self.prompt_tokens.size)

    @property
    def closed_loop(self) -> bool:
        """True for a closed loop (``concurrency`` users; arrivals decided by the engine)."""
        return self.concurrency is not None


def _rows(p: Path, cols: list[str], path: str) -> pd.DataFrame:
    import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
    df = pd.read_csv(p, usecols=cols)
    if len(df) == 0:
        raise ConfigError(f"{path}: trace has a header but no rows")
    for c in cols:
        bad = df[c].isna()
        if bad.any():
            raise ConfigError(f"{path}: row {int(bad.to_numpy().argmax()) + 2}, column {c}: empty or non-numeric cell")
    return df


def _token_counts(df: pd.DataFrame, col: str, path: str) -> np.ndarray:
    """A token-count column as int64: every value a whole number in 1..2^53 (above that a CSV
    number is no exact count, and past 2^63 int64 would wrap to negative); row numbers count the
    header."""
    import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
    v = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(v) | (v < 1) | (v != np.round(v)) | (v > MAX_EXACT_COUNT)
    if bad.any():
        i = int(bad.argmax())
        raise ConfigError(f"{path}: row {i + 2}, column {col}: {df[col].iloc[i]} is not a whole number of "
                          "tokens >= 1 (and <= 2^53)")
    return v.astype(np.int64)


#: bump when _parse_trace changes what it returns (the on-disk cache is keyed by it)
_TRACE_CACHE_FORMAT = 2
_TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "format")


@lru_cache(maxsize=8)
def _read_trace(path: str, mtime_ns: int = 0, size: int = 0) -> Trace:  # stat in the key: an edited file reloads
    p = Path(path)
    why = not_a_file(path, "trace file")
    if why is not None:
        raise ConfigError(why)
    try:
        digest = file_digest(p)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read trace ({e.strerror})") from None
    # parsed once per machine and content: parsing imports pandas (~0.35 s, a third of a cold
    # what-if point) and reads every row
    cols = disk_cached_arrays("trace", (digest, _TRACE_CACHE_FORMAT), lambda: _parse_trace(p, path),
                              keys=_TRACE_COLUMNS)
    return Trace(str(p), cols["arrival_s"], cols["prompt_tokens"], cols["output_tokens"], str(cols["format"]))


def _parse_trace(p: Path, path: str) -> dict[str, np.ndarray]:
    """The trace's columns, sorted by arrival (see :func:`load_trace`)."""
    import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
    try:
        head = pd.read_csv(p, nrows=0).columns.tolist()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read trace ({e.strerror})") from None
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise ConfigError(f"{path}: not a readable CSV trace ({e.__class__.__name__})") from None
    try:
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= set(head):
            df = _rows(p, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path)
            ts = pd.to_datetime(df["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f", errors="coerce")
            if ts.isna().any():  # whole seconds, as a user's own trace may write them
                ts = ts.fillna(pd.to_datetime(df["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S", errors="coerce"))
            if ts.isna().any():
                i = int(ts.isna().to_numpy().argmax())
                raise ConfigError(f"{path}: row {i + 2}, column TIMESTAMP: {df['TIMESTAMP'].iloc[i]!r} is not a "
                                  "time like 2023-11-16 18:15:46.6805900 (the fraction of a second optional)")
            arr = (ts - ts.min()).dt.total_seconds().to_numpy()
            cols, fmt = ("ContextTokens", "GeneratedTokens"), "azure2023"
        elif {"timestamp", "input_length", "output_length"} <= set(head):
            df = _rows(p, ["timestamp", "input_length", "output_length"], path)
            stamp = pd.to_numeric(df["timestamp"], errors="coerce").to_numpy(dtype=np.float64)
            if not np.isfinite(stamp).all():
                i = int((~np.isfinite(stamp)).argmax())
                raise ConfigError(f"{path}: row {i + 2}, column timestamp: {df['timestamp'].iloc[i]!r} is not a "
                                  "number of milliseconds")
            arr = (stamp - stamp.min()) / 1000.0
            cols, fmt = ("input_length", "output_length"), "mooncake"
        else:
            raise ConfigError(
                f"{path}: unknown trace columns {head}; expected Azure (TIMESTAMP, ContextTokens, "
                "GeneratedTokens) or Mooncake (timestamp, input_length, output_length)"
            )
        prompt, out = _token_counts(df, cols[0], path), _token_counts(df, cols[1], path)
    except (ValueError, TypeError, IndexError, pd.errors.ParserError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{path}: trace rows could not be parsed ({e.__class__.__name__}: {str(e)[:80]})") from None
    # arrivals are measured from the earliest request, whatever the row order; replay in time order
    order = np.argsort(arr, kind="stable")
    return {"arrival_s": arr[order], "prompt_tokens": prompt[order], "output_tokens": out[order],
            "format": np.array(fmt)}


def load_trace(path: str | Path) -> Trace:
    """Read a trace CSV (cached per path, modification time and size).

    Args:
        path: an Azure LLM inference 2023 CSV (``TIMESTAMP, ContextTokens, GeneratedTokens``) or
            a Mooncake CSV (``timestamp`` in ms, ``input_length``, ``output_length``).

    Returns:
        The :class:`Trace`, sorted by arrival (stable, so same-instant rows keep their order).

    Raises:
        ConfigError: missing or unreadable file (or a folder), unknown columns, or a row whose timestamp or
            token count does not parse (message names the row and column).

    Source:
        The column layouts of the Azure 2023 trace (Patel et al. 2024, Splitwise) and of the
        Mooncake trace (Qin et al., FAST '25).
    """
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError:
        return _read_trace(str(p))  # reports the missing / unreadable file
    return _read_trace(str(p), st.st_mtime_ns, st.st_size)


def trace_replay_start(trace: Trace, num_requests: int, start_offset_s: float = 0.0) -> int:
    """Index of the first row a trace replay of ``num_requests`` from ``start_offset_s`` uses.

    One check for load time (:class:`memtp_sim.config.WorkloadConfig`) and run time
    (:func:`build_workload`), so a replay the trace cannot fill is refused before any run starts.

    Args:
        trace: the trace.
        num_requests: requests the replay takes, in arrival order.
        start_offset_s: skip requests that arrived earlier than this (trace time, s).

    Returns:
        The row index (the rows ``first .. first + num_requests - 1`` are replayed).

    Raises:
        ConfigError: ``start_offset_s`` lies past the trace's last arrival, or fewer than
            ``num_requests`` rows arrive from it on; one line naming the trace, the field and
            what is allowed.
    """
    first = int(np.searchsorted(trace.arrival_s, start_offset_s))
    left = len(trace) - first
    if left == 0:
        last = float(trace.arrival_s[-1])
        # repr, not :g: six digits can round the limit above the value refused (8.464985 -> 8.46499)
        raise ConfigError(f"start_offset_s: {float(start_offset_s)!r} s is past the last arrival of {trace.path} "
                          f"({last!r} s); allowed: <= {last!r}")
    if left < num_requests:
        raise ConfigError(f"num_requests: {trace.path} has only {left} request{'s' * (left != 1)} from "
                          f"start_offset_s={float(start_offset_s)!r} on, {num_requests} requested; allowed: <= {left}"
                          + (" (or an earlier start_offset_s)" if first else ""))
    return first


def _piecewise_poisson(rng: np.random.Generator, n: int, schedule: list[tuple[float, float]]) -> np.ndarray:
    """Arrival times (at most ``n``) of a Poisson process with a piecewise-constant rate.

    Time rescaling: unit-rate exponential gaps give arrival "mass" coordinates, mapped back to
    time through the inverse of the cumulative rate. Arrivals after the schedule ends are dropped.
    """
    durations = np.array([d for d, _ in schedule], dtype=np.float64)
    rates = np.array([r for _, r in schedule], dtype=np.float64)
    edges = np.concatenate(([0.0], np.cumsum(durations * rates)))  # cumulative expected arrivals
    starts = np.concatenate(([0.0], np.cumsum(durations)))
    mass = np.cumsum(rng.exponential(1.0, size=n))
    mass = mass[mass < edges[-1]]
    # side="right" skips zero-rate segments (their mass interval is empty)
    seg = np.searchsorted(edges, mass, side="right") - 1
    return starts[seg] + (mass - edges[seg]) / rates[seg]


def build_workload(
    trace: Trace,
    *,
    mode: str,
    num_requests: int,
    rng: np.random.Generator,
    domain_probs: np.ndarray,
    rate_scale: float = 1.0,
    rate_per_s: float | None = None,
    rate_schedule: list[tuple[float, float]] | None = None,
    concurrency: int | None = None,
    think_time_s: float = 0.0,
    start_offset_s: float = 0.0,
) -> Workload:
    """Draw a workload of ``num_requests`` from ``trace``.

    Args:
        trace: the trace whose arrivals (trace mode) or lengths (other modes) are used.
        mode: ``"trace"``, ``"poisson"`` or ``"closed_loop"``.
        num_requests: requests to draw, >= 1.
        rng: the workload's own generator (domains, lengths, arrival gaps).
        domain_probs: probability of each acceptance domain, shape (n_domains,), sums to 1.
        rate_scale: trace mode: arrival rate multiplier (times are divided by it).
        rate_per_s: poisson mode: mean arrival rate, requests per second.
        rate_schedule: poisson mode: ``[(duration_s, rate_per_s), ...]`` piecewise-constant rate
            (a load ramp); arrivals stop at the end of the schedule, so ``num_requests`` is then
            an upper bound.
        concurrency: closed-loop users.
        think_time_s: closed loop: seconds between a completion and that user's next request.
        start_offset_s: trace mode: skip requests that arrived earlier than this (trace time).

    Returns:
        A :class:`Workload` of ``(n,)`` arrays (``n <= num_requests`` under a rate schedule, the
        rest counted in ``num_not_arrived``).

    Raises:
        ConfigError: the trace has fewer rows than requested from ``start_offset_s`` on
            (:func:`trace_replay_start`); a poisson mode without a schedule and ``rate_per_s``
            missing or <= 0; a closed loop with ``concurrency`` missing or < 1; an unknown ``mode``.

    Source:
        docs/model.md section 3 (the three modes); Poisson arrivals as i.i.d. exponential gaps;
        a ramp by inverting the cumulative rate (the time-rescaling construction of a
        non-homogeneous Poisson process); closed loop as the x-axis of DSpark paper Fig. 8
        (concurrent requests).
    """
    n = int(num_requests)
    domain = rng.choice(domain_probs.size, size=n, p=domain_probs)
    if mode == "trace":
        first = trace_replay_start(trace, n, start_offset_s)
        sl = slice(first, first + n)
        arrival = (trace.arrival_s[sl] - trace.arrival_s[first]) / rate_scale
        return Workload(arrival, trace.prompt_tokens[sl].copy(), trace.output_tokens[sl].copy(), domain,
                        description=f"trace replay x{rate_scale:g} of {Path(trace.path).name}")
    idx = rng.integers(0, len(trace), size=n)
    prompt, out = trace.prompt_tokens[idx], trace.output_tokens[idx]
    if mode == "poisson":
        if rate_schedule:
            arrival = _piecewise_poisson(rng, n, rate_schedule)
            prompt, out, domain = prompt[: arrival.size], out[: arrival.size], domain[: arrival.size]
            desc = "Poisson ramp " + " -> ".join(f"{r:g}/s x {d:g}s" for d, r in rate_schedule)
        else:
            if rate_per_s is None or rate_per_s <= 0:
                raise ConfigError(f"workload.rate_per_s: must be > 0 in poisson mode, got {rate_per_s}")
            arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
            arrival -= arrival[0]
            desc = f"Poisson {rate_per_s:g} req/s"
        return Workload(arrival, prompt, out, domain, description=f"{desc}, lengths from {Path(trace.path).name}",
                        num_not_arrived=n - int(arrival.size))
    if mode == "closed_loop":
        if concurrency is None or concurrency < 1:
            raise ConfigError(f"workload.concurrency: must be >= 1 in closed_loop mode, got {concurrency}")
        return Workload(np.full(n, np.nan), prompt, out, domain, concurrency=int(concurrency),
                        think_time_s=float(think_time_s),
                        description=f"closed loop, {concurrency} users, lengths from {Path(trace.path).name}")
    raise ConfigError(f"workload.mode: unknown mode {mode!r}; choose trace, poisson or closed_loop")
