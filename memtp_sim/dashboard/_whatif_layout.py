"""The what-if page's components: controls built from the settings, result panes, stores.

Every control carries the value its setting has in the URL (or the page default), and an error
line under it (``<control id>-error``) where the library's one-line error appears. Policy
parameter controls are built from the policy's pydantic ``Params`` fields
(:func:`policy_param_controls`), so a newly registered policy gets its controls without changes
here.
"""

from __future__ import annotations

import math
import typing
from typing import Any

from dash import dcc, html

from ..hardware import list_profiles
from ..policies import available_policies
from ._settings import policy_param_fields, shipped_traces

__all__ = ["ERROR_TARGETS", "LEVEL_DEFAULTS", "control_values", "policy_param_controls", "whatif_page"]

#: Load-sweep levels offered per workload mode (values of its load key).
LEVEL_DEFAULTS = {"closed_loop": "1,2,4,8,16,32", "poisson": "0.25,0.5,1,1.5,2", "trace": "0.5,1,2,4"}

#: Which error line shows the library's message about a path (first match of prefix wins).
ERROR_TARGETS: tuple[tuple[str, str], ...] = (
    ("extra_gib", "hw-extra"),
    ("hardware", "hw-profile"),
    ("workload.trace", "wl-trace"),
    ("workload.concurrency", "wl-concurrency"),
    ("workload.rate_per_s", "wl-rate"),
    ("workload.rate_scale", "wl-rate-scale"),
    ("workload.num_requests", "wl-requests"),
    ("workload", "wl-mode"),
    ("engine.prefill_gpus", "eng-prefill-gpus"),
    ("engine", "eng-prefill"),
    ("policy.gamma", "pol-depth"),
    ("memtp.max_depth", "pol-depth"),
    ("policy.name", "pol-name"),
    ("policy", "pol-params"),
    ("confidence.temperature", "conf-temp"),
    ("confidence.sts_rounds", "conf-sts-rounds"),
    ("confidence", "conf-sts"),
    ("memtp.depth", "memtp-heads"),
    ("memtp.head_cost_gib", "memtp-head-cost"),
    ("memtp.r_low", "memtp-r-low"),
    ("memtp.r_high", "memtp-r-high"),
    ("memtp", "memtp-mode"),
    ("seeds", "seeds"),
    ("", "general"),
)

_NUM = {"type": "number", "debounce": True, "className": "num"}


def _field(label: str, control: Any, cid: str, help_text: str = "") -> html.Div:
    """A labelled control with its help line and error line."""
    return html.Div(className="field", id=f"{cid}-box", children=[
        html.Label(label, htmlFor=cid), control,
        html.Div(help_text, className="help", id=f"{cid}-help") if help_text is not None else None,
        html.Div(id=f"{cid}-error", className="error"),
    ])


def control_values(full: dict[str, Any]) -> dict[str, Any]:
    """Each control's value for settings ``full`` (one value per setting key, e.g. from the URL).

    Args:
        full: settings with every key of :data:`DEFAULTS` (and the policy's parameters).

    Returns:
        ``{control id: value}``: the MEMTP mode (off / fixed / elastic) and head count from
        ``memtp.depth``, the max depth from ``memtp.max_depth`` (elastic) or ``policy.gamma``.
    """
    depth = full.get("memtp.depth")
    mode = "off" if depth is None else ("elastic" if depth == "elastic" else "fixed")
    temp = full.get("confidence.temperature")
    return {
        "hw-profile": full["hardware.profile"], "hw-extra": full["extra_gib"],
        "wl-trace": full["workload.trace"], "wl-mode": full["workload.mode"],
        "wl-concurrency": full["workload.concurrency"], "wl-rate": full["workload.rate_per_s"],
        "wl-rate-scale": full["workload.rate_scale"], "wl-requests": full["workload.num_requests"],
        "eng-prefill": full["engine.prefill"], "eng-prefill-gpus": full["engine.prefill_gpus"],
        "pol-name": full["policy.name"],
        "pol-depth": full["memtp.max_depth"] if mode == "elastic" else full["policy.gamma"],
        "conf-temp": temp,
        "conf-temp-slider": math.log2(temp) if isinstance(temp, (int, float)) and temp > 0 else 0.0,
        "conf-sts": full["confidence.sts"], "conf-sts-rounds": full["confidence.sts_rounds"],
        # fixed heads from a link whose count is not a whole number (an emptied box: memtp.depth=)
        # leave the box empty, so its error shows, rather than 4 heads nobody chose
        "memtp-mode": mode, "memtp-heads": depth if isinstance(depth, int) else (None if mode == "fixed" else 4),
        "memtp-head-cost": full["memtp.head_cost_gib"], "memtp-r-low": full["memtp.r_low"],
        "memtp-r-high": full["memtp.r_high"], "seeds": full["seeds"],
    }


