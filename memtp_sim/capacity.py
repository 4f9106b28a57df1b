"""SLA capacity: the highest Poisson request rate at which a scenario meets a service-level objective.

An :class:`SLO` is one or more terms ``metric <= bound`` / ``metric >= bound`` on run metrics
(any name of :data:`memtp_sim.metrics.METRIC_NAMES`, in the metric's own units), all of which must
hold (AND). Parsed from strings such as ``"ttft_s_p90 <= 2"``, ``"tpot_ms_p90 <= 50"`` or
``"ttft_s_p90 <= 2 AND tpot_ms_p90 <= 50"``.

:func:`sla_capacity` searches over the arrival rate (requests per second) of an open-loop Poisson
workload built from the scenario's trace lengths (see :func:`poisson_scenario`):

1. **Unloaded run.** One closed-loop run with a single user (:data:`UNLOADED_REQUESTS` requests,
   the first seed) gives ``W0``, the mean end-to-end time of a request served alone, seconds.
   Terms on metrics that can only get worse with load (:data:`LOAD_MONOTONE`: TTFT, TPOT,
   end-to-end and queueing time ``<= bound``; per-user tok/s ``>= bound``) are judged on it
   first: one that fails there fails at every rate, so the search stops at once with status
   ``no_passing_rate`` and a note such as ``ttft_s_p90 = 6.64 > 2 even unloaded``. (The unloaded
   percentiles rest on its :data:`UNLOADED_REQUESTS` requests: a bound within their sampling
   noise of the unloaded value may be judged either way.)
2. **Start rate** ``sqrt(N) / W0`` req/s, ``N`` the engine's running-request limit: the geometric
   middle between the one-request-at-a-time bound ``1 / W0`` and the perfect-batching bound
   ``N / W0``.
3. **Bracket** by doubling (while the rate passes) or halving (while it fails) until one rate
   passes and the next fails (at most :data:`MAX_DOUBLINGS` / :data:`MAX_HALVINGS` steps).
   Halving stops early (status ``no_passing_rate``) when a failing term on a metric outside
   :data:`LOAD_MONOTONE` (acceptance rate, throughput, ...) came no closer to its bound over the
   last :data:`NO_GAIN_HALVINGS` halvings (by :data:`NO_GAIN_FRAC` of its gap): lower load does
   not make it better, so no lower rate meets it.
4. **Bisection on log rate**: the geometric midpoint of the bracket, until
   ``hi / lo <= 1 + rel_tol``.

Every rate is judged on every seed: a rate **passes** when the SLO holds on the seed means of its
metrics (``nanmean``; a metric NaN on every seed fails) and the rate is not overloaded. Per-seed
verdicts are recorded too. The capacity is the last passing rate (a rate that was seen to pass),
and the interval is ``[last passing rate, first failing rate]``; the true crossing lies in it up
to sampling noise.

**Overload.** A finite run hides a queue that grows without bound: its percentiles describe the
requests that happened to finish, so a rate the GPU cannot sustain must fail whatever they say.
The test is flow conservation over the late half of each run's arrival window, ``(mid, last
arrival]``: ``offered_load_ratio_late = A / D``, arrivals over departures (completions and
rejections) there, and ``A - D = N(last) - N(mid)``, the growth of the number in system over the
window (:mod:`memtp_sim.metrics`).

* A stable queue ends the window about as full as it began it: ``A - D`` is a difference of two
  samples of the number in system, ``O(std N)`` whatever the run's length, so the ratio scatters
  around 1 by ``O(std N / n)``.
* An overloaded queue is saturated over the window: it departs at its service rate ``mu`` while
  requests arrive at ``lambda``, so the ratio tends to ``lambda / mu`` whatever the run's length.

A rate is **overloaded** when its seed-mean late ratio exceeds :func:`overload_limit`, ``1 + 1 /
sqrt(k n / 2)`` for ``k`` seeds of ``n`` requests: the backlog grew by more than one Poisson
standard deviation of the ``k n / 2`` arrivals of the late halves, the scale on which a critically
loaded queue (``lambda = mu``) wanders. The limit falls toward 1 as runs lengthen, so the test
resolves ever smaller overloads; at a given length it cannot tell ``lambda`` within about ``mu /
sqrt(k n / 2)`` of ``mu`` from ``mu`` (a critically loaded queue's backlog grows like ``sqrt(n)``,
as fast as a slightly overloaded one's), and rates there pass or fail by sampling noise. Measured
on the tests' M/D/1 queue (service rate 10 req/s) at 4,000 requests a run, 60 seeds: one seed
was flagged in none of 60 runs at 0.9 ``mu``, 2% at 0.95 ``mu``, 18% at ``mu``, 52% at 1.02 ``mu``,
90% at 1.05 ``mu`` and every time at 1.1 ``mu``; the mean of three seeds in none of 20 triples at
0.95 ``mu``, 10% at ``mu``, 95% at 1.02 ``mu`` and every time from 1.05 ``mu``. On
``scenarios/h200-colocated.yaml`` with ``no_spec`` (``mu`` about 16.4 req/s), whose service rate
varies with the request lengths drawn, the spread is about twice that (24 seeds): one seed was
flagged never at 0.9 and 0.95 ``mu``, 17% at ``mu``, 62% at 1.05 ``mu`` and 92% at 1.1 ``mu``;
the mean of three never at 0.95 ``mu``, 25% at ``mu``, 88% at 1.05 ``mu`` and every time at 1.1
``mu``. So the capacity lies below about 1.05 ``mu`` (three seeds; 1.1 ``mu`` with one), a stable
rate at 0.95 ``mu`` passes, and more seeds or requests narrow the band. The limit assumes a stable
queue's own swing, ``std N``, is small beside ``sqrt(n)`` (true of both queues measured: at 0.9
and 0.95 ``mu`` and 4,000 requests the ratio's spread was under 0.01); one whose number in system
swings by hundreds needs longer runs (``min_requests``). (The whole-window ``offered_load_ratio``
starts from an empty system: a stable run ends with about ``L`` requests it did not start with,
which lifts that ratio by about ``L / n``; the limit of 1.2 it needs,
:data:`memtp_sim.metrics.OVERLOAD_RATIO`, let a rate 18% past ``mu``
pass an SLO with no queue-sensitive term. Reports still flag load points with it.)

**Run length.** Each run has ``n = max(scenario num_requests, min_requests,
REQUESTS_PER_IN_SYSTEM x rate x W0)`` requests: enough that the p90s rest on many requests.
``W`` grows with load, so ``W0`` can undersize a run, and a run that starts empty is optimistic: a
short one can hide a queue that grows slowly (TTFT grows with the run's length). So a rate whose
SLO terms hold (a candidate answer) on runs of fewer than ``max(OVERLOAD_MIN_REQUESTS,
REQUESTS_PER_IN_SYSTEM x L)`` requests (``L`` its seed-mean ``mean_in_system``) is run once more
with ``max(OVERLOAD_MIN_REQUESTS, min(4 n, REQUESTS_PER_IN_SYSTEM x L))`` requests, and the longer
runs decide: every passing rate rests on at least :data:`OVERLOAD_MIN_REQUESTS` requests a seed,
the length the overload test's resolution above was measured at. A rate whose SLO terms fail is
not rerun. Even so the answer is "meets the SLO over runs of this length".

**Common random numbers.** Every rate uses the same seeds; Poisson gaps are drawn as
``Exponential(1 / rate)``, so one seed's gaps scale exactly with ``1 / rate``. For a FIFO single
server the waiting time is then monotone in the rate for each seed (Lindley's recursion). The
rates tried lie on one geometric grid whatever the SLO (the start rate times powers of 2, then
geometric midpoints), and a rate that passes a tighter SLO passes a looser one, so while the
verdict is monotone in the rate a looser SLO never yields a lower capacity.

Sources: bisection on a monotone predicate; flow conservation (arrivals - departures = change in
the number in system) and the stability condition of a queue (lambda < mu); Little's law
(L = lambda W); the Pollaczek-Khinchine
mean waiting time of M/G/1 queues (the tests' closed-form oracle); DESIGN.md section 3 (goodput
under an SLA); issue 11 item 5.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import yaml
from pydantic import ValidationError

from ._io import load_yaml
from .api import run
from .config import (
    MAX_REQUESTS_PER_RUN,
    Scenario,
    Study,
    WorkloadConfig,
    yaml_flow,
    format_validation_error,
    load_scenario,
    read_config_yaml,
)
from .errors import ConfigError, InvalidArgumentError
from .metrics import METRIC_NAMES, bound_never_holds, is_overloaded

__all__ = [
    "SLO",
    "SLOTerm",
    "CapacityPoint",
    "CapacityResult",
    "sla_capacity",
    "check_capacity_args",
    "capacity_objective",
    "poisson_scenario",
    "parse_policies",
    "load_capacity_scenarios",
    "STATUSES",
    "UNLOADED_REQUESTS",
    "REQUESTS_PER_IN_SYSTEM",
    "MAX_DOUBLINGS",
    "MAX_HALVINGS",
    "LOAD_MONOTONE",
    "NO_GAIN_HALVINGS",
    "NO_GAIN_FRAC",
    "OVERLOAD_MIN_REQUESTS",
    "overload_limit",
]

#: Requests of the unloaded (one-user, closed-loop) run that estimates the start rate.
UNLOADED_REQUESTS = 32
#: A run holds at least this many times the requests in the system (rate x W0 at first).
REQUESTS_PER_IN_SYSTEM = 20.0
#: Doublings / halvings of the rate at most while bracketing (2**20: a factor of a million).
MAX_DOUBLINGS = 20
MAX_HALVINGS = 20
#: Metrics that can only get worse as load grows (latency up: TTFT, TPOT, end-to-end and queueing
#: time, percentiles and means; per-user decode speed down), each with the op of a bound the unloaded
#: run can already refute: a term ``ttft_s_p90 <= 2`` that fails with one request at a time fails at
#: every rate, so :func:`sla_capacity` stops after the unloaded run (status ``no_passing_rate``).
LOAD_MONOTONE: dict[str, str] = {
    **{m: "<=" for m in ("ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
                         "e2e_s_p50", "e2e_s_p90", "e2e_s_p99", "mean_e2e_s", "queue_s_p50", "queue_s_p90")},
    **{m: ">=" for m in ("tok_per_s_user_p10", "tok_per_s_user_p50", "tok_per_s_user_p90", "tok_per_s_user_mean")},
}
#: While halving, a failing term outside LOAD_MONOTONE must come NO_GAIN_FRAC of its gap closer to its
#: bound within this many halvings (load / 8); one that does not (acceptance rate, throughput) gets
#: no better at lower load, and halving on would spend 20 more rates to say so.
NO_GAIN_HALVINGS = 3
#: The gain (fraction of the first gap) that counts as closer: more than run-to-run noise.
NO_GAIN_FRAC = 0.1
#: A rate whose SLO terms hold is judged on runs of at least this many requests: their late halves
#: hold about 2,000 arrivals a seed, the length the overload test's resolution was measured at
#: (module docstring, overload).
OVERLOAD_MIN_REQUESTS = 4000
#: Extra metrics every point records besides the SLO's own.
_ALWAYS = ("offered_load_ratio_late", "offered_load_ratio", "mean_in_system", "mean_e2e_s", "num_completed")

_TERM_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(<=|>=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_AND_RE = re.compile(r"\s+and\s+|\s*&&\s*", re.IGNORECASE)


# ------------------------------------------------------------------------------------------ SLO
@dataclass(frozen=True)
class SLOTerm:
    """One term of an SLO: ``metric op bound``.

    Attributes:
        metric: a name of :data:`memtp_sim.metrics.METRIC_NAMES`.
        op: ``"<="`` or ``">="``.
        bound: the bound, in the metric's units (finite).
    """

    metric: str
    op: str
    bound: float

    @property
    def label(self) -> str:
        """``"metric op bound"``, e.g. ``"ttft_s_p90 <= 2"``."""
        return f"{self.metric} {self.op} {self.bound:g}"

    def holds(self, value: float) -> bool:
        """Whether ``value`` meets the term (inclusive); NaN or None never does.

        Args:
            value: the metric's value, in its units.

        Returns:
            ``value <= bound`` or ``value >= bound``.
        """
        if value is None or not math.isfinite(float(value)):
            return False
        return float(value) <= self.bound if self.op == "<=" else float(value) >= self.bound


def _parse_term(text: str, whole: str) -> SLOTerm:
    """One ``metric op number`` term (``whole`` is the full text, for the message)."""
    m = _TERM_RE.match(text)
    if m is None:
        hint = " (use <= or >=)" if re.search(r"[<>=]", text) and not re.search(r"<=|>=", text) else ""
        raise InvalidArgumentError(f"SLO {whole!r}: term {text.strip()!r} is not 'metric <= number' or "
                                   f"'metric >= number'{hint}")
    metric, op, bound = m.group(1), m.group(2), float(m.group(3))
    if metric not in METRIC_NAMES:
        close = difflib.get_close_matches(metric, METRIC_NAMES, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else "e.g. ttft_s_p90, tpot_ms_p90, mean_e2e_s"
        raise InvalidArgumentError(f"SLO {whole!r}: unknown metric {metric!r}; {hint} "
                                   "(any name of memtp_sim.metrics.METRIC_NAMES)")
    if not math.isfinite(bound):
        raise InvalidArgumentError(f"SLO {whole!r}: bound of {metric} must be a finite number")
    why = bound_never_holds(metric, op, bound)
    if why is not None:
        raise InvalidArgumentError(f"SLO {whole!r}: {why}")
    return SLOTerm(metric, op, bound)


@dataclass(frozen=True)
class SLO:
    """A service-level objective: terms that must all hold (AND).

    Attributes:
        terms: the terms, at least one, in the order given.
    """

    terms: tuple[SLOTerm, ...]

    @classmethod
    def parse(cls, spec: "str | SLO | Iterable[str]") -> "SLO":
        """An SLO from text: one string (terms joined with ``AND``/``and``/``&&``), several strings
        (all must hold), or an SLO (returned as is).

        Args:
            spec: e.g. ``"ttft_s_p90 <= 2"``, ``["ttft_s_p90 <= 2", "tpot_ms_p90 <= 50"]`` or
                ``"ttft_s_p90 <= 2 AND tpot_ms_p90 <= 50"``.

        Returns:
            The SLO.

        Raises:
            InvalidArgumentError: one line: empty text, a term not of the form ``metric <= number``
                or ``metric >= number``, an unknown metric (the closest names are suggested), or a
                non-finite bound.
        """
        if isinstance(spec, SLO):
            return spec
        texts = [spec] if isinstance(spec, str) else list(spec)
        terms: list[SLOTerm] = []
        for text in texts:
            if not isinstance(text, str):
                raise InvalidArgumentError(f"SLO: expected text like 'ttft_s_p90 <= 2', got {type(text).__name__}")
            if not text.strip():
                raise InvalidArgumentError("SLO: empty; expected e.g. 'ttft_s_p90 <= 2' (terms joined with AND)")
            terms += [_parse_term(part, text) for part in _AND_RE.split(text.strip())]
        if not terms:
            raise InvalidArgumentError("SLO: no term given; expected e.g. 'ttft_s_p90 <= 2'")
        return cls(tuple(terms))

    @property
    def label(self) -> str:
        """The terms joined with ``AND``."""
        return " AND ".join(t.label for t in self.terms)

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metric names the SLO reads (each once, in order)."""
        return tuple(dict.fromkeys(t.metric for t in self.terms))

    def failures(self, values: Mapping[str, Any]) -> list[str]:
        """The terms ``values`` does not meet, each as ``"metric = value, not op bound"``.

        Args:
            values: metric name -> value (a missing metric counts as NaN).

        Returns:
            One text per failing term (empty when the SLO holds).
        """
        out = []
        for t in self.terms:
            v = values.get(t.metric, float("nan"))
            if not t.holds(v):
                out.append(f"{t.metric} = {float(v):.4g}, not {t.op} {t.bound:g}")
        return out

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether every term holds on ``values`` (metric name -> value)."""
        return not self.failures(values)


# --------------------------------------------------------------------------------- scenarios
def poisson_scenario(scenario: Scenario, rate_per_s: float, num_requests: int) -> Scenario:
    """The scenario with an open-loop Poisson workload at ``rate_per_s``.

    Keeps the trace (prompt and output lengths are drawn from its rows, as in poisson mode) and
    everything outside the workload; drops what only other modes read (a trace replay's arrival
    times and ``rate_scale``, a closed loop's ``concurrency`` and ``think_time_s``, a
    ``rate_schedule``).

    Args:
        scenario: any validated scenario.
        rate_per_s: arrival rate, requests per second (> 0).
        num_requests: requests in the run (>= 1; capped at the per-run limit).

    Returns:
        A new scenario (the argument is unchanged).

    Raises:
        InvalidArgumentError: ``rate_per_s`` is not a finite number > 0.
    """
    if not (_is_real(rate_per_s) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise InvalidArgumentError(f"rate_per_s: must be a finite number > 0 (got {_show(rate_per_s)})")
    wl = WorkloadConfig.model_validate({"trace": scenario.workload.trace, "mode": "poisson",
                                        "num_requests": int(min(max(1, num_requests), MAX_REQUESTS_PER_RUN)),
                                        "rate_per_s": float(rate_per_s)})
    return scenario.model_copy(update={"workload": wl})


def parse_policies(texts: Sequence[str]) -> list[dict[str, Any]]:
    """Policies given on the command line (``capacity --policies``), as policy mappings.

    Each item is a policy name (``dspark``), a YAML or JSON mapping with a ``name`` and the
    policy's parameters (``'{name: static, k: 3}'``, ``'{"name": "dspark", "gamma": 5}'``), or a
    YAML list of those (``'[no_spec, {name: static, k: 3}]'``).

    Args:
        texts: the items, in order.

    Returns:
        ``[{"name": ..., **params}, ...]`` in order (parameters are checked later, against the
        policy's own model, when the scenarios are built).

    Raises:
        ConfigError: one line: an item that is not valid YAML, or neither a name nor a mapping
            with a ``name``.
    """
    out: list[dict[str, Any]] = []
    for text in texts:
        try:
            value = load_yaml(text)
        except yaml.YAMLError:
            value = None
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, str) and item.strip():
                out.append({"name": item.strip()})
            elif isinstance(item, dict) and isinstance(item.get("name"), str):
                out.append(dict(item))
            else:
                raise ConfigError(f"--policies: {text!r}: expected a policy name (dspark) or a YAML/JSON mapping "
                                  "with a name, e.g. '{name: static, k: 3}'")
    return out


def load_capacity_scenarios(path: str | Path, policies: Sequence[str] | None = None) -> list[Scenario]:
    """The scenarios a ``capacity`` command searches: the scenario file, once per policy.

    Without ``policies``: the file as :func:`memtp_sim.config.load_scenario` reads it. With them:
    the file's scenario with its policy replaced by each (as a study's ``policies`` list does: a
    bare name takes the library's defaults, not the file's parameters for that policy; a field
    that has no effect under every policy is refused, one that matters under some is kept).

    Args:
        path: a scenario YAML (relative paths inside resolve against its folder).
        policies: ``--policies`` items (see :func:`parse_policies`), or None.

    Returns:
        One validated scenario per policy, in order (one when ``policies`` is empty).

    Raises:
        ConfigError: one line: an unreadable or invalid scenario file, a bad policy item, or a
            field with no effect under any of the policies.
    """
    if not policies:
        return [load_scenario(path)]
    doc = read_config_yaml(path, "scenario")
    context = {"base_dir": str(Path(path).parent)}
    items = parse_policies(policies)
    try:
        Scenario.model_validate(doc, context=context)  # the file's own errors, named as in a scenario
        base = {k: v for k, v in doc.items() if k != "policy"}  # the flag's policies replace the file's
        study = Study.model_validate({"name": "capacity", "base": base, "policies": items}, context=context)
    except ValidationError as e:
        err = e.errors()[0]
        loc = err["loc"]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if len(loc) >= 2 and loc[0] == "policies" and isinstance(loc[1], int):  # the flag's fault, not the file's
            raise ConfigError(f"--policies: {yaml_flow(items[loc[1]])}: {msg}") from None
        if tuple(loc) == ("policies",):  # the list as a whole: one policy given twice
            raise ConfigError(f"--policies: {msg}") from None
        raise ConfigError(format_validation_error(e, str(path), Scenario)) from None
    # fields named as the scenario file names them (it has no base section), parameters as the flag's
    return [scen for _, scen, _ in study.expand(
        source=str(path), name_field=lambda f: f"--policies {f}" if f.startswith("policy.") else f)]


def _unloaded_scenario(scenario: Scenario) -> Scenario:
    """One user in a closed loop, :data:`UNLOADED_REQUESTS` requests: no queueing, no batching."""
    wl = WorkloadConfig.model_validate({"trace": scenario.workload.trace, "mode": "closed_loop",
                                        "num_requests": UNLOADED_REQUESTS, "concurrency": 1})
    return scenario.model_copy(update={"workload": wl})


# ---------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class CapacityPoint:
    """One evaluated rate.

    Attributes:
        rate_per_s: the Poisson arrival rate, requests per second.
        num_requests: requests per run at this rate (the deciding runs).
        means: seed means (``nanmean``) of the SLO's metrics and of ``offered_load_ratio_late``,
            ``offered_load_ratio``, ``mean_in_system``, ``mean_e2e_s``, ``num_completed``; units as
            named.
        per_seed: the same metrics, one value per seed (in seed order).
        seed_passed: per seed, whether that seed alone met the SLO and was not overloaded (its
            late ratio within ``overload_limit(num_requests, 1)``).
        overloaded: the seed-mean ``offered_load_ratio_late`` exceeds :func:`overload_limit` of
            the runs' length and number (on runs of at least
            :data:`memtp_sim.metrics.OVERLOAD_MIN_ARRIVALS` requests; module docstring, overload).
        passed: the SLO holds on the seed means and the rate is not overloaded.
        failures: why the rate failed (empty when it passed).
        num_runs: runs spent on this rate (seeds, twice when rerun longer).
    """

    rate_per_s: float
    num_requests: int
    means: dict[str, float]
    per_seed: dict[str, tuple[float, ...]]
    seed_passed: tuple[bool, ...]
    overloaded: bool
    passed: bool
    failures: tuple[str, ...]
    num_runs: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields (lists for tuples)."""
        return {"rate_per_s": self.rate_per_s, "num_requests": self.num_requests, "means": dict(self.means),
                "per_seed": {k: list(v) for k, v in self.per_seed.items()}, "seed_passed": list(self.seed_passed),
                "overloaded": self.overloaded, "passed": self.passed, "failures": list(self.failures),
                "num_runs": self.num_runs}


