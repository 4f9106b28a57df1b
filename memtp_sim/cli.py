"""Command line: ``python -m memtp_sim <command>`` (or the ``memtp-sim`` console script). The only
module that exits the process.

Commands:
    run STUDY.yaml      run (or resume) a study, write results/<study>/ and report.html
                        (--executor dask --scheduler ADDRESS: on a Dask cluster)
    report STUDY_DIR    rebuild report.html from finished runs
    profiles            list shipped hardware profiles
    schedule            run the DSpark scheduler on confidences given on the command line
    depth               MEMTP ensemble depth from free memory (--live reads this machine)
    tune, export        Optuna tuning studies and production configs
    tune TUNE.yaml      Optuna tuning (resumable), fresh-seed validation, results/<study>/report.html
    export              write a vLLM / SGLang / MEMTP config from a tuned study's trial
    dashboard           the Dash what-if app (binds 127.0.0.1:8050; --host, --port, --study, --results)
    drafter-lab LAB.yaml  acceptance by block position per drafter head, written as acceptance profiles
    capacity SCENARIO.yaml --slo "ttft_s_p90 <= 2"  highest Poisson rate meeting the SLO, per policy

Bad input (config, calibration) prints one line to stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from ._version import __version__
from .errors import CalibrationError, InvalidArgumentError, MemtpSimError
from .memtp import MEMTP_DEFAULTS

__all__ = ["main"]


#: What ``--help`` says the program is (the module docstring is for developers).
DESCRIPTION = ("memtp_sim: a discrete-event simulator of LLM serving with speculative decoding (DSpark's "
               "confidence-scheduled verification, MEMTP's memory-elastic draft heads) on measured hardware profiles. "
               "Bad input prints one line to stderr and exits with code 2.")


def _prog() -> str:
    """The name the user invoked: ``memtp-sim`` (the console script) or ``python -m memtp_sim``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith(("memtp-sim", "memtp_sim")) and not name.endswith(".py") else "python -m memtp_sim"


def _name_flags(msg: str, flags: dict[str, str]) -> str:
    """``msg`` with each library argument name (``rate_lo``) replaced by the flag the user typed (``--rate-lo``)."""
    for name, flag in flags.items():
        msg = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", flag, msg)
    return msg


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _eta(elapsed_s: float, done: int, total: int, *, reused: int = 0, first_done_s: float | None = None) -> str:
    """``"12 s, about 2 min left"``: elapsed time, and what remains at the pace of the runs this
    command computed after its first (``first_done_s``, when the first of them finished: it carries
    the start-up, worker processes and imports, and ``reused`` runs took no time); no estimate
    before a second run is computed."""
    computed = done - reused
    if done >= total or computed < 2 or first_done_s is None:
        return _duration(elapsed_s)
    pace_s = (elapsed_s - first_done_s) / (computed - 1)
    return f"{_duration(elapsed_s)}, about {_duration(pace_s * (total - done))} left"