def _param_control(name: str, field: Any, value: Any) -> Any:
    """One control for a policy parameter, by its annotation (bool, Literal, int, float, other)."""
    ann = field.annotation
    pid = {"type": "policy-param", "name": name}
    if ann is bool:
        return dcc.RadioItems(id=pid, options=[{"label": "on", "value": True}, {"label": "off", "value": False}],
                              value=value, inline=True)
    if typing.get_origin(ann) is typing.Literal:
        return dcc.Dropdown(id=pid, options=[{"label": str(c), "value": c} for c in typing.get_args(ann)],
                            value=value, clearable=False)
    if ann in (int, float):
        return dcc.Input(id=pid, value=value, step=1 if ann is int else "any", **_NUM)
    return dcc.Input(id=pid, type="text", debounce=True, value=value if isinstance(value, str) else repr(value))


def policy_param_controls(policy: str, values: dict[str, Any]) -> list[Any]:
    """Controls for the parameters of ``policy`` (its ``Params`` fields, gamma excluded).

    Args:
        policy: policy name.
        values: ``{parameter: value}`` to show (the field's default where missing).

    Returns:
        Labelled controls with pattern-matching ids ``{"type": "policy-param", "name": ...}``.
    """
    out = []
    for name, field in policy_param_fields(policy).items():
        value = values.get(name, field.default)
        out.append(html.Div(className="field", children=[
            html.Label(f"policy.{name}"), _param_control(name, field, value),
            html.Div(field.description or "", className="help")]))
    return out or [html.Div("this policy has no parameters besides the block size", className="help")]


def _options(current: Any, named: dict[str, Any], label: str) -> list[dict[str, str]]:
    opts = [{"label": n, "value": n} for n in named]
    if current not in named and current:
        opts.append({"label": f"{label}: {current}", "value": current})
    return opts


def _hardware(v: dict[str, Any]) -> html.Details:
    return html.Details(open=True, className="section", children=[
        html.Summary("Hardware"),
        _field("profile", dcc.Dropdown(id="hw-profile", options=_options(v["hw-profile"], list_profiles(), "file"),
                                       value=v["hw-profile"], clearable=False), "hw-profile", None),
        dcc.Upload(id="hw-upload", multiple=True, className="upload",
                   children=html.Div(["upload a profile: YAML (+ its measurements CSV)"])),
        html.Div(id="hw-upload-error", className="error"),
        dcc.Input(id="hw-path", type="text", debounce=True, placeholder="or a profile YAML path", className="path"),
        html.Div(id="hw-path-error", className="error"),
        _field("free memory: GiB added (+) or removed (-)", dcc.Input(id="hw-extra", value=v["hw-extra"], step="any",
                                                                     **_NUM), "hw-extra"),
    ])