#: Why a search ended (``CapacityResult.status``).
STATUSES = ("converged", "max_runs", "no_passing_rate", "no_failing_rate")


@dataclass(frozen=True)
class CapacityResult:
    """The outcome of :func:`sla_capacity`.

    Attributes:
        capacity_per_s: the highest rate seen to pass, req/s (0.0 when none passed).
        interval_per_s: ``(last passing rate, first failing rate)``, req/s; ``0.0`` as the low end
            when no rate passed, ``inf`` as the high end when none failed.
        points: every evaluated rate, in evaluation order.
        num_runs: simulation runs in all (the unloaded run included).
        status: ``converged`` (``hi / lo <= 1 + rel_tol``), ``max_runs`` (the run budget ended
            first; the interval is the bracket so far), ``no_passing_rate`` (a term on a
            :data:`LOAD_MONOTONE` metric failed on the unloaded run already: no rate was tried
            and the interval is ``(0, 0)``; or the SLO failed at every rate down to the start /
            2**MAX_HALVINGS, or down to where a term was seen not to get better at lower load:
            see :data:`NO_GAIN_HALVINGS`), ``no_failing_rate`` (it held at every rate up to the
            start x 2**MAX_DOUBLINGS).
        slo: the SLO.
        policy: the scenario's policy label.
        seeds: the seeds every rate ran.
        rel_tol: the relative width the bisection stops at.
        unloaded_e2e_s: ``W0``, mean end-to-end seconds of a request served alone.
        note: one line on why the search stopped when it did not converge (else empty).
        unloaded_metrics: the unloaded run's scalar metrics (one user, :data:`UNLOADED_REQUESTS`
            requests, the first seed).
    """

    capacity_per_s: float
    interval_per_s: tuple[float, float]
    points: tuple[CapacityPoint, ...]
    num_runs: int
    status: str
    slo: SLO
    policy: str
    seeds: tuple[int, ...]
    rel_tol: float
    unloaded_e2e_s: float
    note: str = ""
    unloaded_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def unreachable(self) -> bool:
        """True when the SLO failed on the unloaded run already (no rate was tried)."""
        return self.status == "no_passing_rate" and not self.points

    @property
    def converged(self) -> bool:
        """True when the bracket is within ``rel_tol``."""
        return self.status == "converged"

    def summary_line(self) -> str:
        """One line: policy, capacity, interval, points and runs."""
        lo, hi = self.interval_per_s
        text = (f"{self.policy}: capacity {self.capacity_per_s:.4g} req/s (interval [{lo:.4g}, {hi:.4g}] req/s; "
                f"{len(self.points)} rates, {self.num_runs} runs)")
        return text + (f"; {self.status}: {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``inf`` stays a float; write with ``allow_nan=True``)."""
        return {"policy": self.policy, "slo": self.slo.label, "capacity_per_s": self.capacity_per_s,
                "interval_per_s": list(self.interval_per_s), "status": self.status, "note": self.note,
                "num_runs": self.num_runs, "seeds": list(self.seeds), "rel_tol": self.rel_tol,
                "unloaded_e2e_s": self.unloaded_e2e_s,
                "unloaded": {m: self.unloaded_metrics.get(m, float("nan")) for m in self.slo.metrics},
                "points": [p.to_dict() for p in self.points]}


# ------------------------------------------------------------------------------------ search
class _OutOfRuns(Exception):
    """The run budget cannot pay for the next rate."""


class _NoGain(Exception):
    """A failing SLO term gets no better as the rate halves (the message says which)."""


@dataclass
class _Search:
    """Evaluates rates (all seeds each) within a run budget and keeps every point."""

    scenario: Scenario
    slo: SLO
    seeds: tuple[int, ...]
    min_requests: int
    max_runs: int
    progress: Callable[[CapacityPoint], None] | None
    unloaded_e2e_s: float = float("nan")
    unloaded_metrics: dict[str, float] = field(default_factory=dict)
    num_runs: int = 0
    points: list[CapacityPoint] = field(default_factory=list)

    def unloaded(self) -> float:
        """Run the unloaded scenario once (first seed) and keep ``W0`` (mean e2e, s)."""
        res = run(_unloaded_scenario(self.scenario), seed=self.seeds[0])
        self.num_runs += 1
        w0 = float(res.metrics.get("mean_e2e_s", float("nan")))
        if not (math.isfinite(w0) and w0 > 0):
            raise ConfigError(f"sla_capacity: the unloaded run (1 user, {UNLOADED_REQUESTS} requests) completed no "
                              f"request ({res.metrics.get('rejected_by_reason')}); no rate can meet an SLO")
        self.unloaded_e2e_s = w0
        self.unloaded_metrics = {k: float(v) for k, v in res.metrics.items()
                                 if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)}
        return w0

    def unreachable(self) -> list[str]:
        """The SLO terms on :data:`LOAD_MONOTONE` metrics that the unloaded run already fails, each as
        ``"ttft_s_p90 = 6.64 > 2 even unloaded (one request at a time)"`` (empty when none does; a
        metric the unloaded run did not report as a finite number is not judged)."""
        out = []
        for t in self.slo.terms:
            v = self.unloaded_metrics.get(t.metric, float("nan"))
            if LOAD_MONOTONE.get(t.metric) == t.op and math.isfinite(v) and not t.holds(v):
                out.append(f"{t.metric} = {v:.3g} {'>' if t.op == '<=' else '<'} {t.bound:g} even unloaded "
                           f"(one request at a time, {UNLOADED_REQUESTS} requests)")
        return out

    def requests_for(self, rate: float) -> int:
        """Requests per run at ``rate`` (see the module docstring, run length)."""
        by_little = math.ceil(REQUESTS_PER_IN_SYSTEM * rate * self.unloaded_e2e_s)
        return int(min(MAX_REQUESTS_PER_RUN, max(self.scenario.workload.num_requests, self.min_requests, by_little)))

    def _seed_runs(self, rate: float, n: int) -> list[dict[str, float]]:
        if self.num_runs + len(self.seeds) > self.max_runs:
            raise _OutOfRuns
        scen = poisson_scenario(self.scenario, rate, n)
        out = []
        for s in self.seeds:
            m = run(scen, seed=int(s)).metrics
            self.num_runs += 1
            out.append({k: float(m.get(k, float("nan"))) for k in (*self.slo.metrics, *_ALWAYS)})
        return out

    def evaluate(self, rate: float) -> CapacityPoint:
        """Run every seed at ``rate`` and judge it (see the module docstring)."""
        n = self.requests_for(rate)
        runs = self._seed_runs(rate, n)
        spent = len(self.seeds)
        in_system = _nanmean([r["mean_in_system"] for r in runs])
        slo_holds = self.slo.holds({k: _nanmean([r[k] for r in runs]) for k in self.slo.metrics})
        by_little = math.ceil(REQUESTS_PER_IN_SYSTEM * in_system) if math.isfinite(in_system) else n
        if slo_holds and n < max(OVERLOAD_MIN_REQUESTS, by_little) and n < MAX_REQUESTS_PER_RUN:
            # a candidate answer: too short for its own number in system (it may hide a slowly growing queue)
            # or for the overload test's resolution; the longer runs decide
            n = int(min(max(OVERLOAD_MIN_REQUESTS, min(4 * n, by_little)), MAX_REQUESTS_PER_RUN))
            runs = self._seed_runs(rate, n)
            spent += len(self.seeds)
        point = self._judge(rate, n, runs, spent)
        self.points.append(point)
        if self.progress is not None:
            self.progress(point)
        return point

    def _judge(self, rate: float, n: int, runs: list[dict[str, float]], spent: int) -> CapacityPoint:
        names = list(runs[0])
        per_seed = {k: tuple(r[k] for r in runs) for k in names}
        means = {k: _nanmean(vals) for k, vals in per_seed.items()}
        late = per_seed["offered_load_ratio_late"]
        limit = overload_limit(n, sum(math.isfinite(v) for v in late))
        overloaded = is_overloaded(means["offered_load_ratio_late"], n, limit=limit)
        failures = self.slo.failures(means)
        if overloaded:
            failures.append(f"overloaded: offered_load_ratio_late = {means['offered_load_ratio_late']:.4g} > "
                            f"{limit:.4g} (the number in system grew over the late half of the runs: the queue "
                            "grows without bound)")
        one = overload_limit(n, 1)
        seed_passed = tuple(self.slo.holds(r) and not is_overloaded(v, n, limit=one) for r, v in zip(runs, late, strict=True))
        return CapacityPoint(rate_per_s=float(rate), num_requests=n, means=means, per_seed=per_seed,
                             seed_passed=seed_passed, overloaded=overloaded, passed=not failures,
                             failures=tuple(failures), num_runs=spent)


