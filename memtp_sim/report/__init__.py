"""Study report: numbers first (pandas), then Plotly figures, then one self-contained HTML page.

* :mod:`memtp_sim.report.numbers`: every aggregation as a pure function returning DataFrames or
  NamedTuples (what tests check and a dashboard reuses);
* :mod:`memtp_sim.report.figures`: one drawer per figure, from those frames to a Plotly figure;
* :func:`write_report`: the page (``results/<study>/report.html``).

Figures (one set per combination of the sweep keys other than the load axis):

1. Throughput vs tok/s/user per policy across the load sweep (the DSpark paper's Fig. 7 frontier).
2. Throughput and mean verify budget vs load (Fig. 8; budget counts the bonus token, so MTP-1 is 2).
3. Latency distributions (TTFT, TPOT, end-to-end) per policy and load.
4. Reliability of the confidence per draft position; the MEMTP timeline (when the study runs it).
5. The hardware profile's measured SPS(B) with its lookup rule.

The page also lists, in words, which policy wins where, every load point where DSpark loses to a
static policy and why, and every run that rejected requests (with the reasons) or completed none.
"""

from __future__ import annotations

from ._page import write_report
from ._results import StudyResults, load_results
from .numbers import (
    aggregate,
    dspark_losses,
    extrapolation_notes,
    headline_table,
    overload_notes,
    phase_table,
    rejection_notes,
    rejections,
    terminal_table,
    winners_notes,
)

__all__ = [
    "StudyResults",
    "aggregate",
    "dspark_losses",
    "extrapolation_notes",
    "headline_table",
    "load_results",
    "overload_notes",
    "phase_table",
    "rejection_notes",
    "rejections",
    "terminal_table",
    "winners_notes",
    "write_report",
]
