"""The token-level drafter lab: how acceptance falls along a draft block, per drafter structure.

A small, fully controlled world (numpy only) in which acceptance is *measured*:

* :mod:`~memtp_sim.lab.source`: the target, a sparse order-n Markov source with tunable entropy
  (:class:`MarkovSource`);
* :mod:`~memtp_sim.lab.drafters`: a parallel backbone (:class:`ParallelBackbone`) that drafts every
  block position from the context alone, three sequential heads (:class:`MarkovHead` of rank r,
  :class:`RnnHead` of hidden size h, the n-gram matryoshka tower :class:`NgramMatryoshka`), the
  semi-autoregressive block law :func:`semi_ar_block_dist` that combines them, autoregressive
  drafting (:func:`ar_block_dist`) and the backbone alone (:func:`parallel_block_dist`);
* :mod:`~memtp_sim.lab.measure`: exact verification of whole blocks (the accept/resample rule of
  :mod:`memtp_sim.exactness`), acceptance by block position, and the engine-side noise and
  confidence head that mimic a drafter (:func:`fit_engine_parameters`);
* :mod:`~memtp_sim.lab.costs`: FLOPs, bytes and roofline time of each head per step;
* :mod:`~memtp_sim.lab.run` (:func:`run_lab`, ``python -m memtp_sim drafter-lab``): the whole run,
  writing ``kind: per_position`` acceptance profiles (:func:`memtp_sim.acceptance.load_acceptance`
  reads them), ``report.html`` and ``lab.json``.

Floor 2 of docs/architecture.md: it imports ``acceptance``, ``exactness``, ``confidence`` and the
floor-0 helpers, never ``engine``, ``config`` or ``api``.
"""

from .costs import StepCost, markov_head_step, rnn_head_step, tower_level_step, tower_round
from .drafters import (
    MarkovHead,
    NgramMatryoshka,
    NgramTable,
    ParallelBackbone,
    RnnHead,
    ar_block_dist,
    block_bias,
    fit_gate,
    parallel_block_dist,
    semi_ar_block_dist,
)
from .measure import (
    BlockVerdict,
    EngineFit,
    LabMeasurement,
    acceptance_by_position,
    fit_engine_parameters,
    measure_drafter,
    target_along,
    verify_block,
)
from .run import DRAFTERS, LabConfig, LabResult, build_lab, run_lab
from .source import MarkovSource

__all__ = [
    "DRAFTERS",
    "BlockVerdict",
    "EngineFit",
    "LabConfig",
    "LabMeasurement",
    "LabResult",
    "MarkovHead",
    "MarkovSource",
    "NgramMatryoshka",
    "NgramTable",
    "ParallelBackbone",
    "RnnHead",
    "StepCost",
    "acceptance_by_position",
    "ar_block_dist",
    "block_bias",
    "build_lab",
    "fit_engine_parameters",
    "fit_gate",
    "markov_head_step",
    "measure_drafter",
    "parallel_block_dist",
    "rnn_head_step",
    "run_lab",
    "semi_ar_block_dist",
    "target_along",
    "tower_level_step",
    "tower_round",
    "verify_block",
]
