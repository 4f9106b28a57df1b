"""Dashboard speed benchmark (not a test): how long a what-if point takes to show, cold and cached.

A *what-if point* is one scenario at one load level at the page's default size (120 requests, 16
closed-loop users, 3 seeds, STS fitted on 5,000 held-out rounds; see
``memtp_sim.dashboard.DEFAULTS``). Two measurements, each printed against the 2 s target:

1. **Server path** (always): in a fresh process and a fresh cache folder (after one validation
   has read the profile and the trace, as in a running server), what the app does for one point:
   validate the settings, run the seeds in parallel worker processes (:func:`memtp_sim.run`, files
   written to the cache), build the KPIs and figures. *Cold* is a setting never computed;
   *cached* is going back to it.
2. **Browser** (when Debian's Chromium and Playwright are installed; ``--no-browser`` skips it):
   ``python -m memtp_sim dashboard`` with a fresh cache, a headless Chromium on the page; the time
   from moving the temperature slider to the KPI table showing the new point (*cold*: a
   temperature never computed, median of ``--repeats``), and from moving it back (*cached*).
   ``--screenshot PATH`` also saves a screenshot of the page with a pinned baseline and a load
   sweep (how ``docs/dashboard.png`` was made).

    python benchmarks/bench_dashboard.py [--repeats 3] [--no-browser] [--screenshot docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_S = 2.0
REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _verdict(seconds: float) -> str:
    return f"{seconds:6.2f} s  ({'within' if seconds < TARGET_S else 'OVER'} the {TARGET_S:g} s target)"


_SERVER_PATH = r"""
import sys, tempfile, time
from memtp_sim.dashboard import _whatif as W
from memtp_sim.dashboard._context import AppContext
from memtp_sim.dashboard._settings import query_to_settings
from memtp_sim.dashboard._whatif_layout import control_values

app = AppContext.create(tempfile.mkdtemp(prefix="bench-dashboard-"), "results", "results/tune", None)
full, extras, _ = query_to_settings("")
values = {c: control_values(full)[c] for c in W.CONTROLS}
params = {k.split(".", 1)[1]: v for k, v in full.items() if k.startswith("policy.") and k != "policy.gamma"}
W.on_settings(app, values, params, extras)  # a running server has read the profile and the trace
values["conf-temp"] = 1.035  # a point never computed
for label in ("cold", "cached"):
    t0 = time.perf_counter()
    _, errors, spec, ready, job = W.on_settings(app, values, params, extras)
    if job is not W.no_update:
        ready = W.run_point(app.store, lambda _: None, job)
    W.show_point(app.store, ready, None)
    print(label, time.perf_counter() - t0, ready["computed"], flush=True)
"""


def server_path() -> dict[str, float]:
    """Time one point through the server's functions in a fresh process (so nothing is warm)."""
    out = subprocess.run([sys.executable, "-c", _SERVER_PATH], capture_output=True, text=True, cwd=REPO, check=True)
    times = {}
    for line in out.stdout.splitlines():
        label, seconds, computed = line.split()
        times[label] = float(seconds)
        print(f"  server path, {label:6s} ({computed} runs computed): {_verdict(float(seconds))}")
    return times


def _wait_value_change(page: Any, old: str | None, timeout_s: float = 60.0) -> str:
    """Wait until the throughput KPI shows a value other than ``old``; return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        loc = page.locator("#kpi-throughput_tok_per_s-current")
        if loc.count():
            v = loc.get_attribute("data-value")
            if v is not None and v != old:
                return v
        time.sleep(0.01)
    raise TimeoutError("the KPI table did not change")


def _slide(page: Any, key: str) -> None:
    page.locator("#conf-temp-slider [role=slider]").focus()
    page.keyboard.press(key)


def _screenshot(page: Any, url: str, path: str) -> None:
    """The default page pinned as the baseline, the current point at max depth 4, a load sweep."""
    page.goto(url)
    page.locator("#kpi-throughput_tok_per_s-current").wait_for()
    time.sleep(1)
    page.click("#pin")
    page.locator("#kpi-throughput_tok_per_s-baseline").wait_for()
    box = page.locator("#pol-depth")
    box.fill("4")
    box.press("Enter")
    page.locator("#baseline-label", has_text="policy.gamma").wait_for()
    time.sleep(3)
    page.click("#sweep-run")
    page.locator("#sweep-done", has_text="runs in").wait_for(timeout=300_000)
    time.sleep(1.5)
    page.screenshot(path=path, full_page=True)
    print(f"  screenshot: {path}")


def browser(repeats: int, screenshot: str | None) -> dict[str, float] | None:
    """Time cold and cached points in a headless Chromium against the real server."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("  browser: skipped (pip install playwright)")
        return None
    if not Path(chromium).is_file():
        print("  browser: skipped (apt-get install chromium)")
        return None
    cache = tempfile.mkdtemp(prefix="bench-dashboard-")
    proc = subprocess.Popen([sys.executable, "-m", "memtp_sim", "dashboard", "--port", "0", "--cache-dir", cache],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    url = re.search(r"http://\S+/", proc.stdout.readline()).group(0)
    cold, cached = [], []
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
            page = b.new_page(viewport={"width": 1500, "height": 1100})
            t0 = time.perf_counter()
            page.goto(url)
            first = _wait_value_change(page, None)
            print(f"  browser, first page load incl. its point: {time.perf_counter() - t0:6.2f} s")
            for _ in range(repeats):
                t0 = time.perf_counter()
                _slide(page, "ArrowRight")  # a temperature never computed
                new = _wait_value_change(page, first)
                cold.append(time.perf_counter() - t0)
                time.sleep(0.5)
                t0 = time.perf_counter()
                _slide(page, "ArrowLeft")  # back: cached
                first = _wait_value_change(page, new)
                cached.append(time.perf_counter() - t0)
                _slide(page, "ArrowRight")  # leave the computed temperature behind for the next round
                first = _wait_value_change(page, first)
            if screenshot:
                _screenshot(page, url, screenshot)
            b.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(cache, ignore_errors=True)
    out = {"cold": statistics.median(cold), "cached": statistics.median(cached)}
    print(f"  browser, cold   (median of {repeats}: {', '.join(f'{c:.2f}' for c in cold)}): {_verdict(out['cold'])}")
    print(f"  browser, cached (median of {repeats}: {', '.join(f'{c:.2f}' for c in cached)}): "
          f"{_verdict(out['cached'])}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--repeats", type=int, default=3, help="cold/cached pairs in the browser (default 3)")
    ap.add_argument("--no-browser", action="store_true", help="only the server path")
    ap.add_argument("--screenshot", help="also save a screenshot of the page (PNG path)")
    args = ap.parse_args()
    print(f"what-if point at the default size (120 requests, 16 users, 3 seeds, STS on 5,000 rounds), "
          f"{os.cpu_count()} CPU(s), target {TARGET_S:g} s:")
    times = server_path()
    if not args.no_browser:
        b = browser(args.repeats, args.screenshot)
        if b:
            times.update({f"browser_{k}": v for k, v in b.items()})
    return 0 if all(v < TARGET_S for v in times.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
