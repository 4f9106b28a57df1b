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

from .. import _compiled
from ..errors import InvalidArgumentError

__all__ = ["SPSTable", "roofline_extrapolate", "AttentionCost", "DrafterCost", "MeasuredDrafterCost", "Overheads", "BELOW_MIN_RULES", "BEYOND_MAX_RULES"]


#: Rules for B outside the measured range (``below_min`` / ``beyond_max``).
BELOW_MIN_RULES = ("error", "flat")
BEYOND_MAX_RULES = ("error", "roofline", "extrapolate")  # "extrapolate": the older name of "roofline"


@dataclass(frozen=True)
class AttentionCost:
    """How a pass's time grows with the context it attends to: a roofline of three limits.

    ``attn = max(a(q) * L_max, b * K, c * W)`` ms, where for the requests in the pass ``L_max`` is
    the longest context (tokens in one KV cache: small batches are latency-bound per sequence),
    ``K`` the KV tokens read in all (bandwidth-bound), ``W`` the query-key pairs, sum over requests
    of query tokens x context (compute-bound), and ``q`` the query tokens per request. ``a`` is
    linear in ``q`` between its measured points (flat beyond).

    Attributes:
        a_points: ``((q, ms per context token), ...)`` measured latency slopes, q increasing.
        b_ms_per_kv_token: bandwidth slope, ms per KV token read.
        c_ms_per_pair: compute slope, ms per query-key pair.
        source: how the constants were obtained.

    Source: docs/model.md section 1 step 4 (a pass grows with the KV context it reads); the three
    limits are the roofline reading of the H200 context pairs (calibration/h200/SOURCES.md).
    """

    a_points: tuple[tuple[float, float], ...] = ((1.0, 0.0),)
    b_ms_per_kv_token: float = 0.0
    c_ms_per_pair: float = 0.0
    source: str = ""

    @cached_property
    def _a_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # a_points as two arrays, built once (ms runs every round)
        return (np.array([p[0] for p in self.a_points], dtype=np.float64),
                np.array([p[1] for p in self.a_points], dtype=np.float64))

    @cached_property
    def one_slope(self) -> float | None:
        """``a`` as a Python float when it is one value at every q (one measured point, as every
        shipped profile), else None."""
        qs, slopes = self._a_arrays
        return float(slopes[0]) if qs.size == 1 else None

    @property
    def is_zero(self) -> bool:
        """True when every slope is 0 (the pass time then does not depend on the context)."""
        return self.b_ms_per_kv_token == 0 and self.c_ms_per_pair == 0 and all(a == 0 for _, a in self.a_points)

    def ms(self, q: Any, l_max: Any, kv: Any, pairs: Any) -> Any:
        """``max(a(q) * l_max, b * kv, c * pairs)`` ms (numpy-broadcasting).

        Args:
            q: query tokens per request (scalar or array).
            l_max: longest context in the pass, tokens.
            kv: KV tokens read by the pass in all, tokens.
            pairs: query-key pairs of the pass (query tokens x context, summed over requests).

        Returns:
            The attention term in ms, of the broadcast shape of the arguments.

        Source:
            The three-limit roofline of the class docstring (docs/model.md section 1 step 4).
        """
        a = self.latency_slope(q)
        return np.maximum(np.maximum(a * l_max, self.b_ms_per_kv_token * kv), self.c_ms_per_pair * pairs)

    def latency_slope(self, q: Any) -> Any:
        """``a(q)``, ms per context token: linear between the measured points, flat beyond.

        Args:
            q: query tokens per request (scalar or array).

        Returns:
            A numpy scalar or array of ``q``'s shape.
        """
        qs, slopes = self._a_arrays
        # one measured point: interp gives it at every q (np.interp's wrapper costs ~3 us a round)
        return slopes[0] if qs.size == 1 else np.interp(q, qs, slopes)


