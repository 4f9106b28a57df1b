"""Per-step cost of the sequential draft heads: FLOPs, bytes moved, and time on a given chip.

Each head runs once per draft position for the whole batch of ``R`` requests (one "step").
Conventions: a multiply-add is 2 FLOPs (Kaplan et al. 2020, "2N FLOPs per token" for N
parameters); weights are read from memory once per step (a batched step shares them) and each
request also reads its inputs and writes its V-wide output; ``bytes_per_param`` covers weights
and activations (2 for fp16/bf16). Time is the roofline ``max(bytes / bandwidth, FLOPs / rate)``
(Williams, Waterman, Patterson, "Roofline", CACM 2009): at small R a head is memory-bound, so its
step time is about its weight bytes over the memory bandwidth.

* Markov head (rank r): ``bias = E[x_prev] @ W``, ``E`` (V x r), ``W`` (r x V) (DSpark paper section
  3; docs/model.md section 1: "low-rank V x r . r x V transition bias, r = 256"). Per step: gather R
  rows of E, one (R x r) . (r x V) product, the bias added to the backbone logits. This is the
  ``t_seq = rank * vocab * bytes / bandwidth`` of the hardware profiles' drafter cost, plus the
  per-request rows.
* RNN head (hidden h, token embedding e, default h): Elman recurrence ``s = tanh(W_x emb(x) + W_h s
  + b)`` (Elman 1990, "Finding structure in time") and the output projection ``s @ W_o`` (h x V).
* n-gram matryoshka tower: level j of order ``o_j`` gathers the o_j previous tokens' embeddings
  (r each), mixes them with its own (o_j r x r) matrix and projects with a (r x V) output matrix
  shared by all levels (the nesting); level j runs at position j, so a round of gamma positions
  costs the sum over its levels j = 1..gamma (nominal orders ``o_j = j``, "up to k + 1").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import InvalidArgumentError

__all__ = [
    "StepCost",
    "markov_head_step",
    "rnn_head_step",
    "tower_level_step",
    "tower_round",
]


@dataclass(frozen=True)
class StepCost:
    """Work of one head step (or a sum of steps).

    Attributes:
        flops: floating-point operations (a multiply-add counts 2).
        bytes: bytes moved between memory and the chip.
    """

    flops: float
    bytes: float

    def __add__(self, other: "StepCost") -> "StepCost":
        return StepCost(self.flops + other.flops, self.bytes + other.bytes)

    def scaled(self, times: float) -> "StepCost":
        """The same step repeated ``times`` times."""
        return StepCost(self.flops * times, self.bytes * times)

    def time_s(self, bandwidth_gb_s: float, flops_per_s: float) -> float:
        """Roofline time, seconds: ``max(bytes / (bandwidth_gb_s * 1e9), flops / flops_per_s)``.

        Raises:
            InvalidArgumentError: a rate that is not > 0.
        """
        if not (bandwidth_gb_s > 0 and flops_per_s > 0):
            raise InvalidArgumentError(f"bandwidth_gb_s, flops_per_s: must be > 0, got {bandwidth_gb_s}, {flops_per_s}")
        return max(self.bytes / (bandwidth_gb_s * 1e9), self.flops / flops_per_s)


def _check(**kw: float) -> None:
    for name, v in kw.items():
        if not v > 0:
            raise InvalidArgumentError(f"{name}: must be > 0, got {v}")


def markov_head_step(vocab: int, rank: int, *, batch: int = 1, bytes_per_param: float = 2.0) -> StepCost:
    """One Markov-head step for ``batch`` requests (module docstring).

    FLOPs ``2 R r V`` (product) ``+ R V`` (bias add); bytes ``bpp (r V + R r + 2 R V)`` (W once, R rows
    of E, each request's logits read and written).

    Raises:
        InvalidArgumentError: a size that is not > 0.
    """
    _check(vocab=vocab, rank=rank, batch=batch, bytes_per_param=bytes_per_param)
    flops = 2.0 * batch * rank * vocab + batch * vocab
    return StepCost(flops, bytes_per_param * (rank * vocab + batch * rank + 2.0 * batch * vocab))


def rnn_head_step(vocab: int, hidden: int, *, embed: int | None = None, batch: int = 1,
                  bytes_per_param: float = 2.0) -> StepCost:
    """One RNN-head step: hidden update and output projection (module docstring).

    FLOPs ``2 R h (e + h) + 2 R h V + R V``; bytes ``bpp (h (e + h + 1) + h V + R (e + h) + 2 R V)``.

    Raises:
        InvalidArgumentError: a size that is not > 0.
    """
    e = hidden if embed is None else embed
    _check(vocab=vocab, hidden=hidden, embed=e, batch=batch, bytes_per_param=bytes_per_param)
    params = hidden * (e + hidden + 1) + hidden * vocab
    flops = 2.0 * batch * hidden * (e + hidden) + 2.0 * batch * hidden * vocab + batch * vocab
    return StepCost(flops, bytes_per_param * (params + batch * (e + hidden) + 2.0 * batch * vocab))


def tower_level_step(vocab: int, rank: int, order: int, *, batch: int = 1, bytes_per_param: float = 2.0) -> StepCost:
    """One tower level of n-gram order ``order`` (module docstring).

    FLOPs ``2 R o r^2 + 2 R r V + R V``; bytes ``bpp (o r^2 + r V + R o r + 2 R V)``.

    Raises:
        InvalidArgumentError: a size that is not > 0.
    """
    _check(vocab=vocab, rank=rank, order=order, batch=batch, bytes_per_param=bytes_per_param)
    flops = 2.0 * batch * order * rank * rank + 2.0 * batch * rank * vocab + batch * vocab
    moved = order * rank * rank + rank * vocab + batch * order * rank + 2.0 * batch * vocab
    return StepCost(flops, bytes_per_param * moved)


def tower_round(vocab: int, rank: int, gamma: int, *, orders: Sequence[int] | None = None, batch: int = 1,
                bytes_per_param: float = 2.0) -> StepCost:
    """A round of ``gamma`` positions of the tower: the sum of its levels 1..gamma.

    Args:
        orders: order of each level (default ``1, 2, ..., gamma``); a shorter list repeats its last.

    Raises:
        InvalidArgumentError: a size that is not > 0, or an empty ``orders``.
    """
    _check(gamma=gamma)
    ords = list(range(1, gamma + 1)) if orders is None else list(orders)
    if not ords:
        raise InvalidArgumentError("orders: must not be empty")
    total = StepCost(0.0, 0.0)
    for j in range(gamma):
        total = total + tower_level_step(vocab, rank, ords[min(j, len(ords) - 1)], batch=batch,
                                         bytes_per_param=bytes_per_param)
    return total
