"""memtp_sim: a SimPy simulator of LLM serving with speculative decoding.

DSpark's confidence-scheduled verification and the MEMTP memory-elastic draft-head ensemble on
one GPU serving queue, calibrated from measured AMD Strix Halo (gfx1151) costs and driven by real
request traces.
"""

from ._version import __version__
from .acceptance import AcceptanceModel, expected_tau_iid, load_acceptance
from .api import run
from .confidence import (
    ConfidenceHead,
    apply_temperature,
    auc_score,
    brier_score,
    expected_calibration_error,
    per_position_metrics,
    reliability_curve,
    sequential_temperature_scaling,
)
from .config import Scenario, Study, load_scenario, load_study
from .errors import (
    CalibrationError,
    ConfigError,
    EngineInvariantError,
    ExperimentalWarning,
    InvalidArgumentError,
    MemtpSimError,
    TelemetryUnavailableError,
)
from .hardware import HardwareProfile, SPSTable, list_profiles, load_profile
from .exactness import analytical_acceptance, residual_distribution, speculative_step
from .memtp import MEMTP_DEFAULTS, CoherenceEWMA, DepthController, MemtpSettings, memtp_depth
from .metrics import RunResult
from .policies import (
    Policy,
    RoundPlan,
    RoundView,
    ScheduleResult,
    available_policies,
    hardware_aware_prefix_scheduler,
    make_policy,
    register,
)
from .telemetry import memtp_depth_live, read_free_memory


__all__ = [
    "__version__",
    "AcceptanceModel",
    "CoherenceEWMA",
    "ConfidenceHead",
    "DepthController",
    "analytical_acceptance",
    "apply_temperature",
    "auc_score",
    "brier_score",
    "expected_calibration_error",
    "memtp_depth",
    "memtp_depth_live",
    "per_position_metrics",
    "read_free_memory",
    "reliability_curve",
    "residual_distribution",
    "sequential_temperature_scaling",
    "speculative_step",
    "CalibrationError",
    "ConfigError",
    "EngineInvariantError",
    "InvalidArgumentError",
    "TelemetryUnavailableError",
    "MEMTP_DEFAULTS",
    "MemtpSettings",
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