@dataclass(frozen=True)
class _Dense:
    """Per-integer-B arrays of a table (index = B), computed once and shared by its context views."""

    raw_ms: np.ndarray  # measured-rule pass time at each point's own context (NaN where refused)
    zero_ms: np.ndarray  # the same with the attention term removed (context 0)
    pad_index: np.ndarray  # the captured (graph) size a B is padded to
    factor: np.ndarray  # 1, or the eager factor above the largest captured size

    @cached_property
    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """(pad_index as float64, zero_ms at the padded size) per B: slices of them are views,
        where indexing zero_ms by pad_index would copy every round."""
        return self.pad_index.astype(np.float64), self.zero_ms[self.pad_index]

    @cached_property
    def padded_lists(self) -> tuple[list[float], list[float], list[float]]:
        """:attr:`padded` and ``factor`` as Python lists: one B priced on floats, no numpy scalars."""
        pad_f, zero_at_pad = self.padded
        return pad_f.tolist(), zero_at_pad.tolist(), self.factor.tolist()


def roofline_extrapolate(x: Any, xs: np.ndarray, ts: np.ndarray) -> Any:
    """Time beyond the largest measured point: a straight line that never falls.

    The slope is the secant through the last two measured points (the compute-bound line). When
    that secant does not rise (measurement noise at the top of a curve, e.g. H200 decode passes
    of 16.1 ms at B = 512 after 18.0 ms at 448), the secant from the last point down to the
    measured point nearest half of it is used instead, and the slope is never below zero: a
    bigger batch never takes less time than the largest measured one. One point: proportional.

    Args:
        x: where to evaluate (scalar or array), beyond ``xs[-1]``.
        xs: measured positions, shape (n,), increasing.
        ts: measured times, shape (n,), > 0 (any unit; the result has the same).

    Returns:
        Times of ``x``'s shape, ``>= ts[-1]`` for ``x >= xs[-1]``.

    Raises:
        Nothing (the callers validate ``xs`` and ``ts`` on construction).

    Source:
        Roofline model (Williams, Waterman, Patterson, CACM 2009): above the knee, time grows
        linearly with the work; the noise guard is this project's (a fault report: negative pass
        times from a falling last secant).
    """
    x1, t1 = float(xs[-1]), float(ts[-1])
    if xs.size < 2:
        return t1 * (np.asarray(x, dtype=np.float64) / x1)
    slope = (t1 - float(ts[-2])) / (x1 - float(xs[-2]))
    if slope <= 0.0:
        j = int(np.argmin(np.abs(xs[:-1] - x1 / 2.0)))
        slope = max((t1 - float(ts[j])) / (x1 - float(xs[j])), 0.0)
    return t1 + (np.asarray(x, dtype=np.float64) - x1) * slope


