"""Fixtures of the dashboard tests: a tiny tuning study, a tiny finished study, the app served by
``python -m memtp_sim dashboard`` in its own process, and a headless Chromium (Playwright, driving
Debian's ``/usr/bin/chromium``; no ``playwright install``).

Browser tests are marked ``browser``; without Chromium they skip, unless ``MEMTP_REQUIRE_BROWSER=1``
(set by ``.ci/run``), under which they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from _sim_helpers import REPO, tiny_tune_doc

from memtp_sim.config import Study
from memtp_sim.study import run_study
from memtp_sim.tuning import parse_tune_spec, run_tune

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Flags from ../shared/RECIPES.md (headless Chromium on a CI machine without a GPU or network).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def need_browser() -> None:
    """Skip (or, with MEMTP_REQUIRE_BROWSER=1, fail) when Chromium or Playwright is missing."""
    missing = None
    if not Path(CHROMIUM).is_file():
        missing = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "playwright is not installed (pip install -e '.[test]')"
    if missing:
        if os.environ.get("MEMTP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"MEMTP_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="session")
def tune_study(results_dir: Path) -> dict[str, Any]:
    """A tuning study of 4 trials on 24 requests (``results/tiny``), validated on 2 fresh seeds."""
    doc = tiny_tune_doc("tiny", n_trials=4, validation={"top_k": 2, "num_seeds": 2})
    spec = parse_tune_spec(doc, source="tiny.yaml")
    out = run_tune(spec, out_dir=results_dir, workers=1, report=False)
    assert out.complete == 4
    return {"spec": spec, "folder": results_dir / "tiny", "url": out.storage_url, "name": "tiny"}


@pytest.fixture(scope="session")
def finished_study(results_dir: Path) -> Path:
    """A finished study: no_spec and dspark at 2 and 4 users, one seed (``results/small``)."""
    study = Study.model_validate({
        "name": "small",
        "base": {"workload": {"trace": str(REPO / "data" / "traces" / "azure2023_conv.csv"), "mode": "closed_loop",
                              "concurrency": 2, "num_requests": 24},
                 "confidence": {"sts": "none"}},
        "sweep": {"workload.concurrency": [2, 4]},
        "policies": [{"name": "no_spec"}, {"name": "dspark", "gamma": 4}],
        "seeds": [0]})
    run_study(study, out_dir=results_dir, jobs=1)
    return results_dir / "small"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, results_dir: Path, tune_study: dict,
           finished_study: Path) -> Iterator[dict[str, Any]]:
    """``python -m memtp_sim dashboard --port 0`` in its own process; yields its URL and process."""
    need_browser()
    cache = tmp_path_factory.mktemp("dashboard-cache")
    cmd = [sys.executable, "-m", "memtp_sim", "dashboard", "--port", "0", "--study", str(tune_study["folder"]),
           "--results", str(results_dir), "--cache-dir", str(cache)]
    # Output goes to files, not pipes: nobody reads a pipe during the session, and a full one
    # (64 KiB) would block the server or a job at its next write.
    logs = tmp_path_factory.mktemp("dashboard-logs")
    out_path, err_path = logs / "stdout.txt", logs / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=REPO)
    m = None
    deadline = time.monotonic() + 120
    while m is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        line = out_path.read_text()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if m is None:
        proc.kill()
        pytest.fail(f"dashboard did not start: {out_path.read_text()!r} {err_path.read_text()[-2000:]}")
    line = line.splitlines()[0] + "\n"
    yield {"url": m.group(0).rstrip("/"), "proc": proc, "line": line, "cache": cache, "stderr": err_path}
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("the dashboard did not stop on SIGTERM")
    _, alive = psutil.wait_procs(children, timeout=3)
    assert not alive, f"job processes outlived the dashboard: {alive}"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, server: dict) -> Iterator[Any]:
    """A fresh browser page; fails the test if the browser logged an error (console or page)."""
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.base = server["url"]
    yield pg
    time.sleep(0.2)  # let late responses land
    context.close()
    assert not errors, "\n".join(errors)