def _workload(v: dict[str, Any]) -> html.Details:
    return html.Details(open=True, className="section", children=[
        html.Summary("Workload"),
        _field("trace", dcc.Dropdown(id="wl-trace", options=_options(v["wl-trace"], shipped_traces(), "file"),
                                     value=v["wl-trace"], clearable=False), "wl-trace", None),
        dcc.Upload(id="wl-upload", className="upload", children=html.Div(["upload a trace CSV"])),
        html.Div(id="wl-upload-error", className="error"),
        _field("mode", dcc.RadioItems(id="wl-mode", options=["closed_loop", "poisson", "trace"], value=v["wl-mode"],
                                      inline=True), "wl-mode", None),
        _field("concurrent users", dcc.Input(id="wl-concurrency", value=v["wl-concurrency"], step=1, **_NUM),
               "wl-concurrency", "closed loop: users, each sends its next request when the last one finishes"),
        _field("rate (requests/s)", dcc.Input(id="wl-rate", value=v["wl-rate"], step="any", **_NUM), "wl-rate",
               "Poisson arrivals"),
        _field("trace rate x", dcc.Input(id="wl-rate-scale", value=v["wl-rate-scale"], step="any", **_NUM),
               "wl-rate-scale", "replay the trace's arrival times this much faster"),
        _field("requests", dcc.Input(id="wl-requests", value=v["wl-requests"], step=1, **_NUM), "wl-requests",
               "per run; more is slower and less noisy"),
        _field("deployment", dcc.RadioItems(id="eng-prefill", options=["colocated", "disaggregated"],
                                            value=v["eng-prefill"], inline=True), "eng-prefill",
               "disaggregated: prompts are prefilled on other GPUs of the same kind"),
        _field("prefill GPUs", dcc.Input(id="eng-prefill-gpus", value=v["eng-prefill-gpus"], step=1, **_NUM),
               "eng-prefill-gpus"),
    ])


def _policy(v: dict[str, Any], params: dict[str, Any]) -> html.Details:
    return html.Details(open=True, className="section", children=[
        html.Summary("Policy"),
        _field("verification policy", dcc.Dropdown(id="pol-name", options=available_policies(), value=v["pol-name"],
                                                   clearable=False), "pol-name", None),
        _field("max depth (gamma)", dcc.Input(id="pol-depth", value=v["pol-depth"], step=1, **_NUM), "pol-depth",
               "draft block size: policy.gamma, or memtp.max_depth with the elastic ensemble"),
        html.Div(id="pol-params", children=policy_param_controls(v["pol-name"], params)),
        html.Div(id="pol-params-error", className="error"),
    ])


def _confidence(v: dict[str, Any]) -> html.Details:
    marks = {math.log2(t): f"{t:g}" for t in (0.25, 0.5, 1, 2, 4)}
    return html.Details(open=True, className="section", children=[
        html.Summary("Confidence"),
        _field("temperature (log scale)", html.Div(className="temp", children=[
            dcc.Slider(id="conf-temp-slider", min=-2, max=2, step=0.05, value=v["conf-temp-slider"], marks=marks,
                       allow_direct_input=False, updatemode="mouseup"),
            dcc.Input(id="conf-temp", value=v["conf-temp"], step="any", **_NUM)]), "conf-temp",
            "global temperature on top of STS; > 1 lowers the confidences"),
        _field("STS", dcc.RadioItems(id="conf-sts", options=[{"label": "fit (on)", "value": "fit"},
                                                             {"label": "off", "value": "none"}],
                                     value=v["conf-sts"], inline=True), "conf-sts",
               "sequential temperature scaling, fitted on a held-out stream"),
        _field("STS fit rounds", dcc.Input(id="conf-sts-rounds", value=v["conf-sts-rounds"], step=1, **_NUM),
               "conf-sts-rounds", "held-out rounds of the fit (the library's default is 20,000)"),
    ])


