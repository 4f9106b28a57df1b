"""The drafter lab's target model: a sparse order-n Markov source over a small vocabulary.

The next-token law depends on the last ``order`` tokens (the *history*). Its logits are a mixture
over suffix lengths, so the nearest token can matter more than older ones, as in text::

    z(x | h) = sum_{j=1..order} mix[j] * G_j[last j tokens of h, x],   G_j ~ N(0, 1) i.i.d.
    p(. | h) = (1 - floor) * softmax(z(. | h) / temperature over its top-`support` tokens) + floor / V

Sparse: each history puts its mass on ``support`` tokens (plus the uniform ``floor``, which keeps
every token possible and the chain ergodic). **Entropy is tuned by ``temperature``** (lower: closer
to deterministic), then ``support`` and ``floor``; :meth:`MarkovSource.entropy_rate_bits` reports
the result. ``mix`` sets how much of the dependency the last token carries (``mix[0]``) versus the
older ones, which is what separates a first-order (Markov) head from heads that see more of the
prefix. The defaults (V = 16, order 2, support 4, temperature 0.15, mix 0.8/0.2, floor 0.01) give
about 1.06 bits per token: a few tokens ahead are still fairly predictable from the context, as in
the text a drafter sees.

Token ids are int64 in ``0..V-1``; a history of ``order`` tokens ``(t_1, ..., t_n)`` (oldest first)
has index ``sum_i t_i * V ** (n - i)`` (the last token is the least significant digit), so the
suffix of length j of history ``h`` has index ``h % V ** j``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidArgumentError
from ..exactness import sample_rows  # the exact rule's own categorical sampler (inverse CDF), shared

__all__ = ["MarkovSource", "history_index", "sample_categorical"]


def sample_categorical(rng: np.random.Generator, probs: NDArray[np.float64]) -> NDArray[np.int64]:
    """One draw per row of ``probs`` (shape (n, V), rows summing to 1) by inverse CDF; (n,) int64.

    The sampler of :mod:`memtp_sim.exactness` (one uniform per row, zero-mass tokens never drawn).
    """
    return sample_rows(rng, probs)


def history_index(tokens: NDArray[np.int64], order: int, vocab_size: int) -> NDArray[np.int64]:
    """Index of the last ``order`` tokens of each row of ``tokens`` (shape (n, L >= order)); (n,) int64.

    ``order == 0`` gives zeros (the empty history).

    Raises:
        InvalidArgumentError: fewer than ``order`` columns.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 2 or tokens.shape[1] < order:
        raise InvalidArgumentError(f"tokens: need shape (n, >= {order}), got {tokens.shape}")
    idx = np.zeros(tokens.shape[0], dtype=np.int64)
    for i in range(order):
        idx = idx * vocab_size + tokens[:, tokens.shape[1] - order + i]
    return idx


