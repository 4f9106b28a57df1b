"""Draft acceptance: per-domain, per-position conditional acceptance with request and round noise.

Model (one draft chain per request and round; position k = 1..gamma):

    p[r, k] = sigmoid(base[d_r, k] + u_r + z[r, t])

``u_r ~ N(0, sigma_request^2)`` is the request's difficulty, drawn once; ``z[r, t] ~ N(0,
sigma_round^2)`` is the context of round t, shared by the positions of that round (so acceptance
is correlated within a round, which is what confidence scheduling exploits). Position k is accepted
with probability ``p[r, k]`` given 1..k-1 were, so ``p`` is the *conditional* acceptance the DSpark
paper's confidence head estimates (section 3.2). A perfectly calibrated head outputs ``c = p``.

The per-position base logits ``base[d, k]`` (shape (n_domains, n_positions)) come in two kinds:

* ``linear`` (the Table-1 fit, ``calibration/acceptance/dspark-qwen3.yaml``):
  ``base[d, k] = mu[d] + slope[d] * (k - 1)`` for every k, with ``mu`` fitted so that static
  verification of the fit gamma reproduces the mean accepted length tau of the DSpark paper's
  Table 1 for each domain.
* ``per_position`` (``kind: per_position`` profiles, e.g. the drafter lab's, or
  :meth:`AcceptanceModel.per_position` for a vector given directly): each domain gives the
  *population* conditional acceptance ``c_1..c_K`` (P(k accepted | 1..k-1 accepted), the DSpark
  paper's Fig. 2 quantity), and ``base[d, 1..K]`` is fitted left to right so that, under the
  request and round noise, the population conditional acceptance reproduces ``c_k`` exactly
  (Gauss-Hermite quadrature, as :func:`conditional_acceptance`). **Beyond the K measured
  positions the last level is repeated, flat**: the population conditional acceptance stays at
  ``c_K`` out to position :data:`EXTRAPOLATED_POSITIONS` (64; under noise this needs slowly falling
  base logits, as easy rounds survive), and the base logit of position 64 is repeated beyond it.
  :attr:`AcceptanceModel.measured_positions` says how many positions were measured.
"""

from __future__ import annotations

import os
from collections import abc
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Any, Mapping, Sequence

import numpy as np

from ._io import ANY_KEY, check_keys, disk_cached, not_a_file, read_yaml
from ._lazy import brentq, expit, logit
from .errors import CalibrationError
from .hardware import calibration_dir

__all__ = [
    "AcceptanceModel",
    "conditional_acceptance",
    "expected_tau_iid",
    "alpha_from_mean_acceptance_length",
    "alpha_from_accepted_ratio",
    "conditional_from_per_position",
    "fit_per_position_logits",
    "load_acceptance",
    "parse_conditional_acceptance",
    "parse_rates",
    "population_conditional_acceptance",
    "DEFAULT_ACCEPTANCE",
    "EXTRAPOLATED_POSITIONS",
    "acceptance_dir",
]

DEFAULT_ACCEPTANCE = "dspark-qwen3"
#: Per-position models are fitted out to this many positions (the last measured level repeated);
#: beyond it the last base logit is repeated.
EXTRAPOLATED_POSITIONS = 64
_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(64)
_GH_WEIGHTS = _GH_WEIGHTS / _GH_WEIGHTS.sum()  # expectation under N(0, 1)


