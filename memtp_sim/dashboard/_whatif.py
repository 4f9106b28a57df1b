"""The what-if page's callbacks: controls -> URL and scenario -> cached or background runs -> KPIs
and figures beside a pinned baseline; load sweeps that stream their points.

Flow (each arrow one callback):

* controls -> :func:`on_settings`: the URL query, the library's error under the control it names,
  and, for a valid scenario, the ``spec`` store; if every run of the point is cached the ``ready``
  store at once, otherwise the ``job`` store;
* ``job`` -> :func:`run_point` (a Dash background callback: its own process, a progress bar, a
  cancel button) -> ``ready``;
* ``ready`` and ``baseline`` -> :func:`show_point`: KPIs with intervals, deltas, figures;
* "Run load sweep" -> :func:`run_sweep` (background) streams ``sweep-partial`` after every run;
  -> :func:`show_sweep`: frontier and load curves.

A job process starts by watching the server (:meth:`AppContext.job_started`), so a stopped or
killed app leaves no job behind; a new request for the same callback, or Cancel, kills the running
one (Dash), and the server reaps finished ones.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, html, no_update
from dash.exceptions import PreventUpdate

from ..config import Scenario
from ..errors import MemtpSimError
from ..hardware import load_profile
from ..policies import available_policies, policy_class
from ..workload import load_trace
from . import _figures
from ._context import AppContext
from ._runs import RunStore, Side, kpi_rows, point_keys, usable_cpus
from ._settings import (
    Invalid,
    applicable,
    outside_served,
    policy_param_fields,
    settings_to_query,
    sweep_key,
    validate,
)
from ._whatif_layout import ERROR_TARGETS, LEVEL_DEFAULTS, policy_param_controls

__all__ = ["CONTROLS", "ERROR_IDS", "error_target", "full_settings", "register_whatif"]

#: Control ids, in the order :func:`on_settings` receives their values.
CONTROLS = ("hw-profile", "hw-extra", "wl-trace", "wl-mode", "wl-concurrency", "wl-rate", "wl-rate-scale",
            "wl-requests", "eng-prefill", "eng-prefill-gpus", "pol-name", "pol-depth", "conf-temp", "conf-sts",
            "conf-sts-rounds", "memtp-mode", "memtp-heads", "memtp-head-cost", "memtp-r-low", "memtp-r-high", "seeds")
#: Error lines :func:`on_settings` writes (one per distinct target of ERROR_TARGETS).
ERROR_IDS = tuple(dict.fromkeys(t for _, t in ERROR_TARGETS))
_SHOW, _HIDE = {}, {"display": "none"}


def error_target(path: str) -> str:
    """The control whose error line shows an error about ``path`` (see ERROR_TARGETS).

    Args:
        path: a dotted scenario path, a section, a page key or ``""``.

    Returns:
        A control id (``general`` when nothing closer fits).
    """
    for prefix, target in ERROR_TARGETS:
        if not prefix or path == prefix or path.startswith(prefix + "."):
            return target
    return "general"


def full_settings(values: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """Settings with a value for every control, from the controls' values.

    Args:
        values: ``{control id: value}`` (ids of :data:`CONTROLS`).
        params: ``{policy parameter: value}`` from the parameter controls.

    Returns:
        The settings before :func:`~memtp_sim.dashboard._settings.applicable` keeps those that apply.
    """
    mode = values["memtp-mode"]
    heads = values["memtp-heads"]
    if mode == "fixed" and heads is None:
        heads = ""  # an emptied box: refused under it, not read as memtp.depth null (MEMTP off)
    full = {
        "hardware.profile": values["hw-profile"], "extra_gib": values["hw-extra"],
        "workload.trace": values["wl-trace"], "workload.mode": values["wl-mode"],
        "workload.concurrency": values["wl-concurrency"], "workload.rate_per_s": values["wl-rate"],
        "workload.rate_scale": values["wl-rate-scale"], "workload.num_requests": values["wl-requests"],
        "engine.prefill": values["eng-prefill"], "engine.prefill_gpus": values["eng-prefill-gpus"],
        "policy.name": values["pol-name"], "policy.gamma": values["pol-depth"], "memtp.max_depth": values["pol-depth"],
        "confidence.temperature": values["conf-temp"], "confidence.sts": values["conf-sts"],
        "confidence.sts_rounds": values["conf-sts-rounds"],
        "memtp.depth": None if mode == "off" else ("elastic" if mode == "elastic" else heads),
        "memtp.head_cost_gib": values["memtp-head-cost"], "memtp.r_low": values["memtp-r-low"],
        "memtp.r_high": values["memtp-r-high"], "seeds": values["seeds"],
    }
    full.update({f"policy.{k}": v for k, v in params.items()})
    return full


def _param_values(ids: list[dict[str, str]], values: list[Any], policy: str) -> dict[str, Any]:
    """The parameter controls' values that belong to ``policy`` (text fields read as JSON)."""
    fields = policy_param_fields(policy)
    out = {}
    for pid, v in zip(ids, values):
        name = pid["name"]
        if name in fields:
            if isinstance(v, str) and fields[name].annotation not in (str,):
                try:
                    v = json.loads(v)
                except ValueError:
                    pass
            out[name] = v
    return out