@dataclass(frozen=True)
class MarkovSource:
    """A sparse order-n Markov source (module docstring).

    Attributes:
        vocab_size: V, tokens ``0..V-1``.
        order: n >= 1, how many previous tokens the next-token law depends on.
        table: (V ** n, V) float64, row ``h`` is ``p(. | h)`` (rows sum to 1, all entries > 0
            when ``floor > 0``).
        params: the construction parameters (for provenance).
    """

    vocab_size: int
    order: int
    table: NDArray[np.float64]
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def sparse(cls, *, vocab_size: int = 16, order: int = 2, support: int = 4, temperature: float = 0.15,
               mix: Sequence[float] | None = (0.8, 0.2), floor: float = 0.01, seed: int = 0) -> "MarkovSource":
        """Build the source of the module docstring, reproducibly from ``seed``.

        Args:
            vocab_size: V >= 2.
            order: n >= 1; the table has V ** n rows (V ** (n + 1) <= 2 ** 24).
            support: tokens each history's law may use (besides the floor), 1..V.
            temperature: > 0; lower means lower entropy.
            mix: weight of each suffix length 1..n (normalised; None: equal weights).
            floor: probability mass spread uniformly, in [0, 1).
            seed: numpy seed of the construction.

        Raises:
            InvalidArgumentError: an argument out of range (the message names it).
        """
        v, n = int(vocab_size), int(order)
        if v < 2:
            raise InvalidArgumentError(f"vocab_size: must be >= 2, got {vocab_size}")
        if n < 1 or v ** (n + 1) > 2**24:
            raise InvalidArgumentError(f"order: must be >= 1 with vocab_size ** (order + 1) <= 2**24, got {order}")
        if not 1 <= support <= v:
            raise InvalidArgumentError(f"support: must lie in 1..{v}, got {support}")
        if not temperature > 0:
            raise InvalidArgumentError(f"temperature: must be > 0, got {temperature}")
        if not 0.0 <= floor < 1.0:
            raise InvalidArgumentError(f"floor: must lie in [0, 1), got {floor}")
        w = np.full(n, 1.0 / n) if mix is None else np.asarray(mix, dtype=np.float64)
        if w.shape != (n,) or np.any(w < 0) or w.sum() <= 0:
            raise InvalidArgumentError(f"mix: need {n} weights >= 0 with a positive sum, got {mix}")
        w = w / w.sum()
        rng = np.random.default_rng(seed)
        hist = np.arange(v**n)
        z = np.zeros((v**n, v))
        for j in range(1, n + 1):
            z += w[j - 1] * rng.normal(size=(v**j, v))[hist % v**j]
        z = z / temperature
        keep = np.zeros(z.shape, dtype=bool)
        np.put_along_axis(keep, np.argsort(-z, axis=1)[:, :support], True, axis=1)
        z = np.where(keep, z - z.max(axis=1, keepdims=True), -np.inf)
        table = np.exp(z)
        table = (1.0 - floor) * table / table.sum(axis=1, keepdims=True) + floor / v
        params = {"vocab_size": v, "order": n, "support": int(support), "temperature": float(temperature),
                  "mix": [float(x) for x in w], "floor": float(floor), "seed": int(seed)}
        return cls(v, n, table, params)

    @classmethod
    def from_table(cls, table: NDArray[np.float64], order: int) -> "MarkovSource":
        """A source from an explicit (V ** order, V) table of next-token laws.

        Raises:
            InvalidArgumentError: wrong shape, negative entries, or rows not summing to 1 (1e-9).
        """
        t = np.asarray(table, dtype=np.float64)
        v = t.shape[-1] if t.ndim == 2 else 0
        if t.ndim != 2 or v < 2 or t.shape[0] != v**order:
            raise InvalidArgumentError(f"table: need shape (V ** {order}, V), got {t.shape}")
        if np.any(t < 0) or not np.allclose(t.sum(axis=1), 1.0, atol=1e-9):
            raise InvalidArgumentError("table: rows must be probability vectors")
        return cls(v, int(order), t, {"vocab_size": v, "order": int(order), "explicit": True})

    def next_dist(self, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """``p(. | last order tokens)`` for each row of ``tokens`` (n, L >= order); (n, V) float64."""
        return self.table[history_index(tokens, self.order, self.vocab_size)]

    def stationary(self) -> NDArray[np.float64]:
        """Stationary law over histories, shape (V ** order,) (power iteration to 1e-13)."""
        v, s = self.vocab_size, self.table.shape[0]
        nxt = ((np.arange(s)[:, None] * v + np.arange(v)[None, :]) % s).ravel()
        pi = np.full(s, 1.0 / s)
        for _ in range(10_000):
            new = np.bincount(nxt, weights=(pi[:, None] * self.table).ravel(), minlength=s)
            if np.abs(new - pi).sum() < 1e-13:
                return new
            pi = new
        return pi

    def unigram(self) -> NDArray[np.float64]:
        """Stationary law of one token, shape (V,)."""
        return self.stationary() @ self.table

    def entropy_rate_bits(self) -> float:
        """Entropy rate ``sum_h pi(h) H(p(. | h))``, bits per token."""
        t = self.table
        h = -(t * np.log2(np.where(t > 0, t, 1.0))).sum(axis=1)
        return float(self.stationary() @ h)

    def sample(self, rng: np.random.Generator, n: int, length: int) -> NDArray[np.int64]:
        """``n`` independent stationary stretches of ``length`` tokens, shape (n, length) int64.

        The first ``order`` tokens are a history drawn from :meth:`stationary`, the rest follow
        the chain, so every window is a draw from the stationary process.

        Raises:
            InvalidArgumentError: ``length < order`` or ``n < 1``.
        """
        if n < 1 or length < self.order:
            raise InvalidArgumentError(f"length: need n >= 1 and length >= order ({self.order}), got n={n}, "
                                       f"length={length}")
        v, k = self.vocab_size, self.order
        out = np.empty((n, length), dtype=np.int64)
        h = rng.choice(self.table.shape[0], size=n, p=self.stationary())
        for i in range(k):
            out[:, i] = (h // v ** (k - 1 - i)) % v
        for t in range(k, length):
            out[:, t] = sample_categorical(rng, self.table[h])
            h = (h * v + out[:, t]) % v**k
        return out

    def block_marginals(self, context: Sequence[int], positions: int) -> NDArray[np.float64]:
        """Law of each of the next ``positions`` tokens after ``context`` (marginal over the
        tokens in between), shape (positions, V): exact, by propagating the history law."""
        ctx = np.asarray(context, dtype=np.int64)[None, :]
        v, s = self.vocab_size, self.table.shape[0]
        law = np.zeros(s)
        law[history_index(ctx, self.order, v)[0]] = 1.0
        nxt = ((np.arange(s)[:, None] * v + np.arange(v)[None, :]) % s).ravel()
        out = np.empty((positions, v))
        for k in range(positions):
            joint = law[:, None] * self.table  # (history, next token)
            out[k] = joint.sum(axis=0)
            law = np.bincount(nxt, weights=joint.ravel(), minlength=s)
        return out