def expected_tau_iid(alpha: float, gamma: int) -> float:
    """Leviathan et al. (2023): expected tokens per round, bonus included, for i.i.d. acceptance.

    ``(1 - alpha^(gamma + 1)) / (1 - alpha)``; ``gamma + 1`` when ``alpha == 1``.
    """
    if alpha == 1.0:
        return float(gamma + 1)
    return float((1.0 - alpha ** (gamma + 1)) / (1.0 - alpha))


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-domain conditional acceptance (see module docstring).

    Attributes:
        domains: domain names, e.g. ("math", "code", "chat").
        mu: base logit at position 1 per domain, shape (n_domains,).
        slope: logit change per position per domain, shape (n_domains,); 0 for a per-position
            model (whose shape is in ``base``).
        sigma_request: sd of per-request difficulty (logit units).
        sigma_round: sd of per-round context noise (logit units).
        name: profile name; ``source`` names the paper figures (or the lab run) it was fitted to.
        fit_gamma: the gamma of the Table-1 fit (linear kind); the number of measured positions
            (per-position kind).
        targets: domain -> tau the fit reproduces (linear kind; for reports/tests).
        base: per-position base logits, shape (n_domains, n_positions), or None for the linear
            kind (then ``base[d, k] = mu[d] + slope[d] * (k - 1)`` at every k, see
            :meth:`base_logits`).
        conditional_targets: domain -> the population conditional acceptance c_1..c_K the
            per-position fit reproduces (empty for the linear kind).
        confidence: ``ConfidenceHead`` parameters (``noise_sd``, ``overconfidence``) that mimic
            the drafter's own confidence, when the profile carries them (the drafter lab's do);
            empty otherwise.

    Raises:
        ValueError: ``mu``/``slope`` not one value per domain; negative sigmas; ``base`` not
            finite or not of shape (n_domains, n_positions >= 1).
    """

    domains: tuple[str, ...]
    mu: np.ndarray
    slope: np.ndarray
    sigma_request: float = 0.0
    sigma_round: float = 0.0
    name: str = "custom"
    source: str = ""
    fit_gamma: int = 7
    targets: Mapping[str, float] = field(default_factory=dict)
    base: np.ndarray | None = None
    conditional_targets: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    confidence: Mapping[str, float] = field(default_factory=dict)
    # base_logits(gamma) of the per-position kind, built once per gamma (every drafted round asks)
    _base_by_gamma: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)
    # summary()'s population conditional acceptance, computed once per model (every run's provenance asks)
    _conditional_summary: dict[str, tuple[float, ...]] = field(default_factory=dict, init=False, repr=False,
                                                               compare=False)

    def __post_init__(self) -> None:
        # own C-contiguous copies: the compiled round reads them as flat arrays (a view of a
        # caller's column would be strided, and could change under the model)
        mu = np.array(self.mu, dtype=np.float64).reshape(-1)
        slope = np.array(self.slope, dtype=np.float64).reshape(-1)
        if mu.shape != (len(self.domains),) or slope.shape != mu.shape:
            raise ValueError("acceptance: mu and slope need one value per domain")
        if self.sigma_request < 0 or self.sigma_round < 0:
            raise ValueError("acceptance: sigma_request and sigma_round must be >= 0")
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "slope", slope)
        if self.base is not None:
            base = np.array(self.base, dtype=np.float64)
            if base.ndim != 2 or base.shape[0] != len(self.domains) or base.shape[1] < 1:
                raise ValueError(f"acceptance: base needs shape (n_domains={len(self.domains)}, n_positions >= 1), "
                                 f"got {base.shape}")
            if not np.all(np.isfinite(base)):
                raise ValueError("acceptance: base logits must be finite")
            base.setflags(write=False)
            object.__setattr__(self, "base", base)

    @classmethod
    def fixed(cls, alpha: float, *, domains: tuple[str, ...] = ("chat", "code", "math")) -> "AcceptanceModel":
        """i.i.d. acceptance ``alpha`` at every position, no request or round noise.

        Raises:
            ValueError: ``alpha`` not in (0, 1).
        """
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"acceptance.alpha: must lie in (0, 1), got {alpha}")
        n = len(domains)
        return cls(domains, np.full(n, logit(alpha)), np.zeros(n), 0.0, 0.0, name=f"fixed-{alpha:g}",
                   source="fixed per-position acceptance (Leviathan et al. 2023 setting)")

    @classmethod
    def per_position(cls, conditional: Sequence[float] | Mapping[str, Sequence[float]], *,
                     sigma_request: float = 0.0, sigma_round: float = 0.0,
                     domains: tuple[str, ...] = ("chat", "code", "math"), name: str | None = None,
                     source: str = "", confidence: Mapping[str, float] | None = None) -> "AcceptanceModel":
        """A per-position model from the population conditional acceptance given directly.

        Args:
            conditional: c_1..c_K, each in (0, 1) (P(k accepted | 1..k-1 accepted) over the
                population of rounds), used for every domain of ``domains``; or a mapping
                domain -> c_1..c_K (all of the same length K).
            sigma_request, sigma_round: request and round noise (logit units, >= 0); the base
                logits are fitted so that the population conditional acceptance under this noise
                is exactly ``conditional`` (with no noise: ``base = logit(c)``).
            domains: domain names when ``conditional`` is one vector.
            name: profile name (default: ``per-position-`` and the vector, e.g.
                ``per-position-0.84/0.6/0.39/0.27``).
            source: provenance text.
            confidence: optional ``ConfidenceHead`` parameters (``noise_sd``, ``overconfidence``).

        Beyond position K the last level is repeated, flat (module docstring).

        Raises:
            ValueError: an empty vector, a value outside (0, 1) or not finite, vectors of
                different lengths, negative sigmas. The message names the offending argument.
        """
        if isinstance(conditional, Mapping):
            vectors = {str(d): _check_conditional(v, f"conditional[{d!r}]") for d, v in conditional.items()}
            if not vectors:
                raise ValueError("conditional: needs at least one domain")
        else:
            vec = _check_conditional(conditional, "conditional")
            vectors = {d: vec for d in domains}
        lengths = {len(v) for v in vectors.values()}
        if len(lengths) != 1:
            raise ValueError(f"conditional: every domain needs the same number of positions, got {sorted(lengths)}")
        if sigma_request < 0 or sigma_round < 0:
            raise ValueError("sigma_request, sigma_round: must be >= 0")
        sigma = float(np.hypot(sigma_request, sigma_round))
        first = next(iter(vectors.values()))
        flat = max(EXTRAPOLATED_POSITIONS - len(first), 0)
        base = np.stack([fit_per_position_logits(v + (v[-1],) * flat, sigma) for v in vectors.values()])
        label = name or "per-position-" + "/".join(f"{c:g}" for c in first)
        return cls(tuple(vectors), base[:, 0].copy(), np.zeros(len(vectors)), float(sigma_request),
                   float(sigma_round), name=label, source=source, fit_gamma=len(first), base=base,
                   conditional_targets={d: tuple(v) for d, v in vectors.items()},
                   confidence=dict(confidence or {}))

    @property
    def kind(self) -> str:
        """``"linear"`` (mu + slope * (k - 1), the Table-1 fit) or ``"per_position"``."""
        return "linear" if self.base is None else "per_position"

    @property
    def measured_positions(self) -> int | None:
        """Positions whose acceptance was given (per-position kind: the length of the measured
        vectors, else of ``base``); None for the linear kind, whose formula holds at every position."""
        if self.base is None:
            return None
        if self.conditional_targets:
            return len(next(iter(self.conditional_targets.values())))
        return int(self.base.shape[1])

    @property
    def fingerprint(self) -> tuple:
        """Everything that determines the draws, hashable (for caches keyed by the model)."""
        shape = (tuple(self.mu), tuple(self.slope)) if self.base is None else tuple(map(tuple, self.base))
        return (self.name, self.kind, self.domains, shape, self.sigma_request, self.sigma_round)

    def base_logits(self, gamma: int) -> np.ndarray:
        """Base logits of positions 1..gamma per domain, shape (n_domains, gamma).

        Linear kind: ``mu[d] + slope[d] * (k - 1)``. Per-position kind: the fitted ``base``
        (measured positions, then the flat extrapolation to :data:`EXTRAPOLATED_POSITIONS`), its
        last column repeated beyond that.
        """
        if self.base is None:
            return self.mu[:, None] + self.slope[:, None] * np.arange(gamma, dtype=np.float64)[None, :]
        out = self._base_by_gamma.get(gamma)
        if out is None:
            # C order: the compiled round reads it row by row (a column gather may come out in F order)
            out = np.ascontiguousarray(self.base[:, np.minimum(np.arange(gamma), self.base.shape[1] - 1)])
            out.setflags(write=False)  # shared by every caller
            self._base_by_gamma[gamma] = out
        return out

    def domain_index(self, name: str) -> int:
        """Index of domain ``name`` in :attr:`domains`.

        Raises:
            ValueError: an unknown domain (the message lists the known ones).
        """
        try:
            return self.domains.index(name)
        except ValueError:
            raise ValueError(f"acceptance: unknown domain {name!r}; known: {', '.join(self.domains)}") from None

    @property
    def sigma_total(self) -> float:
        """Total per-round logit sd, ``hypot(sigma_request, sigma_round)``."""
        return float(np.hypot(self.sigma_request, self.sigma_round))

    def expected_tau(self, domain: str | int, gamma: int) -> float:
        """Accepted tokens per round (bonus included) under static verification of ``gamma``, as a
        benchmark measures it: total accepted tokens / total rounds.

        A hard request takes more rounds for the same output, so rounds are not weighted equally
        across requests: with tau_u the mean over round noise for difficulty u, the ratio is
        1 / E_u[1 / tau_u] (equal output lengths). Both integrals use Gauss-Hermite quadrature.
        """
        d = self.domain_index(domain) if isinstance(domain, str) else int(domain)
        if self.base is None:
            return _expected_tau(float(self.mu[d]), float(self.slope[d]), self.sigma_request, self.sigma_round, gamma)
        row = tuple(float(x) for x in self.base_logits(gamma)[d])
        return _expected_tau_base(row, self.sigma_request, self.sigma_round)

    def sample_difficulty(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Per-request difficulty offsets ``u``, shape (n,)."""
        if self.sigma_request == 0.0:
            return np.zeros(n)
        return rng.normal(0.0, self.sigma_request, size=n)

    def round_logits(self, rng: np.random.Generator, domain_idx: np.ndarray, difficulty: np.ndarray,
                     gamma: int) -> np.ndarray:
        """Logits of the conditional acceptance of positions 1..gamma, shape (R, gamma).

        Draws one round offset per request (``sigma_round > 0``), the same draws for both kinds.
        """
        if self.base is not None:
            offset = np.asarray(difficulty, dtype=np.float64)
            if self.sigma_round > 0.0:
                offset = offset + rng.normal(0.0, self.sigma_round, size=offset.shape)
            return self.base_logits(gamma)[domain_idx] + offset[:, None]
        # linear kind: this exact arithmetic (and order of additions) is what every shipped run used
        base = self.mu[domain_idx] + difficulty
        if self.sigma_round > 0.0:
            base = base + rng.normal(0.0, self.sigma_round, size=base.shape)
        pos = np.arange(gamma, dtype=np.float64)
        return base[:, None] + self.slope[domain_idx][:, None] * pos[None, :]

    def _population_summary(self) -> dict[str, tuple[float, ...]]:
        # the population conditional acceptance at 16 positions per domain, rounded for reports
        if not self._conditional_summary:
            self._conditional_summary.update({
                d: tuple(round(float(x), 4) for x in population_conditional_acceptance(row, self.sigma_total))
                for d, row in zip(self.domains, self.base_logits(16))
            })
        return self._conditional_summary

    def summary(self) -> dict[str, Any]:
        """Provenance of the model as plain data (run summaries, reports)."""
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "kind": self.kind,
            "domains": list(self.domains),
            "mu": [round(float(x), 6) for x in self.mu],
            "slope": [float(x) for x in self.slope],
            "sigma_request": self.sigma_request,
            "sigma_round": self.sigma_round,
            "fit_gamma": self.fit_gamma,
            "targets_tau": dict(self.targets),
            "conditional_acceptance": {d: list(row) for d, row in self._population_summary().items()},
        }
        if self.base is not None:
            out["measured_positions"] = self.measured_positions
            k = self.measured_positions
            out["base_logits"] = {d: [round(float(x), 6) for x in row[:k]] for d, row in zip(self.domains, self.base)}
            out["conditional_targets"] = {d: list(v) for d, v in self.conditional_targets.items()}
            out["beyond_measured"] = (f"population conditional acceptance flat at the last measured level to "
                                      f"position {EXTRAPOLATED_POSITIONS}, then the last base logit repeated")
        if self.confidence:
            out["confidence"] = dict(self.confidence)
        return out