def _spec(settings: dict[str, Any], extras: dict[str, Any], scenario: Scenario, seeds: list[int],
          query: str) -> dict[str, Any]:
    """The browser-side record of a valid point: what to run, and how to make it again."""
    dump = scenario.model_dump(mode="json")
    pid = hashlib.sha256(json.dumps([dump, seeds], sort_keys=True).encode()).hexdigest()[:16]
    return {"id": pid, "scenario": dump, "seeds": seeds, "keys": point_keys(scenario, seeds),
            "settings": settings, "extras": extras, "query": query, "policy": scenario.policy_label()}


def on_settings(app_ctx: AppContext, values: dict[str, Any], params: dict[str, Any],
                extras: dict[str, Any] | None) -> tuple[str, dict[str, str], Any, Any, Any]:
    """Validate the controls' settings and decide how the point is shown.

    Args:
        app_ctx: the app.
        values: controls' values by id.
        params: policy parameters' values.
        extras: the link's settings without a control.

    Returns:
        ``(query, errors by control id, spec, ready, job)``; spec, ready and job are ``no_update``
        where they do not change (an invalid setting keeps the last good result on screen).
    """
    settings = applicable(full_settings(values, params))
    query = settings_to_query(settings, extras)
    errors = dict.fromkeys(ERROR_IDS, "")
    checked = validate(settings, extras, app_ctx.workdir)
    if isinstance(checked, Invalid):
        errors[error_target(checked.path)] = checked.message
        return query, errors, no_update, no_update, no_update
    scenario, seeds = checked
    spec = _spec(settings, extras or {}, scenario, seeds, query)
    if all(app_ctx.store.cached(scenario, s) is not None for s in seeds):
        return query, errors, spec, {**spec, "elapsed_s": 0.0, "computed": 0}, no_update
    return query, errors, spec, no_update, spec


def run_point(store: RunStore, set_progress: Callable[[tuple], None], job: dict[str, Any],
              workers: int | None = None) -> dict[str, Any]:
    """Compute the runs of one what-if point (in a background-job process), seeds in parallel.

    Args:
        store: the run store.
        set_progress: Dash's progress setter (bar value, bar max, text).
        job: the spec from :func:`on_settings`.
        workers: processes computing seeds at once (default: the usable CPUs).

    Returns:
        The spec, with ``elapsed_s`` and ``computed`` (runs computed now).
    """
    t0 = time.perf_counter()
    scenario = Scenario.model_validate(job["scenario"])
    seeds = job["seeds"]
    todo = sum(store.cached(scenario, s) is None for s in seeds)
    done = [0]

    def on_done(i: int, summary: dict[str, Any]) -> None:
        done[0] += 1
        set_progress((str(done[0]), str(len(seeds)), f"{done[0]} of {len(seeds)} seeds done"))

    set_progress(("0", str(len(seeds)), f"running {todo} of {len(seeds)} seeds"))
    store.ensure_all([(scenario, s) for s in seeds], workers=workers or usable_cpus(), on_done=on_done)
    return {**job, "elapsed_s": time.perf_counter() - t0, "computed": todo}