#: errors of the machine, not of the input: exit code 1 (a failure), not 2 (bad input)
_OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def _print_failed(failed: dict[str, str], n_runs: int, again: str, head: str = "") -> None:
    """List failed runs on stderr, split by whether a rerun can help (``study.failure_kind``): a run
    that failed on its input fails the same way until the input is fixed, one that raised inside
    the simulation fails the same way for its seed, so only the machine's failures get the retry hint."""
    from .study import failure_kind  # lazy: pandas

    kinds = {rid: failure_kind(why) for rid, why in failed.items()}
    print(head or f"\n{len(failed)} of {n_runs} run(s) failed (the report says which):", file=sys.stderr)
    for kind, hint in (("input", f"failed on their input, and fail the same way when run again: fix the input "
                                 f"the error names, then {again}"),
                       ("same", "raised inside the simulation, and fail the same way when run again (a run is "
                                "deterministic for its seed): the error says what broke; an engine invariant a "
                                "scenario breaks is its input to change, any other is a bug to report with the "
                                "traceback in the run's failed.json"),
                       ("transient", f"did not complete for a reason a rerun may get past (a lost worker, damaged "
                                     f"files, memory or disk, an input changed while the study ran): {again} to "
                                     "retry them")):
        group = {rid: why for rid, why in failed.items() if kinds[rid] == kind}
        if group:
            print(f"{len(group)} {hint}:", file=sys.stderr)
            for rid, why in list(group.items())[:10]:
                print(f"  {rid}: {why}", file=sys.stderr)
            if len(group) > 10:
                print(f"  ... and {len(group) - 10} more (each with its failed.json under runs/)", file=sys.stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from .config import load_study  # lazy: a subcommand loads only what it uses
    from .report import (extrapolation_notes, load_results, overload_notes, rejection_notes,  # lazy: pandas + plotly; keep --help fast
                         terminal_table, write_report)
    from .study import check_executor, check_writable, plan_runs, run_study  # lazy: a subcommand loads only what it uses

    check_executor(args.executor, args.scheduler, args.jobs)  # before anything else: one line, exit 2
    console = Console(stderr=True)
    study = load_study(args.study)
    specs = plan_runs(study, source=args.study)
    n_runs = len(specs)
    check_writable(Path(args.out) / study.name)
    if not args.quiet:
        console.print(f"[bold]{study.name}[/]: {n_runs} runs -> {Path(args.out) / study.name}", soft_wrap=True)
    capped = Counter(note for spec in specs for note in spec.scenario.capped_settings())
    for note, count in capped.items():  # (kept: a table may serve drafters of several depths)
        print(f"note: {note} in {count} of {n_runs} run(s)", file=sys.stderr)
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, disable=args.quiet or not console.is_terminal and not args.progress) as prog:
        task = prog.add_task("runs", total=n_runs)
        inner = prog.add_task("requests (current run)", total=None, visible=False)

        pace = {"reused": 0, "first_done_s": None}  # for the estimate of what remains (_eta)

        def on_progress(done: int, total: int, run_id: str) -> None:
            prog.update(task, completed=done)
            elapsed_s = time.perf_counter() - t0
            if not run_id:  # before any run: the reused ones
                pace["reused"] = done
            elif pace["first_done_s"] is None:
                pace["first_done_s"] = elapsed_s
            if not console.is_terminal and not args.quiet and run_id:
                print(f"  [{done}/{total}] {run_id} ({_eta(elapsed_s, done, total, **pace)})",
                      file=sys.stderr, flush=True)

        def on_run_progress(done: int, total: int) -> None:  # runs executing in this process
            prog.update(inner, completed=done, total=total, visible=True)

        out = run_study(study, out_dir=args.out, jobs=args.jobs, force=args.force, source=args.study,
                        on_progress=on_progress, on_run_progress=on_run_progress, executor=args.executor,
                        scheduler=args.scheduler, connect_timeout_s=args.scheduler_timeout)
    root = out.root
    elapsed = time.perf_counter() - t0
    if not args.quiet and (out.num_reused or out.recomputed):
        print(f"resume: {out.ran_note()}", file=sys.stderr)
    if out.num_stale and not args.quiet:
        earlier = (f"; among them earlier results of {out.num_superseded} run(s) computed now, see resume: above"
                   if out.num_superseded else "")
        print(f"note: {out.num_stale} folder(s) under {root}/runs belong to no run of this study (left "
              f"untouched{earlier})", file=sys.stderr)
    if len(out.table):
        report = write_report(root)
        res = load_results(root)
        summary = terminal_table(res)
        _print_table(summary.table)
        for line in summary.legend:
            print(f"  {line}")
        for note in rejection_notes(res) + overload_notes(res) + extrapolation_notes(res):
            print(f"warning: {note}", file=sys.stderr)
        parts = ([f"{out.num_ran} ran now", f"{out.num_reused} reused"] if out.num_reused else []) \
            + ([f"{len(out.failed)} failed"] if out.failed else [])
        ran = f" ({', '.join(parts)})" if parts else ""
        # (two lines: one ran past a 110-column terminal with a resumed study's counts)
        print(f"\n{n_runs} run{'' if n_runs == 1 else 's'}{ran} in {elapsed:.1f} s; results in {root}/ (every metric: "
              f"runs.csv)\nreport: {report}")
    if out.failed:
        _print_failed(out.failed, n_runs, "run the same command again")
        return 1
    return 0


def _cell_text(v: object) -> str:
    """A table cell as the report writes it: ``-`` where nothing was measured or a sweep key does not
    apply (NaN, None, pandas' NA), not ``nan``."""
    import pandas as pd  # loaded already: the cell comes from a DataFrame

    if v is None or v is pd.NA or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


