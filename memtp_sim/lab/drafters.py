"""Drafters of the lab: a parallel backbone, three sequential heads, and their block distributions.

Conventions (all arrays numpy):

* ``context``: (n, L) int64, the tokens up to and including the round's anchor (the last target
  token), oldest first; each drafter reads as many of the last columns as it needs.
* A block has ``gamma`` draft positions ``k = 1..gamma``; position k predicts the k-th token after
  the anchor. ``tokens``: (n, gamma) int64 drafted (or, for fitting, true) tokens.
* Distributions over the vocabulary are float64 rows summing to 1; logits are natural-log scale.

**Parallel backbone** (:class:`ParallelBackbone`): one pass drafts every position from the context
alone, ``log q_k(x) = log P^(x_{t+k} = x | last m context tokens)``, a count estimate from a
training corpus (skip-gram counts, Dirichlet-smoothed towards the unigram). It cannot see the
tokens it drafts at earlier positions of the same block, so its acceptance decays along the block
(the DSpark paper's Fig. 2 for DFlash).

**Sequential heads** put intra-block dependency back. Each head has the same small interface::

    state = head.start(context)               # before position 1 (reads the anchor and context)
    bias  = head.bias(state, k)               # (n, V) log-ratio bias for position k
    state = head.advance(state, tokens_k)     # after drafting position k's tokens (n,)

and its bias is a *log-ratio against the unigram*, ``log P^(x | what the head sees) - log P^(x)``:

* :class:`MarkovHead` (rank r): ``bias = E[x_{k-1}] @ W`` with ``E`` (V, r) and ``W`` (r, V), the
  low-rank V x r . r x V transition bias conditioned on the previous token (the anchor at k = 1),
  fitted as the rank-r truncated SVD of the empirical bigram log-ratio
  ``log P^(x | a) - log P^(x)`` (Eckart-Young: the best rank-r approximation in Frobenius norm).
* :class:`RnnHead` (hidden size h): an echo-state recurrence ``s <- tanh(W_in[x] + s @ W_rec)``
  run over the last ``context`` tokens and then the drafted ones (a state over the full prefix),
  with fixed random ``W_in``, ``W_rec`` (spectral radius < 1) and a linear readout
  ``bias = [s, 1] @ W_out`` fitted by ridge regression (least squares) to the teacher-forced
  log-ratio of the target (Jaeger 2001, "echo state" networks; Lukosevicius 2012, the practical
  guide: fixed reservoir, linear readout by ridge regression).
* :class:`NgramMatryoshka`: level j drafts position j with an n-gram of order ``o_j`` (the last
  o_j tokens: anchor and drafts); the default is ``o_j = j`` (orders 1, 2, ..., k+1 as the block
  goes deeper: the Markov head at position 1, the whole block prefix further on), capped at the
  table's ``max_order``.

**Semi-autoregressive block distribution** (:func:`semi_ar_block_dist`): position k samples from

    q_k = softmax(g_k[0] * backbone_logits_k + g_k[1] * bias_k + g_k[2] * log P^(x))

left to right, the head's state advancing with each drafted token. The gate ``g_k`` is
``(1, 1, 0)`` by default, DSpark's form "backbone logits plus transition bias": with a log-ratio
bias this is the naive-Bayes product ``P(x | context) * P(x | a) / P(x)``, exact when the context
and the previous token are independent given x. :func:`fit_gate` fits ``g_k`` per position by
Newton's method on the teacher-forced cross-entropy to the target (three numbers per position).

Sampling rule everywhere: one categorical draw per row by inverse CDF
(:func:`memtp_sim.lab.source.sample_categorical`, the sampler of :mod:`memtp_sim.exactness`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidArgumentError
from .source import history_index, sample_categorical

__all__ = [
    "Head",
    "MarkovHead",
    "NgramMatryoshka",
    "NgramTable",
    "ParallelBackbone",
    "RnnHead",
    "ar_block_dist",
    "block_bias",
    "fit_gate",
    "log_softmax",
    "parallel_block_dist",
    "semi_ar_block_dist",
]

#: The default gate (backbone, head bias, unigram): DSpark's "backbone logits + transition bias".
DSPARK_GATE = (1.0, 1.0, 0.0)


def log_softmax(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row-wise log softmax over the last axis (stable)."""
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _windows(corpus: NDArray[np.int64], order: int, vocab_size: int, stop: int) -> NDArray[np.int64]:
    """History index of the ``order`` tokens ending at column t - 1, for t = order..stop - 1;
    shape (n_seq, stop - order)."""
    idx = np.zeros((corpus.shape[0], stop - order), dtype=np.int64)
    for i in range(order):
        idx = idx * vocab_size + corpus[:, i: stop - order + i]
    return idx