def _fmt(v: Any) -> str:
    if not isinstance(v, (int, float)) or math.isnan(v):
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _cell(ci: dict[str, Any] | None, cell_id: str, *, delta: bool = False) -> html.Td:
    """A KPI cell: mean ± half-width (the exact mean in ``data-value`` for tests and tools)."""
    if ci is None:
        return html.Td("")
    mean, half = ci["mean"], ci.get("half_width")
    text = ("+" if delta and mean > 0 else "") + _fmt(mean)
    if isinstance(half, float) and not math.isnan(half):
        text += f" ± {_fmt(half)}"
    cls = "beyond" if delta and ci.get("beyond_noise") else ("noise" if delta else "")
    return html.Td(text, id=cell_id, className=cls, **{"data-value": repr(float(mean))})


def kpi_table(rows: list[dict[str, Any]], baseline: bool) -> html.Table:
    """The KPI table: current (and baseline, delta) per headline metric.

    Args:
        rows: :func:`~memtp_sim.dashboard._runs.kpi_rows`.
        baseline: whether rows carry a baseline.

    Returns:
        An HTML table; cells have ids ``kpi-<metric>-current|baseline|delta``.
    """
    head = ["KPI", "current"] + (["baseline", "current - baseline"] if baseline else [])
    body = []
    for r in rows:
        m = r["metric"]
        cells = [html.Td(f"{r['label']}" + (f" ({r['unit']})" if r["unit"] else ""), title=m),
                 _cell(r["current"], f"kpi-{m}-current")]
        if baseline:
            cells += [_cell(r["baseline"], f"kpi-{m}-baseline"), _cell(r["delta"], f"kpi-{m}-delta", delta=True)]
        body.append(html.Tr(cells))
    return html.Table(className="kpis", children=[html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)])


def _describe(ready: dict[str, Any]) -> str:
    n = len(ready["seeds"])
    how = "from the cache" if not ready.get("computed") else f"{ready['computed']} computed in {ready['elapsed_s']:.2f} s"
    return f"{ready['policy']}: mean of {n} seed{'s' * (n != 1)} ({', '.join(map(str, ready['seeds']))}); {how}"


