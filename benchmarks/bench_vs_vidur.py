"""memtp_sim against Vidur (Agrawal et al., MLSys 2024): requests simulated per wall second.

Both simulators replay the same requests (the first ``--requests`` rows of the Azure 2023
conversation trace, arrivals compressed by ``--time-scale``) on the same hardware (our measured
H200 + Llama-3.1-8B bf16 profile, ``h200-llama31-8b-bf16``) with the same caps (at most
``--batch-cap`` requests in a pass, at most ``--token-budget`` tokens per pass, chunked prefill in
that budget: Vidur's Sarathi scheduler; ours keeps ``--batch-cap`` tokens of it for decode anchors) and the same KV capacity, and the script prints each
one's requests simulated per wall second and the ratio.

**Vidur cannot simulate speculative decoding.** It runs plain decoding only, so the script
compares memtp_sim's ``no_spec`` (like for like) and memtp_sim's DSpark (speculation: drafting,
Algorithm 1, acceptance sampling every round) against the same Vidur plain-decoding run, and says
so in its output.

Vidur downloads its profiling data from the Hugging Face hub at run time. This script installs
nothing and fetches nothing: it writes Vidur profile CSVs (``mlp.csv``, ``attention.csv`` and the
unused network ones) generated from our profile's measured costs: per layer, the context-free pass
time at ``num_tokens`` split over the projections in proportion to their weights, the fixed host
cost per step in ``add``, and decode attention ``a + b x batch x context`` from the profile's
measured context slope; and it runs Vidur in a subprocess of ``--vidur-python`` (default: this
interpreter) with two of Vidur's private methods replaced so that it reads those files and never
asks the hub (``SklearnExecutionTimePredictor._get_input_files`` and
``_load_predictions_from_hf``). Vidur then fits its own random-forest predictors to them, as it
does to real profiles (setup, not timed; cached in the work folder).

Timing: memtp_sim's wall time is one ``memtp_sim.run`` call (workload, engine, metrics); Vidur's
is ``Simulator.run`` without its final output writing (plots and chrome trace off; its request and
batch metrics are kept) in a fresh process (Vidur keeps entity ids in globals, so one process
simulates once). Each is the best of ``--repeat``, the repeats taking turns (memtp_sim's two runs,
then Vidur's, again), so that a slow spell of a shared machine falls on both simulators.

    pip install -e ".[bench]"       # vidur into this environment, or point at another one:
    python benchmarks/bench_vs_vidur.py [--requests 1000] [--vidur-python /path/to/venv/bin/python]

Exit code 2 with one line when Vidur cannot be imported or run (the command and its error).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench_engine import best_of  # same folder: the script's directory is on sys.path
from memtp_sim import run
from memtp_sim.config import Scenario
from memtp_sim.hardware import load_profile
from memtp_sim.workload import load_trace

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"
PROFILE = "h200-llama31-8b-bf16"
VIDUR_MODEL = "meta-llama/Llama-3-8B"  # Vidur's built-in config: the Llama-3.1-8B shape (H 4096, 32 layers)
#: Llama-3-8B shape, as Vidur's model config has it (the profile rows must match it to be used).
SHAPE = {"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336, "use_gated_mlp": True,
         "vocab_size": 128256, "num_layers": 32}
#: Share of a layer's linear time per projection: their weights (q,k,v: 4096 x 6144; o: 4096^2;
#: gate+up: 4096 x 28672; down: 14336 x 4096), the LM head spread over layers with them.
_W = {"attn_pre_proj": 4096 * 6144, "attn_post_proj": 4096 * 4096, "mlp_up_proj": 4096 * 28672,
      "mlp_down_proj": 14336 * 4096}
SPLIT = {k: v / sum(_W.values()) for k, v in _W.items()}
MAX_TOKENS = 8192  # longest request (prompt + output) both simulators see; Vidur predicts up to it

# Runs inside --vidur-python: reads the job JSON (argv[1]), prints one JSON line.
VIDUR_DRIVER = r"""
import json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
job = json.load(open(sys.argv[1]))
from vidur.config import SimulationConfig
from vidur.execution_time_predictor import sklearn_execution_time_predictor as sk
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds

def _no_hub(self):
    raise RuntimeError("bench_vs_vidur: predictions are fitted locally")
