"""What a pass costs: the verify-cost table SPS(B) and the drafter's cost per round.

Lookup rule (``linear_pass_time``): for a token batch B between two measured sizes
``B_lo < B < B_hi`` the pass time is linear in B between the two measured pass times. Every
measured point is reproduced exactly and only the two neighbours influence a value, so a measured
cliff (a jump between neighbours) stays a cliff. Below the smallest or above the largest measured B
there is no rule: the lookup raises, unless the table asks for ``beyond_max: extrapolate`` (linear
in pass time through the last two points), which the run then reports.

Source: docs/model.md section 1 steps 1 and 4 (SPS(B) is a measured, jagged table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["SPSTable", "DrafterCost"]


@dataclass(frozen=True)
class SPSTable:
    """Verifier steps per second as a function of the token batch B of one forward pass.

    Attributes:
        batch_tokens: measured B values, shape (n,), strictly increasing ints >= 1.
        pass_ms: measured pass time at each B, shape (n,), milliseconds, > 0.
        source: where the points come from (URL / file and selection).
        beyond_max: ``"error"`` (refuse B above the largest measured B) or ``"extrapolate"``
            (linear in pass time through the last two measured points).

    Source: docs/model.md section 1 step 4 (SPS(B) is a measured, jagged table).
    """

    batch_tokens: np.ndarray
    pass_ms: np.ndarray
    source: str = "user table"
    beyond_max: str = "error"

    def __post_init__(self) -> None:
        b = np.asarray(self.batch_tokens, dtype=np.int64)
        t = np.asarray(self.pass_ms, dtype=np.float64)
        if b.ndim != 1 or b.shape != t.shape or b.size == 0:
            raise InvalidArgumentError("sps: need matching 1-D batch sizes and pass times, at least one point")
        if np.any(b < 1):
            raise InvalidArgumentError(f"sps: batch sizes must be >= 1, got {b.min()}")
        if np.any(np.diff(b) <= 0):
            raise InvalidArgumentError("sps: batch sizes must be strictly increasing (no duplicates)")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise InvalidArgumentError("sps: pass times / steps per second must be finite and > 0")
        if self.beyond_max not in ("error", "extrapolate"):
            raise InvalidArgumentError(f"sps: beyond_max must be 'error' or 'extrapolate', got {self.beyond_max!r}")
        object.__setattr__(self, "batch_tokens", b)
        object.__setattr__(self, "pass_ms", t)

    @classmethod
    def from_mapping(cls, sps: Mapping[int, float], *, source: str = "user table") -> "SPSTable":
        """Build a table from ``{B: steps per second}``.

        Raises:
            InvalidArgumentError: a key is not a positive integer or a value is not a positive number.
        """
        if not isinstance(sps, Mapping) or not sps:
            raise InvalidArgumentError("sps: expected a non-empty mapping {B: steps per second}")
        items = []
        for k, v in sps.items():
            if isinstance(k, bool) or int(k) != k or int(k) < 1:
                raise InvalidArgumentError(f"sps: keys must be integer batch sizes >= 1, got {k!r}")
            v = float(v)
            if not math.isfinite(v) or v <= 0:
                raise InvalidArgumentError(f"sps: SPS({k}) must be a positive number, got {v!r}")
            items.append((int(k), 1000.0 / v))
        items.sort()
        return cls(np.array([i[0] for i in items]), np.array([i[1] for i in items]), source=source)

    @property
    def min_batch_tokens(self) -> int:
        return int(self.batch_tokens[0])

    @property
    def max_batch_tokens(self) -> int:
        """Largest measured B (the end of the lookup rule's domain)."""
        return int(self.batch_tokens[-1])

    @cached_property
    def _dense_pass_s(self) -> np.ndarray:
        # pass time in seconds for every integer B in [0, max]; index 0 unused (NaN).
        bs = np.arange(self.max_batch_tokens + 1, dtype=np.float64)
        out = np.interp(bs, self.batch_tokens, self.pass_ms) / 1000.0
        out[: self.min_batch_tokens] = np.nan
        return out

    def covers(self, b: int) -> bool:
        """Whether B has a value under the lookup rule."""
        return self.min_batch_tokens <= b and (b <= self.max_batch_tokens or self.beyond_max == "extrapolate")

    def pass_time_s(self, b: Any) -> Any:
        """Forward-pass time in seconds at token batch ``b`` (int or int array).

        Raises:
            InvalidArgumentError: some ``b`` lies outside the measured range and the table does not
                extrapolate.
        """
        if isinstance(b, (int, np.integer)) and self.min_batch_tokens <= b <= self.max_batch_tokens:
            return float(self._dense_pass_s[b])  # fast path: one scalar inside the measured range
        arr = np.asarray(b, dtype=np.int64)
        lo, hi = self.min_batch_tokens, self.max_batch_tokens
        if arr.size and (arr.min() < lo or (arr.max() > hi and self.beyond_max != "extrapolate")):
            bad = int(arr.min()) if arr.min() < lo else int(arr.max())
            raise InvalidArgumentError(
                f"sps: no value for B={bad}: measured range is {lo}..{hi} and the lookup rule "
                "(linear in pass time between measured neighbours) does not extend past it"
            )
        if arr.size and arr.max() > hi:
            out = np.empty(arr.shape, dtype=np.float64)
            inside = arr <= hi
            out[inside] = self._dense_pass_s[arr[inside]]
            out[~inside] = self._extrapolate_s(arr[~inside])
        else:
            out = self._dense_pass_s[arr]
        return float(out) if np.ndim(b) == 0 else out

    def pass_time_range_s(self, b_first: int, b_last: int) -> np.ndarray:
        """Pass times for every B in ``b_first..b_last`` (inclusive), shape (b_last - b_first + 1,)."""
        if self.min_batch_tokens <= b_first and b_last <= self.max_batch_tokens:
            return self._dense_pass_s[b_first: b_last + 1]
        return self.pass_time_s(np.arange(b_first, b_last + 1))

    def _extrapolate_s(self, b: np.ndarray) -> np.ndarray:
        if self.batch_tokens.size < 2:
            return np.full(b.shape, self.pass_ms[-1] / 1000.0) * (b / self.batch_tokens[-1])
        b0, b1 = self.batch_tokens[-2:]
        t0, t1 = self.pass_ms[-2:]
        return (t1 + (b - b1) * (t1 - t0) / (b1 - b0)) / 1000.0

    def sps(self, b: Any) -> Any:
        """Steps per second ``1 / pass_time_s(b)``."""
        return 1.0 / self.pass_time_s(b)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_tokens": self.batch_tokens.tolist(),
            "pass_ms": [round(float(x), 4) for x in self.pass_ms],
            "source": self.source,
            "lookup": "linear_pass_time",
            "beyond_max": self.beyond_max,
        }


