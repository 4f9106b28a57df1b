"""Verification-length policies, chosen by name in YAML (see :func:`make_policy`).

Modules: :mod:`.base` (the interface: RoundView -> RoundPlan), :mod:`.registry` (names),
:mod:`.static` (no_spec, static, mtp1), :mod:`.dspark` (Algorithm 1, dspark, dspark_async),
:mod:`.threshold`, :mod:`.goodput`; :mod:`._candidates` holds the ranking they share.
"""

from .base import Policy, PolicyParams, RoundPlan, RoundView
from .dspark import DSparkAsyncPolicy, DSparkPolicy, ScheduleResult, hardware_aware_prefix_scheduler
from .goodput import GoodputPolicy
from .registry import available_policies, make_policy, policy_class, register
from .static import Mtp1Policy, NoSpecPolicy, StaticPolicy
from .threshold import ThresholdPolicy

__all__ = [
    "Policy",
    "PolicyParams",
    "RoundPlan",
    "RoundView",
    "NoSpecPolicy",
    "StaticPolicy",
    "Mtp1Policy",
    "DSparkPolicy",
    "DSparkAsyncPolicy",
    "ThresholdPolicy",
    "GoodputPolicy",
    "ScheduleResult",
    "hardware_aware_prefix_scheduler",
    "available_policies",
    "make_policy",
    "policy_class",
    "register",
]