sk.SklearnExecutionTimePredictor._get_input_files = lambda self: tuple(job["profiles"])
sk.SklearnExecutionTimePredictor._load_predictions_from_hf = _no_hub
sys.argv = ["vidur"] + job["argv"]
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
t_setup = time.perf_counter()
sim = Simulator(config)
setup_s = time.perf_counter() - t_setup
written = []
inner = sim._write_output
def timed_write():
    t = time.perf_counter(); inner(); written.append(time.perf_counter() - t)
sim._write_output = timed_write
t0 = time.perf_counter()
sim.run()
wall = time.perf_counter() - t0 - sum(written)
print(json.dumps({"wall_s": wall, "setup_s": setup_s, "sim_s": float(sim._time)}))
"""


def requests_table(n: int, time_scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival times (s, from 0, compressed by ``time_scale``), prompt and output tokens of the first
    ``n`` trace requests whose prompt + output fits ``MAX_TOKENS``."""
    tr = load_trace(str(TRACE))
    keep = (tr.prompt_tokens + tr.output_tokens) <= MAX_TOKENS
    arr, p, o = tr.arrival_s[keep][:n], tr.prompt_tokens[keep][:n], tr.output_tokens[keep][:n]
    if len(arr) < n:
        raise SystemExit(f"error: the trace has only {len(arr)} requests within {MAX_TOKENS} tokens")
    return (arr - arr[0]) * time_scale, p.astype(int), o.astype(int)


def write_traces(work: Path, arr: np.ndarray, p: np.ndarray, o: np.ndarray) -> tuple[Path, Path]:
    """The same requests in memtp_sim's trace format and in Vidur's trace-replay format."""
    ours, theirs = work / "requests_memtp.csv", work / "requests_vidur.csv"
    t0 = np.datetime64("2023-11-16T00:00:00")
    stamps = [str(t0 + np.timedelta64(round(a * 1e7) * 100, "ns")).replace("T", " ") for a in arr]
    ours.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"{s},{a},{b}\n" for s, a, b in zip(stamps, p, o)))
    theirs.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\n"
                      + "".join(f"2023-11-16,{t:.7f},{a},{b}\n" for t, a, b in zip(arr, p, o)))
    return ours, theirs


def write_vidur_profiles(work: Path, block: int) -> list[str]:
    """Vidur compute/network profile CSVs from our profile's measured costs (see module docstring);
    times in ms per layer, as Vidur's profiler writes them."""
    prof = load_profile(PROFILE)
    layers = SHAPE["num_layers"]
    common = {k: SHAPE[k] for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp",
                                    "vocab_size")}
    tokens = np.unique(np.concatenate([np.arange(1, 64), np.arange(64, 513, 8), np.geomspace(512, MAX_TOKENS, 48)
                                       .astype(int)]))
    rows = []
    for n in tokens:  # decode table up to its largest B, the prefill table beyond (both context-free)
        tab = prof.decode_table if n <= prof.decode_table.max_batch_tokens else prof.prefill_table
        lin_ms = float(tab.pass_time_s(int(n))) * 1e3 / layers
        row = {**common, "num_tensor_parallel_workers": 1, "num_tokens": int(n)}
        row.update({f"time_stats.{k}.median": lin_ms * f for k, f in SPLIT.items()})
        row.update({"time_stats.mlp_act.median": 0.0, "time_stats.attn_rope.median": 0.0,
                    "time_stats.input_layernorm.median": 0.0, "time_stats.post_attention_layernorm.median": 0.0,
                    "time_stats.add.median": prof.overheads.host_s * 1e3 / layers})
        rows.append(row)
    att = prof.decode_table.attention  # a(R) ms + b ms per KV token read, per pass
    a_ms, b_ms = float(att.a_points[0][1]), float(att.b_ms_per_kv_token)
    arows = []
    for bs in (1, 2, 4, 8, 16, 32, 64, 96, 128):
        for kv in (0, 256, 512, 1024, 2048, 4096, MAX_TOKENS):
            arows.append({"batch_size": bs, "prefill_chunk_size": 0, "kv_cache_size": kv,
                          "time_stats.attn_decode.median": (a_ms + b_ms * bs * kv) / layers,
                          "time_stats.attn_prefill.median": 0.0})
    for chunk in (32, 64, 128, 256, 512, 1024, 2048, 4096):
        for kv in (0, 256, 1024, 2048, 4096, MAX_TOKENS):
            arows.append({"batch_size": 1, "prefill_chunk_size": chunk, "kv_cache_size": kv,
                          "time_stats.attn_decode.median": 0.0,
                          "time_stats.attn_prefill.median": b_ms * kv / layers})
    for r in arows:
        r.update({"n_embd": SHAPE["n_embd"], "n_q_head": SHAPE["n_head"], "n_kv_head": SHAPE["n_kv_head"],
                  "block_size": block, "num_tensor_parallel_workers": 1, "time_stats.attn_kv_cache_save.median": 0.0})
    files = {"mlp.csv": rows, "attention.csv": arows,
             "all_reduce.csv": [{"num_workers": 1, "devices_per_node": 1, "collective": "all_reduce", "size": 8192,
                                 "time_stats.all_reduce.median": 0.0}],
             "send_recv.csv": [{"num_workers": 2, "devices_per_node": 2, "collective": "send_recv", "size": 8192,
                                "time_stats.send_recv.median": 0.0}]}
    out = []
    for name, table in files.items():
        cols = list(table[0])
        (work / name).write_text(",".join(cols) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n"
                                                                 for r in table))
        out.append(str(work / name))
    return out


