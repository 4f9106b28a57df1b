"""The dashboard in a real headless Chromium, against ``python -m memtp_sim dashboard``.

Every number a test checks comes from an independent :func:`memtp_sim.run` (or the tuning study's
own trial values), never from the app's cache; workloads are tiny (24 requests) so each test takes
a few seconds on 2 cores.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import zipfile
from pathlib import Path

import numpy as np
import psutil
import pytest

from memtp_sim.config import Scenario, format_validation_error
from memtp_sim.errors import CalibrationError, MemtpSimError
from memtp_sim.hardware import load_profile
from memtp_sim.tuning import feasible_trials, open_storage, scenario_for
from memtp_sim.tuning.export import export_config

from ._expect import TINY_QUERY, job_processes, kpi_value, run_metrics, tiny_doc, tiny_scenario, wait_kpi

pytestmark = pytest.mark.browser

THROUGHPUT = "throughput_tok_per_s"


def _open(page, query: str = TINY_QUERY, path: str = "/") -> None:
    page.goto(f"{page.base}{path}?{query}" if query else f"{page.base}{path}")


def _query(page) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(page.url).query))


def _set_number(page, selector: str, value: str) -> None:
    box = page.locator(selector)
    box.fill(value)
    box.press("Enter")


def test_page_loads_without_console_errors_and_shows_the_run(page, server):
    assert server["line"].startswith("memtp_sim dashboard on http://127.0.0.1:")
    _open(page)
    expected = run_metrics(tiny_scenario())
    for metric in (THROUGHPUT, "tok_per_s_user_p50", "ttft_s_p99", "mean_verify_len", "num_rejected"):
        wait_kpi(page, metric, float(expected[metric]))
    for graph in ("#fig-latency", "#fig-sps"):
        assert page.locator(f"{graph} .js-plotly-plot").count() == 1
    # the SPS figure marks the pass sizes the policy chose
    names = page.evaluate("Array.from(document.querySelector('#fig-sps .js-plotly-plot')._fullData, t => t.name)")
    assert any(n.startswith("current: B chosen") for n in names)


def test_moving_the_temperature_gives_the_runs_numbers(page):
    _open(page)
    wait_kpi(page, THROUGHPUT, run_metrics(tiny_scenario())[THROUGHPUT])
    page.locator("#conf-temp-slider [role=slider]").focus()
    page.keyboard.press("ArrowRight")  # log2 scale, step 0.05: T = 2 ** 0.05 = 1.035 (3 digits)
    expected = run_metrics(tiny_scenario(confidence={"temperature": 1.035}))
    for metric in (THROUGHPUT, "tok_per_s_user_p10", "tpot_ms_p50", "acceptance_rate", "mean_verify_len"):
        wait_kpi(page, metric, float(expected[metric]))
    assert _query(page)["confidence.temperature"] == "1.035"
    assert page.locator("#conf-temp").input_value() == "1.035"


def test_changing_the_depth_gives_the_runs_numbers(page):
    _open(page)
    wait_kpi(page, THROUGHPUT, run_metrics(tiny_scenario())[THROUGHPUT])
    _set_number(page, "#pol-depth", "3")
    expected = run_metrics(tiny_scenario(policy={"gamma": 3}))
    base = run_metrics(tiny_scenario())
    assert expected["mean_verify_len"] != base["mean_verify_len"]  # the test can tell them apart
    for metric in (THROUGHPUT, "tok_per_s_user_p50", "mean_verify_len", "acceptance_rate"):
        wait_kpi(page, metric, float(expected[metric]))
    assert _query(page)["policy.gamma"] == "3"


def test_pinned_baseline_shows_the_delta_with_its_interval(page):
    _open(page, TINY_QUERY.replace("seeds=0", "seeds=0,1"))
    seeds = (0, 1)
    base = [run_metrics(tiny_scenario(), s)[THROUGHPUT] for s in seeds]
    wait_kpi(page, THROUGHPUT, float(np.mean(base)))
    page.click("#pin")
    page.locator("#kpi-throughput_tok_per_s-baseline").wait_for()
    _set_number(page, "#pol-depth", "2")
    cur = [run_metrics(tiny_scenario(policy={"gamma": 2}), s)[THROUGHPUT] for s in seeds]
    wait_kpi(page, THROUGHPUT, float(np.mean(cur)))
    assert kpi_value(page, THROUGHPUT, "baseline") == pytest.approx(np.mean(base), rel=1e-12)
    paired = np.array(cur) - np.array(base)  # common random numbers: differences by seed
    assert kpi_value(page, THROUGHPUT, "delta") == pytest.approx(paired.mean(), rel=1e-9)
    half = 12.706204736174707 * paired.std(ddof=1) / np.sqrt(2)  # t(0.975, 1 degree of freedom)
    text = page.locator("#kpi-throughput_tok_per_s-delta").inner_text()
    assert "±" in text and float(text.split("±")[1].replace(",", "")) == pytest.approx(half, rel=1e-3)
    assert "policy.gamma: 7 -> 2" in page.locator("#baseline-label").inner_text()
    # both sides are in the latency figure
    names = page.evaluate("Array.from(document.querySelector('#fig-latency .js-plotly-plot')._fullData, t => t.name)")
    assert {"current", "baseline"} <= set(names)


def test_a_value_the_library_refuses_shows_its_error_and_keeps_the_result(page):
    _open(page)
    expected = run_metrics(tiny_scenario())[THROUGHPUT]
    wait_kpi(page, THROUGHPUT, expected)
    _set_number(page, "#wl-concurrency", "0")
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        Scenario.model_validate(tiny_doc(workload={"concurrency": 0}))
    line = format_validation_error(e.value, "what-if", Scenario)
    page.locator("#wl-concurrency-error", has_text=line).wait_for()
    time.sleep(0.5)
    assert kpi_value(page, THROUGHPUT) == expected  # the last good result stays


def test_uploading_a_broken_profile_shows_the_library_error_and_keeps_the_result(page, tmp_path):
    _open(page)
    expected = run_metrics(tiny_scenario())[THROUGHPUT]
    wait_kpi(page, THROUGHPUT, expected)
    broken = b"name: broken\nverify: {lookup: linear_pass_time}\n"
    f = tmp_path / "broken.yaml"
    f.write_bytes(broken)
    with pytest.raises(CalibrationError) as e:
        load_profile(f)
    why = str(e.value).split(": ", 1)[1]  # the message after the file's path
    page.set_input_files("#hw-upload input[type=file]", files=[
        {"name": "broken.yaml", "mimeType": "application/x-yaml", "buffer": broken}])
    err = page.locator("#hw-upload-error")
    err.filter(has_text=why).wait_for()
    assert err.inner_text().endswith(why) and "broken.yaml" in err.inner_text()
    assert kpi_value(page, THROUGHPUT) == expected
    assert "gfx1151-llama31-8b-q4km-vulkan" in page.locator("#hw-profile").inner_text()


def test_the_url_restores_the_view(page, browser):
    query = ("workload.num_requests=24&workload.concurrency=3&confidence.sts=none&seeds=0&policy.name=threshold"
             "&policy.threshold=0.3&confidence.temperature=1.5")
    _open(page, query)
    scen = tiny_scenario(workload={"concurrency": 3}, confidence={"temperature": 1.5},
                         policy={"name": "threshold", "gamma": 7, "threshold": 0.3})
    assert page.locator("#wl-concurrency").input_value() == "3"
    assert page.locator("#conf-temp").input_value() == "1.5"
    assert "threshold" in page.locator("#pol-name").inner_text()
    assert page.locator('[id=\'{"name":"threshold","type":"policy-param"}\']').input_value() == "0.3"
    wait_kpi(page, THROUGHPUT, run_metrics(scen)[THROUGHPUT])
    _set_number(page, "#pol-depth", "5")
    scen5 = tiny_scenario(workload={"concurrency": 3}, confidence={"temperature": 1.5},
                          policy={"name": "threshold", "gamma": 5, "threshold": 0.3})
    wait_kpi(page, THROUGHPUT, run_metrics(scen5)[THROUGHPUT])
    link = page.url
    other = browser.new_page()
    try:
        other.goto(link)
        assert other.locator("#pol-depth").input_value() == "5"
        assert other.locator("#wl-concurrency").input_value() == "3"
        wait_kpi(other, THROUGHPUT, run_metrics(scen5)[THROUGHPUT])
        assert "from the cache" in other.locator("#point-info").inner_text()
    finally:
        other.close()


def test_the_load_sweep_streams_the_frontier(page):
    _open(page)
    wait_kpi(page, THROUGHPUT, run_metrics(tiny_scenario())[THROUGHPUT])
    page.locator("#sweep-levels").fill("2,4")
    page.locator("#sweep-levels").press("Enter")
    page.click("#sweep-run")
    page.locator("#sweep-done", has_text="2 runs").wait_for()
    fig = "document.querySelector('#fig-frontier .js-plotly-plot')._fullData[0]"
    page.wait_for_function(f"{fig} && {fig}.x.length == 2")
    xs = page.evaluate(f"Array.from({fig}.x)")
    ys = page.evaluate(f"Array.from({fig}.y)")
    runs = [run_metrics(tiny_scenario(workload={"concurrency": c})) for c in (2, 4)]
    assert xs == pytest.approx([r["tok_per_s_user_p50"] for r in runs], rel=1e-12)
    assert ys == pytest.approx([r[THROUGHPUT] for r in runs], rel=1e-12)


def test_cancel_stops_a_sweep_and_leaves_no_process(page, server):
    # 1,000 requests per level (about 12 s for the 20 levels in one process here), so the cancel
    # lands mid-sweep: 24 requests per level finished in 0.8 s, before the click, and 400 (8 s
    # once) came down to 5.6 s as the engine got faster
    _open(page, TINY_QUERY.replace("workload.num_requests=24", "workload.num_requests=1000"))
    wait_kpi(page, THROUGHPUT, run_metrics(tiny_scenario(workload={"num_requests": 1000}))[THROUGHPUT])
    page.locator("#sweep-levels").fill("1,2,3,5,6,7,9,10,11,12,13,14,15,17,18,19,20,21,22,23")
    page.locator("#sweep-levels").press("Enter")
    page.click("#sweep-run")
    page.locator("#sweep-status", has_text="/20 runs").wait_for()
    server_proc = psutil.Process(server["proc"].pid)
    assert job_processes(server_proc), "the sweep runs in a job process"
    page.click("#sweep-cancel")
    page.wait_for_function("!document.querySelector('#sweep-run').disabled")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and job_processes(server_proc):
        time.sleep(0.1)
    assert not job_processes(server_proc)
    done = page.locator("#sweep-status").inner_text()
    assert "/20 runs" in done and not done.startswith("20/20")


def _best_trial(tune_study: dict):
    import optuna

    study = optuna.load_study(study_name="tiny", storage=open_storage(tune_study["url"]))
    feas = feasible_trials(study)
    return study, max(feas, key=lambda t: (t.values[0], -t.number))


def test_a_tuning_trial_opens_in_the_what_if_page(page, tune_study):
    _, trial = _best_trial(tune_study)
    _open(page, "", "/tune")
    link = page.locator(f"#trial-link-{trial.number}")
    link.click()
    page.wait_for_url(lambda u: urllib.parse.urlparse(u).path == "/")
    spec = tune_study["spec"]
    scen = scenario_for(spec, trial.params)
    runs = [run_metrics(scen, s)[THROUGHPUT] for s in spec.seeds]
    got = wait_kpi(page, THROUGHPUT, float(np.mean(runs)))
    assert got == pytest.approx(trial.values[0], rel=1e-12)  # the tuner's own seed mean
    q = _query(page)
    assert q["seeds"] == ",".join(map(str, spec.seeds))
    assert float(q["confidence.temperature"]) == pytest.approx(trial.params["confidence.temperature"])


def test_the_tuning_page_shows_the_feasible_front(page, tune_study):
    study, _ = _best_trial(tune_study)
    _open(page, "", "/tune")
    page.locator("#tune-pareto .js-plotly-plot").wait_for()
    data = page.evaluate("Array.from(document.querySelector('#tune-pareto .js-plotly-plot')._fullData, "
                         "t => ({name: t.name, ids: Array.from(t.customdata || [])}))")
    by_name = {d["name"]: set(d["ids"]) for d in data}
    feas = {t.number for t in feasible_trials(study)}
    assert by_name["feasible Pareto front"] <= feas and by_name["feasible Pareto front"]
    assert not by_name["infeasible"] & feas
    assert page.locator("#tune-history-0 .js-plotly-plot").count() == 1


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_export_download_parses_and_matches_the_cli(page, tune_study, tmp_path, fmt):
    _open(page, "", "/tune")
    page.locator("#tune-pareto .js-plotly-plot").wait_for()
    page.locator("#export-format").click()
    page.get_by_role("option", name=fmt, exact=True).click()
    with page.expect_download(timeout=30_000) as dl:
        page.click("#export-run")
    got_path = tmp_path / "download"
    dl.value.save_as(got_path)
    ref = export_config(study_name="tiny", fmt=fmt, storage_url=tune_study["url"], output=tmp_path / f"ref.{fmt}",
                        out_dir=tune_study["folder"].parent, warn=lambda m: None)[0]
    if fmt == "vllm":
        got, want = json.loads(got_path.read_text()), json.loads(Path(ref).read_text())
        for doc in (got, want):
            doc["provenance"].pop("exported_at_utc")
        assert got == want
        assert got["provenance"]["study"] == "tiny"
    else:  # a zip of the flags file (provenance in comments, the export time on one line) and the SPS table
        def flags(text: str) -> list[str]:
            return [ln for ln in text.splitlines() if "exported_at_utc" not in ln]
        with zipfile.ZipFile(got_path) as z:
            files = {n: z.read(n).decode() for n in z.namelist()}
        sps = [n for n in files if n.endswith(".sps.json")]
        flag_file = [n for n in files if n not in sps]
        assert len(sps) == 1 and len(flag_file) == 1, sorted(files)
        (tmp_path / "cli").mkdir()
        ref = export_config(study_name="tiny", fmt=fmt, storage_url=tune_study["url"],  # the same file name
                            output=tmp_path / "cli" / flag_file[0], out_dir=tune_study["folder"].parent,
                            warn=lambda m: None)[0]
        assert flags(files[flag_file[0]]) == flags(Path(ref).read_text())
        sps_docs = [json.loads(files[sps[0]]), json.loads((tmp_path / "cli" / sps[0]).read_text())]
        for doc in sps_docs:  # exported a second apart at most: the time is the one field that may differ
            doc["provenance"].pop("exported_at_utc")
        assert sps_docs[0] == sps_docs[1]
        assert "--speculative-algorithm" in files[flag_file[0]]


def test_memtp_export_of_a_study_without_memtp_shows_the_cli_refusal(page, tune_study, tmp_path):
    """The tiny study never simulated the MEMTP ensemble: the page shows the library's one-line
    refusal (the same text as the CLI's) and offers no download."""
    with pytest.raises(MemtpSimError) as e:
        export_config(study_name="tiny", fmt="memtp", storage_url=tune_study["url"], output=tmp_path / "ref.yaml",
                      out_dir=tune_study["folder"].parent, warn=lambda m: None)
    _open(page, "", "/tune")
    page.locator("#tune-pareto .js-plotly-plot").wait_for()
    page.locator("#export-format").click()
    page.get_by_role("option", name="memtp", exact=True).click()
    page.click("#export-run")
    page.wait_for_function("document.querySelector('#export-status').innerText.includes('did not simulate')",
                           timeout=30_000)
    assert page.locator("#export-status").inner_text() == str(e.value)


def test_the_study_page_shows_a_finished_study(page, finished_study):
    _open(page, "", "/study")
    table = page.locator("#study-headline")
    table.wait_for(timeout=30_000)
    text = table.inner_text()
    assert "no_spec" in text and "dspark" in text
    assert table.locator("tbody tr").count() == 4  # 2 loads x 2 policies
    page.locator("#study-frontier-0 .js-plotly-plot").wait_for()


def test_elastic_memtp_shows_its_timeline(page):
    _open(page, TINY_QUERY + "&memtp.depth=elastic&memtp.max_depth=6")
    scen = tiny_scenario(memtp={"depth": "elastic", "max_depth": 6})
    expected = run_metrics(scen)
    wait_kpi(page, "mean_verify_len", float(expected["mean_verify_len"]))
    page.locator("#timeline-box .js-plotly-plot").wait_for()
    assert page.locator("#timeline-box").is_visible()
    names = page.evaluate("Array.from(document.querySelector('#fig-timeline .js-plotly-plot')._fullData, t => t.name)")
    assert names and set(names) == {"current"}
    assert page.locator("#memtp-r-low").is_visible() and not page.locator("#memtp-heads").is_visible()


def test_switching_policy_builds_its_parameter_controls(page):
    _open(page)
    wait_kpi(page, THROUGHPUT, run_metrics(tiny_scenario())[THROUGHPUT])
    page.locator("#pol-name").click()
    page.get_by_role("option", name="threshold", exact=True).click()
    box = page.locator('[id=\'{"name":"threshold","type":"policy-param"}\']')
    box.wait_for()
    assert box.input_value() == "0.5"  # the Params model's default
    box.fill("0.2")
    box.press("Enter")
    expected = run_metrics(tiny_scenario(policy={"name": "threshold", "gamma": 7, "threshold": 0.2}))
    wait_kpi(page, THROUGHPUT, float(expected[THROUGHPUT]))
    q = _query(page)
    assert q["policy.name"] == "threshold" and q["policy.threshold"] == "0.2"


def test_clicking_a_pareto_point_opens_the_trial(page, tune_study):
    _, trial = _best_trial(tune_study)
    _open(page, "", "/tune")
    page.locator("#tune-pareto .js-plotly-plot").wait_for()
    # the trial's point in page pixels, from Plotly's own axes
    x, y = page.evaluate("""([x, y]) => {
        const gd = document.querySelector('#tune-pareto .js-plotly-plot');
        const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
        return [r.left + gd._fullLayout.xaxis.l2p(x), r.top + gd._fullLayout.yaxis.l2p(y)];
    }""", list(trial.values[:2]))
    page.mouse.click(x, y)
    page.wait_for_url(lambda u: urllib.parse.urlparse(u).path == "/")
    spec = tune_study["spec"]
    assert wait_kpi(page, THROUGHPUT, trial.values[0]) == pytest.approx(trial.values[0], rel=1e-12)
    assert _query(page)["policy.gamma"] == str(scenario_for(spec, trial.params).policy.params["gamma"])
