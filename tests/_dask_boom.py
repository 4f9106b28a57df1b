"""A policy that fails, or kills its own process, on purpose, for the Dask executor tests (not a
test module).

The test process imports it (so a study naming ``test_dask_boom`` validates) and every
``dask worker`` loads it with ``--preload`` (so the worker can run and fail the same way).
"""

from __future__ import annotations

import os
import signal

import numpy as np

from memtp_sim.policies import PolicyParams, RoundPlan, register
from memtp_sim.policies.static import StaticPolicy


class DaskBoomParams(PolicyParams):
    """``k``: draft length (as for ``static``); ``fail``: raise in the first round instead; ``die``:
    kill the process with SIGKILL in the first round (as the out-of-memory killer would)."""

    k: int = 1
    fail: bool = False
    die: bool = False


@register("test_dask_boom")
class DaskBoomPolicy(StaticPolicy):
    """Verify one draft token per request, or fail the run when ``fail`` is set, or kill the
    worker process running it when ``die`` is set."""

    Params = DaskBoomParams

    def plan(self, view):  # noqa: ANN001, ANN201
        if self.params.die:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.params.fail:
            raise RuntimeError("boom: this run fails on purpose")
        return RoundPlan(np.minimum(np.ones(view.num_requests, dtype=np.int64), view.draft_len))
