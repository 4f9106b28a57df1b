"""Draft-length controllers: how many positions to draft each round, decided before drafting.

A controller (YAML section ``draft_control``, chosen by name) sits in front of any verification
policy: it caps the round's draft length (0 turns speculation off for the round), and the policy
then verifies what was drafted. Controllers:

* ``always`` (default): draft everything the drafter offers; not a dynamic mechanism.
* ``disable_by_batch_size``: speculation off when the batch is above ``max_batch`` (and, if
  given, below ``min_batch``), with ``hysteresis`` (batch units) so a batch hovering at the
  threshold does not flip every round (vLLM ``speculative_disable_by_batch_size``; SGLang PR #13376).
* ``batch_table``: a batch-range -> k table in vLLM's ``num_speculative_tokens_per_batch_size``
  shape (``{"1-16": 3, "64-128": 2, "256-4096": 0}``: inclusive ranges; a gap inherits the previous
  range's k; vLLM PR #32374).
* ``context_table``: (batch range x context range) -> k, for context-aware schedules (the best
  draft length rises with context; vLLM issue #49986 measures schedules over context).
* ``acceptance_target``: an EMA of the acceptance rate against a target with hysteresis; k steps
  down when acceptance is low, up when high (SGLang / MLX servers ship such controllers).
* ``probing``: draft the full block every ``probe_every`` rounds (paying for the probe), and in
  between the k that maximises expected goodput under the probe's per-position acceptance.

Every controller but ``always`` is dynamic: while it is on, each pass pays the stated
``tax_frac`` (vLLM issue #49548 measured +6.6% TPOT at 2 concurrent requests and +21.6% at 189
for dynamic speculation with no draft token scheduled: default ``tax: measured`` interpolates
those two points over the batch), and every switch between drafting and not drafting pays
``switch_s`` (the drafter must catch up on the tokens decoded without it).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
from pydantic import Field, field_validator, model_validator

from ..errors import InvalidArgumentError
from .base import DraftView, PolicyParams, RoundOutcome

__all__ = ["DraftControl", "ControlParams", "register_control", "make_control", "control_class",
           "available_controls", "parse_range_table", "dynamic_tax_frac"]

_CONTROLS: dict[str, type["DraftControl"]] = {}

#: Dynamic-speculation tax measured in vLLM issue #49548 (H100 NVL, vLLM 0.27.1, K = 0 schedule):
#: (concurrent requests, extra TPOT fraction).
MEASURED_TAX_POINTS = ((2, 0.0656), (189, 0.2158))


def dynamic_tax_frac(tax: Any, num_requests: int) -> float:
    """The per-pass tax fraction of a dynamic controller: ``tax`` if a number, else the measured
    points of :data:`MEASURED_TAX_POINTS` interpolated linearly over the batch (flat beyond)."""
    if isinstance(tax, (int, float)):
        return float(tax)
    xs, ys = zip(*MEASURED_TAX_POINTS)
    return float(np.interp(num_requests, xs, ys))


def register_control(name: str) -> Callable[[type["DraftControl"]], type["DraftControl"]]:
    """Class decorator registering a controller under ``name``.

    Raises:
        InvalidArgumentError: ``name`` is already registered.
    """

    def deco(cls: type["DraftControl"]) -> type["DraftControl"]:
        if name in _CONTROLS:
            raise InvalidArgumentError(f"draft control {name!r} is already registered")
        cls.name = name
        _CONTROLS[name] = cls
        return cls

    return deco


def available_controls() -> list[str]:
    """Registered controller names, sorted."""
    return sorted(_CONTROLS)


def control_class(name: str) -> type["DraftControl"]:
    """Look up a controller class.

    Raises:
        InvalidArgumentError: unknown name (the message lists the registered ones).
    """
    try:
        return _CONTROLS[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown draft control {name!r}; choose one of: "
                                   f"{', '.join(available_controls())}") from None


def make_control(name: str, params: Mapping[str, Any] | None = None) -> "DraftControl":
    """Build a controller from its name and parameters (validated by its Params model)."""
    cls = control_class(name)
    return cls(cls.Params(**dict(params or {})))


_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_range_table(table: Mapping[str, int], what: str) -> list[tuple[int, int, int]]:
    """``{"lo-hi": k}`` -> sorted ``[(lo, hi, k)]``, checked: ranges well formed, not overlapping.

    Raises:
        ValueError: a malformed or overlapping range, or a k < 0 (for pydantic validators).
    """
    out = []
    for key, k in table.items():
        m = _RANGE.match(str(key))
        if m is None or int(m.group(1)) > int(m.group(2)) or int(m.group(1)) < 0:
            raise ValueError(f"{what}: range {key!r} is not 'lo-hi' with 0 <= lo <= hi")
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"{what}: k for {key!r} must be a whole number >= 0, got {k!r}")
        out.append((int(m.group(1)), int(m.group(2)), int(k)))
    out.sort()
    for (lo1, hi1, _), (lo2, _, _) in zip(out, out[1:]):
        if lo2 <= hi1:
            raise ValueError(f"{what}: ranges overlap at {lo2}")
    if not out:
        raise ValueError(f"{what}: give at least one range")
    return out


def _lookup(ranges: list[tuple[int, int, int]], x: int, below: int) -> int:
    """k of the range holding x; in a gap, the previous range's k; below the first range, ``below``."""
    k = below
    for lo, hi, kk in ranges:
        if x < lo:
            break
        k = kk
        if x <= hi:
            break
    return k