def _baseline_diff(base: dict[str, Any], cur: dict[str, Any]) -> str:
    """Settings where the baseline differs from the current point, in words."""
    a = {**base["settings"], **base.get("extras", {})}
    b = {**cur["settings"], **cur.get("extras", {})}
    diff = [f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return "baseline pinned; current differs in " + "; ".join(diff) if diff else "baseline pinned (same settings)"


def notes_by_seed(summaries: list[dict[str, Any]]) -> list[str]:
    """The runs' notes, each once, saying which seeds it came from (a note such as "1 request(s)
    rejected" is per run: shown once for three seeds it read as one rejection in all).

    Args:
        summaries: the point's runs (``summary.json`` mappings with ``seed`` and ``notes``).

    Returns:
        ``"seed 2: ..."``, ``"seeds 0, 2: ..."`` or ``"each of the 3 seeds: ..."``, in first-seen order.
    """
    seeds: dict[str, list[Any]] = {}
    for s in summaries:
        for n in s.get("notes", []):
            seeds.setdefault(n, []).append(s.get("seed"))
    out = []
    for note, which in seeds.items():
        if len(summaries) == 1:
            out.append(note)
        elif len(which) == len(summaries):
            out.append(f"each of the {len(which)} seeds: {note}")
        else:
            out.append(f"seed{'s' if len(which) > 1 else ''} {', '.join(map(str, which))}: {note}")
    return out


def show_point(store: RunStore, ready: dict[str, Any], baseline: dict[str, Any] | None) -> tuple:
    """KPIs, notes and figures of the ready point beside the baseline.

    Args:
        store: the run store.
        ready: the point's spec (its runs are stored).
        baseline: the pinned baseline's spec, or None.

    Returns:
        ``(kpi table, notes, info, baseline label, latency fig, sps fig, timeline fig, timeline style)``.

    Raises:
        PreventUpdate: a run of the point or the baseline is no longer stored (Dash keeps the page
            as it is until the next change).
    """
    cur = [store.load(k) for k in ready["keys"]]
    base = [store.load(k) for k in baseline["keys"]] if baseline else None
    if any(s is None for s in cur) or (base is not None and any(s is None for s in base)):
        raise PreventUpdate  # a run vanished from the cache (cleared by hand): wait for the next change
    sides = [Side("current", tuple(ready["keys"]))] + ([Side("baseline", tuple(baseline["keys"]))] if baseline else [])
    res = store.results(sides)
    notes = [html.Li(n) for n in notes_by_seed(cur)]
    notes += [html.Li(f"profile note: {w}") for w in (cur[0].get("provenance", {}).get("hardware", {}).get(
        "warnings") or [])]
    tl = _figures.timeline(res)
    return (kpi_table(kpi_rows(cur, base), baseline is not None), notes, _describe(ready),
            _baseline_diff(baseline, ready) if baseline else "no baseline pinned",
            _figures.latency(res), _figures.sps_with_batches(res),
            tl if tl is not None else _figures.empty_figure("MEMTP is off"), _SHOW if tl is not None else _HIDE)


def _levels(text: str, key: str) -> list[Any] | str:
    """Load levels from the page's text, or why they cannot be read."""
    out: list[Any] = []
    for t in (t.strip() for t in str(text or "").split(",")):
        if not t:
            continue
        try:
            v = float(t)
        except ValueError:
            return f"levels: {t!r} is not a number"
        v = int(v) if key == "workload.concurrency" and v == int(v) else v
        if v in out:  # the same runs twice, and a frontier with two points at one load
            return f"levels: {t} is given twice; give each load level once"
        out.append(v)
    return out or "levels: give at least one load level, e.g. 1,2,4,8"


def _sweep_plan(app_ctx: AppContext, specs: list[tuple[str, dict[str, Any]]], levels: list[Any]
                ) -> tuple[list[tuple[str, Any, Scenario, int]], list[str], str]:
    """Every run of a sweep: (side, level, scenario, seed); errors of levels the library refuses."""
    plan, errors = [], []
    key = sweep_key(specs[0][1]["settings"])
    for label, spec in specs:
        for level in levels:
            checked = validate({**spec["settings"], key: level}, spec.get("extras"), app_ctx.workdir)
            if isinstance(checked, Invalid):
                errors.append(f"{label} at {key} = {level}: {checked.message}")
                continue
            scen, seeds = checked
            plan += [(label, level, scen, s) for s in seeds]
    return plan, errors, key


def run_sweep(app_ctx: AppContext, set_progress: Callable[[tuple], None], spec: dict[str, Any],
              baseline: dict[str, Any] | None, levels_text: str) -> str:
    """Run the current point (and the baseline) at every load level, streaming finished runs.

    Args:
        app_ctx: the app.
        set_progress: Dash's progress setter (bar value, bar max, text, partial data).
        spec: the current point's spec.
        baseline: the baseline's spec, or None.
        levels_text: comma-separated load levels.

    Returns:
        The final status line.
    """
    key = sweep_key(spec["settings"])
    levels = _levels(levels_text, key)
    if isinstance(levels, str):
        return levels
    specs = [("current", spec)] + ([("baseline", baseline)] if baseline else [])
    plan, errors, key = _sweep_plan(app_ctx, specs, levels)
    data: dict[str, Any] = {"x": key, "id": spec["id"], "sides": {label: {"keys": [], "x": []} for label, _ in specs}}
    t0 = time.perf_counter()
    count = [0]

    def on_done(i: int, summary: dict[str, Any]) -> None:
        label, level = plan[i][0], plan[i][1]
        data["sides"][label]["keys"].append(summary["run_id"])
        data["sides"][label]["x"].append(level)
        count[0] += 1
        set_progress((str(count[0]), str(len(plan)), f"{count[0]}/{len(plan)} runs ({time.perf_counter() - t0:.1f} s)",
                      json.loads(json.dumps(data))))

    app_ctx.store.ensure_all([(scen, seed) for _, _, scen, seed in plan], workers=usable_cpus(), on_done=on_done)
    return f"{len(plan)} runs in {time.perf_counter() - t0:.1f} s" + (f"; skipped: {'; '.join(errors)}" if errors else "")


def show_sweep(store: RunStore, data: dict[str, Any] | None, spec: dict[str, Any] | None) -> tuple:
    """Frontier and load figures of the (partial) sweep.

    Args:
        store: the run store.
        data: ``{"x", "id", "sides": {label: {"keys", "x"}}}`` from :func:`run_sweep`.
        spec: the current point's spec (the sweep may be of an earlier setting).

    Returns:
        ``(frontier figure, load figure)``.

    Raises:
        PreventUpdate: no sweep has run yet (Dash keeps the page as it is).
    """
    if not data:
        raise PreventUpdate
    sides = [Side(label, tuple(d["keys"]), tuple(d["x"])) for label, d in data["sides"].items() if d["keys"]]
    figs = _figures.sweep_figures(store.results(sides, data["x"]), data["x"])
    if spec and spec.get("id") != data.get("id"):
        for f in figs.values():
            f.update_layout(title=f"{f.layout.title.text} - of an earlier setting; run the sweep again")
    return figs["frontier"], figs["load"]


def _check_file(kind: str, paths: list, checker: Callable[[str], Any], typed: bool = False) -> tuple[str | None, str]:
    """The first path of ``kind`` that the library loads, or its error line (``typed``: one path
    the user typed, not uploaded files, and the message says so)."""
    want = (".yaml", ".yml") if kind == "profile" else (".csv",)
    picked = [str(p) for p in paths if str(p).lower().endswith(want)]
    if not picked:
        if typed:
            return None, f"{paths[0]}: not a {' or '.join(want)} file (give the path of a hardware profile YAML)"
        return None, f"no {' or '.join(want)} file among the uploaded ones"
    try:
        checker(picked[0])
    except (MemtpSimError, OSError, ValueError) as e:
        return None, str(e)
    return picked[0], ""


def register_whatif(app: Dash, app_ctx: AppContext) -> None:
    """Register the what-if page's callbacks on ``app``.

    Args:
        app: the Dash app.
        app_ctx: the app's shared state.
    """
    _register_controls(app, app_ctx)
    _register_point(app, app_ctx)
    _register_sweep(app, app_ctx)


def _register_controls(app: Dash, app_ctx: AppContext) -> None:
    """Small control-side callbacks: temperature slider, visible fields, policy parameters, files."""

    @app.callback(Output("conf-temp", "value"), Output("conf-temp-slider", "value"),
                  Input("conf-temp", "value"), Input("conf-temp-slider", "value"), prevent_initial_call=True)
    def sync_temperature(temp: Any, slider: Any) -> tuple:
        """Keep the log-scale slider and the temperature box in step."""
        if ctx.triggered_id == "conf-temp-slider" and isinstance(slider, (int, float)):
            return round(2.0 ** slider, 3), no_update
        if isinstance(temp, (int, float)) and temp > 0:
            return no_update, max(-2.0, min(2.0, math.log2(temp)))
        return no_update, no_update

    @app.callback([Output(f"{c}-box", "style") for c in ("wl-concurrency", "wl-rate", "wl-rate-scale",
                                                         "eng-prefill-gpus", "memtp-heads", "memtp-head-cost",
                                                         "memtp-r-low", "memtp-r-high", "conf-sts-rounds",
                                                         "pol-depth")],
                  Input("wl-mode", "value"), Input("eng-prefill", "value"), Input("memtp-mode", "value"),
                  Input("conf-sts", "value"), Input("pol-name", "value"))
    def show_fields(mode: str, prefill: str, memtp: str, sts: str, policy: str) -> list[dict]:
        """Show the controls that apply in the chosen modes."""
        gamma = policy in _policies_with_gamma()
        show = [mode == "closed_loop", mode == "poisson", mode == "trace", prefill == "disaggregated",
                memtp == "fixed", memtp != "off", memtp == "elastic", memtp == "elastic", sts == "fit",
                (gamma and memtp == "off") or memtp == "elastic"]
        return [_SHOW if s else _HIDE for s in show]

    @app.callback(Output("pol-params", "children"), Input("pol-name", "value"),
                  State({"type": "policy-param", "name": ALL}, "value"),
                  State({"type": "policy-param", "name": ALL}, "id"), prevent_initial_call=True)
    def policy_params(policy: str, values: list, ids: list) -> list:
        """Parameter controls of the chosen policy (same-named values kept)."""
        return policy_param_controls(policy, {i["name"]: v for i, v in zip(ids, values)})

    @app.callback(Output("sweep-levels", "value"), Input("wl-mode", "value"), prevent_initial_call=True)
    def sweep_levels(mode: str) -> str:
        """Load levels offered for the workload mode."""
        return LEVEL_DEFAULTS.get(mode, LEVEL_DEFAULTS["closed_loop"])

    @app.callback(Output("hw-extra-help", "children"), Input("hw-profile", "value"), Input("hw-extra", "value"))
    def memory_help(profile: str, extra: Any) -> str:
        """The profile's memory budget, before and after the change, in words."""
        try:
            mem = load_profile(profile).memory
        except (MemtpSimError, OSError):
            return ""
        free = mem.gpu_allocatable_gib - mem.weights_gib - mem.reserve_gib
        add = extra if isinstance(extra, (int, float)) else 0.0
        return (f"profile: {mem.gpu_allocatable_gib:.1f} GiB allocatable - {mem.weights_gib:.1f} weights - "
                f"{mem.reserve_gib:.1f} reserve = {free:.1f} GiB for drafter, KV cache and heads; "
                f"with this change {free + add:.1f} GiB")

    _register_files(app, app_ctx)


def _policies_with_gamma() -> set[str]:
    """Policies whose parameters include ``gamma`` (the max-depth control applies to them)."""
    return {p for p in available_policies() if "gamma" in policy_class(p).Params.model_fields}


def _register_files(app: Dash, app_ctx: AppContext) -> None:
    """Uploads and typed paths of profiles and traces: checked by the library, then offered."""

    def decode(contents: str) -> bytes:
        """An upload's bytes (Dash sends a base64 data URL)."""
        return base64.b64decode(contents.split(",", 1)[1])

    @app.callback(Output("hw-profile", "options"), Output("hw-profile", "value"), Output("hw-upload-error", "children"),
                  Output("hw-path-error", "children"), Input("hw-upload", "contents"), Input("hw-path", "value"),
                  State("hw-upload", "filename"), State("hw-profile", "options"), prevent_initial_call=True)
    def add_profile(contents: list | None, path: str | None, names: list | None, options: list) -> tuple:
        """Offer an uploaded or typed profile once the library loads it; else its error."""
        if ctx.triggered_id == "hw-upload":
            if not contents:
                raise PreventUpdate
            saved = app_ctx.workdir.save_upload([(n, decode(c)) for n, c in zip(names, contents)])
            good, err = _check_file("profile", saved, load_profile)
            errors = (err, "")
        else:
            if not path:  # the box was cleared: so is its error
                return no_update, no_update, no_update, ""
            why = outside_served(path, app_ctx.workdir)
            good, err = (None, why) if why is not None else _check_file("profile", [path], load_profile, typed=True)
            errors = ("", err)
        if good is None:
            return no_update, no_update, *errors
        label = f"file: {load_profile(good).name} ({good})"
        return options + [{"label": label, "value": good}], good, "", ""

    @app.callback(Output("wl-trace", "options"), Output("wl-trace", "value"), Output("wl-upload-error", "children"),
                  Input("wl-upload", "contents"), State("wl-upload", "filename"), State("wl-trace", "options"),
                  prevent_initial_call=True)
    def add_trace(contents: str | None, name: str | None, options: list) -> tuple:
        """Offer an uploaded trace once the library reads it; else its error."""
        if not contents:
            raise PreventUpdate
        saved = app_ctx.workdir.save_upload([(name or "trace.csv", decode(contents))])
        good, err = _check_file("trace", saved, load_trace)
        if good is None:
            return no_update, no_update, err
        return options + [{"label": f"file: {good}", "value": good}], good, ""


def _register_point(app: Dash, app_ctx: AppContext) -> None:
    """Settings -> point -> KPIs and figures; the baseline pin."""

    @app.callback(Output("url", "search"), [Output(f"{e}-error", "children") for e in ERROR_IDS],
                  Output("spec", "data"), Output("ready", "data", allow_duplicate=True), Output("job", "data"),
                  [Input(c, "value") for c in CONTROLS], Input({"type": "policy-param", "name": ALL}, "value"),
                  State({"type": "policy-param", "name": ALL}, "id"), State("extras", "data"),
                  prevent_initial_call="initial_duplicate")
    def settings_changed(*args: Any) -> tuple:
        """Controls -> URL, errors, and the point (cached, or a job)."""
        values = dict(zip(CONTROLS, args[:len(CONTROLS)]))
        pvals, pids, extras = args[len(CONTROLS):]
        query, errors, spec, ready, job = on_settings(
            app_ctx, values, _param_values(pids, pvals, values["pol-name"]), extras)
        return (query, *[errors[e] for e in ERROR_IDS], spec, ready, job)

    @app.callback(Output("ready", "data", allow_duplicate=True), Input("job", "data"), background=True,
                  manager=app_ctx.manager, interval=100, prevent_initial_call=True,
                  progress=[Output("point-progress", "value"), Output("point-progress", "max"),
                            Output("point-status", "children")],
                  running=[(Output("point-busy", "style"), {"display": "flex"}, {"display": "none"}),
                           (Output("point-cancel", "disabled"), False, True)],
                  cancel=[Input("point-cancel", "n_clicks")])
    def point_job(set_progress: Callable, job: dict | None) -> dict:
        """Compute the point's runs (a background job with progress and cancel)."""
        if not job:
            raise PreventUpdate
        app_ctx.job_started()
        return run_point(app_ctx.store, set_progress, job)

    @app.callback(Output("kpis", "children"), Output("notes", "children"), Output("point-info", "children"),
                  Output("baseline-label", "children"), Output("fig-latency", "figure"), Output("fig-sps", "figure"),
                  Output("fig-timeline", "figure"), Output("timeline-box", "style"),
                  Input("ready", "data"), Input("baseline", "data"), State("spec", "data"))
    def point_shown(ready: dict | None, baseline: dict | None, spec: dict | None) -> tuple:
        """KPIs and figures of the point that is ready."""
        if not ready or (spec and ready.get("id") != spec.get("id")):
            raise PreventUpdate  # nothing yet, or a result of an earlier setting arriving late
        return show_point(app_ctx.store, ready, baseline)

    @app.callback(Output("point-info", "children", allow_duplicate=True), Input("point-cancel", "n_clicks"),
                  prevent_initial_call=True)
    def point_cancelled(_: Any) -> str:
        """Say that the job was cancelled (the last result stays)."""
        return "cancelled: the last result stays on screen"

    @app.callback(Output("baseline", "data"), Input("pin", "n_clicks"), Input("unpin", "n_clicks"),
                  State("ready", "data"), prevent_initial_call=True)
    def pin(_pin: Any, _unpin: Any, ready: dict | None) -> Any:
        """Pin the point on screen as the baseline, or clear it."""
        if ctx.triggered_id == "unpin":
            return None
        if not ready:
            raise PreventUpdate
        return ready


def _register_sweep(app: Dash, app_ctx: AppContext) -> None:
    """The load sweep: a background job streaming its runs into the frontier and load figures."""

    @app.callback(Output("sweep-done", "children"), Input("sweep-run", "n_clicks"), State("spec", "data"),
                  State("baseline", "data"), State("sweep-levels", "value"), background=True,
                  manager=app_ctx.manager, interval=300, prevent_initial_call=True,
                  progress=[Output("sweep-progress", "value"), Output("sweep-progress", "max"),
                            Output("sweep-status", "children"), Output("sweep-partial", "data")],
                  running=[(Output("sweep-run", "disabled"), True, False),
                           (Output("sweep-cancel", "disabled"), False, True)],
                  cancel=[Input("sweep-cancel", "n_clicks")])
    def sweep_job(set_progress: Callable, _n: Any, spec: dict | None, baseline: dict | None, levels: str) -> str:
        """Run the load sweep (a background job streaming its runs)."""
        if not spec:
            return "nothing to sweep yet: fix the settings first"
        app_ctx.job_started()
        return run_sweep(app_ctx, set_progress, spec, baseline, levels)

    @app.callback(Output("fig-frontier", "figure"), Output("fig-load", "figure"), Input("sweep-partial", "data"),
                  State("spec", "data"))
    def sweep_shown(data: dict | None, spec: dict | None) -> tuple:
        """Frontier and load figures of the sweep so far."""
        if not data:
            blank = _figures.empty_figure("run a load sweep to see the frontier and the load curves")
            return blank, blank
        return show_sweep(app_ctx.store, data, spec)
