"""Hardware: what passes cost and how much memory there is, from measured, sourced profiles.

Modules: :mod:`.cost` (SPS(B) verify-cost table, drafter cost), :mod:`.memory` (memory budget,
paged KV geometry), :mod:`.profile` (named profiles under ``calibration/<chip>/``: load, list).
"""

from .cost import AttentionCost, DrafterCost, MeasuredDrafterCost, Overheads, SPSTable
from .memory import GIB, MemorySpec
from .profile import DEFAULT_PROFILE, HardwareProfile, calibration_dir, list_profiles, load_profile, profile_catalog, profile_files

__all__ = [
    "SPSTable",
    "AttentionCost",
    "MeasuredDrafterCost",
    "Overheads",
    "DrafterCost",
    "MemorySpec",
    "HardwareProfile",
    "DEFAULT_PROFILE",
    "GIB",
    "calibration_dir",
    "list_profiles",
    "load_profile",
    "profile_catalog",
    "profile_files",
]