def _print_table(df, *, console=None) -> None:  # noqa: ANN001 - pandas DataFrame, rich Console
    """Print ``df`` as rich tables that fit the console and never cut a number.

    The leading key columns (up to and including ``policy``) repeat in every table and wrap at
    spaces, as headers do; every other column is as wide as its widest cell. When those columns do
    not all fit beside the keys, they are split over several tables, one after another.
    """
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console(width=max(60, os.get_terminal_size(sys.stdout.fileno()).columns)
                          if sys.stdout.isatty() else 200)
    cols = [str(c) for c in df.columns]
    cells = [[_cell_text(v) for v in row] for row in df.itertuples(index=False)]
    n_keys = cols.index("policy") + 1 if "policy" in cols else 1

    def width(i: int) -> int:  # content width: headers and keys may wrap at spaces, other cells never
        longest_word = max((len(w) for text in [cols[i]] + [r[i] for r in cells] for w in text.split()), default=1)
        widest_cell = max((len(r[i]) for r in cells), default=1)
        if i < n_keys:
            return max(longest_word, min(max(widest_cell, len(cols[i])), 20))
        return max(longest_word, widest_cell)

    widths = [width(i) for i in range(len(cols))]
    roomy = widths[:n_keys] + [max(w, len(c)) for w, c in zip(widths[n_keys:], cols[n_keys:])]
    if sum(roomy) + 3 * len(cols) + 1 <= console.width:  # everything fits with headers on one line
        widths = roomy
    room = console.width - (sum(widths[:n_keys]) + 3 * n_keys + 1)  # 3 = padding + border per column
    groups: list[list[int]] = [[]]
    for i in range(n_keys, len(cols)):
        if groups[-1] and sum(widths[j] + 3 for j in groups[-1]) + widths[i] + 3 > room:
            groups.append([])
        groups[-1].append(i)
    for group in groups:
        t = Table(show_header=True, header_style="bold")
        for i in list(range(n_keys)) + group:
            # a number fits its column exactly, so it never wraps; "fold" (not "...") keeps every digit
            t.add_column(cols[i], justify="right", width=widths[i], overflow="fold")
        for r in cells:
            t.add_row(*[r[i] for i in list(range(n_keys)) + group])
        console.print(t)


def _cmd_report(args: argparse.Namespace) -> int:
    import pandas as pd

    from .report import load_results, write_report  # lazy: pandas + plotly; keep --help fast
    from .study import not_a_study_folder  # lazy: pandas, as the line above

    root = Path(args.study_dir)
    why = not_a_study_folder(root)
    if why is not None:
        return _fail(why)
    try:
        print(write_report(root))
    except MemtpSimError as e:  # the reader's own line names the file (e.g. an unreadable study.json)
        return _fail(str(e))
    except (pd.errors.EmptyDataError, KeyError, ValueError) as e:
        return _fail(f"{root}: study results are incomplete or damaged ({e.__class__.__name__}); "
                     "rerun the study to rebuild them")
    missing = load_results(root).missing
    if missing:
        _print_failed(missing, 0, "run the study again", head=(
            f"warning: the report covers {len(load_results(root).table)} runs; {len(missing)} run(s) of the study "
            "have no verified result (listed at the top of the report):"))
        return 1
    return 0