def _check_corpus(corpus: NDArray[np.int64], vocab_size: int, min_len: int) -> NDArray[np.int64]:
    c = np.asarray(corpus, dtype=np.int64)
    if c.ndim != 2 or c.shape[1] < min_len:
        raise InvalidArgumentError(f"corpus: need shape (n_seq, >= {min_len}), got {c.shape}")
    if c.size and (c.min() < 0 or c.max() >= vocab_size):
        raise InvalidArgumentError(f"corpus: token ids must lie in 0..{vocab_size - 1}")
    return c


# ----------------------------------------------------------------------------------------------
# n-gram tables and the parallel backbone (count estimates from a training corpus)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NgramTable:
    """Interpolated n-gram estimates of orders 0..max_order from a corpus.

    ``P^_0(x) = (c(x) + 1) / (N + V)``; ``P^_o(x | h) = (c(h, x) + beta * P^_{o-1}(x | h')) /
    (c(h) + beta)`` with ``h'`` the history without its oldest token (Dirichlet-prior smoothing
    towards the next lower order, MacKay and Peto 1995), so unseen histories fall back smoothly.

    Attributes:
        vocab_size: V.
        max_order: highest order o (histories of o tokens).
        log_probs: per order o, (V ** o, V) float64 ``log P^_o(x | h)`` (order 0: shape (1, V)).
        smoothing: beta.
    """

    vocab_size: int
    max_order: int
    log_probs: tuple[NDArray[np.float64], ...]
    smoothing: float

    @classmethod
    def fit(cls, corpus: NDArray[np.int64], vocab_size: int, max_order: int,
            smoothing: float = 4.0) -> "NgramTable":
        """Count and smooth (see class docstring).

        Args:
            corpus: (n_seq, T) int64 token stretches (windows never cross rows).
            vocab_size: V.
            max_order: >= 0, with V ** (max_order + 1) <= 2 ** 24 (dense tables).
            smoothing: beta > 0.

        Raises:
            InvalidArgumentError: bad shapes, token ids or orders.
        """
        v, top = int(vocab_size), int(max_order)
        c = _check_corpus(corpus, v, top + 1)
        if top < 0 or v ** (top + 1) > 2**24:
            raise InvalidArgumentError(f"max_order: must be >= 0 with V ** (max_order + 1) <= 2 ** 24, got {max_order}")
        if not smoothing > 0:
            raise InvalidArgumentError(f"smoothing: must be > 0, got {smoothing}")
        c0 = np.bincount(c.ravel(), minlength=v).astype(np.float64)
        probs = ((c0 + 1.0) / (c0.sum() + v))[None, :]
        out = [np.log(probs)]
        for o in range(1, top + 1):
            idx = _windows(c, o, v, c.shape[1])
            counts = np.bincount((idx * v + c[:, o:]).ravel(), minlength=v ** (o + 1)).reshape(v**o, v)
            lower = probs[np.arange(v**o) % v ** (o - 1)]
            probs = (counts + smoothing * lower) / (counts.sum(axis=1, keepdims=True) + smoothing)
            out.append(np.log(probs))
        return cls(v, top, tuple(out), float(smoothing))

    def log_prob(self, tokens: NDArray[np.int64], order: int) -> NDArray[np.float64]:
        """``log P^_order(. | last order tokens)`` per row of ``tokens`` (n, >= order); (n, V).

        Raises:
            InvalidArgumentError: ``order`` outside 0..max_order, or too few columns.
        """
        if not 0 <= order <= self.max_order:
            raise InvalidArgumentError(f"order: must lie in 0..{self.max_order}, got {order}")
        if order == 0:
            return np.broadcast_to(self.log_probs[0], (np.shape(tokens)[0], self.vocab_size))
        return self.log_probs[order][history_index(tokens, order, self.vocab_size)]

    @property
    def unigram_log_probs(self) -> NDArray[np.float64]:
        """``log P^_0``, shape (V,)."""
        return self.log_probs[0][0]