class ControlParams(PolicyParams):
    """Parameters every controller has.

    Attributes:
        tax: per-pass tax fraction while the mechanism is on (a number, or ``measured``: the
            vLLM issue #49548 points interpolated over the batch); a scenario refuses it with
            ``always``, which is not dynamic (as ``switch_s``).
        switch_s: time paid each time speculation is switched on or off, seconds.
    """

    # (Any and one validator: a union's member names would show in pydantic's messages)
    tax: Any = Field("measured", description="per-pass tax while dynamic: a fraction in [0, 5), or 'measured'")
    switch_s: float = Field(0.001, ge=0.0, description="cost of each on/off switch, seconds (stated assumption: "
                                                       "one drafter catch-up step, ~1 ms)")

    def k_settings(self) -> list[tuple[str, int]]:
        """The draft lengths this controller's settings name, as ``(where, k)``: a run caps each at
        the drafter's draft length (none here; the tables and ``k_min`` below name some)."""
        return []

    @field_validator("tax", mode="before")
    @classmethod
    def _tax(cls, v: Any) -> Any:
        if v == "measured" and isinstance(v, str):
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v < 5.0:
            return float(v)
        raise ValueError("allowed: 'measured' or a fraction in [0, 5)")


class DraftControl(ABC):
    """Base class of draft-length controllers (see module docstring).

    Subclasses set ``name``, ``Params`` and implement :meth:`cap`; ``dynamic`` says whether the
    engine charges the dynamic-speculation tax and switch cost.
    """

    name: ClassVar[str]
    Params: ClassVar[type[ControlParams]] = ControlParams
    dynamic: ClassVar[bool] = True

    def __init__(self, params: ControlParams) -> None:
        self.params = params

    @abstractmethod
    def cap(self, view: DraftView) -> int:
        """The most positions every request may draft this round (0: speculation off)."""

    def observe(self, outcome: RoundOutcome) -> None:
        """Called after each round that verified drafts."""

    def describe(self) -> str:
        """Short label, e.g. ``batch_table({'1-16': 3})``."""
        args = ", ".join(f"{k}={v}" for k, v in self.params.model_dump().items() if k not in ("tax", "switch_s"))
        return f"{self.name}({args})" if args else self.name


@register_control("always")
class AlwaysDraft(DraftControl):
    """Draft everything the drafter offers, every round (speculation always on)."""

    dynamic = False

    def cap(self, view: DraftView) -> int:
        """All the drafter offers: ``view.max_draft_len``.

        Args:
            view: the round before drafting (``num_requests``, ``max_draft_len``).

        Returns:
            Positions every request may draft this round, in ``0..view.max_draft_len``.
        """
        return view.max_draft_len


class BatchThresholdParams(ControlParams):
    """``disable_by_batch_size``: off above ``max_batch`` (and below ``min_batch``), with hysteresis."""

    max_batch: int = Field(..., ge=0, description="speculation off while more requests than this decode")
    min_batch: int = Field(0, ge=0, description="speculation off while fewer requests than this decode")
    hysteresis: int = Field(0, ge=0, description="batch units the batch must move past a threshold to switch back")


@register_control("disable_by_batch_size")
class DisableByBatchSize(DraftControl):
    """Speculation off above ``max_batch`` running requests (vLLM ``speculative_disable_by_batch_size``).

    With ``hysteresis`` h, speculation turns off when the batch exceeds ``max_batch`` and back on
    only when it falls to ``max_batch - h`` (likewise at ``min_batch``), so a batch hovering at
    the threshold does not flip every round.
    """

    Params = BatchThresholdParams

    def __init__(self, params: BatchThresholdParams) -> None:
        super().__init__(params)
        self._on = True

    def cap(self, view: DraftView) -> int:
        """``view.max_draft_len`` while on, 0 while off (switching with hysteresis).

        Args:
            view: the round before drafting (``num_requests``, ``max_draft_len``).

        Returns:
            Positions every request may draft this round, in ``0..view.max_draft_len``.
        """
        p, r = self.params, view.num_requests
        if self._on:
            if r > p.max_batch or r < p.min_batch:
                self._on = False
        elif p.min_batch + p.hysteresis <= r <= p.max_batch - p.hysteresis:
            self._on = True
        return view.max_draft_len if self._on else 0


