"""Verification-length policies, chosen by name in YAML (see :func:`make_policy`)."""

from .base import Policy, PolicyParams, RoundPlan, RoundView
from .builtin import DSparkPolicy, Mtp1Policy, NoSpecPolicy, StaticPolicy
from .registry import available_policies, make_policy, policy_class, register
from .rival import DSparkAsyncPolicy, GoodputPolicy, ThresholdPolicy

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
    "available_policies",
    "make_policy",
    "policy_class",
    "register",
]