def overload_limit(num_requests: int, num_seeds: int = 1) -> float:
    """The seed-mean ``offered_load_ratio_late`` above which a rate is overloaded (module docstring, overload).

    ``1 + 1 / sqrt(num_seeds x num_requests / 2)``: the backlog grew over the late half of the runs by more
    than one Poisson standard deviation of the arrivals there (about ``num_requests / 2`` per seed).

    Args:
        num_requests: requests per run (>= 1).
        num_seeds: runs the mean is over (>= 1).

    Returns:
        The limit, > 1 (e.g. 1.0224 for one seed of 4,000 requests, 1.0129 for three).
    """
    return 1.0 + 1.0 / math.sqrt(max(1, num_seeds) * max(1, num_requests) / 2.0)


def _nanmean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there is none), without numpy's empty-slice warning."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    return float(arr.mean()) if arr.size else float("nan")


def _is_real(v: Any) -> bool:
    """A Python or numpy real number, not a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _show(v: Any) -> str:
    """A value for a message as the user wrote it: numpy scalars as plain numbers (never ``np.float64(1.5)``)."""
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    if isinstance(v, np.generic):
        v = v.item()
    return repr(v)


def check_capacity_args(seeds: Sequence[int], rate_lo: float | None = None, rate_hi: float | None = None,
                        rel_tol: float = 0.05, max_runs: int = 60, min_requests: int = 1000) -> tuple[int, ...]:
    """Validate :func:`sla_capacity`'s search arguments (it calls this first; the CLI calls it before
    any output, so a bad flag is one line).

    Args:
        seeds, rate_lo, rate_hi, rel_tol, max_runs, min_requests: as :func:`sla_capacity` takes them.

    Returns:
        The seeds as a tuple of ints.

    Raises:
        InvalidArgumentError: one line naming the argument (values written plainly, never as
            numpy reprs): no seed, a seed < 0 or repeated, a rate not finite and > 0,
            ``rate_lo >= rate_hi``, ``rel_tol`` outside (0, 1], ``max_runs`` below the unloaded
            run plus two rates, ``min_requests < 1``.
    """
    seeds_t = tuple(seeds)
    if not seeds_t:
        raise InvalidArgumentError("seeds: give at least one seed (an integer >= 0)")
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)) and s >= 0 for s in seeds_t):
        raise InvalidArgumentError(f"seeds: expected integers >= 0 (got {_show(list(seeds_t))})")
    if len(set(seeds_t)) != len(seeds_t):
        raise InvalidArgumentError(f"seeds: each seed at most once (got {_show(list(seeds_t))})")
    for name, v in (("rate_lo", rate_lo), ("rate_hi", rate_hi)):
        if v is not None and not (_is_real(v) and math.isfinite(v) and v > 0):
            raise InvalidArgumentError(f"{name}: must be a finite number of requests per second > 0 (got {_show(v)})")
    if rate_lo is not None and rate_hi is not None and not rate_lo < rate_hi:
        raise InvalidArgumentError(f"rate_lo ({rate_lo:g}) must be below rate_hi ({rate_hi:g})")
    if not (_is_real(rel_tol) and 0 < rel_tol <= 1):
        raise InvalidArgumentError(f"rel_tol: must be in (0, 1] (got {_show(rel_tol)}); e.g. 0.05 for 5%")
    if not (isinstance(max_runs, (int, np.integer)) and not isinstance(max_runs, bool)
            and max_runs >= 1 + 2 * len(seeds_t)):
        raise InvalidArgumentError(f"max_runs: must be an integer >= {1 + 2 * len(seeds_t)} (the unloaded run and two "
                                   f"rates of {len(seeds_t)} seed(s)); got {_show(max_runs)}")
    if not (isinstance(min_requests, (int, np.integer)) and not isinstance(min_requests, bool) and min_requests >= 1):
        raise InvalidArgumentError(f"min_requests: must be an integer >= 1 (got {_show(min_requests)})")
    return tuple(int(s) for s in seeds_t)


def _bracket(search: _Search, start: float, rate_lo: float | None,
             rate_hi: float | None) -> tuple[CapacityPoint | None, CapacityPoint | None]:
    """Steps 3 of the module docstring: ``(passing point, failing point)``, either None when the
    doubling / halving limit was reached (raises :class:`_OutOfRuns` when the budget ends)."""
    lo: CapacityPoint | None = None
    hi: CapacityPoint | None = None
    first = search.evaluate(rate_lo if rate_lo is not None else (rate_hi if rate_hi is not None else start))
    lo, hi = (first, None) if first.passed else (None, first)
    if lo is not None and rate_lo is not None and rate_hi is not None:
        second = search.evaluate(rate_hi)
        lo, hi = (second, None) if second.passed else (lo, second)
    steps = 0
    while hi is None and lo is not None and steps < MAX_DOUBLINGS:
        p = search.evaluate(lo.rate_per_s * 2.0)
        lo, hi = (p, None) if p.passed else (lo, p)
        steps += 1
    steps = 0
    failing = [hi] if hi is not None else []
    while lo is None and hi is not None and steps < MAX_HALVINGS:
        p = search.evaluate(hi.rate_per_s / 2.0)
        lo, hi = (p, hi) if p.passed else (None, p)
        steps += 1
        if lo is None:
            failing.append(p)
            stuck = _no_gain(search.slo, failing[-(NO_GAIN_HALVINGS + 1):])
            if stuck:
                raise _NoGain(stuck)
    return lo, hi


def _no_gain(slo: SLO, window: list[CapacityPoint]) -> str:
    """Why halving is pointless, or ``""``: over ``window`` (consecutive halvings, all failing) a term
    outside :data:`LOAD_MONOTONE` failed at every rate and came less than :data:`NO_GAIN_FRAC` of its
    first gap closer to its bound (a NaN value counts as an infinite gap)."""
    if len(window) <= NO_GAIN_HALVINGS:
        return ""
    for t in slo.terms:
        if LOAD_MONOTONE.get(t.metric) == t.op:
            continue  # gets better as load drops; the unloaded run judged it
        vals = [p.means.get(t.metric, float("nan")) for p in window]
        gaps = [(v - t.bound if t.op == "<=" else t.bound - v) if math.isfinite(v) else math.inf for v in vals]
        if min(gaps) <= 0:
            continue  # it held at some rate
        gained = (min(gaps[1:]) <= gaps[0] * (1.0 - NO_GAIN_FRAC) if math.isfinite(gaps[0])
                  else any(math.isfinite(g) for g in gaps[1:]))
        if not gained:
            first, last = window[0], window[-1]
            return (f"the SLO fails at every rate tried, down to {last.rate_per_s:.4g} req/s, and {t.metric} does not "
                    f"get better at lower load ({_val(vals[0])} at {first.rate_per_s:.4g} req/s, {_val(vals[-1])} at "
                    f"{last.rate_per_s:.4g} req/s; needs {t.op} {t.bound:g}), so no rate meets it")
    return ""


def _val(v: float) -> str:
    """A metric value for a note: ``-`` where nothing was measured."""
    return f"{v:.4g}" if math.isfinite(v) else "- (nothing measured)"


def sla_capacity(scenario: Scenario, slo: "SLO | str | Iterable[str]", *, seeds: Sequence[int] = (0, 1, 2),
                 rate_lo: float | None = None, rate_hi: float | None = None, rel_tol: float = 0.05,
                 max_runs: int = 60, min_requests: int = 1000,
                 progress: Callable[[CapacityPoint], None] | None = None) -> CapacityResult:
    """The highest Poisson request rate at which ``scenario`` meets ``slo`` (module docstring).

    The scenario's workload is replaced by a Poisson workload over its trace's lengths at each
    rate tried (:func:`poisson_scenario`): a trace replay's arrival times and a closed loop's
    users are not used; everything else (hardware, policy, engine, acceptance) is.

    Args:
        scenario: a validated scenario (any workload mode).
        slo: an :class:`SLO` or its text (see :meth:`SLO.parse`).
        seeds: run seeds; every rate runs each (common random numbers).
        rate_lo: a rate to try first, req/s (expected to pass); default: estimated.
        rate_hi: a rate expected to fail, req/s, tried when ``rate_lo`` passes (or first when
            ``rate_lo`` is not given). The bracket grows past either when they do not bracket.
        rel_tol: stop when ``first failing / last passing <= 1 + rel_tol``.
        max_runs: simulation runs at most (the unloaded run and every seed of every rate, reruns
            included); the search stops with status ``max_runs`` when the next rate would exceed it.
        min_requests: requests per run at least (the scenario's ``num_requests`` is also a floor;
            a rate whose SLO holds is rerun with at least :data:`OVERLOAD_MIN_REQUESTS`).
        progress: called with each :class:`CapacityPoint` once evaluated.

    Returns:
        A :class:`CapacityResult` (capacity and interval in req/s, every point, runs, status).

    Raises:
        InvalidArgumentError: a bad SLO or argument (one line naming it).
        ConfigError: the unloaded run completed no request (e.g. every request exceeds the KV
            cache).
    """
    slo = SLO.parse(slo)
    seeds_t = check_capacity_args(seeds, rate_lo, rate_hi, rel_tol, max_runs, min_requests)
    search = _Search(scenario, slo, seeds_t, min_requests, max_runs, progress)
    w0 = search.unloaded()
    unreachable = search.unreachable()
    if unreachable:  # fails at every rate: no search
        return CapacityResult(capacity_per_s=0.0, interval_per_s=(0.0, 0.0), points=(), num_runs=search.num_runs,
                              status="no_passing_rate", slo=slo, policy=scenario.policy_label(), seeds=seeds_t,
                              rel_tol=float(rel_tol), unloaded_e2e_s=w0, note="; ".join(unreachable),
                              unloaded_metrics=dict(search.unloaded_metrics))
    start = math.sqrt(scenario.engine.num_seqs_limit) / w0
    status, note = "converged", ""
    lo = hi = None
    try:
        lo, hi = _bracket(search, start, rate_lo, rate_hi)
        while lo is not None and hi is not None and hi.rate_per_s > lo.rate_per_s * (1.0 + rel_tol):
            p = search.evaluate(math.sqrt(lo.rate_per_s * hi.rate_per_s))
            lo, hi = (p, hi) if p.passed else (lo, p)
    except _NoGain as e:
        status, note = "no_passing_rate", str(e)
        lo, hi = None, min(search.points, key=lambda p: p.rate_per_s)
    except _OutOfRuns:
        status, note = "max_runs", f"max_runs={max_runs} reached before the bracket was within rel_tol={rel_tol:g}"
        passed = [p for p in search.points if p.passed]
        failed = [p for p in search.points if not p.passed]
        lo = max(passed, key=lambda p: p.rate_per_s) if passed else None
        above = [p for p in failed if lo is None or p.rate_per_s > lo.rate_per_s]
        hi = min(above, key=lambda p: p.rate_per_s) if above else None
    if status == "converged" and lo is None:
        status, note = "no_passing_rate", f"the SLO fails at every rate tried, down to {hi.rate_per_s:.4g} req/s"
    elif status == "converged" and hi is None:
        status, note = "no_failing_rate", f"the SLO holds at every rate tried, up to {lo.rate_per_s:.4g} req/s"
    interval = (lo.rate_per_s if lo is not None else 0.0, hi.rate_per_s if hi is not None else float("inf"))
    return CapacityResult(capacity_per_s=interval[0], interval_per_s=interval, points=tuple(search.points),
                          num_runs=search.num_runs, status=status, slo=slo, policy=scenario.policy_label(),
                          seeds=seeds_t, rel_tol=float(rel_tol), unloaded_e2e_s=w0, note=note,
                          unloaded_metrics=dict(search.unloaded_metrics))


def capacity_objective(scenario: Scenario, slo: "SLO | str | Iterable[str]", seeds: Sequence[int] = (0, 1, 2),
                       **kwargs: Any) -> float:
    """SLA capacity as a tuning objective (to maximise): :func:`sla_capacity`'s ``capacity_per_s``.

    The value is conservative whatever the search's status: the highest rate seen to pass, req/s
    (0.0 when none passed). One call costs one search (about 10-20 rates x ``len(seeds)`` runs).

    Args:
        scenario: the trial's scenario.
        slo: the SLO (an :class:`SLO` or its text).
        seeds: run seeds of every rate.
        **kwargs: passed to :func:`sla_capacity` (``rel_tol``, ``max_runs``, ``min_requests``,
            ``rate_lo``, ``rate_hi``).

    Returns:
        The capacity, requests per second.
    """
    return sla_capacity(scenario, slo, seeds=seeds, **kwargs).capacity_per_s