class BatchTableParams(ControlParams):
    """``batch_table``: vLLM's ``num_speculative_tokens_per_batch_size`` mapping."""

    table: dict[str, int] = Field(..., description="{'lo-hi': k}: inclusive batch ranges; gaps inherit the previous k")

    @field_validator("table")
    @classmethod
    def _table(cls, v: dict[str, int]) -> dict[str, int]:
        parse_range_table(v, "table")
        return v

    def k_settings(self) -> list[tuple[str, int]]:
        """Each range's k, as ``("table['lo-hi']", k)``."""
        return [(f"table[{rng!r}]", int(k)) for rng, k in self.table.items()]


@register_control("batch_table")
class BatchTable(DraftControl):
    """k from the batch size by an inclusive range table (vLLM PR #32374's semantics: a batch in a
    gap takes the previous range's k; below the first range, the first range's k; k is clamped to
    what the drafter offers)."""

    Params = BatchTableParams

    def __init__(self, params: BatchTableParams) -> None:
        super().__init__(params)
        self._ranges = parse_range_table(params.table, "table")

    def cap(self, view: DraftView) -> int:
        """k of the range holding ``view.num_requests``, clamped to ``view.max_draft_len``.

        Args:
            view: the round before drafting (``num_requests``, ``max_draft_len``).

        Returns:
            Positions every request may draft this round, in ``0..view.max_draft_len``.
        """
        k = _lookup(self._ranges, view.num_requests, self._ranges[0][2])
        return min(k, view.max_draft_len)


class ContextTableParams(ControlParams):
    """``context_table``: rows of (batch range, context range, k)."""

    rows: list[dict[str, Any]] = Field(..., description="[{batch: 'lo-hi', context: 'lo-hi', k: n}, ...]; first match wins")
    default_k: int = Field(0, ge=0, description="k when no row matches")

    @model_validator(mode="after")
    def _rows(self) -> "ContextTableParams":
        if not self.rows:
            raise ValueError("rows: give at least one {batch, context, k} row")
        for i, row in enumerate(self.rows):
            if set(row) != {"batch", "context", "k"}:
                raise ValueError(f"rows[{i}]: needs exactly batch, context and k (got {sorted(row)})")
            parse_range_table({row["batch"]: row["k"]}, f"rows[{i}].batch")
            parse_range_table({row["context"]: row["k"]}, f"rows[{i}].context")
        return self

    def k_settings(self) -> list[tuple[str, int]]:
        """Each row's k and ``default_k``."""
        return [(f"rows[{i}].k", int(r["k"])) for i, r in enumerate(self.rows)] + [("default_k", self.default_k)]


@register_control("context_table")
class ContextTable(DraftControl):
    """k from (batch size, mean context of the decoding requests) by a 2-D table; the first row
    whose batch and context ranges both hold wins; ``default_k`` when none does."""

    Params = ContextTableParams

    def __init__(self, params: ContextTableParams) -> None:
        super().__init__(params)
        self._rows = [(parse_range_table({r["batch"]: 0}, "batch")[0][:2],
                       parse_range_table({r["context"]: 0}, "context")[0][:2], int(r["k"])) for r in params.rows]

    def cap(self, view: DraftView) -> int:
        """k of the first row holding the batch size and the mean context (tokens).

        Args:
            view: the round before drafting (``num_requests``, ``max_draft_len``, ``context_tokens``).

        Returns:
            Positions every request may draft this round, in ``0..view.max_draft_len``.
        """
        r = view.num_requests
        ctx = float(view.context_tokens.mean()) if view.context_tokens.size else 0.0
        for (blo, bhi), (clo, chi), k in self._rows:
            if blo <= r <= bhi and clo <= ctx <= chi:
                return min(k, view.max_draft_len)
        return min(self.params.default_k, view.max_draft_len)


class AcceptanceTargetParams(ControlParams):
    """``acceptance_target``: EMA of acceptance vs a target, with hysteresis."""

    target: float = Field(0.6, gt=0.0, lt=1.0, description="acceptance rate to hold")
    hysteresis: float = Field(0.05, ge=0.0, lt=0.5, description="dead band around the target")
    half_life_rounds: float = Field(8.0, gt=0.0, description="EMA half-life, rounds")
    # (bounded: the compiled rounds read them as 64-bit integers; 127 is the widest drafter, MAX_DRAFT_LEN)
    k_min: int = Field(1, ge=0, le=127, description="smallest k (0 lets it turn speculation off)")
    probe_every: int = Field(32, ge=1, le=100000, description="at k = 0, draft one position every this many rounds")

    def k_settings(self) -> list[tuple[str, int]]:
        """``k_min``."""
        return [("k_min", self.k_min)]