def _memtp(v: dict[str, Any]) -> html.Details:
    return html.Details(open=True, className="section", children=[
        html.Summary("MEMTP ensemble"),
        _field("depth", dcc.RadioItems(id="memtp-mode", options=[
            {"label": "off (classic drafter)", "value": "off"}, {"label": "fixed heads", "value": "fixed"},
            {"label": "elastic", "value": "elastic"}], value=v["memtp-mode"], inline=True), "memtp-mode", None),
        _field("heads", dcc.Input(id="memtp-heads", value=v["memtp-heads"], step=1, **_NUM), "memtp-heads"),
        _field("head cost (GiB)", dcc.Input(id="memtp-head-cost", value=v["memtp-head-cost"], step="any", **_NUM),
               "memtp-head-cost"),
        _field("r_low", dcc.Input(id="memtp-r-low", value=v["memtp-r-low"], step="any", **_NUM), "memtp-r-low",
               "coherence at or below which the depth falls to its floor of 1"),
        _field("r_high", dcc.Input(id="memtp-r-high", value=v["memtp-r-high"], step="any", **_NUM), "memtp-r-high",
               "coherence at or above which all free memory funds heads"),
    ])


def _results(levels: str) -> html.Div:
    return html.Div(className="results", children=[
        html.Div(id="point-busy", className="busy", style={"display": "none"}, children=[
            html.Progress(id="point-progress", value="0", max="1"),
            html.Span(id="point-status", className="status"),
            html.Button("Cancel", id="point-cancel", disabled=True)]),
        html.Div(id="point-info", className="status"),
        html.Div(id="general-error", className="error"),
        html.Div(className="pin", children=[
            html.Button("Pin as baseline", id="pin"), html.Button("Clear baseline", id="unpin"),
            html.Span(id="baseline-label", className="help")]),
        html.Div(id="kpis"),
        html.Ul(id="notes", className="notes"),
        dcc.Graph(id="fig-latency"),
        dcc.Graph(id="fig-sps"),
        html.Div(id="timeline-box", style={"display": "none"}, children=[dcc.Graph(id="fig-timeline")]),
        html.H3("Load sweep: the frontier (paper Fig. 7) and verify length vs load (Fig. 8)"),
        html.Div(className="sweep", children=[
            html.Label("levels", htmlFor="sweep-levels"),
            dcc.Input(id="sweep-levels", type="text", value=levels, debounce=True),
            html.Button("Run load sweep", id="sweep-run"), html.Button("Cancel", id="sweep-cancel", disabled=True),
            html.Progress(id="sweep-progress", value="0", max="1")]),
        html.Div(id="sweep-status", className="status"),
        html.Div(id="sweep-done", className="status"),
        dcc.Graph(id="fig-frontier"),
        dcc.Graph(id="fig-load"),
    ])


def whatif_page(full: dict[str, Any], extras: dict[str, Any], ignored: list[str]) -> html.Div:
    """The what-if page for settings ``full`` (every control's value) and a link's extras.

    Args:
        full: settings with every key of :data:`DEFAULTS` and the policy's parameters.
        extras: scenario paths the link sets that no control owns (kept and applied).
        ignored: link keys that are neither (listed on the page, not applied).

    Returns:
        The page: controls on the left, results on the right, and its stores.
    """
    v = control_values(full)
    params = {k.split(".", 1)[1]: val for k, val in full.items() if k.startswith("policy.")}
    notes = []
    if extras:
        notes.append(html.Div("also set by the link: " + ", ".join(f"{k} = {val}" for k, val in extras.items()),
                              className="help", id="extras-note"))
    if ignored:
        notes.append(html.Div(f"not understood in the link (ignored): {', '.join(ignored)}", className="error"))
    seeds = _field("seeds (replicates)", dcc.Input(id="seeds", type="text", value=v["seeds"], debounce=True),
                   "seeds", "comma-separated; KPIs show the mean and a 95% t interval over them")
    return html.Div(className="whatif", children=[
        html.Div(className="controls", children=[
            *notes, _hardware(v), _workload(v), _policy(v, params), _confidence(v), _memtp(v),
            html.Details(open=True, className="section", children=[html.Summary("Replicates"), seeds])]),
        _results(LEVEL_DEFAULTS.get(str(full["workload.mode"]), LEVEL_DEFAULTS["closed_loop"])),
        dcc.Store(id="extras", data=extras), dcc.Store(id="spec"), dcc.Store(id="ready"), dcc.Store(id="job"),
        dcc.Store(id="sweep-partial"),
    ])