@dataclass(frozen=True)
class ParallelBackbone:
    """Parallel drafter: ``log P^(x_{t+k} | last m context tokens)`` for k = 1..K in one pass.

    Skip-gram counts from the corpus, smoothed towards the unigram:
    ``(c(h, k, x) + beta * P^_0(x)) / (c(h) + beta)``.

    Attributes:
        vocab_size: V.
        context: m, context tokens the backbone reads (the anchor and m - 1 before it).
        positions: K, block positions it drafts.
        log_probs: (V ** m, K, V) float64.
    """

    vocab_size: int
    context: int
    positions: int
    log_probs: NDArray[np.float64]

    @classmethod
    def fit(cls, corpus: NDArray[np.int64], vocab_size: int, context: int, positions: int,
            unigram: NDArray[np.float64], smoothing: float = 4.0) -> "ParallelBackbone":
        """Count ``(history of m tokens ending at the anchor, position k, token)`` triples.

        Args:
            corpus: (n_seq, T) int64 with T >= context + positions.
            vocab_size: V; context: m >= 1; positions: K >= 1.
            unigram: (V,) prior the counts are smoothed towards.
            smoothing: beta > 0.

        Raises:
            InvalidArgumentError: bad shapes or sizes.
        """
        v, m, k_max = int(vocab_size), int(context), int(positions)
        if m < 1 or k_max < 1 or v ** m * k_max * v > 2**26:
            raise InvalidArgumentError(f"context, positions: need >= 1 and V ** m * K * V <= 2 ** 26, got "
                                       f"m={context}, K={positions}")
        c = _check_corpus(corpus, v, m + k_max)
        t_len = c.shape[1]
        n_anchor = t_len - m - k_max + 1
        idx = _windows(c, m, v, m + n_anchor)  # (n_seq, n_anchor): the m tokens ending at each anchor
        counts = np.zeros(v**m * k_max * v)
        for k in range(1, k_max + 1):
            x = c[:, m - 1 + k: m - 1 + k + n_anchor]
            counts += np.bincount(((idx * k_max + (k - 1)) * v + x).ravel(), minlength=counts.size)
        counts = counts.reshape(v**m, k_max, v)
        n_h = counts[:, :1, :].sum(axis=2, keepdims=True)
        probs = (counts + smoothing * np.asarray(unigram)[None, None, :]) / (n_h + smoothing)
        return cls(v, m, k_max, np.log(probs))

    def logits(self, context: NDArray[np.int64], gamma: int | None = None) -> NDArray[np.float64]:
        """Backbone log-probabilities of positions 1..gamma (default K), shape (n, gamma, V).

        Raises:
            InvalidArgumentError: gamma > K, or a context narrower than m.
        """
        g = self.positions if gamma is None else int(gamma)
        if not 1 <= g <= self.positions:
            raise InvalidArgumentError(f"gamma: the backbone drafts 1..{self.positions} positions, got {gamma}")
        return self.log_probs[history_index(context, self.context, self.vocab_size), :g]


# ----------------------------------------------------------------------------------------------
# heads
# ----------------------------------------------------------------------------------------------


class Head(Protocol):
    """A sequential head: state over what it sees, a (n, V) log-ratio bias per position."""

    def start(self, context: NDArray[np.int64]) -> Any:
        """State before position 1, from the (n, L) context up to the anchor."""
        ...

    def bias(self, state: Any, position: int) -> NDArray[np.float64]:
        """(n, V) log-ratio bias for block position ``position`` (1-based)."""
        ...

    def advance(self, state: Any, tokens: NDArray[np.int64]) -> Any:
        """State after the (n,) tokens drafted at the current position."""
        ...