@register_control("acceptance_target")
class AcceptanceTarget(DraftControl):
    """k steps down by one when the acceptance EMA falls below ``target - hysteresis`` and up by one
    above ``target + hysteresis`` (within [k_min, drafter depth]); at k = 0 acceptance is not
    observed, so one position is drafted every ``probe_every`` rounds."""

    Params = AcceptanceTargetParams

    def __init__(self, params: AcceptanceTargetParams) -> None:
        super().__init__(params)
        self._k: int | None = None
        self._ema: float | None = None
        self._alpha = 1.0 - 0.5 ** (1.0 / params.half_life_rounds)
        self._off_rounds = 0

    def cap(self, view: DraftView) -> int:
        """The current k (1 every ``probe_every`` rounds while k is 0).

        Args:
            view: the round before drafting (``num_requests``, ``max_draft_len``).

        Returns:
            Positions every request may draft this round, in ``0..view.max_draft_len``.
        """
        if self._k is None:
            self._k = view.max_draft_len
        self._k = min(self._k, view.max_draft_len)
        if self._k == 0:
            self._off_rounds += 1
            if self._off_rounds >= self.params.probe_every:
                self._off_rounds = 0
                return 1
            return 0
        return self._k

    def observe(self, outcome: RoundOutcome) -> None:
        """Update the acceptance EMA (accepted / verified draft tokens) and step k by one.

        Args:
            outcome: the verified round (``verified``, ``accepted`` per request).
        """
        verified = int(outcome.verified.sum())
        if verified == 0 or self._k is None:
            return
        rate = float(outcome.accepted.sum()) / verified
        self._ema = rate if self._ema is None else self._ema + self._alpha * (rate - self._ema)
        p = self.params
        if self._ema < p.target - p.hysteresis:
            self._k = max(p.k_min, self._k - 1)
        elif self._ema > p.target + p.hysteresis:
            self._k = self._k + 1  # clamped to the drafter's depth at the next cap()
        if self._k == 0:
            self._ema = None  # re-learn from the probes


class ProbingParams(ControlParams):
    """``probing``: a full-block probe every ``probe_every`` rounds."""

    probe_every: int = Field(32, ge=2, le=100000, description="rounds between full-block probes")


@register_control("probing")
class Probing(DraftControl):
    """Draft the full block every ``probe_every`` rounds; in between, the k that maximises the
    expected rate ``R (1 + sum_{j<=k} A_j) / (T_draft(k) + T_pass(R (1 + k)) + fixed)``, A_j the
    probe's measured acceptance by position (joint: positions 1..j accepted), against plain
    decoding (k = 0). Tokens per round from Leviathan et al. 2023."""

    Params = ProbingParams

    def __init__(self, params: ProbingParams) -> None:
        super().__init__(params)
        self._since = params.probe_every  # probe first
        self._accept: np.ndarray | None = None  # joint acceptance by position from the last probe
        self._probing = False

    def cap(self, view: DraftView) -> int:
        """The full block on a probe round, else the k with the best expected rate.

        Args:
            view: the round before drafting (``num_requests``, ``max_draft_len``, ``expected_rate``).

        Returns:
            Positions every request may draft this round, in ``0..view.max_draft_len``.
        """
        self._since += 1
        if self._accept is None or self._since >= self.params.probe_every:
            self._since, self._probing = 0, True
            return view.max_draft_len
        self._probing = False
        best_k, best = 0, view.expected_rate(0, 0.0)
        cum = np.cumsum(self._accept[: view.max_draft_len])
        for k in range(1, cum.size + 1):
            rate = view.expected_rate(k, float(cum[k - 1]))
            if rate == rate and rate > best * (1 + 1e-9):
                best_k, best = k, rate
        return best_k

    def observe(self, outcome: RoundOutcome) -> None:
        """After a probe round, keep its joint acceptance by position (product of the conditional
        rates ``accepted_by_position / tested_by_position``).

        Args:
            outcome: the verified round.
        """
        if not self._probing:
            return
        v = outcome.tested_by_position
        with np.errstate(divide="ignore", invalid="ignore"):
            cond = np.where(v > 0, outcome.accepted_by_position / np.maximum(v, 1), 0.0)
        self._accept = np.cumprod(cond)  # P(1..j accepted) = product of the conditional rates
