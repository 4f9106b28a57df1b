"""Draft acceptance: per-domain, per-position conditional acceptance with request and round noise.

Model (one draft chain per request and round; position k = 1..gamma):

    p[r, k] = sigmoid(mu[d_r] + slope[d_r] * (k - 1) + u_r + z[r, t])

``u_r ~ N(0, sigma_request^2)`` is the request's difficulty, drawn once; ``z[r, t] ~ N(0,
sigma_round^2)`` is the context of round t, shared by the positions of that round (so acceptance
is correlated within a round, which is what confidence scheduling exploits). Position k is accepted
with probability ``p[r, k]`` given 1..k-1 were, so ``p`` is the *conditional* acceptance the DSpark
paper's confidence head estimates (section 3.2). A perfectly calibrated head outputs ``c = p``.

``mu`` is fitted so that static verification of the fit gamma reproduces the mean accepted length
tau of the DSpark paper's Table 1 for each domain (see ``calibration/acceptance/*.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml
from scipy.optimize import brentq
from scipy.special import expit, logit

from .errors import CalibrationError
from .hardware import calibration_dir

__all__ = [
    "AcceptanceModel",
    "conditional_acceptance",
    "expected_tau_iid",
    "load_acceptance",
    "DEFAULT_ACCEPTANCE",
    "acceptance_dir",
]

DEFAULT_ACCEPTANCE = "dspark-qwen3"
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
        slope: logit change per position per domain, shape (n_domains,).
        sigma_request: sd of per-request difficulty (logit units).
        sigma_round: sd of per-round context noise (logit units).
        name: profile name; ``source`` names the paper figures it was fitted to.
        targets: domain -> tau the fit reproduces (for reports/tests).
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

    def __post_init__(self) -> None:
        mu = np.asarray(self.mu, dtype=np.float64).reshape(-1)
        slope = np.asarray(self.slope, dtype=np.float64).reshape(-1)
        if mu.shape != (len(self.domains),) or slope.shape != mu.shape:
            raise ValueError("acceptance: mu and slope need one value per domain")
        if self.sigma_request < 0 or self.sigma_round < 0:
            raise ValueError("acceptance: sigma_request and sigma_round must be >= 0")
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "slope", slope)

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

    def domain_index(self, name: str) -> int:
        try:
            return self.domains.index(name)
        except ValueError:
            raise ValueError(f"acceptance: unknown domain {name!r}; known: {', '.join(self.domains)}") from None

    @property
    def sigma_total(self) -> float:
        return float(np.hypot(self.sigma_request, self.sigma_round))

    def expected_tau(self, domain: str | int, gamma: int) -> float:
        """Accepted tokens per round (bonus included) under static verification of ``gamma``, as a
        benchmark measures it: total accepted tokens / total rounds.

        A hard request takes more rounds for the same output, so rounds are not weighted equally
        across requests: with tau_u the mean over round noise for difficulty u, the ratio is
        1 / E_u[1 / tau_u] (equal output lengths). Both integrals use Gauss-Hermite quadrature.
        """
        d = self.domain_index(domain) if isinstance(domain, str) else int(domain)
        return _expected_tau(float(self.mu[d]), float(self.slope[d]), self.sigma_request, self.sigma_round, gamma)

    def sample_difficulty(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Per-request difficulty offsets ``u``, shape (n,)."""
        if self.sigma_request == 0.0:
            return np.zeros(n)
        return rng.normal(0.0, self.sigma_request, size=n)

    def round_logits(self, rng: np.random.Generator, domain_idx: np.ndarray, difficulty: np.ndarray,
                     gamma: int) -> np.ndarray:
        """Logits of the conditional acceptance of positions 1..gamma, shape (R, gamma)."""
        base = self.mu[domain_idx] + difficulty
        if self.sigma_round > 0.0:
            base = base + rng.normal(0.0, self.sigma_round, size=base.shape)
        pos = np.arange(gamma, dtype=np.float64)
        return base[:, None] + self.slope[domain_idx][:, None] * pos[None, :]

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "domains": list(self.domains),
            "mu": [round(float(x), 6) for x in self.mu],
            "slope": [float(x) for x in self.slope],
            "sigma_request": self.sigma_request,
            "sigma_round": self.sigma_round,
            "fit_gamma": self.fit_gamma,
            "targets_tau": dict(self.targets),
            "conditional_acceptance": {
                d: [round(float(x), 4) for x in conditional_acceptance(
                    float(self.mu[i]), float(self.slope[i]), self.sigma_total, 16)]
                for i, d in enumerate(self.domains)
            },
        }


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


def acceptance_dir() -> Path:
    """Folder of the shipped acceptance profiles (``calibration/acceptance``)."""
    return calibration_dir() / "acceptance"


def load_acceptance(name_or_path: str | Path | None = None) -> AcceptanceModel:
    """Load an acceptance profile and fit its per-domain ``mu`` to the paper's Table 1.

    Raises:
        CalibrationError: unknown profile, missing fields, or a target tau no ``mu`` can reach.
    """
    key = DEFAULT_ACCEPTANCE if name_or_path is None else str(name_or_path)
    path = Path(key)
    if path.suffix not in (".yaml", ".yml"):
        path = acceptance_dir() / f"{key}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in acceptance_dir().glob("*.yaml"))
        raise CalibrationError(f"acceptance profile {key!r} not found; shipped: {', '.join(known)}")
    return _load_acceptance_cached(str(path.resolve()))


@lru_cache(maxsize=16)
def _load_acceptance_cached(path: str) -> AcceptanceModel:
    where = path
    doc = yaml.safe_load(Path(path).read_text())
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
        if shape == "flat":
            mu, slope = _fit_flat(target, s_req, s_round, gamma, flat_through)
        else:
            slope = float(shape)
            mu = _fit_mu(target, slope, s_req, s_round, gamma)
        names.append(dname)
        mus.append(mu)
        slopes.append(slope)
        targets[dname] = target
    return AcceptanceModel(tuple(names), np.array(mus), np.array(slopes), s_req, s_round,
                           name=str(doc.get("name", Path(path).stem)), source=str(doc.get("source", "")),
                           fit_gamma=gamma, targets=targets)
