"""Command line: ``python -m memtp_sim <command>``. The only module that exits the process.

Commands:
    run STUDY.yaml      run (or resume) a study, write results/<study>/ and report.html
    report STUDY_DIR    rebuild report.html from finished runs
    profiles            list shipped hardware profiles
    schedule            run the DSpark scheduler on confidences given on the command line

Bad input (config, calibration) prints one line to stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from .errors import MemtpSimError

__all__ = ["main"]


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .config import load_study
    from .report import headline_table, load_results, write_report
    from .study import plan_runs, run_study

    console = Console(stderr=True)
    study = load_study(args.study)
    n_runs = len(plan_runs(study, source=args.study))
    console.print(f"[bold]{study.name}[/]: {n_runs} runs -> {Path(args.out) / study.name}")
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=args.quiet or not console.is_terminal and not args.progress) as prog:
        task = prog.add_task("simulating", total=n_runs)

        def on_progress(done: int, total: int, run_id: str) -> None:
            prog.update(task, completed=done)
            if not console.is_terminal and not args.quiet and run_id:
                print(f"  [{done}/{total}] {run_id}", file=sys.stderr, flush=True)

        root, _ = run_study(study, out_dir=args.out, jobs=args.jobs, force=args.force, source=args.study,
                            on_progress=on_progress)
    report = write_report(root)
    elapsed = time.perf_counter() - t0
    res = load_results(root)
    _print_table(headline_table(res))
    print(f"\n{n_runs} runs in {elapsed:.1f} s; results in {root}/; report: {report}")
    return 0


def _print_table(df) -> None:  # noqa: ANN001 - pandas DataFrame
    from rich.console import Console
    from rich.table import Table

    t = Table(show_header=True, header_style="bold")
    for c in df.columns:
        t.add_column(str(c), justify="right")
    for _, row in df.iterrows():
        t.add_row(*[f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row.tolist()])
    Console(width=max(120, min(220, os.get_terminal_size(0).columns if sys.stdout.isatty() else 200))).print(t)


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    root = Path(args.study_dir)
    if not (root / "runs.csv").is_file():
        return _fail(f"{root}: no runs.csv here; run a study first (python -m memtp_sim run STUDY.yaml)")
    print(write_report(root))
    return 0


def _cmd_profiles(args: argparse.Namespace) -> int:
    from .hardware import DEFAULT_PROFILE, list_profiles, load_profile

    for name, path in list_profiles().items():
        p = load_profile(name)
        mark = " (default)" if name == DEFAULT_PROFILE else ""
        print(f"{name}{mark}\n  {path}\n  {p.description}\n  B={p.sps.batch_tokens.tolist()}\n"
              f"  pass_ms={[round(float(x), 1) for x in p.sps.pass_ms]}")
    return 0


def _cmd_schedule(args: argparse.Namespace) -> int:
    from .scheduling import hardware_aware_prefix_scheduler

    conf = [[float(x) for x in row.split(",") if x] for row in args.confidences]
    sps = None
    if args.sps:
        sps = {int(k): float(v) for k, v in (pair.split("=") for pair in args.sps.split(","))}
    try:
        r = hardware_aware_prefix_scheduler(conf, sps, early_stop=not args.global_search)
    except ValueError as e:
        return _fail(str(e))
    print(f"lengths={r.lengths.tolist()} batch_tokens={r.batch_tokens} tau={r.tau:.4f} theta={r.theta:.4f}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m memtp_sim", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run (or resume) a study YAML")
    r.add_argument("study", help="study YAML, e.g. studies/load.yaml")
    r.add_argument("--out", default="results", help="results folder (default: results)")
    r.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    r.add_argument("--force", action="store_true", help="recompute runs that already have results")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument("--progress", action="store_true", help="show the progress bar even when not a terminal")
    r.set_defaults(func=_cmd_run)

    rp = sub.add_parser("report", help="rebuild report.html of a finished study")
    rp.add_argument("study_dir", help="results/<study>")
    rp.set_defaults(func=_cmd_report)

    pr = sub.add_parser("profiles", help="list shipped hardware profiles")
    pr.set_defaults(func=_cmd_profiles)

    s = sub.add_parser("schedule", help="run DSpark's Algorithm 1 on given confidences")
    s.add_argument("confidences", nargs="+", help="one comma-separated list of c_k per request, e.g. 0.9,0.8")
    s.add_argument("--sps", help="SPS table as B=steps_per_s pairs, e.g. 1=1.0,2=0.5,3=0.45 (default: shipped profile)")
    s.add_argument("--global-search", action="store_true", help="no early stop")
    s.set_defaults(func=_cmd_schedule)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MemtpSimError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