@dataclass(frozen=True)
class MarkovHead:
    """Low-rank transition bias ``bias(x | a) = (E[a] @ W)[x]`` for previous token a.

    Attributes:
        embed: E, (V, r) float64.
        project: W, (r, V) float64.
    """

    embed: NDArray[np.float64]
    project: NDArray[np.float64]

    @classmethod
    def from_log_ratio(cls, log_ratio: NDArray[np.float64], rank: int) -> "MarkovHead":
        """Rank-``rank`` truncated SVD of a (V, V) log-ratio matrix ``L[a, x]``:
        ``L ~ U_r S_r V_r^T``, ``E = U_r sqrt(S_r)``, ``W = sqrt(S_r) V_r^T``.

        Raises:
            InvalidArgumentError: not square, or rank outside 1..V.
        """
        lr = np.asarray(log_ratio, dtype=np.float64)
        if lr.ndim != 2 or lr.shape[0] != lr.shape[1]:
            raise InvalidArgumentError(f"log_ratio: need a (V, V) matrix, got {lr.shape}")
        if not 1 <= rank <= lr.shape[0]:
            raise InvalidArgumentError(f"rank: must lie in 1..{lr.shape[0]}, got {rank}")
        u, s, vt = np.linalg.svd(lr)
        root = np.sqrt(s[:rank])
        return cls(u[:, :rank] * root[None, :], root[:, None] * vt[:rank])

    @classmethod
    def fit(cls, table: NgramTable, rank: int) -> "MarkovHead":
        """From the corpus: truncated SVD of the empirical bigram log-ratio ``log P^_1 - log P^_0``."""
        return cls.from_log_ratio(table.log_probs[1] - table.log_probs[0], rank)

    @classmethod
    def from_transition(cls, transition: NDArray[np.float64], unigram: NDArray[np.float64],
                        rank: int | None = None) -> "MarkovHead":
        """From a known first-order law ``transition[a, x] = P(x | a)`` and ``unigram`` P(x):
        the (truncated) log-ratio ``log P(x | a) - log P(x)``; full rank by default."""
        t = np.asarray(transition, dtype=np.float64)
        lr = np.log(t) - np.log(np.asarray(unigram, dtype=np.float64))[None, :]
        return cls.from_log_ratio(lr, t.shape[0] if rank is None else rank)

    @property
    def rank(self) -> int:
        """r, the rank of the transition bias."""
        return int(self.embed.shape[1])

    def start(self, context: NDArray[np.int64]) -> NDArray[np.int64]:
        """The anchor (last context token) of each row, (n,) int64."""
        return np.asarray(context, dtype=np.int64)[:, -1].copy()

    def bias(self, state: NDArray[np.int64], position: int) -> NDArray[np.float64]:
        """``E[prev] @ W``, (n, V), whatever the position (one head shared along the block)."""
        return self.embed[state] @ self.project

    def advance(self, state: NDArray[np.int64], tokens: NDArray[np.int64]) -> NDArray[np.int64]:
        """The new previous token: the one just drafted."""
        return np.asarray(tokens, dtype=np.int64).copy()