@dataclass(frozen=True)
class SPSTable:
    """Pass time (and verifier steps per second) of one forward pass over B tokens.

    The measured curve, interpolated linearly in pass time between measured neighbours (every
    measured point exact, cliffs kept), plus four stated extensions:

    * **Outside the measured range**: ``below_min`` (``error`` refuses, ``flat`` takes the
      smallest measured pass: the memory-bound floor) and ``beyond_max`` (``error`` refuses,
      ``roofline`` continues linearly through the last two measured points: the compute-bound
      line, never falling: :func:`roofline_extrapolate`). A run reports the fraction of its rounds priced outside the measured range.
    * **Context**: a pass attends to the KV cache of every request in it, so its time grows with
      the context (:class:`AttentionCost`). Each measured point is first brought to context 0 by
      removing the attention term of its own measured context (``ref_*`` arrays), and a round's
      table adds the term for that round's context back: ``at_context(R, L_max, K)``.
    * **CUDA-graph padding**: with ``graph_sizes`` a pass runs padded to the next captured size and
      above the largest one eager, ``eager_factor`` times slower.

    Attributes:
        batch_tokens: measured B, shape (n,), strictly increasing ints >= 1.
        pass_ms: measured pass time at each B, shape (n,), ms, > 0.
        source: where the points come from (URL / file and selection).
        beyond_max: rule above the largest measured B (see above).
        below_min: rule below the smallest measured B.
        attention: the context term (default: none).
        ref_requests: requests R of each measured pass, shape (n,) (default 1).
        ref_l_max: longest context of each measured pass, tokens, shape (n,) (default 0).
        ref_kv: KV tokens each measured pass read, shape (n,) (default 0).
        context: ``(R, L_max, K)`` this table is evaluated at (None: each point's own context).
        graph_sizes: captured CUDA-graph batch sizes, increasing (empty: no padding).
        eager_factor: pass-time factor above the largest captured size (>= 1).
        dense_limit: precompute values up to this B (the engine's max_batch_tokens).

    Raises:
        InvalidArgumentError: on construction: mismatched, empty or non-increasing
            ``batch_tokens``, a B < 1, a non-finite or non-positive pass time, an unknown
            ``beyond_max`` / ``below_min`` rule, negative or non-finite ``ref_*`` values,
            ``graph_sizes`` not increasing from >= 1, or ``eager_factor`` < 1.

    Source: docs/model.md section 1 step 4 (SPS(B) is a measured, jagged table; real passes grow
    with the KV context read, run padded to captured CUDA-graph sizes); vLLM model_runner captures
    graph sizes 1, 2, 4 and multiples of 8 (vllm-project/vllm PR #7894).
    """

    batch_tokens: np.ndarray
    pass_ms: np.ndarray
    source: str = "user table"
    beyond_max: str = "error"
    below_min: str = "error"
    attention: AttentionCost | None = None
    ref_requests: np.ndarray | None = None
    ref_l_max: np.ndarray | None = None
    ref_kv: np.ndarray | None = None
    context: tuple[float, float, float] | None = None
    graph_sizes: tuple[int, ...] = ()
    eager_factor: float = 1.0
    dense_limit: int = 0

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
        if self.beyond_max not in BEYOND_MAX_RULES:
            raise InvalidArgumentError(f"sps: beyond_max must be one of {', '.join(BEYOND_MAX_RULES)}, "
                                       f"got {self.beyond_max!r}")
        if self.below_min not in BELOW_MIN_RULES:
            raise InvalidArgumentError(f"sps: below_min must be one of {', '.join(BELOW_MIN_RULES)}, "
                                       f"got {self.below_min!r}")
        for name, default in (("ref_requests", 1.0), ("ref_l_max", 0.0), ("ref_kv", 0.0)):
            v = getattr(self, name)
            arr = np.full(b.size, default) if v is None else \
                np.broadcast_to(np.asarray(v, dtype=np.float64), b.shape).copy()
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise InvalidArgumentError(f"sps: {name} must be finite and >= 0")
            object.__setattr__(self, name, arr)
        g = tuple(int(x) for x in self.graph_sizes)
        if any(x < 1 for x in g) or any(y <= x for x, y in zip(g, g[1:])):
            raise InvalidArgumentError(f"sps: graph_sizes must be increasing batch sizes >= 1, got {list(g)}")
        if not (math.isfinite(self.eager_factor) and self.eager_factor >= 1.0):
            raise InvalidArgumentError(f"sps: eager_factor must be >= 1, got {self.eager_factor}")
        object.__setattr__(self, "graph_sizes", g)
        object.__setattr__(self, "batch_tokens", b)
        object.__setattr__(self, "pass_ms", t)

    @classmethod
    def from_mapping(cls, sps: Mapping[int, float], *, source: str = "user table") -> "SPSTable":
        """Build a table from ``{B: steps per second}``.

        Args:
            sps: ``{B (tokens): SPS(B) (passes per second)}``; pass times become ``1000 / SPS`` ms.
            source: where the numbers come from.

        Returns:
            The table, with the default rules (``error`` outside the measured range).

        Raises:
            InvalidArgumentError: an empty or non-mapping ``sps``, a key that is not a positive
                integer, a value that is not a positive number, or any check of the class.

        Source:
            docs/model.md section 1 step 4 (a pass over B tokens takes ``1 / SPS(B)``).
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

    @cached_property
    def min_batch_tokens(self) -> int:
        """Smallest B with a value (1 when ``below_min`` is ``flat``); cached: asked several times a round."""
        return 1 if self.below_min == "flat" else int(self.batch_tokens[0])

    @cached_property
    def max_batch_tokens(self) -> int:
        """Largest measured B (the end of the interpolation's domain); cached: asked several times a round."""
        return int(self.batch_tokens[-1])

    @cached_property
    def has_context_term(self) -> bool:
        """Whether pass time depends on the context attended to."""
        return self.attention is not None and not self.attention.is_zero

    def _attention_at_points(self) -> np.ndarray:
        """The attention term of each measured point at its own context, ms, shape (n,)."""
        if not self.has_context_term:
            return np.zeros(self.batch_tokens.size)
        q = self.batch_tokens / self.ref_requests
        return self.attention.ms(q, self.ref_l_max, self.ref_kv, self.ref_kv * q)

    def is_measured(self, b: int) -> bool:
        """Whether B lies inside the measured range (no extrapolation rule needed).

        Args:
            b: token batch B.

        Returns:
            ``batch_tokens[0] <= b <= batch_tokens[-1]``.
        """
        return int(self.batch_tokens[0]) <= b <= self.max_batch_tokens

    @cached_property
    def _dense(self) -> _Dense:
        top = max(self.max_batch_tokens, int(self.dense_limit), max(self.graph_sizes, default=0))
        bs = np.arange(top + 1, dtype=np.float64)
        raw = self._interp_ms(bs, self.pass_ms)
        zero = self._interp_ms(bs, self.pass_ms - self._attention_at_points()) if self.has_context_term else raw
        pad = np.arange(top + 1)
        factor = np.ones(top + 1)
        if self.graph_sizes:
            sizes = np.array(self.graph_sizes)
            j = np.searchsorted(sizes, pad)  # first captured size >= B
            inside = j < sizes.size
            pad[inside] = sizes[j[inside]]
            factor[~inside] = self.eager_factor
        return _Dense(raw, np.maximum(zero, 0.05 * raw), pad, factor)

    def _interp_ms(self, bs: np.ndarray, ms: np.ndarray) -> np.ndarray:
        """``ms`` (one per measured point) at every B of ``bs`` under the table's rules (NaN where refused)."""
        out = np.interp(bs, self.batch_tokens, ms)
        if self.below_min == "error":
            out[: int(self.batch_tokens[0])] = np.nan
        out[0] = np.nan
        beyond = bs > self.max_batch_tokens
        if beyond.any():
            out[beyond] = self._roofline_ms(bs[beyond], ms) if self.beyond_max != "error" else np.nan
        return out

    @cached_property
    def _dense_pass_s(self) -> np.ndarray:
        # pass time in seconds for every integer B in [0, top] at this table's context; NaN where refused
        d = self._dense
        if self.context is None or not self.has_context_term:
            t = d.raw_ms
        else:
            req, l_max, kv = self.context
            q = np.arange(d.zero_ms.size, dtype=np.float64) / max(req, 1.0)  # query tokens per request
            t = d.zero_ms + self.attention.ms(q, l_max, kv, kv * q)
        return t[d.pad_index] * d.factor / 1000.0

    def at_context(self, num_requests: int, l_max: float, kv_tokens: float) -> "SPSTable":
        """This table for one round: ``num_requests`` requests whose longest context is ``l_max``
        tokens and which read ``kv_tokens`` KV tokens in all (the pairs term takes every token of
        the pass as a query over the mean context). Cheap: shares the per-B arrays; without a
        context term it returns ``self``.

        Args:
            num_requests: requests R in the pass.
            l_max: longest context among them, tokens.
            kv_tokens: KV tokens the pass reads in all, tokens.

        Returns:
            A table whose pass times include this round's attention term.

        Raises:
            InvalidArgumentError: a count that is not a number, or negative, infinite or NaN (the
                context's maxima would then depend on the order of their operands).

        Source:
            docs/model.md section 1 step 4 (real passes grow with the KV context they read).
        """
        try:
            ok = 0 <= num_requests < math.inf and 0 <= l_max < math.inf and 0 <= kv_tokens < math.inf
        except TypeError:  # not numbers
            ok = False
        if not ok:
            raise InvalidArgumentError(f"at_context: num_requests, l_max and kv_tokens must be finite numbers >= 0, "
                                       f"got {num_requests!r}, {l_max!r}, {kv_tokens!r}")
        if not self.has_context_term:
            return self
        # computed once on the base table and shared by every round's view (a view's own
        # cached_property would compute them again each round)
        self._dense, self.min_batch_tokens, self.max_batch_tokens  # noqa: B018
        out = object.__new__(SPSTable)
        state = out.__dict__
        state.update(self.__dict__)
        state.pop("_dense_pass_s", None)  # the base table's context-free cache is not this view's
        state["context"] = (float(num_requests), float(l_max), float(kv_tokens))
        return out

    def covers(self, b: int) -> bool:
        """Whether B has a value under the table's rules.

        Args:
            b: token batch B.

        Returns:
            True when :meth:`pass_time_s` would return a value for ``b``.
        """
        return self.min_batch_tokens <= b and (b <= self.max_batch_tokens or self.beyond_max != "error")

    def pass_time_s(self, b: Any) -> Any:
        """Forward-pass time in seconds at token batch ``b`` (int or int array).

        Args:
            b: token batch B (tokens in the pass): an int, or an int array of any shape.

        Returns:
            Seconds per pass: a float for an int ``b``, else a float64 array of ``b``'s shape.

        Raises:
            InvalidArgumentError: some ``b`` lies outside the range the table's rules cover.

        Source:
            The ``linear_pass_time`` lookup rule of the module docstring, plus the context,
            graph-padding and edge extensions of the class docstring (docs/model.md section 1
            step 4).
        """
        if self.context is not None and self.has_context_term:
            if isinstance(b, (int, np.integer)):
                v = self._context_one_s(int(b))
                if v == v:  # not NaN: one scalar, computed alone (no per-round dense array)
                    return v
        else:
            dense = self._dense_pass_s
            if isinstance(b, (int, np.integer)) and 0 < b < dense.size:
                v = dense[b]
                if v == v:  # not NaN: fast path for one scalar
                    return float(v)
        dense = self._dense_pass_s
        arr = np.asarray(b, dtype=np.int64)
        if arr.size and (arr.min() < self.min_batch_tokens or (arr.max() > self.max_batch_tokens
                                                               and self.beyond_max == "error")):
            bad = int(arr.min()) if arr.min() < self.min_batch_tokens else int(arr.max())
            raise InvalidArgumentError(
                f"sps: no value for B={bad}: measured range is {int(self.batch_tokens[0])}..{self.max_batch_tokens} "
                f"and the table's rules (below_min {self.below_min}, beyond_max {self.beyond_max}) do not cover it"
            )
        if arr.size and arr.max() >= dense.size:
            out = np.empty(arr.shape, dtype=np.float64)
            inside = arr < dense.size
            out[inside] = dense[arr[inside]]
            far = arr[~inside].astype(np.float64)
            if self.context is not None and self.has_context_term:
                req, l_max, kv = self.context
                q = far / max(req, 1.0)
                far_ms = self._roofline_ms(far, self.pass_ms - self._attention_at_points()) + \
                    self.attention.ms(q, l_max, kv, kv * q)
            else:
                far_ms = self._roofline_ms(far, self.pass_ms)
            out[~inside] = far_ms * (self.eager_factor if self.graph_sizes else 1.0) / 1000.0
        else:
            out = dense[arr]
        return float(out) if np.ndim(b) == 0 else out

    def pass_time_range_s(self, b_first: int, b_last: int) -> np.ndarray:
        """Pass times for every B in ``b_first..b_last`` (inclusive).

        Args:
            b_first: first token batch B.
            b_last: last token batch B (>= ``b_first``).

        Returns:
            ``(b_last - b_first + 1,)`` float64 seconds (a view of the precomputed values when
            they cover the range).

        Raises:
            InvalidArgumentError: some B in the range has no value (from :meth:`pass_time_s`).
        """
        ok = self.min_batch_tokens <= b_first and (b_last <= self.max_batch_tokens or self.beyond_max != "error")
        if self.context is not None and self.has_context_term:
            if ok and b_last < self._dense.zero_ms.size:
                return self._context_slice_s(b_first, b_last)  # only the B the caller scans
        else:
            dense = self._dense_pass_s
            if ok and b_last < dense.size:
                return dense[b_first: b_last + 1]
        return self.pass_time_s(np.arange(b_first, b_last + 1))

    def pass_times_along_s(self, b: int, num_requests: int, l_max: np.ndarray,
                           kv_tokens: np.ndarray) -> np.ndarray | None:
        """Pass time at one B over a sequence of contexts (the rounds of a block, whose context
        grows every round): element j is what ``at_context(num_requests, l_max[j],
        kv_tokens[j]).pass_time_s(b)`` returns, bit for bit (the same float operations).

        Args:
            b: token batch B.
            num_requests: requests R in each pass.
            l_max: ``(m,)`` longest context of each pass, tokens.
            kv_tokens: ``(m,)`` KV tokens each pass reads in all, tokens.

        Returns:
            ``(m,)`` float64 seconds, or None where that one-B rule does not price B (outside the
            dense range of a table with a context term, or no value there): ask
            :meth:`pass_time_s` instead.
        """
        if not self.has_context_term:
            return np.full(np.shape(l_max), self.pass_time_s(b))
        d = self._dense
        if not 0 < b < d.zero_ms.size:
            return None
        out = self._context_s(slice(b, b + 1), float(num_requests), np.asarray(l_max, dtype=np.float64),
                              np.asarray(kv_tokens, dtype=np.float64))
        return None if np.isnan(out).any() else out

    def _context_s(self, bs: Any, num_requests: float, l_max: Any, kv: Any) -> Any:
        """The pass time in seconds at batch(es) ``bs`` (an int, or a slice of B) with the attention
        term of ``num_requests`` requests, longest context ``l_max`` and ``kv`` KV tokens read (floats
        or arrays, broadcast): the one formula every context pricing here uses, so that a scalar, a
        range of B and a sequence of contexts agree bit for bit."""
        d = self._dense
        pad_f, zero_at_pad = d.padded
        q = pad_f[bs] / max(num_requests, 1.0)
        return (zero_at_pad[bs] + self.attention.ms(q, l_max, kv, kv * q)) * d.factor[bs] / 1000.0

    def context_coefficients(self, b: int, num_requests: float) -> tuple[float, float, float, float] | None:
        """The context pricing at one B for ``num_requests`` requests, as Python floats: the pass
        time at ``l_max`` and ``kv`` KV tokens read is ``(zero_ms + max(max(a * l_max,
        b_ms_per_kv_token * kv), c_ms_per_pair * (kv * q))) * factor / 1000`` s (:meth:`_context_s`,
        the same operations in the same order; the engine's compiled plain rounds take these).

        Args:
            b: token batch B.
            num_requests: requests R in the pass.

        Returns:
            ``(zero_ms, factor, a, q)``: the context-free pass time at B's padded size (ms), the
            eager factor, the latency slope at q (ms per context token) and the query tokens per
            request; None where no one-B rule prices B (no context term, B outside the dense
            range, or no value there).

        Source:
            docs/model.md section 1 step 4 (real passes grow with the KV context they read).
        """
        if not self.has_context_term or not 0 < b < self._dense.zero_ms.size:
            return None
        pad_f, zero_at_pad, factor = self._dense.padded_lists
        if zero_at_pad[b] != zero_at_pad[b]:  # NaN: B refused by the table's rules
            return None
        q = pad_f[b] / max(num_requests, 1.0)
        a = self.attention.one_slope
        return zero_at_pad[b], factor[b], float(self.attention.latency_slope(q)) if a is None else a, q

    def _context_one_s(self, b: int) -> float:
        """:meth:`_context_s` for one B on Python floats: the same operations in the same order
        (tests/test_cost_context_scalar.py checks the bits against the array formula)."""
        # context_coefficients inlined (a call costs a third of this, twice a round)
        pad_f, zero_at_pad, factor = self._dense.padded_lists
        if not 0 < b < len(zero_at_pad) or zero_at_pad[b] != zero_at_pad[b]:  # outside, or NaN: refused
            return float("nan")
        num_requests, l_max, kv = self.context
        q = pad_f[b] / max(num_requests, 1.0)
        att = self.attention
        a = att.one_slope
        if a is None:
            a = float(att.latency_slope(q))
        return (zero_at_pad[b] + max(max(a * l_max, att.b_ms_per_kv_token * kv), att.c_ms_per_pair * (kv * q))) \
            * factor[b] / 1000.0

    def _context_slice_s(self, b_first: int, b_last: int) -> np.ndarray:
        """Pass times at this table's context for B in ``b_first..b_last``, seconds (a round's table
        evaluates only what it is asked for: a per-round dense array would cost more than the scan).
        One compiled call where the latency slope is one value (every shipped profile)."""
        kernels = _compiled.active()
        att = self.attention
        if kernels is not None and att.one_slope is not None:  # a(q) is one value: the kernel's case
            pad_f, zero_at_pad = self._dense.padded
            num_requests, l_max, kv = self.context
            return kernels.context_pass_times(pad_f, zero_at_pad, self._dense.factor, b_first, b_last,
                                              float(num_requests), att.one_slope, float(l_max),
                                              float(kv), float(att.b_ms_per_kv_token), float(att.c_ms_per_pair))
        return self._context_s(slice(b_first, b_last + 1), *self.context)

    def _roofline_ms(self, b: np.ndarray, ms: np.ndarray | None = None) -> np.ndarray:
        return roofline_extrapolate(b, self.batch_tokens, self.pass_ms if ms is None else ms)

    def sps(self, b: Any) -> Any:
        """Steps per second ``1 / pass_time_s(b)``.

        Args:
            b: token batch B: an int or an int array.

        Returns:
            SPS(B) in passes per second (1/s), same type and shape as :meth:`pass_time_s`.

        Raises:
            InvalidArgumentError: as :meth:`pass_time_s`.

        Source:
            docs/model.md section 1 step 4.
        """
        return 1.0 / self.pass_time_s(b)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description (points, rules, context term, graph sizes) for run provenance.

        Returns:
            ``{"batch_tokens", "pass_ms" (ms, 4 decimals), "source", "lookup", "below_min",
            "beyond_max"}`` plus ``"attention"`` and ``"graph_sizes"`` / ``"eager_factor"`` when
            the table has them.
        """
        out: dict[str, Any] = {
            "batch_tokens": self.batch_tokens.tolist(),
            "pass_ms": [round(float(x), 4) for x in self.pass_ms],
            "source": self.source,
            "lookup": "linear_pass_time",
            "below_min": self.below_min,
            "beyond_max": self.beyond_max,
        }
        if self.has_context_term:
            a = self.attention
            out["attention"] = {"a_points": [list(p) for p in a.a_points], "b_ms_per_kv_token": a.b_ms_per_kv_token,
                                "c_ms_per_pair": a.c_ms_per_pair, "source": a.source}
        if self.graph_sizes:
            out["graph_sizes"] = list(self.graph_sizes)
            out["eager_factor"] = self.eager_factor
        return out


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

    Source:
        docs/model.md section 1 step 1 (``T_draft(R, gamma) = t_parallel(R * gamma) + gamma *
        t_seq``); the Markov head (low-rank V x r . r x V, r = 256) of DSpark paper (Cheng et al.
        2026), as summarised there.
    """

    t_small_s: float
    large_b: int
    t_large_s: float
    time_scale: float
    t_seq_s: float
    weights_gib: float
    source: str = ""
    kv_bytes_per_token: int = 0  # the measured small model's own KV, when used as a draft model

    def round_time_s(self, num_requests: int, gamma: int) -> float:
        """Drafting time of one round for ``num_requests`` requests drafting ``gamma`` tokens.

        Args:
            num_requests: requests R that draft this round.
            gamma: draft tokens per request (bonus excluded).

        Returns:
            Seconds; 0.0 when nothing is drafted.

        Source:
            docs/model.md section 1 step 1.
        """
        if gamma <= 0 or num_requests <= 0:
            return 0.0
        n = num_requests * gamma
        t_par = self.time_scale * max(self.t_small_s, n * self.t_large_s / self.large_b)
        return t_par + gamma * self.t_seq_s


@dataclass(frozen=True)
class MeasuredDrafterCost:
    """Drafting cost from measured drafter kernels, interpolated over the work of one round.

    Kinds (docs/model.md section 1 step 1):

    * ``block``: one semi-autoregressive pass drafts ``gamma`` tokens for every request (DSpark's
      drafter): ``T = t_pass(R * gamma tokens) + gamma * t_seq``, with ``t_pass`` measured over
      tokens in the pass (``x`` = tokens) and ``t_seq`` the sequential head's step.
    * ``mtp`` / ``model``: ``gamma`` sequential batched steps over the R drafting requests (an MTP
      module, or a separate small draft model): ``T = gamma * t_step(R)`` (``x`` = requests).
    * ``per_sequence``: a drafter that runs each request on its own (no batching):
      ``T = R * t_pass(gamma tokens)`` (``x`` = tokens of one request's pass).

    Between measured x the time is linear; below the smallest it is the smallest (a memory-bound
    floor); above the largest it continues through the last two points (roofline).

    Attributes:
        kind: ``block``, ``mtp``, ``model`` or ``per_sequence``.
        x: measured work (tokens or requests, see above), shape (n,), increasing.
        ms: measured time at each x, ms.
        t_seq_s: one sequential-head step (block kind), seconds.
        weights_gib: drafter memory, GiB.
        time_scale: stated ratio of the deployed drafter to the measured one (e.g. layers).
        source: measurements and mapping.

    Raises:
        InvalidArgumentError: on construction: an unknown ``kind``, or ``x`` / ``ms`` not
            matching, empty, non-increasing or with a time <= 0.

    Source: the H200 kinds draft_mtp / draft_block / draft_model (data/calibration/h200/SOURCES.md).
    """

    kind: str
    x: np.ndarray
    ms: np.ndarray
    t_seq_s: float = 0.0
    weights_gib: float = 0.0
    time_scale: float = 1.0
    source: str = ""
    kv_bytes_per_token: int = 0  # a draft model's own KV cache, bytes per token

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float64)
        ms = np.asarray(self.ms, dtype=np.float64)
        if self.kind not in ("block", "mtp", "model", "per_sequence"):
            raise InvalidArgumentError(f"drafter kind: {self.kind!r}; allowed: block, mtp, model, per_sequence")
        if x.ndim != 1 or x.shape != ms.shape or x.size == 0 or np.any(np.diff(x) <= 0) or np.any(ms <= 0):
            raise InvalidArgumentError("drafter: need increasing work values and positive times, one each")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "ms", ms)

    def _t_ms(self, work: float) -> float:
        if work <= self.x[-1] or self.x.size < 2:
            return float(np.interp(work, self.x, self.ms))
        return float(roofline_extrapolate(np.float64(work), self.x, self.ms))

    def round_time_s(self, num_requests: int, gamma: int) -> float:
        """Drafting time of one round, seconds (0 when nothing is drafted).

        Args:
            num_requests: requests R that draft this round.
            gamma: draft tokens per request (bonus excluded).

        Returns:
            Seconds, ``time_scale`` times the formula of the drafter's kind (class docstring).

        Source:
            docs/model.md section 1 step 1 and DESIGN.md section 1 (how each drafter kind prices
            a round).
        """
        if gamma <= 0 or num_requests <= 0:
            return 0.0
        if self.kind == "block":
            t = self._t_ms(num_requests * gamma) / 1000.0 + gamma * self.t_seq_s
        elif self.kind == "per_sequence":
            t = num_requests * self._t_ms(gamma) / 1000.0
        else:
            t = gamma * self._t_ms(num_requests) / 1000.0
        return self.time_scale * t


@dataclass(frozen=True)
class Overheads:
    """Costs a real engine pays every round besides the passes.

    Attributes:
        host_s: fixed host/CPU time per round not overlapped with the GPU (scheduling, input
            preparation, sampling), seconds.
        planner_s: extra per-round time of a policy that plans from confidences in the critical
            path (DSpark sync, threshold, goodput; not the asynchronous scheduler, whose planning
            overlaps the pass), seconds.
        sources: where each figure comes from (measurement or stated assumption).

    Raises:
        InvalidArgumentError: on construction: ``host_s`` or ``planner_s`` not a finite number
            >= 0.

    Source: docs/model.md section 1 step 4 ("a fixed host cost per step, plus the planner's own
    cost for adaptive policies: all measured or stated").
    """

    host_s: float = 0.0
    planner_s: float = 0.0
    sources: dict[str, str] | None = None

    def __post_init__(self) -> None:
        for name in ("host_s", "planner_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InvalidArgumentError(f"overheads.{name}: must be a finite number of seconds >= 0, got {v!r}")
