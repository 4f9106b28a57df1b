"""memtp_sim: a SimPy simulator of LLM serving with speculative decoding.

DSpark's confidence-scheduled verification and the MEMTP memory-elastic draft-head ensemble on
one GPU serving queue, calibrated from measured AMD Strix Halo (gfx1151) costs and driven by real
request traces.
"""

from typing import TYPE_CHECKING

from ._version import __version__

from .errors import (  # tiny, and often needed in an ``except`` before anything else
    CalibrationError,
    ConfigError,
    EngineInvariantError,
    ExperimentalWarning,
    InvalidArgumentError,
    MemtpSimError,
    TelemetryUnavailableError,
)

# public name -> the submodule that defines it (imported on first access)
_LAZY = {
    "AcceptanceModel": "acceptance", "expected_tau_iid": "acceptance", "load_acceptance": "acceptance",
    "run": "api",
    "ConfidenceHead": "confidence", "apply_temperature": "confidence", "auc_score": "confidence",
    "brier_score": "confidence", "expected_calibration_error": "confidence", "per_position_metrics": "confidence",
    "reliability_curve": "confidence", "sequential_temperature_scaling": "confidence",
    "Scenario": "config", "Study": "config", "load_scenario": "config", "load_study": "config",
    "analytical_acceptance": "exactness", "residual_distribution": "exactness", "speculative_step": "exactness",
    "HardwareProfile": "hardware", "SPSTable": "hardware", "list_profiles": "hardware", "load_profile": "hardware",
    "CoherenceEWMA": "memtp", "DepthController": "memtp", "MEMTP_DEFAULTS": "memtp", "MemtpSettings": "memtp",
    "memtp_depth": "memtp",
    "RunResult": "metrics",
    "Policy": "policies", "RoundPlan": "policies", "RoundView": "policies", "ScheduleResult": "policies",
    "available_policies": "policies", "hardware_aware_prefix_scheduler": "policies", "make_policy": "policies",
    "register": "policies",
    "memtp_depth_live": "telemetry", "read_free_memory": "telemetry",
}


def __getattr__(name: str) -> object:
    # PEP 562 lazy loading (as scipy and scikit-image do, SPEC 1): ``import memtp_sim`` stays
    # light for the CLI's --help and for tools that need one function; the first access to a
    # public name imports its submodule
    from importlib import import_module
    from importlib.util import find_spec

    mod = _LAZY.get(name)
    if mod is not None:
        value = getattr(import_module(f".{mod}", __name__), name)
    elif not name.startswith("__") and find_spec(f"{__name__}.{name}") is not None:
        value = import_module(f".{name}", __name__)  # a submodule: ``memtp_sim.metrics.METRIC_NAMES`` works
    else:
        raise AttributeError(f"module 'memtp_sim' has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # what static analysis and IDEs see: the same names, eagerly
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


# every public name: the version, the errors above and the lazily loaded names
__all__ = ["__version__", "CalibrationError", "ConfigError", "EngineInvariantError", "ExperimentalWarning",
           "InvalidArgumentError", "MemtpSimError", "TelemetryUnavailableError", *_LAZY]