def _cmd_profiles(args: argparse.Namespace) -> int:
    from .hardware import DEFAULT_PROFILE, load_profile, profile_catalog  # lazy: a subcommand loads what it uses
    from .hardware.profile import _read_profile_doc, _stat_key  # lazy, as above: the YAML's own labels

    profiles, clashes, unreadable = profile_catalog()
    # a listing shows every profile that loads and names each one that does not (one broken file
    # emptied it before)
    problems = [f"{path}: {why}" for path, why in unreadable.items()]
    problems += [f"the profile name {n!r} is given by {len(ps)} files ({', '.join(map(str, ps))}): none is "
                 "used by that name; rename all but one (their name: field)" for n, ps in clashes.items()]
    for name, path in profiles.items():
        try:
            p = load_profile(name)
        except CalibrationError as e:
            problems.append(str(e))
            continue
        doc = _read_profile_doc(str(path.resolve()), *_stat_key(path))  # legacy profiles: labels in the YAML only
        label = {k: getattr(p, k) or str(doc.get(k, "") or "not stated") for k in ("model", "engine", "build")}
        b = p.sps.batch_tokens
        rng = f"B {int(b[0])}..{int(b[-1])} ({b.size} points; below {p.sps.below_min}, beyond {p.sps.beyond_max})"
        if p.decode is not None:
            rng += f"; decode B {int(p.decode.batch_tokens[0])}..{int(p.decode.batch_tokens[-1])}"
        if p.prefill is not None:
            rng += f"; prefill B {int(p.prefill.batch_tokens[0])}..{int(p.prefill.batch_tokens[-1])}"
        mark = " (default)" if name == DEFAULT_PROFILE else ""
        print(f"{name}{mark}\n  path:     {path}\n  chip:     {p.chip or 'not stated'}\n  model:    {label['model']}\n"
              f"  engine:   {label['engine']}\n  build:    {label['build']}\n  measured: {rng}\n"
              f"  drafters: {', '.join(p.drafters) if p.drafters else 'roofline mapping'}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 1 if problems else 0


def _cmd_calibrate_import(args: argparse.Namespace) -> int:
    from .hardware import importers  # lazy: a subcommand loads only what it uses

    return importers.cli_import(args)


def _cmd_calibrate_check(args: argparse.Namespace) -> int:
    from .report import fidelity  # lazy: a subcommand loads only what it uses

    return fidelity.cli_check(args)


def _cmd_schedule(args: argparse.Namespace) -> int:
    from .policies import hardware_aware_prefix_scheduler  # lazy: a subcommand loads only what it uses

    try:
        conf = [[float(x) for x in row.split(",")] for row in args.confidences]
    except ValueError:
        return _fail(f"confidences: expected comma-separated numbers per request, e.g. 0.9,0.8 (got {args.confidences})")
    sps = None
    if args.sps:
        try:
            pairs = [(int(k), float(v)) for k, v in (pair.split("=") for pair in args.sps.split(","))]
        except ValueError:
            return _fail(f"--sps: expected B=steps_per_second pairs, e.g. 1=1.0,2=0.5 (got {args.sps!r})")
        sps = dict(pairs)
        if len(sps) < len(pairs):  # a dict keeps the last: say so rather than pick one
            dup = next(b for i, (b, _) in enumerate(pairs) if b in {c for c, _ in pairs[:i]})
            return _fail(f"--sps: B={dup} is given twice; give each B once")
        small = next((b for b, _ in pairs if b < 1), None)
        if small is not None:
            return _fail(f"--sps: B={small}: batch sizes are whole numbers >= 1")
        bad = next((f"B={b}: {v!r}" for b, v in pairs if not (math.isfinite(v) and v > 0)), None)
        if bad is not None:
            return _fail(f"--sps: {bad}: steps per second must be a finite number > 0")
        if all(v > 0 for v in sps.values()):  # the plausibility rules every profile's curve passes
            import numpy as np  # lazy: --help stays fast

            from .hardware.profile import check_curve  # lazy: a subcommand loads only what it uses

            bs = sorted(sps)
            try:  # on pass times (1000 / SPS ms), as a profile's curve
                check_curve(np.array(bs), np.array([1000.0 / sps[b] for b in bs]), where="--sps")
            except CalibrationError as e:
                return _fail(str(e))
    try:
        r = hardware_aware_prefix_scheduler(conf, sps, early_stop=not args.global_search,
                                            max_batch_tokens=args.max_batch_tokens)
    except ValueError as e:
        return _fail(_name_flags(str(e), {"max_batch_tokens": "--max-batch-tokens"}))
    print(f"lengths={r.lengths.tolist()} batch_tokens={r.batch_tokens} tau={r.tau:.4f} (tokens the pass is expected "
          f"to emit, all requests) theta={r.theta:.4f} tok/s (tau over the pass's time)")
    if sps is None:  # (the scheduler priced the passes with the shipped default profile's curve)
        from .hardware import load_profile  # lazy: only this message reads a profile

        print(f"(pass costs: the {load_profile(None).name} profile's verify curve; --sps B=SPS,... gives your own)",
              file=sys.stderr)
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    import shlex

    # lazy: the tuning package's config models (~0.5 s); --help and the other commands never need them
    from .tuning import constraint_failures, default_storage_url, load_tune_spec, open_storage, run_tune, top_trials

    spec = load_tune_spec(args.spec)  # (a bad spec is reported before optuna loads)
    import optuna  # lazy: only this command needs optuna (~0.15 s)

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    last = [-1]

    def on_progress(done: int, total: int) -> None:
        if not args.quiet and done != last[0]:
            # (a resumed study may hold more than asked: it runs none)
            print(f"  [{done}/{total}] trials complete" if done <= total else
                  f"  {done} trials complete, {total} asked: none to run", file=sys.stderr, flush=True)
            last[0] = done

    out = run_tune(spec, storage_url=args.storage, n_trials=args.n_trials, workers=args.workers, out_dir=args.out,
                   validate=not args.no_validate, on_progress=on_progress)
    if out.stale_failed:
        print(f"resume: marked FAIL the RUNNING trial(s) {out.stale_failed} of dead workers", file=sys.stderr)
    held = (f"{out.complete}/{out.requested} complete trials" if out.complete <= out.requested
            else f"{out.complete} complete trials ({out.requested} asked)")
    print(f"{spec.name}: {held} ({out.started_note()}; {out.elapsed_s:.1f} s) in {out.storage_url}")
    for message in out.notes:
        print(f"note: {message}", file=sys.stderr)
    if out.short:
        for message in out.warnings:
            print(f"warning: {message}", file=sys.stderr)
        dead = [c for c in out.worker_exit_codes if c != 0]
        why = f"worker exit codes {out.worker_exit_codes}" if dead else "some trials failed"
        print(f"incomplete ({why}); run the same command again to resume", file=sys.stderr)
        return 1
    storage = open_storage(args.storage or default_storage_url(spec.name, args.out),
                           flag="--storage" if args.storage else "--out")
    study = optuna.load_study(study_name=spec.name, storage=storage)
    best = top_trials(study, spec, 1)
    for num, rec in sorted(out.validation.items()):
        # (export's default: best by the tuning seeds' means, which the fresh seeds below may order otherwise)
        tag = " (best on the tuning seeds: export's default)" if best and num == best[0].number else ""
        vals = ", ".join(f"{m} {rec['metrics'][m]['mean']:.2f} ± {rec['metrics'][m]['half_width']:.2f}"
                         for m in spec.objective_names if m in rec["metrics"])
        fails = constraint_failures(spec, rec["constraint_values"],
                                    {m: ci["mean"] for m, ci in rec["metrics"].items()})
        print(f"  trial {num}{tag}: {rec['params']} -> {vals} (fresh seeds, 95% CI)"
              + (f" [fails on fresh seeds: {'; '.join(fails)}]" if fails else ""))
    if out.report is not None:
        print(f"report: {out.report}")
    for message in out.warnings:  # under the validation lines, where the 0.00 scores are
        print(f"warning: {message}", file=sys.stderr)
    if not best:
        why = (f"meets the constraints ({'; '.join(c.label for c in spec.constraints)})" if spec.constraints
               else "has finite objective values")
        print(f"no feasible trial: none of the {out.complete} complete trials {why}, so there is nothing to "
              f"export; relax the constraints in {args.spec} or run more trials (--n-trials)")
        return 0
    # the export command that reads this very study: same storage, same results folder
    hint = ["python", "-m", "memtp_sim", "export", "--study", spec.name]
    if args.storage:
        hint += ["--storage", out.storage_url]
    if Path(args.out) != Path("results"):
        hint += ["--out", args.out]
    masked = " (password masked: put it back in --storage)" if args.storage and out.storage_url != args.storage \
        else ""
    print("export: " + " ".join(shlex.quote(a) for a in hint) + " --format vllm   (or --format sglang / memtp)"
          + masked)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .tuning.export import export_config  # lazy, as in _cmd_tune

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    for path in export_config(study_name=args.study, fmt=args.fmt, storage_url=args.storage, trial=args.trial,
                              output=args.output, out_dir=args.out, warn=warn):
        print(path)
    return 0


def _cmd_drafter_lab(args: argparse.Namespace) -> int:
    from .config import read_config_yaml  # lazy: a subcommand loads only what it uses
    from .lab import LabConfig, run_lab  # lazy: the lab (numpy, scipy) loads only for this command
    from .lab.report import summary_lines  # lazy: pandas + plotly; keep --help fast

    read_config_yaml(args.config, "drafter-lab spec")  # a study or tune spec given here: say which command takes it
    cfg = LabConfig.load(args.config)
    out = Path(args.out) if args.out else Path("results") / cfg["name"]
    say = None if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    result = run_lab(cfg, out, command=f"python -m memtp_sim drafter-lab {args.config}", progress=say)
    print("\n".join(summary_lines(result)))
    return 0


def _cmd_depth(args: argparse.Namespace) -> int:
    import json

    from .memtp import memtp_depth  # lazy: a subcommand loads only what it uses
    from .telemetry import memtp_depth_live  # lazy: a subcommand loads only what it uses

    kw = {"head_cost_gib": args.head_cost_gib, "r_low": args.r_low, "r_high": args.r_high}
    try:
        if args.live:
            depth, tel = memtp_depth_live(max_depth=args.max_depth, coherence=args.coherence,
                                          reserve_gib=args.reserve_gib, **kw)
        else:
            if args.free_gib is None:
                return _fail("depth: give --free-gib N, or --live to read this machine's free memory")
            if args.reserve_gib != 0.0:  # --free-gib is already what funds heads: nothing to keep back from
                return _fail("--reserve-gib: only used with --live (with --free-gib, give the memory left after "
                             "any reserve)")
            depth = memtp_depth(args.free_gib, args.coherence, max_depth=args.max_depth, **kw)
            tel = {"source": "--free-gib", "free_gib": args.free_gib, "coherence": args.coherence,
                   "max_depth": args.max_depth, **kw, "depth": depth}
    except ValueError as e:
        flags = {"coherence": "--coherence", "max_depth": "--max-depth", "head_cost_gib": "--head-cost-gib",
                 "r_low": "--r-low", "r_high": "--r-high", "reserve_gib": "--reserve-gib"}
        return _fail(_name_flags(str(e), flags | ({} if args.live else {"free_gib": "--free-gib"})))
    if args.json:
        print(json.dumps(tel, indent=2, default=str))
    else:
        reserve = f" - reserve {args.reserve_gib:g} GiB" if args.live and args.reserve_gib else ""
        print(f"depth {depth} (free {tel['free_gib']:.2f} GiB{reserve} from {tel['source']}, coherence {args.coherence}, "
              f"head {args.head_cost_gib} GiB, R thresholds {args.r_low}..{args.r_high}, max {args.max_depth})")
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from .dashboard import serve  # lazy: dash, flask and plotly load only for this command

    try:
        return serve(args.host, args.port, study=args.study, results=args.results, cache_dir=args.cache_dir)
    except OSError as e:  # bind: the port is taken, or the host is not this machine's
        hint = "; another program uses it: stop it, or pass another --port (0: any free one)" \
            if e.errno == errno.EADDRINUSE else ""
        return _fail(f"--host {args.host} --port {args.port}: cannot listen there ({e.strerror}){hint}")


def _cmd_capacity(args: argparse.Namespace) -> int:
    import json

    # lazy: a subcommand loads only what it uses
    from ._io import atomic_write_text, json_default
    # lazy: a subcommand loads only what it uses (capacity imports the simulator)
    from .capacity import (SLO, CapacityPoint, check_capacity_args, load_capacity_scenarios, overload_limit,
                           sla_capacity)

    slo = SLO.parse(args.slo)
    try:  # before any output: a bad flag is one line, named as typed
        check_capacity_args(args.seeds, args.rate_lo, args.rate_hi, args.rel_tol, args.max_runs, args.min_requests)
    except InvalidArgumentError as e:
        return _fail(_name_flags(str(e), _CAPACITY_FLAGS))
    scenarios = load_capacity_scenarios(args.scenario, args.policies)

    def on_point(p: CapacityPoint) -> None:
        vals = ", ".join(f"{k} {p.means[k]:.4g}" if math.isfinite(p.means[k]) else f"{k} - (nothing measured)"
                         for k in (*slo.metrics, "offered_load_ratio_late"))
        limit = overload_limit(p.num_requests, sum(math.isfinite(v) for v in p.per_seed["offered_load_ratio_late"]))
        vals += f" (overloaded above {limit:.4g})"
        verdict = "pass" if p.passed else "FAIL"
        print(f"  {p.rate_per_s:10.4g} req/s  {verdict}  ({vals}; seeds passing {sum(p.seed_passed)}/"
              f"{len(p.seed_passed)}, {p.num_requests} requests)", file=sys.stderr, flush=True)

    print(f"SLO: {slo.label}; seeds {' '.join(map(str, args.seeds))}; rel_tol {args.rel_tol:g}")
    results = []
    for scen in scenarios:
        if not args.quiet:
            print(f"{scen.policy_label()}:", file=sys.stderr, flush=True)
        res = sla_capacity(scen, slo, seeds=args.seeds, rate_lo=args.rate_lo, rate_hi=args.rate_hi,
                           rel_tol=args.rel_tol, max_runs=args.max_runs, min_requests=args.min_requests,
                           progress=None if args.quiet else on_point)
        results.append(res)
        print(res.summary_line(), flush=True)
    if args.json:
        atomic_write_text(args.json, json.dumps([r.to_dict() for r in results], indent=2, default=json_default))
        print(f"results: {args.json}")
    unfinished = [r.policy for r in results if r.status in ("max_runs", "no_failing_rate")]
    if unfinished:
        print(f"not converged: {', '.join(unfinished)}; raise --max-runs or give --rate-lo/--rate-hi", file=sys.stderr)
        return 1
    return 0


#: sla_capacity's arguments and the ``capacity`` flags that give them.
_CAPACITY_FLAGS = {"seeds": "--seeds", "rate_lo": "--rate-lo", "rate_hi": "--rate-hi", "rel_tol": "--rel-tol",
                   "max_runs": "--max-runs", "min_requests": "--min-requests"}


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def _folder(text: str) -> str:
    # an empty --out would write into the working folder under the study's name
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty string")
    return text


def _tcp_port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port 0-65535 (0: any free one), got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 0-65535 (0: any free one), got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=_prog(), description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run (or resume) a study YAML")
    r.add_argument("study", help="study YAML, e.g. studies/load.yaml")
    r.add_argument("--out", default="results", type=_folder, help="results folder (default: results)")
    r.add_argument("--jobs", type=_positive_int, default=None,
                   help="local worker processes (default: CPU count; not with --executor dask)")
    r.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="where runs execute: local processes (default) or a Dask distributed cluster "
                        "(needs --scheduler and the dask extra); results are written here either way")
    r.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="Dask scheduler address for --executor dask, e.g. tcp://10.0.0.5:8786")
    r.add_argument("--scheduler-timeout", metavar="SECONDS", type=_positive_float, default=10.0,
                   help="seconds to wait for the Dask scheduler to answer and have a worker (default: 10)")
    r.add_argument("--force", action="store_true", help="recompute runs that already have results")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument("--progress", action="store_true", help="show the progress bar even when not a terminal")
    r.set_defaults(func=_cmd_run, on_interrupt="finished runs are kept; run the same command again to resume")

    rp = sub.add_parser("report", help="rebuild report.html of a finished study")
    rp.add_argument("study_dir", help="results/<study>")
    rp.set_defaults(func=_cmd_report)

    pr = sub.add_parser("profiles", help="list the hardware profiles under calibration/ (shipped and imported)")
    pr.set_defaults(func=_cmd_profiles)

    _add_calibrate_parser(sub)

    s = sub.add_parser("schedule", help="run DSpark's Algorithm 1 on given confidences")
    s.add_argument("confidences", nargs="+", help="one comma-separated list of c_k per request, e.g. 0.9,0.8")
    s.add_argument("--sps", help="SPS table as B=steps_per_s pairs, e.g. 1=1.0,2=0.5,3=0.45 (default: shipped profile)")
    s.add_argument("--global-search", action="store_true", help="no early stop")
    s.add_argument("--max-batch-tokens", type=_positive_int, default=None,
                   help="cap on B; candidates beyond it are not considered")
    s.set_defaults(func=_cmd_schedule)

    _add_depth_parser(sub)

    _add_tune_parsers(sub)
    _add_dashboard_parser(sub)
    _add_drafter_lab_parser(sub)
    _add_capacity_parser(sub)
    return p


