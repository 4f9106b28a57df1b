"""A policy that fails, or kills its own process, on purpose (not a test module).

The runner, dashboard and Dask tests use it to break a run at a known point instead of killing a
worker after a guessed sleep (a sleep that the engine outgrew: a run that took a second took a
tenth of one, the kill came after the work was done, and the test failed or tested nothing).
The test process imports it (so a study naming ``test_boom`` validates, and forked workers have
it), every ``dask worker`` loads it with ``--preload _boom``, and a command started by a test
(``tune``, whose workers are spawned) gets it through ``MEMTP_SIM_PLUGINS=_boom``.
"""

from __future__ import annotations

import os
import signal
import time
from itertools import count
from pathlib import Path

import numpy as np

from memtp_sim.policies import PolicyParams, RoundPlan, register
from memtp_sim.policies.static import StaticPolicy


class BoomParams(PolicyParams):
    """``k``: draft length (as for ``static``); ``fail``: raise in the first round; ``die``: kill the
    process with SIGKILL in the first round (as the out-of-memory killer would); ``die_once``: a
    marker file; the first run to reach round ``die_round`` while it is absent creates it and kills
    its own process with SIGKILL mid-run (so a retried run, and every later one, runs through);
    ``hold``: a folder; every run's first round creates ``started-<pid>-<n>`` there and waits until
    ``release`` exists in it (so a test knows a run, and its process, is mid-run while it acts)."""

    k: int = 1
    fail: bool = False
    die: bool = False
    die_once: str = ""
    die_round: int = 20
    hold: str = ""


_runs = count()
HOLD_LIMIT_S = 120.0


def cli_env() -> dict[str, str]:
    """The environment of a ``python -m memtp_sim`` subprocess: the repository and the tests'
    helper modules importable, and this policy registered in it and its (spawned) workers."""
    tests = Path(__file__).resolve().parent
    path = os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, MEMTP_SIM_PLUGINS="_boom")


def started(folder: Path) -> dict[int, int]:
    """``{pid: runs held or released}`` of the ``hold`` folder's started markers."""
    pids: dict[int, int] = {}
    for f in folder.glob("started-*"):
        pid = int(f.name.split("-")[1])
        pids[pid] = pids.get(pid, 0) + 1
    return pids


def wait_started(folder: Path, num_pids: int, timeout_s: float = 120.0, alive=lambda: True) -> dict[int, int]:  # noqa: ANN001
    """Wait until runs of ``num_pids`` processes have started (held) in ``folder``; their markers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        pids = started(folder)
        if len(pids) >= num_pids:
            return pids
        time.sleep(0.02)
    raise AssertionError(f"runs of {num_pids} processes never started in {folder}: {started(folder)}")


@register("test_boom")
class BoomPolicy(StaticPolicy):
    """Verify one draft token per request (``k`` at most), or break as the parameters say."""

    Params = BoomParams

    def __init__(self, params: BoomParams) -> None:
        super().__init__(params)
        self._rounds = 0

    def plan(self, view):  # noqa: ANN001, ANN201
        self._rounds += 1
        if self.params.hold and self._rounds == 1:
            folder = Path(self.params.hold)
            (folder / f"started-{os.getpid()}-{next(_runs)}").touch()
            deadline = time.monotonic() + HOLD_LIMIT_S
            while not (folder / "release").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"boom: held {HOLD_LIMIT_S:.0f} s and never released ({folder})")
                time.sleep(0.005)
        if self.params.die:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.params.fail:
            raise RuntimeError("boom: this run fails on purpose")
        marker = self.params.die_once
        if marker and self._rounds == self.params.die_round and not Path(marker).exists():
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return RoundPlan(np.minimum(np.full(view.num_requests, self.params.k), view.draft_len))
