"""The Dash app: three pages behind one URL, background jobs on disk, and the server.

Pages (the path of the URL): ``/`` what-if, ``/study`` a finished study, ``/tune`` an Optuna
study. The what-if settings live in the URL's query, so a link reproduces the view; the page is
built from the query when the path changes (first load, a link, a trial opened from ``/tune``).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diskcache
from dash import Dash, Input, Output, State, dcc, html

from ..errors import ConfigError
from ._context import AppContext, default_cache_dir
from ._jobs import JobManager, start_job_server
from ._settings import query_to_settings
from ._studies import register_studies, study_page
from ._tuning import register_tuning, storage_url_of, tuning_page
from ._whatif import register_whatif
from ._whatif_layout import whatif_page

__all__ = ["check_sources", "create_app", "serve"]

#: serve()'s default folders: a fresh clone has neither yet, and the pages say so, so only a path
#: the user named must exist.
_DEFAULT_STUDY, _DEFAULT_RESULTS = "results/tune", "results"

_CSS = """
body { font-family: system-ui, sans-serif; margin: 0; color: #222; }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .5em 1em; background: #2a3f5f; color: #fff; }
header a { color: #fff; } header b { font-size: 1.1em; }
.whatif { display: grid; grid-template-columns: 340px 1fr; gap: 1em; padding: 0 1em; }
.page { padding: 0 1em; }
.controls { font-size: .9em; }
.section { border-bottom: 1px solid #ddd; padding: .3em 0; } .section summary { font-weight: 600; cursor: pointer; }
.field { margin: .35em 0; } .field label { display: block; font-weight: 500; }
.num { width: 7em; } .path { width: 95%; }
.help { color: #666; font-size: .85em; } .error { color: #b00020; font-size: .9em; white-space: pre-wrap; }
.status { color: #555; font-size: .9em; margin: .2em 0; }
.upload { border: 1px dashed #999; padding: .3em; margin: .3em 0; text-align: center; cursor: pointer; font-size: .85em; }
.temp { display: grid; grid-template-columns: 1fr 6em; gap: .4em; align-items: center; } .temp .num { width: 6em; }
.busy { gap: .6em; align-items: center; } .busy progress { width: 240px; }
.pin { margin: .4em 0; display: flex; gap: .5em; align-items: center; }
table.kpis { border-collapse: collapse; margin: .5em 0; } .kpis td, .kpis th { border: 1px solid #ddd; padding: .2em .6em; }
.kpis td { text-align: right; } .kpis td:first-child { text-align: left; }
td.beyond { background: #fff3c4; font-weight: 600; } td.noise { color: #777; }
.sweep { display: flex; gap: .5em; align-items: center; } .export { display: grid; grid-template-columns: 5em 8em 14em auto auto; gap: .5em; align-items: center; margin: .5em 0; }
"""

_INDEX = """<!DOCTYPE html>
<html><head>{%metas%}<title>{%title%}</title>{%favicon%}{%css%}<style>""" + _CSS + """</style></head>
<body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer></body></html>"""


def _header() -> html.Header:
    return html.Header([html.B("memtp_sim"), dcc.Link("What-if", href="/", id="nav-whatif"),
                        dcc.Link("Study", href="/study", id="nav-study"),
                        dcc.Link("Tuning", href="/tune", id="nav-tune")])


def create_app(*, cache_dir: str | Path | None = None, results: str | Path = "results",
               study: str = "results/tune") -> Dash:
    """Build the dashboard app.

    Args:
        cache_dir: the work folder for cached runs, uploads and background jobs (default
            :func:`~memtp_sim.dashboard._context.default_cache_dir`).
        results: folder of finished studies (the study page lists them).
        study: tuning study folder or storage URL the tuning page opens first.

    Returns:
        The Dash app (its Flask server is ``app.server``).
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    manager = JobManager(diskcache.Cache(str(root / "jobs")))
    app_ctx = AppContext.create(root, results, study, manager)
    app = Dash(__name__, title="memtp_sim what-if", suppress_callback_exceptions=True,
               background_callback_manager=manager, update_title=None)
    app.index_string = _INDEX
    app.layout = html.Div([dcc.Location(id="url", refresh=False), _header(), dcc.Store(id="baseline"),
                           html.Div(id="page")])

    @app.callback(Output("page", "children"), Input("url", "pathname"), State("url", "search"))
    def route(pathname: str | None, search: str | None) -> Any:
        """The page for the URL's path (the what-if page built from its query)."""
        if pathname in (None, "/", ""):
            return whatif_page(*query_to_settings(search))
        if pathname == "/study":
            return study_page(app_ctx)
        if pathname == "/tune":
            return tuning_page(app_ctx)
        return html.Div(className="page", children=[html.H2("not found"), dcc.Link("what-if page", href="/")])

    register_whatif(app, app_ctx)
    register_studies(app, app_ctx)
    register_tuning(app, app_ctx)
    return app


def serve(host: str = "127.0.0.1", port: int = 8050, *, study: str = "results/tune", results: str = "results",
          cache_dir: str | Path | None = None, say: Callable[[str], None] | None = None) -> int:
    """Run the dashboard until Ctrl-C: one line with its URL, then quiet.

    Args:
        host: interface to bind (``127.0.0.1``: this machine only).
        port: TCP port (0 picks a free one; the printed URL has it).
        study: tuning study folder or storage URL.
        results: folder of finished studies.
        cache_dir: the work folder (see :func:`create_app`).
        say: where the start line goes (default: stdout, flushed).

    Returns:
        0 after Ctrl-C.

    Raises:
        ConfigError: a path that is not there (:func:`check_sources`).
        OSError: the port cannot be bound (e.g. in use).
    """
    from werkzeug.serving import make_server

    check_sources(study, results, cache_dir)  # first: a mistyped path is one line, nothing started
    sock = _bind(host, port)  # first: a busy port is one error, before anything starts
    app = create_app(cache_dir=cache_dir, results=results, study=study)
    start_job_server()  # before the server's threads exist (see _jobs)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server(host, port, app.server, threaded=True, fd=sock.fileno())
    bound = sock.getsockname()[1]  # the port 0 picked
    sock.close()  # the server holds its own copy
    line = f"memtp_sim dashboard on http://{host}:{bound}/ (Ctrl-C to stop)"
    if say is None:
        print(line, flush=True)
    else:
        say(line)
    if threading.current_thread() is threading.main_thread():  # `kill` stops it like Ctrl-C does
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        _stop_jobs()
    return 0


def check_sources(study: str = _DEFAULT_STUDY, results: str | Path = _DEFAULT_RESULTS,
                  cache_dir: str | Path | None = None) -> None:
    """Refuse, before anything starts, a ``--study``, ``--results`` or ``--cache-dir`` that is not there
    (a typo would otherwise serve empty pages with no word why).

    Raises:
        ConfigError: one line naming the flag: a ``--study`` (other than the default) that is
            neither a storage URL, a folder holding ``optuna.db`` nor a ``.db`` file; a
            ``--results`` (other than the default) that is not a folder, or any that is a file;
            a ``--cache-dir`` that is a file.
    """
    if str(study).endswith((".yaml", ".yml")):  # a tune spec or study file, not its results
        raise ConfigError(f"--study {study}: takes a tuning results folder (e.g. results/tune) or an Optuna "
                          f"storage URL, not a YAML; run `python -m memtp_sim tune {study}` first, then give its --out")
    if str(study) != _DEFAULT_STUDY:
        try:
            storage_url_of(str(study))
        except ConfigError as e:
            raise ConfigError(f"--study {e}") from None
    res = Path(results).expanduser()
    if res.exists() and not res.is_dir():
        raise ConfigError(f"--results {results}: is a file, not a folder (the folder `python -m memtp_sim run` "
                          "writes studies into, e.g. results)")
    if str(results) != _DEFAULT_RESULTS and not res.exists():
        raise ConfigError(f"--results {results}: no such folder (the folder `python -m memtp_sim run` writes "
                          "studies into, e.g. results)")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else None
    if cache is not None and cache.exists() and not cache.is_dir():
        raise ConfigError(f"--cache-dir {cache_dir}: is a file, not a folder")


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (as werkzeug would make it).

    Raises:
        OSError: the address cannot be bound (``errno.EADDRINUSE``: another program has the port).
    """
    from werkzeug.serving import get_sockaddr, select_address_family

    family = select_address_family(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(get_sockaddr(host, port, family))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_jobs(grace_s: float = 3.0) -> None:
    """End the background jobs this server started: SIGTERM, then SIGKILL after ``grace_s``
    (they would also end with it: see AppContext.job_started)."""
    import time

    import multiprocess

    procs = multiprocess.active_children()
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=1.0)