def _add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    """``calibrate import`` and ``calibrate check``."""
    cal = sub.add_parser("calibrate", help="build a hardware profile from measurements, or check one")
    calsub = cal.add_subparsers(dest="calibrate_command", required=True)
    ci = calsub.add_parser("import", help="measurements (llama-bench, batched-bench, GPU cost CSV, a table) -> "
                           "a cost table and a profile YAML")
    ci.add_argument("file", help="the measurements file")
    ci.add_argument("--format", required=True, dest="fmt", help="input format (see docs/calibration.md)")
    ci.add_argument("--select", action="append", default=[], metavar="COLUMN=VALUE",
                    help="keep only rows where COLUMN equals VALUE (repeatable)")
    ci.add_argument("-o", "--output", required=True, help="profile YAML to write, e.g. calibration/<chip>/<name>.yaml")
    ci.add_argument("--name", help="profile name (default: the output file's stem)")
    ci.add_argument("--memory", action="append", default=[], metavar="FIELD=VALUE",
                    help="memory figures the file lacks: gpu_allocatable_gib, weights_bytes, kv_bytes_per_token (or "
                    "kv_shape=LAYERS,KV_HEADS,HEAD_DIM[,BYTES]), max_model_len, reserve_gib, kv_block_tokens, "
                    "drafter_weights_gib")
    ci.set_defaults(func=_cmd_calibrate_import)
    cc = calsub.add_parser("check", help="fidelity report of a profile: leave-one-out error, cliffs, sensitivity")
    cc.add_argument("profile", help="shipped profile name or profile YAML")
    cc.add_argument("--out", default="results/calibrate", type=_folder, help="folder for the HTML report (default: results/calibrate)")
    cc.add_argument("--scenario", help="scenario YAML for the sensitivity run (default: a built-in closed-loop one)")
    cc.add_argument("--quick", action="store_true", help="smaller sensitivity run (for tests)")
    cc.set_defaults(func=_cmd_calibrate_check)