def kv_blocks(block: int) -> int:
    """Our profile's KV capacity (no drafter weights), in Vidur blocks of ``block`` tokens."""
    m = load_profile(PROFILE).memory
    free = (m.gpu_allocatable_gib - m.weights_gib - m.reserve_gib) * 2**30
    return int(free // (m.kv_bytes_per_token * block))


def vidur_command(args: argparse.Namespace, work: Path, trace: Path) -> list[str]:
    """The command that runs Vidur once on the requests (a subprocess of ``args.vidur_python``),
    its profiles and job file written to ``work``."""
    block = load_profile(PROFILE).memory.kv_block_tokens
    profiles = write_vidur_profiles(work, block)
    pre = "--random_forrest_execution_time_predictor_config_"
    argv = ["--seed", "0", "--replica_config_model_name", VIDUR_MODEL, "--replica_config_device", "h100",
            "--replica_config_network_device", "h100_dgx", "--replica_config_tensor_parallel_size", "1",
            "--replica_config_num_pipeline_stages", "1", "--cache_config_block_size", str(block),
            "--cache_config_num_blocks", str(kv_blocks(block)),
            "--replica_scheduler_config_type", "sarathi",
            "--sarathi_scheduler_config_batch_size_cap", str(args.batch_cap),
            "--sarathi_scheduler_config_chunk_size", str(args.token_budget),
            "--request_generator_config_type", "trace_replay",
            "--trace_request_generator_config_trace_file", str(trace),
            "--trace_request_generator_config_date", "2023-11-16",
            "--trace_request_generator_config_prefill_scale_factor", "1",
            "--trace_request_generator_config_decode_scale_factor", "1",
            "--trace_request_generator_config_time_scale_factor", "1",
            "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
            "--execution_time_predictor_config_type", "random_forrest",
            pre + "cache_dir", str(work / "vidur_cache"), pre + "k_fold_cv_splits", "2",
            pre + "num_estimators", "100", pre + "max_depth", "16", pre + "min_samples_split", "2",
            pre + "prediction_max_tokens_per_request", str(MAX_TOKENS),
            pre + "prediction_max_prefill_chunk_size", str(args.token_budget),
            pre + "prediction_max_batch_size", str(args.batch_cap),
            pre + "attention_decode_batching_overhead_fraction", "0",
            "--metrics_config_output_dir", str(work / "vidur_out"), "--no-metrics_config_store_plots",
            "--no-metrics_config_enable_chrome_trace", "--log_level", "warning"]
    job = work / "vidur_job.json"
    job.write_text(json.dumps({"argv": argv, "profiles": profiles}))
    return [args.vidur_python, "-c", VIDUR_DRIVER, str(job)]


def run_vidur(args: argparse.Namespace, cmd: list[str], work: Path) -> dict:
    """One Vidur run in a fresh process (Vidur keeps entity ids in globals): its wall, simulated
    and setup seconds; exit code 2 with one line where it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=args.vidur_timeout, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"error: Vidur failed: {args.vidur_python} -c VIDUR_DRIVER {cmd[-1]} -> exit "
                         f"{proc.returncode}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_vidur(python: str) -> str:
    """Vidur's version under ``python``, or exit 2 with the command and its error."""
    cmd = [python, "-c", "import importlib.metadata as m, vidur.simulator; print(m.version('vidur'))"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except OSError as e:
        raise SystemExit(f"error: cannot start {python} ({e.strerror}); give --vidur-python PATH") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"error: Vidur is not importable: {' '.join(cmd[:2])} 'import vidur.simulator' -> {tail}; "
                         "pip install -e \".[bench]\", or --vidur-python PATH of an environment that has it")
    return proc.stdout.strip()


def scenario(policy: dict, trace: Path, n: int, args: argparse.Namespace) -> Scenario:
    """Our side: the same requests replayed on the same profile, caps and chunked prefill."""
    return Scenario.model_validate({
        "hardware": {"profile": PROFILE},
        "workload": {"trace": str(trace), "mode": "trace", "num_requests": n},
        "engine": {"prefill": "colocated", "max_num_seqs": args.batch_cap, "max_batch_tokens": args.token_budget,
                   "prefill_chunk_tokens": args.token_budget - args.batch_cap},  # room for every decode anchor
        "policy": policy,
    })


def main() -> None:
    """Parse the options, run both simulators, print the table."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--requests", type=int, default=1000, help="requests to replay (default 1000)")
    ap.add_argument("--time-scale", type=float, default=0.05,
                    help="multiply the trace's arrival times by this (default 0.05: 20x the trace's rate)")
    ap.add_argument("--batch-cap", type=int, default=128, help="most requests in one pass (default 128)")
    # 512: every pass stays within the profile's measured decode range (B <= 512); with larger
    # budgets memtp_sim's H200 passes that mix long prefill chunks and decodes came out negative
    # (a "Negative delay" from SimPy at the time of writing), which would make the comparison void
    ap.add_argument("--token-budget", type=int, default=512,
                    help="most tokens in one pass, prefill chunks included (default 512)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N wall times (default 3)")
    ap.add_argument("--vidur-python", default=sys.executable,
                    help="Python of an environment with vidur installed (default: this one)")
    ap.add_argument("--vidur-timeout", type=float, default=1800, help="seconds for the Vidur subprocess")
    ap.add_argument("--work", default=None, help="folder for the generated traces and profiles (default: temporary)")
    args = ap.parse_args()
    version = check_vidur(args.vidur_python)
    with tempfile.TemporaryDirectory(prefix="bench_vs_vidur_") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        arr, p, o = requests_table(args.requests, args.time_scale)
        ours_trace, vidur_trace = write_traces(work, arr, p, o)
        n = len(arr)
        print(f"{n} requests (Azure 2023 conversation, arrivals x {args.time_scale:g}; mean prompt {p.mean():.0f}, "
              f"output {o.mean():.0f} tokens), {PROFILE}, batch cap {args.batch_cap}, "
              f"{args.token_budget} tokens per pass; vidur {version} at {args.vidur_python}")
        run(scenario({"name": "dspark"}, ours_trace, min(n, 20), args), seed=0)  # warm caches
        ours = [("memtp_sim no_spec", scenario({"name": "no_spec"}, ours_trace, n, args)),
                ("memtp_sim dspark", scenario({"name": "dspark"}, ours_trace, n, args))]
        cmd = vidur_command(args, work, vidur_trace)
        best: dict[str, tuple] = {}
        for _ in range(args.repeat):  # the repeats take turns: memtp_sim's two runs, then Vidur's
            for label, scen in ours:
                wall, m = best_of(scen, 1)
                if label not in best or wall < best[label][0]:
                    best[label] = (wall, m["makespan_s"], m["num_completed"])
            v = run_vidur(args, cmd, work)
            label = f"vidur {version} (plain decoding)"
            if label not in best:
                setup_s = v["setup_s"]  # the first run fits the predictors; later ones read them back
            if label not in best or v["wall_s"] < best[label][0]:
                best[label] = (v["wall_s"], v["sim_s"], n)
        rows = [(label, *vals) for label, vals in best.items()]
    print(f"\n{'simulator':<34} {'wall_s':>8} {'simulated_s':>12} {'completed':>9} {'requests/wall_s':>16}")
    for label, wall, sim_s, done in rows:
        print(f"{label:<34} {wall:8.3f} {sim_s:12.1f} {done:9d} {done / wall:16.0f}")
    vid = rows[-1][3] / rows[-1][1]
    print(f"\nratio memtp_sim no_spec / vidur (both plain decoding): {rows[0][3] / rows[0][1] / vid:.2f}x")
    print(f"ratio memtp_sim dspark / vidur plain decoding:          {rows[1][3] / rows[1][1] / vid:.2f}x")
    print("Vidur cannot simulate speculative decoding: the dspark row simulates drafting, Algorithm 1 and "
          "acceptance every round; Vidur's row is plain decoding of the same requests.")
    print(f"Vidur setup (fitting its predictors to the generated profiles, not timed above): {setup_s:.1f} s")


if __name__ == "__main__":
    main()