@dataclass(frozen=True)
class RnnHead:
    """Echo-state recurrence over the prefix with a linear readout (module docstring).

    Attributes:
        w_in: (V, h) input weights (one row per token).
        w_rec: (h, h) recurrent weights.
        w_out: (h + 1, V) readout (last row: bias); zeros until :meth:`fit_readout`.
        context: context tokens the state is run over before position 1 (anchor included).
    """

    w_in: NDArray[np.float64]
    w_rec: NDArray[np.float64]
    w_out: NDArray[np.float64]
    context: int

    @classmethod
    def reservoir(cls, rng: np.random.Generator, vocab_size: int, hidden: int, *,
                  spectral_radius: float = 0.9, input_scale: float = 1.0, context: int = 8) -> "RnnHead":
        """Fixed random weights: ``W_in ~ N(0, input_scale^2)``, ``W_rec`` Gaussian rescaled to the
        given spectral radius (< 1: the echo-state property, old tokens fade).

        Raises:
            InvalidArgumentError: hidden < 1, spectral_radius not in (0, 1), context < 1.
        """
        if hidden < 1 or context < 1 or not 0 < spectral_radius < 1:
            raise InvalidArgumentError(f"hidden, context, spectral_radius: need >= 1, >= 1, (0, 1); got "
                                       f"{hidden}, {context}, {spectral_radius}")
        w_in = rng.normal(0.0, input_scale, size=(vocab_size, hidden))
        w = rng.normal(0.0, 1.0, size=(hidden, hidden))
        w *= spectral_radius / np.max(np.abs(np.linalg.eigvals(w)))
        return cls(w_in, w, np.zeros((hidden + 1, vocab_size)), int(context))

    @property
    def hidden(self) -> int:
        """h, the state size."""
        return int(self.w_rec.shape[0])

    def _step(self, state: NDArray[np.float64], tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        return np.tanh(self.w_in[tokens] + state @ self.w_rec)

    def start(self, context: NDArray[np.int64]) -> NDArray[np.float64]:
        """State (n, h) after running the recurrence from zero over the last ``context`` tokens."""
        ctx = np.asarray(context, dtype=np.int64)[:, -self.context:]
        state = np.zeros((ctx.shape[0], self.hidden))
        for i in range(ctx.shape[1]):
            state = self._step(state, ctx[:, i])
        return state

    def bias(self, state: NDArray[np.float64], position: int) -> NDArray[np.float64]:
        """The readout ``[s, 1] @ W_out``, (n, V)."""
        return state @ self.w_out[:-1] + self.w_out[-1]

    def advance(self, state: NDArray[np.float64], tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """One recurrence step with the drafted tokens."""
        return self._step(state, np.asarray(tokens, dtype=np.int64))

    def fit_readout(self, context: NDArray[np.int64], tokens: NDArray[np.int64],
                    target_bias: NDArray[np.float64], ridge: float = 1e-2) -> "RnnHead":
        """Least-squares readout on a teacher-forced block.

        The state before position k (after the context and ``tokens[:, :k-1]``) is regressed on the
        row-centred ``target_bias[:, k-1]`` (softmax ignores a per-row constant) for every k:
        ``W_out = (X^T X + ridge * N * I)^-1 X^T Y`` with ``X = [s, 1]``.

        Args:
            context: (n, L) int64; tokens: (n, gamma) int64 true continuation;
            target_bias: (n, gamma, V) float64, e.g. ``log p_target - log P^_0``.
            ridge: ridge penalty per sample, >= 0.

        Returns:
            A copy with the fitted readout.
        """
        n, g = tokens.shape
        state = self.start(context)
        xs = []
        for k in range(g):
            xs.append(state)
            state = self.advance(state, tokens[:, k])
        x = np.concatenate([np.concatenate(xs), np.ones((n * g, 1))], axis=1)
        y = np.asarray(target_bias, dtype=np.float64).transpose(1, 0, 2).reshape(n * g, -1)
        y = y - y.mean(axis=1, keepdims=True)
        gram = x.T @ x + ridge * x.shape[0] * np.eye(x.shape[1])
        return replace(self, w_out=np.linalg.solve(gram, x.T @ y))


@dataclass(frozen=True)
class NgramMatryoshka:
    """The n-gram matryoshka tower: level j (block position j) is an n-gram of order ``orders[j-1]``.

    ``bias_j = log P^_{o_j}(x | last o_j tokens) - log P^_0(x)``; positions beyond
    ``len(orders)`` use the last level's order.

    Attributes:
        table: the n-gram estimates (orders up to ``table.max_order``).
        orders: order of each level, each in 1..table.max_order.
    """

    table: NgramTable
    orders: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.orders or any(not 1 <= o <= self.table.max_order for o in self.orders):
            raise InvalidArgumentError(f"orders: each must lie in 1..{self.table.max_order}, got {self.orders}")

    @classmethod
    def matryoshka(cls, table: NgramTable, levels: int) -> "NgramMatryoshka":
        """Orders 1, 2, ..., levels (level j sees the anchor and the j - 1 drafts before it), capped
        at ``table.max_order``: in this lab's order-n source every order >= n carries all the
        information, and higher-order counts only add estimation noise (their histories are rare)."""
        return cls(table, tuple(min(j, table.max_order) for j in range(1, levels + 1)))

    def order_at(self, position: int) -> int:
        """Order of the level that drafts block position ``position`` (1-based)."""
        return self.orders[min(position, len(self.orders)) - 1]

    def start(self, context: NDArray[np.int64]) -> NDArray[np.int64]:
        """The last ``max(orders)`` context tokens, (n, max order) int64.

        Raises:
            InvalidArgumentError: a context narrower than the highest order.
        """
        width = max(self.orders)
        ctx = np.asarray(context, dtype=np.int64)
        if ctx.shape[1] < width:
            raise InvalidArgumentError(f"context: the tower needs >= {width} tokens, got {ctx.shape[1]}")
        return ctx[:, -width:].copy()

    def bias(self, state: NDArray[np.int64], position: int) -> NDArray[np.float64]:
        """``log P^_o(x | last o tokens) - log P^_0(x)`` with o the level's order, (n, V)."""
        return self.table.log_prob(state, self.order_at(position)) - self.table.unigram_log_probs[None, :]

    def advance(self, state: NDArray[np.int64], tokens: NDArray[np.int64]) -> NDArray[np.int64]:
        """The history shifted by one, the drafted tokens appended."""
        return np.concatenate([state[:, 1:], np.asarray(tokens, dtype=np.int64)[:, None]], axis=1)


# ----------------------------------------------------------------------------------------------
# block distributions
# ----------------------------------------------------------------------------------------------


def _check_tokens(tokens: NDArray[np.int64] | None, n: int, gamma: int) -> NDArray[np.int64] | None:
    if tokens is None:
        return None
    t = np.asarray(tokens, dtype=np.int64)
    if t.shape != (n, gamma):
        raise InvalidArgumentError(f"tokens: need shape ({n}, {gamma}), got {t.shape}")
    return t


def _gates(gates: NDArray[np.float64] | Sequence[float] | None, gamma: int) -> NDArray[np.float64]:
    g = np.asarray(DSPARK_GATE if gates is None else gates, dtype=np.float64)
    if g.shape == (3,):
        g = np.broadcast_to(g, (gamma, 3))
    if g.ndim != 2 or g.shape[1] != 3 or g.shape[0] < gamma or not np.all(np.isfinite(g)):
        raise InvalidArgumentError(f"gates: need (3,) or (>= {gamma}, 3) finite numbers, got shape {g.shape}")
    return g


def semi_ar_block_dist(rng: np.random.Generator | None, backbone_logits: NDArray[np.float64], head: Head,
                       context: NDArray[np.int64], *, gates: NDArray[np.float64] | Sequence[float] | None = None,
                       unigram_log_probs: NDArray[np.float64] | None = None,
                       tokens: NDArray[np.int64] | None = None) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Draft (or score) a block with a parallel backbone plus a sequential head.

    Position k's law is ``softmax(g_k0 * backbone_logits[:, k] + g_k1 * head.bias(state, k) +
    g_k2 * unigram_log_probs)``; left to right, a token is drawn from it (inverse CDF, one uniform
    per row) and the head's state advances with it.

    Args:
        rng: numpy Generator for the draws (may be None when ``tokens`` is given).
        backbone_logits: (n, gamma, V) float64, one parallel pass (e.g. :meth:`ParallelBackbone.logits`).
        head: a :class:`Head` (:class:`MarkovHead`, :class:`RnnHead`, :class:`NgramMatryoshka`).
        context: (n, L) int64 context up to the anchor.
        gates: (3,) or (gamma, 3) gate per position (default ``(1, 1, 0)``: backbone + bias).
        unigram_log_probs: (V,) ``log P^_0``; needed when a gate's third entry is not 0.
        tokens: (n, gamma) int64 to score instead of sampling (teacher forcing, verification).

    Returns:
        (tokens (n, gamma) int64, probs (n, gamma, V) float64): the drafted (or given) tokens and
        the law each was drawn from.

    Raises:
        InvalidArgumentError: shapes that do not match, or a unigram term without ``unigram_log_probs``.
    """
    b = np.asarray(backbone_logits, dtype=np.float64)
    if b.ndim != 3:
        raise InvalidArgumentError(f"backbone_logits: need shape (n, gamma, V), got {b.shape}")
    n, gamma, v = b.shape
    given = _check_tokens(tokens, n, gamma)
    g = _gates(gates, gamma)
    if np.any(g[:gamma, 2] != 0) and unigram_log_probs is None:
        raise InvalidArgumentError("unigram_log_probs: needed when a gate weighs the unigram term")
    uni = np.zeros(v) if unigram_log_probs is None else np.asarray(unigram_log_probs, dtype=np.float64)
    out_tokens = np.empty((n, gamma), dtype=np.int64)
    probs = np.empty((n, gamma, v))
    state = head.start(context)
    for k in range(gamma):
        z = g[k, 0] * b[:, k] + g[k, 1] * head.bias(state, k + 1) + g[k, 2] * uni[None, :]
        probs[:, k] = np.exp(log_softmax(z))
        out_tokens[:, k] = given[:, k] if given is not None else sample_categorical(rng, probs[:, k])
        state = head.advance(state, out_tokens[:, k])
    return out_tokens, probs


def parallel_block_dist(rng: np.random.Generator | None, backbone_logits: NDArray[np.float64], *,
                        tokens: NDArray[np.int64] | None = None) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The backbone alone: every position drawn independently from ``softmax(backbone_logits[:, k])``.

    Args and returns as :func:`semi_ar_block_dist` (no head, no gate).
    """
    b = np.asarray(backbone_logits, dtype=np.float64)
    n, gamma, _ = b.shape
    given = _check_tokens(tokens, n, gamma)
    probs = np.exp(log_softmax(b))
    if given is not None:
        return given, probs
    out = np.stack([sample_categorical(rng, probs[:, k]) for k in range(gamma)], axis=1)
    return out, probs


def ar_block_dist(rng: np.random.Generator | None, table: NgramTable, order: int, context: NDArray[np.int64],
                  gamma: int, *, tokens: NDArray[np.int64] | None = None
                  ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Autoregressive drafting: position k drawn from ``P^_order(. | last order tokens)`` of the
    context and the drafts before it (a small AR draft model run gamma times).

    Args and returns as :func:`semi_ar_block_dist`; ``table`` and ``order`` give the draft model.
    """
    ctx = np.asarray(context, dtype=np.int64)
    n = ctx.shape[0]
    given = _check_tokens(tokens, n, gamma)
    hist = ctx[:, -order:].copy() if order else ctx[:, :0]
    out = np.empty((n, gamma), dtype=np.int64)
    probs = np.empty((n, gamma, table.vocab_size))
    for k in range(gamma):
        probs[:, k] = np.exp(table.log_prob(hist, order))
        out[:, k] = given[:, k] if given is not None else sample_categorical(rng, probs[:, k])
        if order:
            hist = np.concatenate([hist[:, 1:], out[:, k: k + 1]], axis=1)
    return out, probs


def block_bias(head: Head, context: NDArray[np.int64], tokens: NDArray[np.int64]) -> NDArray[np.float64]:
    """The head's bias at every position along given tokens (teacher forcing); (n, gamma, V)."""
    n, gamma = tokens.shape
    state = head.start(context)
    out = []
    for k in range(gamma):
        out.append(head.bias(state, k + 1))
        state = head.advance(state, tokens[:, k])
    return np.stack(out, axis=1)


def fit_gate(backbone_logits: NDArray[np.float64], bias: NDArray[np.float64], unigram_log_probs: NDArray[np.float64],
             target: NDArray[np.float64], *, init: Sequence[float] = DSPARK_GATE, max_iter: int = 50) -> NDArray[np.float64]:
    """Gate ``g`` minimising the mean cross-entropy ``-sum_x p(x) log softmax(g . features)(x)``.

    Features: backbone logits, head bias, unigram log-probs, each (N, V) (the unigram broadcast).
    The loss is convex in g (a log-linear model); Newton's method with backtracking from ``init``
    stops when the gradient's largest entry is below 1e-9 or after ``max_iter`` steps.

    Args:
        backbone_logits, bias: (N, V) float64 at one position (teacher-forced).
        unigram_log_probs: (V,).
        target: (N, V) the target's law at that position.

    Returns:
        g, shape (3,).
    """
    feats = np.stack([backbone_logits, bias, np.broadcast_to(unigram_log_probs, backbone_logits.shape)])
    p = np.asarray(target, dtype=np.float64)
    n = p.shape[0]

    def loss_at(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        logq = log_softmax(np.tensordot(theta, feats, axes=1))
        return float(-(p * logq).sum() / n), logq

    theta = np.asarray(init, dtype=np.float64).copy()
    loss, logq = loss_at(theta)
    for _ in range(max_iter):
        q = np.exp(logq)
        eq = (feats * q[None]).sum(axis=2)  # (3, N)
        grad = (eq - (feats * p[None]).sum(axis=2)).mean(axis=1)
        if np.max(np.abs(grad)) < 1e-9:
            break
        hess = np.einsum("inv,jnv,nv->ij", feats, feats, q) / n - eq @ eq.T / n
        step = np.linalg.lstsq(hess + 1e-12 * np.eye(3), grad, rcond=None)[0]
        t = 1.0
        while t > 1e-6:
            cand_loss, cand_logq = loss_at(theta - t * step)
            if cand_loss <= loss:
                theta, loss, logq = theta - t * step, cand_loss, cand_logq
                break
            t *= 0.5
        else:
            break
    return theta