@dataclass(frozen=True)
class DrafterCost:
    """Cost of one drafting round of DSpark's semi-autoregressive drafter.

    ``T_draft(R, gamma) = t_parallel(R * gamma) + gamma * t_seq`` (docs/model.md section 1 step 1),
    with ``t_parallel(n) = scale * max(t_small, n * t_large / large_b)``: flat while the small
    model's pass is memory-bound, then the compute-bound line through its measured large-B point.
    ``t_seq`` is one step of the Markov head: ``rank * vocab * bytes / bandwidth``.

    Attributes:
        t_small_s: measured pass time of the reference model at B=1, seconds.
        large_b: B of the measured large pass (e.g. 512).
        t_large_s: measured pass time at ``large_b``, seconds.
        time_scale: documented ratio drafter / reference model.
        t_seq_s: one sequential-head step, seconds.
        weights_gib: drafter memory, GiB.
        source: text naming the measurements and mapping.
    """

    t_small_s: float
    large_b: int
    t_large_s: float
    time_scale: float
    t_seq_s: float
    weights_gib: float
    source: str = ""

    def round_time_s(self, num_requests: int, gamma: int) -> float:
        """Drafting time of one round for ``num_requests`` requests drafting ``gamma`` tokens."""
        if gamma <= 0 or num_requests <= 0:
            return 0.0
        n = num_requests * gamma
        t_par = self.time_scale * max(self.t_small_s, n * self.t_large_s / self.large_b)
        return t_par + gamma * self.t_seq_s