def _add_depth_parser(sub: argparse._SubParsersAction) -> None:
    """``depth``: the MEMTP depth formula, from --free-gib or this machine's memory."""
    d = sub.add_parser("depth", help="MEMTP ensemble depth from free memory (docs/model.md section 2)")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--live", action="store_true",
                     help="read this machine's free memory (AMD sysfs, NVIDIA NVML/nvidia-smi, else system memory)")
    src.add_argument("--free-gib", type=float, default=None, help="free memory to fund heads, GiB")
    d.add_argument("--coherence", type=float, default=1.0, help="coherence R in [0, 1] (default 1.0)")
    m = MEMTP_DEFAULTS
    d.add_argument("--max-depth", type=int, default=m.max_depth, help=f"heads at most (default {m.max_depth})")
    d.add_argument("--head-cost-gib", type=float, default=m.head_cost_gib,
                   help=f"memory one head takes, GiB (default {m.head_cost_gib:g})")
    d.add_argument("--r-low", type=float, default=m.r_low,
                   help=f"coherence at or below which the gate is 0: the depth floor of 1 (default {m.r_low:g})")
    d.add_argument("--r-high", type=float, default=m.r_high,
                   help=f"coherence at or above which the gate is 1: every affordable head (default {m.r_high:g})")
    d.add_argument("--reserve-gib", type=float, default=0.0, help="--live: memory to keep free, GiB")
    d.add_argument("--json", action="store_true", help="print the telemetry as JSON")
    d.set_defaults(func=_cmd_depth)