def parse_rates(text: str, what: str) -> tuple[float, ...]:
    """``"0.84/0.60/0.39/0.27"`` (or comma-separated) -> (0.84, 0.6, 0.39, 0.27): the one parser of
    every rate vector given as text (``conditional``, ``per_position``).

    Raises:
        ValueError: not a list of numbers; the message names ``what`` and quotes the text.
    """
    parts = [p.strip() for p in str(text).replace(",", "/").split("/") if p.strip()]
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{what}: expected numbers separated by '/', e.g. 0.84/0.60/0.39 (got {text!r})") from None


def parse_conditional_acceptance(text: str) -> tuple[float, ...]:
    """``"0.84/0.60/0.39/0.27"`` (or comma-separated) -> (0.84, 0.6, 0.39, 0.27).

    Raises:
        ValueError: not a list of numbers, or a value outside (0, 1); the message quotes the text.
    """
    values = parse_rates(text, "conditional acceptance")
    _check_conditional(values, "conditional acceptance")
    return values


def _check_conditional(values: Any, name: str) -> tuple[float, ...]:
    """Validate a vector of conditional acceptances: non-empty, finite, each in (0, 1)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (abc.Sequence, np.ndarray)):
        raise ValueError(f"{name}: expected a list of numbers in (0, 1), got {values!r}")
    try:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a list of numbers in (0, 1), got {values!r}") from None
    if arr.size == 0:
        raise ValueError(f"{name}: needs at least one position")
    bad = ~np.isfinite(arr) | (arr <= 0.0) | (arr >= 1.0)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: position {k + 1} is {arr[k]!r}; every value must lie strictly in (0, 1)")
    return tuple(float(x) for x in arr)


def population_conditional_acceptance(base_logits: Sequence[float] | np.ndarray, sigma: float) -> np.ndarray:
    """Population P(position k accepted | 1..k-1 accepted) for base logits ``base[1..K]``.

    Each round has one logit offset ``s ~ N(0, sigma^2)`` shared by its positions (request plus
    round noise: ``sigma = hypot(sigma_request, sigma_round)``); position k is accepted with
    probability ``sigmoid(base[k] + s)``. Gauss-Hermite quadrature (64 nodes). Shape (K,).
    """
    base = np.asarray(base_logits, dtype=np.float64).reshape(-1)
    z = sigma * _GH_NODES[:, None]
    p = expit(base[None, :] + z)
    joint = _GH_WEIGHTS @ np.cumprod(p, axis=1)  # E[prod_{i<=k} p_i]
    prev = np.concatenate(([1.0], joint[:-1]))
    return joint / prev


def fit_per_position_logits(conditional: Sequence[float] | np.ndarray, sigma: float) -> np.ndarray:
    """Base logits whose population conditional acceptance (:func:`population_conditional_acceptance`)
    is ``conditional``, fitted left to right.

    Position k's logit solves ``E[w_k(s) sigmoid(b + s)] / E[w_k(s)] = c_k`` with the earlier
    positions fixed, ``w_k(s) = prod_{i<k} sigmoid(base[i] + s)`` the survival of a round with
    offset s (Gauss-Hermite, 64 nodes); the left side rises monotonically in b, so the root is
    unique (Brent's method, |error| < 1e-12 in logit units). With ``sigma == 0`` it is
    ``logit(c_k)`` exactly.

    Args:
        conditional: c_1..c_K, each in (0, 1).
        sigma: total sd of the per-round logit offset, >= 0.

    Returns:
        Base logits, shape (K,).

    Raises:
        ValueError: a value outside (0, 1), an empty vector, or ``sigma < 0``.
    """
    c = np.array(_check_conditional(conditional, "conditional"))
    if sigma < 0:
        raise ValueError(f"sigma: must be >= 0, got {sigma}")
    if sigma == 0.0:
        return logit(c)
    z = sigma * _GH_NODES
    surv = _GH_WEIGHTS.copy()  # quadrature weight x survival to the current position
    out = np.empty(c.size)
    for k, target in enumerate(c):
        w = surv / surv.sum()

        def excess(b: float) -> float:
            return float(w @ expit(b + z)) - target

        out[k] = brentq(excess, -60.0, 60.0, xtol=1e-12)
        surv = surv * expit(out[k] + z)
    return out


def conditional_acceptance(mu: float, slope: float, sigma: float, gamma: int) -> np.ndarray:
    """Population conditional acceptance P(position k accepted | 1..k-1 accepted), k = 1..gamma.

    Under shared per-round noise, rounds that survive to deep positions are the easy ones, so this
    rises along the block unless ``slope`` offsets it. Shape (gamma,).
    """
    z = sigma * _GH_NODES[:, None]
    p = expit(mu + slope * np.arange(gamma)[None, :] + z)
    joint = _GH_WEIGHTS @ np.cumprod(p, axis=1)  # E[prod_{i<=k} p_i]
    prev = np.concatenate(([1.0], joint[:-1]))
    return joint / prev


def _fit_mu(target: float, slope: float, s_req: float, s_round: float, gamma: int) -> float:
    return brentq(lambda m: _expected_tau(m, slope, s_req, s_round, gamma) - target, -12.0, 12.0, xtol=1e-10)


def _fit_flat(target: float, s_req: float, s_round: float, gamma: int,
              flat_through: int | None = None) -> tuple[float, float]:
    """(mu, slope): tau under static ``gamma`` equals ``target``, and the population conditional
    acceptance is equal at positions 1 and ``flat_through`` (default ``gamma``)."""
    last = flat_through or gamma
    sigma = float(np.hypot(s_req, s_round))

    def tilt(slope: float) -> float:
        ca = conditional_acceptance(_fit_mu(target, slope, s_req, s_round, gamma), slope, sigma, last)
        return float(ca[-1] - ca[0])

    slope = brentq(tilt, -1.0, 0.5, xtol=1e-8) if sigma > 0 else 0.0
    return _fit_mu(target, slope, s_req, s_round, gamma), slope


_GH32_NODES, _GH32_WEIGHTS = np.polynomial.hermite_e.hermegauss(32)
_GH32_WEIGHTS = _GH32_WEIGHTS / _GH32_WEIGHTS.sum()


@lru_cache(maxsize=4096)
def _expected_tau(mu: float, slope: float, s_req: float, s_round: float, gamma: int) -> float:
    # tau_u = E_z[ sum_{j=0..gamma} prod_{k<=j} sigmoid(mu + slope (k-1) + u + z) ];  result 1 / E_u[1 / tau_u]
    u = s_req * _GH32_NODES[:, None, None]
    z = s_round * _GH32_NODES[None, :, None]
    p = expit(mu + slope * np.arange(gamma)[None, None, :] + u + z)  # (u nodes, z nodes, gamma)
    surv = np.cumprod(p, axis=2).sum(axis=2) + 1.0
    tau_u = surv @ _GH32_WEIGHTS
    return float(1.0 / np.dot(_GH32_WEIGHTS, 1.0 / tau_u))


@lru_cache(maxsize=4096)
def _expected_tau_base(base: tuple[float, ...], s_req: float, s_round: float) -> float:
    # as _expected_tau, with per-position base logits (len(base) = gamma)
    u = s_req * _GH32_NODES[:, None, None]
    z = s_round * _GH32_NODES[None, :, None]
    p = expit(np.asarray(base)[None, None, :] + u + z)  # (u nodes, z nodes, gamma)
    surv = np.cumprod(p, axis=2).sum(axis=2) + 1.0
    tau_u = surv @ _GH32_WEIGHTS
    return float(1.0 / np.dot(_GH32_WEIGHTS, 1.0 / tau_u))


def acceptance_dir() -> Path:
    """Folder of the shipped acceptance profiles (``calibration/acceptance``)."""
    return calibration_dir() / "acceptance"


def load_acceptance(name_or_path: str | Path | None = None) -> AcceptanceModel:
    """Load an acceptance profile: a Table-1 fit (``mu`` per domain fitted to the paper's Table 1)
    or, with ``kind: per_position``, a measured conditional acceptance by position.

    A per-position profile (e.g. ``calibration/acceptance/lab-markov.yaml``)::

        name: lab-markov
        kind: per_position
        source: "..."                # provenance text
        sigma_request: 0.0           # logit sd per request, >= 0
        sigma_round: 0.8             # logit sd per round, >= 0
        beyond_measured: repeat_last # optional; the only rule: the last level repeated, flat
        domains:
          lab:
            conditional_acceptance: [0.93, 0.91, ...]   # c_1..c_K, each in (0, 1)
        confidence: {noise_sd: 0.9, overconfidence: 1.1}  # optional ConfidenceHead parameters
        provenance: {...}            # optional, free-form (ignored)

    Raises:
        CalibrationError: unknown profile, a folder, unreadable or invalid YAML, missing or invalid fields
            (one line naming the file and the field), or a target tau no ``mu`` can reach.
    """
    key = DEFAULT_ACCEPTANCE if name_or_path is None else str(name_or_path)
    # where a key was found (a relative path: from this folder), looked up once (resolving costs
    # a system call per folder of the path, in every run); the file must still be there
    where = (key, "" if os.path.isabs(key) else os.getcwd())
    found = _FOUND_ACCEPTANCE.get(where)
    if found is None or not os.path.isfile(found):
        found = _FOUND_ACCEPTANCE[where] = _find_acceptance(key)
    st = os.stat(found)  # in the cache's key, as a hardware profile's: an edited file is read again
    return _load_acceptance_cached(found, st.st_mtime_ns, st.st_size)


_FOUND_ACCEPTANCE: dict[tuple[str, str], str] = {}


def _find_acceptance(key: str) -> str:
    """The resolved path of acceptance profile ``key`` (a shipped name or a YAML path).

    Raises:
        CalibrationError: a folder, or no such profile.
    """
    path = Path(key)
    if path.is_dir() and (path.name != key or key in (".", "..") or path.suffix in (".yaml", ".yml")):
        raise CalibrationError(not_a_file(key, "acceptance profile file"))  # not "not found": it exists
    if path.suffix not in (".yaml", ".yml"):
        path = acceptance_dir() / f"{key}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in acceptance_dir().glob("*.yaml"))
        raise CalibrationError(f"acceptance profile {key!r} not found; shipped: {', '.join(known)}")
    return str(path.resolve())


@lru_cache(maxsize=16)
def _load_acceptance_cached(path: str, mtime_ns: int, size: int) -> AcceptanceModel:  # stat in the key: edits reload
    where = path
    doc = read_yaml(path, error=CalibrationError, what="an acceptance profile mapping (name, domains, ...)")
    kind = doc.get("kind", "table1")
    if kind == "per_position":
        return _load_per_position(path, doc)
    if kind != "table1":
        raise CalibrationError(f"{where}: kind: {kind!r} is not a profile kind; use table1 (default) or per_position")
    check_keys(doc, _TABLE1_KEYS, where, error=CalibrationError)
    try:
        gamma = int(doc["fit_gamma"])
        flat_through = int(doc.get("flat_through", gamma))
        s_req, s_round = float(doc["sigma_request"]), float(doc["sigma_round"])
        domains_doc: dict[str, Any] = doc["domains"]
    except (KeyError, TypeError, ValueError) as e:
        raise CalibrationError(f"{where}: missing or invalid field ({e})") from None
    names, mus, slopes, targets = [], [], [], {}
    for dname, d in domains_doc.items():
        rows = d["table1_tau"]
        vals = [float(v) for row in rows.values() for v in row]
        target = float(np.mean(vals))
        if not 1.0 < target < gamma + 1:
            raise CalibrationError(f"{where}: domains.{dname}: target tau {target} outside (1, {gamma + 1})")
        shape = d.get("slope", "flat")
        # root finds that cost a cold process a quarter of a second: kept on disk by their inputs
        if shape == "flat":
            args = (target, s_req, s_round, gamma, flat_through)
            mu, slope = disk_cached("acceptance-fit", ("flat", *args),
                                    lambda a=args: [float(x) for x in _fit_flat(*a)])
        else:
            args = (target, float(shape), s_req, s_round, gamma)
            slope = args[1]
            mu = disk_cached("acceptance-fit", ("mu", *args), lambda a=args: float(_fit_mu(*a)))
        names.append(dname)
        mus.append(mu)
        slopes.append(slope)
        targets[dname] = target
    return AcceptanceModel(tuple(names), np.array(mus), np.array(slopes), s_req, s_round,
                           name=str(doc.get("name", Path(path).stem)), source=str(doc.get("source", "")),
                           fit_gamma=gamma, targets=targets)


_PER_POSITION_KEYS = {"name", "kind", "source", "sigma_request", "sigma_round", "sigma_note", "beyond_measured",
                      "domains", "confidence", "provenance", "notes"}
#: a table1 profile's keys (memtp_sim._io.check_keys): each domain's Table 1 rows (model -> taus) and slope
_TABLE1_KEYS = {**dict.fromkeys(("name", "kind", "source", "notes", "sigma_note", "fit_gamma", "flat_through",
                                 "sigma_request", "sigma_round")),
                "domains": {ANY_KEY: {"table1_tau": None, "slope": None}}}
_CONFIDENCE_KEYS = {"noise_sd", "overconfidence"}
#: every key a per_position profile may hold (memtp_sim._io.check_keys); provenance is free (what made it)
_PER_POSITION_SCHEMA = {**dict.fromkeys(_PER_POSITION_KEYS), "domains": {ANY_KEY: {"conditional_acceptance": None}},
                        "confidence": dict.fromkeys(_CONFIDENCE_KEYS)}


def _sigma_field(path: str, doc: dict[str, Any], key: str) -> float:
    if key not in doc:
        raise CalibrationError(f"{path}: {key}: missing (logit sd, >= 0; 0 for no noise)")
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
        raise CalibrationError(f"{path}: {key}: must be a number >= 0, got {v!r}")
    return float(v)


def _load_per_position(path: str, doc: dict[str, Any]) -> AcceptanceModel:
    """A ``kind: per_position`` profile -> AcceptanceModel (see :func:`load_acceptance`)."""
    check_keys(doc, _PER_POSITION_SCHEMA, path, error=CalibrationError)
    s_req, s_round = _sigma_field(path, doc, "sigma_request"), _sigma_field(path, doc, "sigma_round")
    rule = doc.get("beyond_measured", "repeat_last")
    if rule != "repeat_last":
        raise CalibrationError(f"{path}: beyond_measured: {rule!r} is not supported; the rule is repeat_last "
                               "(the last measured level repeated, flat)")
    domains_doc = doc.get("domains")
    if not isinstance(domains_doc, dict) or not domains_doc:
        raise CalibrationError(f"{path}: domains: missing or empty (domain -> {{conditional_acceptance: [...]}})")
    vectors: dict[str, tuple[float, ...]] = {}
    for dname, d in domains_doc.items():
        field_name = f"domains.{dname}.conditional_acceptance"
        if not isinstance(d, dict) or "conditional_acceptance" not in d:
            raise CalibrationError(f"{path}: {field_name}: missing")
        try:
            vectors[str(dname)] = _check_conditional(d["conditional_acceptance"], field_name)
        except ValueError as e:
            raise CalibrationError(f"{path}: {e}") from None
    if len({len(v) for v in vectors.values()}) != 1:
        raise CalibrationError(f"{path}: domains: every domain needs the same number of positions, got "
                               + ", ".join(f"{d} {len(v)}" for d, v in vectors.items()))
    confidence = _confidence_field(path, doc.get("confidence"))
    name = doc.get("name", Path(path).stem)
    return AcceptanceModel.per_position(vectors, sigma_request=s_req, sigma_round=s_round, name=str(name),
                                        source=str(doc.get("source", "")), confidence=confidence)


def _confidence_field(path: str, conf: Any) -> dict[str, float]:
    if conf is None:
        return {}
    if not isinstance(conf, dict):
        raise CalibrationError(f"{path}: confidence: expected a mapping {{noise_sd: ..., overconfidence: ...}}")
    out: dict[str, float] = {}
    for key in sorted(_CONFIDENCE_KEYS):
        v = conf.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise CalibrationError(f"{path}: confidence.{key}: must be a number, got {v!r}")
        out[key] = float(v)
    if out["noise_sd"] < 0:
        raise CalibrationError(f"{path}: confidence.noise_sd: must be >= 0, got {out['noise_sd']}")
    if out["overconfidence"] <= 0:
        raise CalibrationError(f"{path}: confidence.overconfidence: must be > 0, got {out['overconfidence']}")
    return out


# ------------------------------------------------------------------------- acceptance inputs
def _solve_alpha(target: float, f: "Callable[[float], float]", what: str) -> float:
    """alpha in (0, 1) with f(alpha) = target (f increasing), by bisection to 1e-12."""
    lo, hi = 1e-9, 1.0 - 1e-9
    if not f(lo) <= target <= f(hi):
        raise ValueError(f"{what}: {target:g} is out of reach (allowed: {f(lo):.4g} .. {f(hi):.4g})")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def alpha_from_mean_acceptance_length(length: float, draft_len: int) -> float:
    """The i.i.d. per-position acceptance whose expected tokens per step, bonus included, equal
    ``length`` when ``draft_len`` tokens are drafted: solves ``(1 - a^(k+1)) / (1 - a) = length``.

    vLLM reports "mean acceptance length" this way (tokens per verification step, bonus counted).

    Raises:
        ValueError: ``length`` outside (1, draft_len + 1) or ``draft_len < 1``.

    Source: Leviathan, Kalman, Matias 2023 (expected tokens per round with i.i.d. acceptance).
    """
    if draft_len < 1:
        raise ValueError(f"draft_len: must be >= 1, got {draft_len}")
    return _solve_alpha(float(length), lambda a: expected_tau_iid(a, draft_len), "mean_acceptance_length")


def alpha_from_accepted_ratio(ratio: float, draft_len: int) -> float:
    """The i.i.d. per-position acceptance whose accepted / drafted ratio is ``ratio`` when every
    step drafts ``draft_len`` tokens: solves ``(a (1 - a^k) / (1 - a)) / k = ratio`` (expected
    accepted drafts per step over drafted ones; llama.cpp prints n_accept / n_draft this way).

    Raises:
        ValueError: ``ratio`` outside (0, 1) or ``draft_len < 1``.

    Source: Leviathan et al. 2023 (the accepted prefix of an i.i.d. chain).
    """
    if draft_len < 1:
        raise ValueError(f"draft_len: must be >= 1, got {draft_len}")
    return _solve_alpha(float(ratio), lambda a: (expected_tau_iid(a, draft_len) - 1.0) / draft_len, "accepted_ratio")


def conditional_from_per_position(rates: Sequence[float]) -> tuple[float, ...]:
    """Per-position acceptance rates as vLLM reports them (position j accepted per draft, which
    needs positions 1..j-1 accepted too: a joint probability, non-increasing) -> conditional
    acceptance ``c_j = a_j / a_(j-1)``.

    Raises:
        ValueError: a rate outside (0, 1], or rates that increase along the block.

    Source: vLLM's spec-decode metrics (num_accepted_tokens_per_pos / num_drafts); DSpark paper
    section 3.2 (a_k = product of c_1..c_k).
    """
    a = [float(x) for x in rates]
    if not a or any(not 0.0 < x <= 1.0 for x in a):
        raise ValueError(f"per_position: rates must lie in (0, 1], got {a}")
    if any(y > x + 1e-12 for x, y in zip(a, a[1:])):
        raise ValueError(f"per_position: rates of a chain cannot increase along the block, got {a}")
    return tuple(min(0.999999, y / x) for x, y in zip([1.0] + a[:-1], a))
