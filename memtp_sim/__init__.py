"""memtp_sim: a SimPy simulator of LLM serving with speculative decoding.

DSpark's confidence-scheduled verification and the MEMTP memory-elastic draft-head ensemble on
one GPU serving queue, calibrated from measured AMD Strix Halo (gfx1151) costs and driven by real
request traces.
"""

from .acceptance import AcceptanceModel, expected_tau_iid, load_acceptance
from .api import run
from .config import Scenario, Study, load_scenario, load_study
from .errors import CalibrationError, ConfigError, ExperimentalWarning, MemtpSimError
from .hardware import HardwareProfile, SPSTable, list_profiles, load_profile
from .metrics import RunResult
from .policies import Policy, RoundPlan, RoundView, available_policies, make_policy, register
from .scheduling import ScheduleResult, hardware_aware_prefix_scheduler

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "AcceptanceModel",
    "CalibrationError",
    "ConfigError",
    "ExperimentalWarning",
    "HardwareProfile",
    "MemtpSimError",
    "Policy",
    "RoundPlan",
    "RoundView",
    "RunResult",
    "SPSTable",
    "Scenario",
    "ScheduleResult",
    "Study",
    "available_policies",
    "expected_tau_iid",
    "hardware_aware_prefix_scheduler",
    "list_profiles",
    "load_acceptance",
    "load_profile",
    "load_scenario",
    "load_study",
    "make_policy",
    "register",
    "run",
]