def _add_tune_parsers(sub: argparse._SubParsersAction) -> None:
    """``tune`` and ``export``."""
    tu = sub.add_parser("tune", help="tune a scenario with Optuna (resumable; see memtp_sim/tuning)")
    tu.add_argument("spec", help="tune YAML, e.g. studies/tune.yaml")
    tu.add_argument("--storage", help="Optuna storage URL (default: sqlite:///results/<study>/optuna.db); "
                    "postgresql+psycopg2://user:pass@host/db or journal:///path/file.log for many workers")
    tu.add_argument("--n-trials", type=_positive_int, default=None,
                    help="COMPLETE trials wanted in total (default: the YAML's)")
    tu.add_argument("--workers", type=_positive_int, default=1,
                    help="local worker processes sharing the storage (default 1)")
    tu.add_argument("--out", default="results", type=_folder, help="results folder (default: results)")
    tu.add_argument("--no-validate", action="store_true", help="skip the fresh-seed re-runs of the top trials")
    tu.add_argument("--quiet", action="store_true", help="no progress output")
    tu.set_defaults(func=_cmd_tune, on_interrupt="finished trials are kept; run the same command again to resume")

    ex = sub.add_parser("export", help="write a production config from a tuned study")
    ex.add_argument("--study", required=True, help="study name (the tune YAML's name)")
    ex.add_argument("--storage", help="Optuna storage URL (default: sqlite:///results/<study>/optuna.db)")
    ex.add_argument("--trial", default="best", help="'best' (feasible Pareto trial with the best primary objective) "
                    "or a trial number (exported even if it fails the constraints, with a warning)")
    ex.add_argument("--format", required=True, choices=["vllm", "sglang", "memtp"], dest="fmt",
                    help="vllm (JSON config), sglang (launch arguments) or memtp (the MEMTP controller's settings, YAML)")
    ex.add_argument("-o", "--output", help="output file (default: results/<study>/export/...)")
    ex.add_argument("--out", default="results", type=_folder, help="results folder (default: results)")
    ex.set_defaults(func=_cmd_export)


def _add_drafter_lab_parser(sub: argparse._SubParsersAction) -> None:
    dl = sub.add_parser("drafter-lab", help="drafter lab: acceptance by block position per head, written as "
                        "per-position acceptance profiles (memtp_sim/lab)")
    dl.add_argument("config", help="lab YAML, e.g. studies/drafter_lab.yaml")
    dl.add_argument("--out", default=None, type=_folder, help="output folder (default: results/<name>)")
    dl.add_argument("--quiet", action="store_true", help="no progress output")
    dl.set_defaults(func=_cmd_drafter_lab)


def _add_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    db = sub.add_parser("dashboard", help="the Dash what-if app in the browser (docs/dashboard.md)")
    db.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    db.add_argument("--port", type=_tcp_port, default=8050, help="TCP port (default 8050; 0 picks a free one)")
    db.add_argument("--study", default="results/tune", help="tuning study folder or Optuna storage URL for the "
                    "tuning page (default: results/tune)")
    db.add_argument("--results", default="results", help="folder of finished studies (default: results)")
    db.add_argument("--cache-dir", default=None, help="cached runs, uploads and background jobs (default: a "
                    "memtp_sim-dashboard folder in the system's temp folder)")
    db.set_defaults(func=_cmd_dashboard)


def _add_capacity_parser(sub: argparse._SubParsersAction) -> None:
    ca = sub.add_parser("capacity", help="SLA capacity: the highest Poisson request rate meeting an SLO, per policy "
                        "(memtp_sim/capacity.py)")
    ca.add_argument("scenario", help="scenario YAML; its workload becomes Poisson over the trace's lengths")
    ca.add_argument("--slo", action="append", required=True, metavar="'METRIC <= N'",
                    help="an SLO term on a run metric, e.g. 'ttft_s_p90 <= 2' (repeat, or join with AND: all must hold)")
    ca.add_argument("--policies", nargs="+", default=None, metavar="POLICY",
                    help="policies to compare, each a name (dspark) or a YAML/JSON mapping ('{name: static, k: 3}'); "
                    "default: the scenario's own")
    ca.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds run at every rate (default: 0 1 2)")
    ca.add_argument("--rel-tol", type=float, default=0.05, help="stop when first failing / last passing rate <= 1 + "
                    "this (default 0.05)")
    ca.add_argument("--rate-lo", type=float, default=None, help="a rate to try first, req/s (default: estimated)")
    ca.add_argument("--rate-hi", type=float, default=None, help="a rate expected to fail, req/s")
    ca.add_argument("--min-requests", type=_positive_int, default=1000, help="requests per run at least (default 1000; a rate "
                    "whose SLO holds is rerun with at least 4000: memtp_sim.capacity.OVERLOAD_MIN_REQUESTS)")
    ca.add_argument("--max-runs", type=_positive_int, default=60, help="runs per policy at most (default 60)")
    ca.add_argument("--json", default=None, metavar="FILE", help="also write every evaluated rate as JSON here")
    ca.add_argument("--quiet", action="store_true", help="no per-rate progress lines")
    ca.set_defaults(func=_cmd_capacity)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MemtpSimError as e:
        return _fail(str(e))
    except BrokenPipeError:  # e.g. `memtp-sim profiles | head`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # unreadable / unwritable files the checks above did not catch
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        if e.errno in _OUT_OF_SPACE:  # not bad input: the machine ran out; what was written is kept
            return _fail(f"{where}{e.strerror}: free some space and run the same command again "
                         "(finished results are kept)", code=1)
        return _fail(f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        kept = getattr(args, "on_interrupt", "")
        print(f"\ninterrupted{': ' + kept if kept else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
