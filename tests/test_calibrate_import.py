"""`calibrate import`: every measurement format from a hand-written fixture, partial curves and their
rules, one-line errors naming file / row / column, the shipped profiles, and the measurement script.

Fixtures: tests/fixtures/calibration/ (README.md there names the public source of every number).
"""

from __future__ import annotations

import argparse
import builtins
import csv
import json
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

import yaml
from pydantic import ValidationError

import memtp_sim
from memtp_sim.config import Scenario, format_validation_error, load_scenario
from memtp_sim.errors import CalibrationError, ConfigError
from memtp_sim.hardware import list_profiles, load_profile
from memtp_sim.hardware.importers import (cli_import, import_measurements, import_profile,
                                          write_cost_table)

FIX = Path(__file__).resolve().parent / "fixtures" / "calibration"
REPO = Path(__file__).resolve().parents[1]
MEM = ["gpu_allocatable_gib=20", "weights_bytes=4677120000", "kv_shape=28,4,128", "max_model_len=32768"]


def rows(df, **where):
    out = df
    for k, v in where.items():
        out = out[out[k] == v]
    return out


def ns(file, fmt, out, select=(), memory=MEM, name=None):
    return argparse.Namespace(file=str(file), fmt=fmt, select=list(select), output=str(out), name=name,
                              memory=list(memory))


# ------------------------------------------------------------------------------------ formats
def test_table_csv_and_yaml_give_the_same_passes():
    a, b = import_measurements(FIX / "table.csv", "table"), import_measurements(FIX / "table.yaml", "table")
    assert a["batch_tokens"].tolist() == b["batch_tokens"].tolist() == [1, 2, 4, 8, 16]
    assert np.allclose(a["pass_ms"], b["pass_ms"]) and a["pass_ms"].iloc[3] == pytest.approx(30.2863)
    assert set(a["num_requests"]) == {1} and (a["tokens_per_request"] == a["batch_tokens"]).all()


def test_llama_bench_jsonl_matches_the_collection_rows():
    # lhl results.jsonl lines: avg_ns / 1e6 is the collection's derived_pass_ms (same public rows)
    df = import_measurements(FIX / "llama_bench.jsonl", "llama-bench")
    with open(FIX / "measurements.csv", newline="") as f:
        coll = {r["test"]: float(r["derived_pass_ms"]) for r in csv.DictReader(f)}
    for b in (1, 2, 4):
        assert rows(df, batch_tokens=b)["pass_ms"].iloc[0] == pytest.approx(coll[f"pp{b}"], abs=1e-3)
    assert df.attrs["notes"] and "failed run" in df.attrs["notes"][0]          # bench_raw: null skipped
    assert df.attrs["meta"]["weights_bytes"] == 34811744256
    assert df.attrs["meta"]["build"] == "llama.cpp a4575513 (5863)"


def test_llama_bench_multi_pass_rule():
    # pp2048 at n_ubatch 512: 4 passes of B = 512, time / 4, at the mean start context 512 * 3 // 2
    df = import_measurements(FIX / "llama_bench.jsonl", "llama-bench")
    r = rows(df, batch_tokens=512).iloc[0]
    assert r["pass_ms"] == pytest.approx(39728.983155 / 4)
    assert r["context_tokens"] == 768 and r["num_requests"] == 1 and r["tokens_per_request"] == 512


def test_llama_bench_json_csv_markdown_and_depth_rules():
    j = import_measurements(FIX / "llama_bench.json", "llama-bench")
    c = import_measurements(FIX / "llama_bench.csv", "llama-bench")
    m = import_measurements(FIX / "llama_bench.md", "llama-bench")
    pp = rows(j, kind="verify", context_tokens=0).iloc[0]
    assert pp["batch_tokens"] == 512 and pp["pass_ms"] == pytest.approx(72.13564)
    tg = rows(j, kind="decode").iloc[0]   # tg128: 128 one-token passes, mean context (128 - 1) // 2
    assert tg["batch_tokens"] == 1 and tg["context_tokens"] == 63 and tg["pass_ms"] == pytest.approx(1076.76788 / 128)
    assert rows(j, context_tokens=512)["pass_ms"].iloc[0] == pytest.approx(512 / 6425.91 * 1e3, rel=1e-6)
    assert rows(c, kind="verify")["pass_ms"].iloc[0] == pytest.approx(70.28566)
    assert sorted(m["context_tokens"]) == [0, 63, 512, 512 + 63]
    assert rows(m, kind="verify", context_tokens=0)["pass_ms"].iloc[0] == pytest.approx(512 / 7340.20 * 1e3)
    assert m.attrs["meta"]["build"] == "llama.cpp 8cf427ff (5163)"


def test_batched_bench_table_and_jsonl():
    t = import_measurements(FIX / "batched_bench.md", "batched-bench")
    j = import_measurements(FIX / "batched_bench.jsonl", "batched-bench")
    for df in (t, j):
        r = rows(df, batch_tokens=8).iloc[0]
        assert r["num_requests"] == 8 and r["tokens_per_request"] == 1 and r["kind"] == "decode"
        assert r["pass_ms"] == pytest.approx(12317 / 64, rel=1e-3) and r["context_tokens"] == 128 + 31
    # the collection's derived_pass_ms for this row: B / S_TG = 8 / 41.57 s
    assert rows(t, batch_tokens=8)["pass_ms"].iloc[0] == pytest.approx(192.4465, rel=2e-3)


def test_gpu_costs_and_sglang_sps():
    g = import_measurements(FIX / "gpu_costs.csv", "gpu-costs")
    assert set(g["kind"]) == {"verify", "prefill", "draft_mtp", "draft_model"}
    assert rows(g, kind="prefill")["tokens_per_request"].iloc[0] == 512
    s = import_measurements(FIX / "sglang_sps.json", "sglang-sps")
    assert s["tokens_per_request"].tolist() == [8, 8, 8, 8]          # gcd of the probes' B
    assert s["num_requests"].tolist() == [1, 2, 4, 8]
    assert s["pass_ms"].iloc[0] == pytest.approx(6.4820, rel=1e-4)


def test_measurements_collection_rules():
    df = import_measurements(FIX / "measurements.csv", "measurements")
    multi = rows(df, batch_tokens=512).iloc[0]        # pp1024 in 2 passes of 512: mean start context 256
    assert multi["context_tokens"] == 256 and multi["pass_ms"] == pytest.approx(9778.1166)
    tg = rows(df, kind="decode").iloc[0]
    assert tg["context_tokens"] == 63


# ---------------------------------------------------------------------------- malformed files
@pytest.mark.parametrize("name, fmt, row, column", [
    ("bad_table.csv", "table", "3", "pass_ms"),
    ("bad_llama_bench.jsonl", "llama-bench", "2", "avg_ns"),
    ("bad_batched_bench.md", "batched-bench", "6", "T_TG s"),
    ("bad_gpu_costs.csv", "gpu-costs", "3", "batch_tokens"),
])
def test_a_malformed_file_is_one_line_naming_file_row_and_column(name, fmt, row, column):
    with pytest.raises(CalibrationError) as e:
        import_measurements(FIX / name, fmt)
    msg = str(e.value)
    assert "\n" not in msg and name in msg and f"row {row}, column {column}" in msg


def test_unknown_format_and_bad_select_are_one_line(tmp_path):
    with pytest.raises(CalibrationError, match="unknown; allowed"):
        import_measurements(FIX / "table.csv", "nope")
    with pytest.raises(CalibrationError, match="no column 'nope'"):
        cli_import(ns(FIX / "llama_bench.jsonl", "llama-bench", tmp_path / "x.yaml", select=["nope=1"]))


# ---------------------------------------------------------------------------------- cli_import
def test_import_writes_a_loadable_profile_with_sources(tmp_path, capsys):
    out = tmp_path / "chip" / "qwen25-7b.yaml"
    assert cli_import(ns(FIX / "llama_bench.json", "llama-bench", out)) == 0
    text = capsys.readouterr().out
    assert f"wrote {out.with_name('qwen25-7b.costs.csv')}" in text and f"wrote {out}" in text
    p = load_profile(out)
    assert p.build == "llama.cpp 8cf427ff (5163)" and p.chip == "NVIDIA GeForce RTX 4080"
    assert p.memory.weights_gib * 2**30 == pytest.approx(4677120000)
    assert p.memory.kv_bytes_per_token == 28 * 4 * 128 * 2 * 2
    assert p.sps.has_context_term            # pp512 at depth 0 and 512: the context slope is fitted
    assert "assumed_block" in p.drafters     # no drafter measured: the stated assumption, named so


def test_partial_curve_loads_and_its_rules_apply(tmp_path):
    out = tmp_path / "partial.yaml"
    cli_import(ns(FIX / "table_partial.csv", "table", out))
    t = load_profile(out).sps
    assert (t.below_min, t.beyond_max) == ("flat", "roofline")
    assert t.pass_time_s(1) == pytest.approx(24.8386e-3)                       # flat floor below B = 2
    assert t.pass_time_s(16) == pytest.approx((30.2863 + 8 * (30.2863 - 25.4626) / 4) * 1e-3)  # roofline
    assert not t.is_measured(16) and t.is_measured(4)


def test_a_run_reports_the_extrapolated_fraction(tmp_path):
    from memtp_sim.api import run
    from _sim_helpers import scenario

    out = tmp_path / "partial.yaml"
    cli_import(ns(FIX / "table_partial.csv", "table", out))
    sc = scenario(hardware={"profile": str(out)}, workload={"num_requests": 12, "concurrency": 4},
                  engine={"max_batch_tokens": 64, "prefill_chunk_tokens": 32})
    m = run(sc, seed=0).metrics
    assert 0.0 < m["extrapolated_cost_frac"] <= 1.0


def test_missing_memory_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "x.yaml"
    with pytest.raises(CalibrationError) as e:
        cli_import(ns(FIX / "llama_bench.json", "llama-bench", out, memory=["gpu_allocatable_gib=20"]))
    msg = str(e.value)
    assert "\n" not in msg and "kv_bytes_per_token" in msg and "max_model_len" in msg and "--memory" in msg
    assert "weights_bytes" not in msg.split(":")[2]   # llama-bench gave model_size
    assert not out.exists() and not out.with_name("x.costs.csv").exists()
    assert "write them in the memory section" not in msg  # the file it would name was never written


def test_reimport_keeps_the_hand_edited_memory_section(tmp_path):
    out = tmp_path / "t.yaml"
    cli_import(ns(FIX / "table.csv", "table", out))
    out.write_text(out.read_text().replace("max_model_len: 32768", "max_model_len: 8192"))
    cli_import(ns(FIX / "table.csv", "table", out, memory=[]))
    assert load_profile(out).memory.max_model_len == 8192


def test_several_target_models_need_a_select(tmp_path):
    with pytest.raises(CalibrationError, match="--select model=NAME"):
        cli_import(ns(_h200_as_gpu_costs(tmp_path), "gpu-costs", tmp_path / "x.yaml"))


def _h200_as_gpu_costs(tmp_path: Path) -> Path:
    """The shipped H200 cost table rewritten in the gpu-costs columns (two target models)."""
    src = REPO / "calibration" / "h200" / "costs.csv"
    out = tmp_path / "h200_gpu_costs.csv"
    with open(src, newline="") as f, open(out, "w", newline="") as g:
        w = csv.writer(g)
        w.writerow(["run", "model", "kind", "requests", "tokens_per_request", "batch_tokens", "context", "mode",
                    "median_ms", "p10_ms", "p90_ms", "reps"])
        for r in csv.DictReader(f):
            w.writerow([1, r["model"], r["kind"], r["num_requests"], r["tokens_per_request"], r["batch_tokens"],
                        r["context_tokens"], "graph", r["pass_ms"], r["p10_ms"], r["p90_ms"], 15])
    return out


def test_gpu_costs_import_of_qwen3_8b_keeps_its_drafters(tmp_path):
    out = tmp_path / "q8.yaml"
    mem = ["gpu_allocatable_gib=118.2", "weights_bytes=16381470720", "kv_shape=36,8,128", "max_model_len=32768",
           "drafter_weights_gib=0.42"]
    cli_import(ns(_h200_as_gpu_costs(tmp_path), "gpu-costs", out, select=["model=qwen3-8b"], memory=mem))
    p = load_profile(out)
    assert set(p.drafters) == {"dspark_block", "mtp", "draft_model"} and p.decode is not None
    assert p.prefill is not None and int(p.prefill.batch_tokens[-1]) == 4096
    notes = [d["note"] for d in yaml.safe_load(out.read_text())["drafters"].values()]
    assert not [n for n in notes if "measured at one" in n]  # H200 measured every drafter at many batches


def test_a_drafter_measured_at_one_batch_says_its_cost_is_held_flat(tmp_path, capsys):
    # review: the fixture's draft model and MTP step are measured at R = 1 only, and the profile
    # prices every R at that time; the import now says so among its assumptions
    out = tmp_path / "one.yaml"
    mem = ["gpu_allocatable_gib=130", "weights_bytes=16000000000", "kv_shape=36,8,128", "max_model_len=32768",
           "drafter_weights_gib=1"]
    assert cli_import(ns(FIX / "gpu_costs.csv", "gpu-costs", out, memory=mem)) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if "measured at one" in ln]
    assert said == [f"assumed: drafters.{k}: measured at one num_requests only (1): its cost is taken as the same at "
                    "every num_requests (a lower bound when more requests draft at once)" for k in ("draft_model", "mtp")]
    p = load_profile(out)
    assert p.drafters["mtp"].round_time_s(64, 1) == p.drafters["mtp"].round_time_s(1, 1)  # what the line says
    doc = yaml.safe_load(out.read_text())  # and the profile file says it, for whoever reads it later
    assert all("measured at one num_requests only (1)" in doc["drafters"][k]["note"] for k in ("draft_model", "mtp"))
    assert set(doc["drafters"]) == {"draft_model", "mtp"}


WORKLOAD = {"trace": str(REPO / "data" / "traces" / "azure2023_conv.csv"), "mode": "closed_loop", "concurrency": 2,
            "num_requests": 4}
INLINE_MEM = {"gpu_allocatable_gib": 117.1875, "weights_bytes": 4912898304, "kv_bytes_per_token": 131072,
       "max_model_len": 131072}


def test_inline_table_in_a_scenario_is_the_imported_table(tmp_path, monkeypatch):
    """A Scenario's ``hardware: {table, memory}`` prices passes exactly as ``calibrate import
    --format table`` of the same numbers does (hand values: measured points exact, linear between)."""
    monkeypatch.setenv("MEMTP_SIM_CACHE_DIR", str(tmp_path / "cache"))
    table = {1: 24.0499, 4: 25.4626, 16: 58.7391}
    sc = Scenario.model_validate({"hardware": {"table": table, "memory": INLINE_MEM, "name": "mybox"},
                                  "engine": {"max_batch_tokens": 16, "prefill_chunk_tokens": 8}, "workload": WORKLOAD})
    p = load_profile(sc.hardware.profile)
    assert p.name == "mybox" and "inline-profiles" in sc.hardware.profile
    assert p.sps.pass_time_s(4) == pytest.approx(25.4626e-3)
    assert p.sps.pass_time_s(10) == pytest.approx((25.4626 + (58.7391 - 25.4626) * 6 / 12) * 1e-3)
    # the same numbers through the CLI give the same profile
    (tmp_path / "t.yaml").write_text("1: 24.0499\n4: 25.4626\n16: 58.7391\n")
    out = tmp_path / "cli.yaml"
    cli_import(ns(tmp_path / "t.yaml", "table", out, memory=[f"{k}={v}" for k, v in INLINE_MEM.items()]))
    q = load_profile(out)
    for b in (1, 3, 4, 9, 16):
        assert p.sps.pass_time_s(b) == q.sps.pass_time_s(b)
    assert p.memory == q.memory
    # a second scenario with the same section reuses the folder; the dump validates back
    again = Scenario.model_validate(sc.model_dump())
    assert again.hardware.profile == sc.hardware.profile
    res = memtp_sim.run(Scenario.model_validate({
        "hardware": {"table": table, "memory": INLINE_MEM, "name": "mybox"}, "engine": {"max_batch_tokens": 16,
        "prefill_chunk_tokens": 8, "prefill": "disaggregated"}, "workload": WORKLOAD,
        "policy": {"name": "static", "k": 3}}), seed=0)
    assert res.metrics["num_completed"] == 4


@pytest.mark.parametrize("hw, says", [
    ({"table": {1: 10.0}, "memory": {"gpu_allocatable_gib": 10, "weights_bytes": 1, "max_model_len": 10}},
     "hardware.memory: missing kv_bytes_per_token"),
    ({"table": {}, "memory": INLINE_MEM}, "hardware.table: expected a non-empty mapping"),
    ({"table": {1: 10.0}, "memory": {**INLINE_MEM, "vram": 3}}, "hardware.memory.vram: unknown figure; allowed:"),
    ({"table": {1: 10.0}, "memory": INLINE_MEM, "profile": "h200-llama31-8b-bf16"}, "give either profile"),
    ({"table": {0: 10.0}, "memory": INLINE_MEM}, "batch_tokens"),
    ({"table": {1: -3.0}, "memory": INLINE_MEM}, "pass_ms"),
    # implausible curves name the YAML's B, not the cached profile's CSV rows
    ({"table": {1: 24.0, 16: 2.4, 64: 135.4}, "memory": INLINE_MEM}, "hardware.table: B=16: 2.4 ms at B=16 is 10.0x faster"),
    ({"table": {1: 10.0, 2: 200.0}, "memory": INLINE_MEM}, "hardware.table: B=2: 200 ms at B=2 is 20.0x slower"),
])
def test_inline_table_errors_are_one_line_naming_the_field(tmp_path, monkeypatch, hw, says):
    monkeypatch.setenv("MEMTP_SIM_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"hardware": hw, "workload": WORKLOAD}))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(f)) and says in msg, msg
    assert ".csv" not in msg and str(tmp_path / "cache") not in msg, msg  # never the cache's files


def test_write_cost_table_round_trips(tmp_path):
    from memtp_sim.hardware.tables import read_cost_table

    df = import_measurements(FIX / "gpu_costs.csv", "gpu-costs")
    write_cost_table(df, tmp_path / "c.csv")
    back = read_cost_table(tmp_path / "c.csv")
    assert back["pass_ms"].tolist() == pytest.approx(df["pass_ms"].tolist())


# ------------------------------------------------------------------------------ shipped profiles
@pytest.mark.parametrize("name", sorted(list_profiles()))
def test_every_shipped_profile_loads(name):
    p = load_profile(name)
    assert p.memory.kv_capacity_blocks(speculative=True) > 0 and p.sps.batch_tokens.size >= 3


def test_profiles_lists_chip_model_engine_build_and_range(capsys):
    from memtp_sim.cli import main

    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in list_profiles():
        block = out.split(name, 1)[1].split("\ngfx1151-", 1)[0].split("\nh200-", 1)[0]
        for field in ("chip:", "model:", "engine:", "build:", "measured: B "):
            assert field in block, (name, field)
        assert "not stated" not in block.split("drafters:")[0], name


@pytest.mark.parametrize("name", ["h200-llama31-8b-bf16", "h200-qwen3-8b-bf16", "h200-qwen3-32b-bf16"])
def test_a_tiny_run_on_each_h200_profile_completes(name):
    from memtp_sim.api import run
    from _sim_helpers import scenario

    res = run(scenario(hardware={"profile": name}, workload={"num_requests": 16, "concurrency": 4}), seed=0)
    assert res.metrics["num_completed"] == 16


# ---------------------------------------------------------------------------------- measure.py
def test_measure_parses_arguments_and_plans_without_torch():
    from memtp_sim import measure

    a = measure.build_parser().parse_args(["--model-shape", "qwen3-8b", "--out", "x.csv", "--requests", "1,8",
                                           "--tokens-per-request", "1,4", "--contexts", "1024", "--prefill", "128",
                                           "--drafters", "mtp,block"])
    plan = measure.sweep_plan(a)
    assert ("verify", 8, 4, 1024) in plan and ("prefill", 1, 128, 0) in plan
    assert ("draft_block", 8, 7, 1024) in plan and ("draft_mtp", 1, 1, 1024) in plan
    assert measure.percentile([1, 2, 3, 4], 0.5) == 2.5
    assert measure.SHAPES["qwen3-32b"].params() == 32762123264    # llama-bench model_n_params of Qwen3-32B
    assert measure.SHAPES["llama31-8b"].params() == 8030261248


def test_measure_without_torch_says_what_to_install(monkeypatch, capsys):
    from memtp_sim import measure

    real = builtins.__import__

    def no_torch(name, *args, **kw):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert measure.main(["--out", "x.csv"]) == 2
    assert 'pip install -e ".[measure]"' in capsys.readouterr().err


@pytest.mark.slow
def test_measure_tiny_cpu_run_writes_what_import_reads(tmp_path, capsys):
    pytest.importorskip("torch")
    from memtp_sim import measure

    out = tmp_path / "tiny_costs.csv"
    assert measure.main(["--model-shape", "tiny", "--draft-shape", "tiny", "--out", str(out), "--device", "cpu",
                         "--requests", "1,2,4", "--tokens-per-request", "1,2", "--contexts", "32",
                         "--prefill", "16,32", "--reps", "7", "--warmup", "2"]) == 0
    df = import_measurements(out, "gpu-costs")
    assert set(df["kind"]) == {"verify", "prefill", "draft_mtp", "draft_block", "draft_model"}
    assert (df["pass_ms"] > 0).all()
    prof = tmp_path / "cpu" / "tiny.yaml"
    assert cli_import(ns(out, "gpu-costs", prof, select=["model=tiny"],
                         memory=["gpu_allocatable_gib=4"])) == 0   # the rest comes from tiny_costs.meta.json
    p = load_profile(prof)
    assert p.memory.kv_bytes_per_token == 2 * 2 * 16 * 2 * 4 and re.search("torch", p.build)


@pytest.mark.parametrize("fixture, fmt", [("table.csv", "table"), ("gpu_costs.csv", "gpu-costs")])
def test_every_assumed_number_the_import_writes_is_printed(tmp_path, capsys, fixture, fmt):
    # review: a hand-made table got 0.5 ms of host time a round (and a note about CUDA graphs) that
    # the import never printed among its assumptions
    out = tmp_path / "p.yaml"
    mem = MEM if fmt == "table" else ["gpu_allocatable_gib=130", "weights_bytes=16000000000", "kv_shape=36,8,128",
                                      "max_model_len=32768", "drafter_weights_gib=1"]
    assert cli_import(ns(FIX / fixture, fmt, out, memory=mem)) == 0
    said = capsys.readouterr().out
    doc = yaml.safe_load(out.read_text())
    for key, source in (("host_ms_per_round", "host_source"), ("planner_ms_per_round", "planner_source")):
        if str(doc["overheads"][source]).startswith("assumption"):
            assert f"assumed: overheads.{key}: {doc['overheads'][key]} (" in said, said
    if fmt == "table":
        assert "CUDA-graph" not in doc["overheads"]["host_source"]  # nothing says the table was graph replays


def test_a_curve_that_cannot_price_one_request_is_refused_at_load_naming_the_profile(tmp_path):
    # review: a table measured from B = 4 with below_min: error loaded, then every run failed at
    # run time with "sps: no value for B=1" and no file named
    table = tmp_path / "from4.csv"
    table.write_text("batch_tokens,pass_ms\n4,25.0\n16,30.0\n64,45.0\n256,120.0\n")
    out = tmp_path / "from4.yaml"
    assert cli_import(ns(table, "table", out)) == 0
    text = out.read_text()
    assert "below_min: flat" in text  # the import's own default prices B < 4 at the B = 4 pass
    load_scenario_doc = {"hardware": {"profile": str(out)}, "workload": WORKLOAD, "engine": {"max_batch_tokens": 256, "prefill_chunk_tokens": 128}}
    Scenario.model_validate(load_scenario_doc)  # runnable as imported
    out.write_text(text.replace("below_min: flat", "below_min: error"))
    with pytest.raises(ValidationError) as e:
        Scenario.model_validate(load_scenario_doc)
    msg = format_validation_error(e.value, "s.yaml", Scenario)
    assert f"hardware.profile: {out}: its decode curve starts at B = 4 with below_min: error" in msg, msg


def test_a_refused_import_leaves_no_folder_behind(tmp_path):
    # review: a failed `calibrate import -o newdir/x.yaml` left newdir/ empty
    table = tmp_path / "cliff.csv"
    table.write_text("batch_tokens,pass_ms\n1,10.0\n2,200.0\n")  # 20x slower for one more token: implausible
    out = tmp_path / "new" / "deeper" / "x.yaml"
    with pytest.raises(CalibrationError, match="slower"):
        cli_import(ns(table, "table", out))
    assert not (tmp_path / "new").exists()


def test_a_hand_table_giving_one_pass_two_times_is_refused(tmp_path):
    # review: rows "1,10" and "1,30" were averaged to 20 ms without a word
    table = tmp_path / "dup.csv"
    table.write_text("batch_tokens,pass_ms\n1,10\n4,12\n1,30\n")
    with pytest.raises(CalibrationError) as e:
        import_measurements(table, "table")
    assert str(e.value) == (f"{table}: rows 2 and 4 both give batch_tokens 1 (num_requests 1, context_tokens 0): "
                            "10 and 30 ms; give each pass once")
    table.write_text("batch_tokens,pass_ms\n1,10\n4,12\n1,10\n")  # the same pass twice says nothing new
    assert import_measurements(table, "table")["batch_tokens"].tolist() == [1, 4, 1]


@pytest.fixture
def own_calibration(tmp_path, monkeypatch):
    """A calibration folder of our own (a copy of the default profile's folder) for name tests."""
    import shutil

    from memtp_sim.hardware import DEFAULT_PROFILE
    from memtp_sim.hardware import profile as prof

    src = prof._resolve_profile_path(DEFAULT_PROFILE)
    root = tmp_path / "cal"
    shutil.copytree(src.parent, root / src.parent.name)
    monkeypatch.setattr(prof, "calibration_dir", lambda: root)
    monkeypatch.setattr(prof, "_PROFILE_BY_NAME", {})
    return root, DEFAULT_PROFILE


def test_an_import_among_the_profiles_cannot_take_a_profiles_name(own_calibration, tmp_path):
    # review: `calibrate import -o calibration/zz/h200-llama31-8b-bf16.yaml` made that name load a
    # 6-point toy table everywhere (studies and scenarios naming the profile included), exit 0
    root, name = own_calibration
    out = root / "zz" / f"{name}.yaml"
    with pytest.raises(CalibrationError) as e:
        cli_import(ns(FIX / "table.csv", "table", out))
    assert str(e.value).startswith(f"-o {out}: the profile name {name!r} is already ") and "--name" in str(e.value)
    assert not (root / "zz").exists()
    assert cli_import(ns(FIX / "table.csv", "table", out, name="my-box")) == 0  # its own name: fine
    assert load_profile("my-box").path == str(out.resolve()) and load_profile(name).sps.batch_tokens.size > 5


def test_a_name_two_files_give_is_refused_and_the_listing_names_every_broken_file(own_calibration, capsys):
    from memtp_sim.cli import main

    root, name = own_calibration
    (root / "zz").mkdir()
    src = next(p for p in (root).glob("*/*.yaml") if f"name: {name}" in p.read_text())
    twin = root / "zz" / "twin.yaml"
    twin.write_text(src.read_text().replace("measurements: measurements.csv",
                                            f"measurements: {src.parent / 'measurements.csv'}"))
    with pytest.raises(CalibrationError, match=f"hardware profile {name!r} is the name of 2 files"):
        load_profile(name)
    (root / "zz" / "broken.yaml").write_text("name: [")                    # not YAML
    rc = main(["profiles"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert f"the profile name {name!r} is given by 2 files" in err and "broken.yaml" in err
    assert out.count("\n  path:") >= 1  # the other profiles are still listed


def test_an_implausible_input_row_is_named_in_the_inputs_terms(tmp_path):
    # review: the error named the cost table it had just removed (out/x.costs.csv, "row 10"), not
    # the user's file and row
    table = tmp_path / "t.csv"
    table.write_text("batch_tokens,pass_ms\n1,24\n4,32\n2,5\n")  # line 4: B=2 4.8x faster than B=1
    out = tmp_path / "o" / "x.yaml"
    with pytest.raises(CalibrationError) as e:
        cli_import(ns(table, "table", out))
    assert str(e.value).startswith(f"{table} row 4 (verify), pass_ms: 5 ms at B=2 is 4.8x faster"), str(e.value)
    assert str(e.value).endswith("nothing was written") and not (tmp_path / "o").exists()


# ------------------------------------------------------------- every measured pass is on a curve
def _lb_fixture_passes(path: Path) -> list[tuple[str, int, int, float]]:
    """``(pp|tg, n, depth, ms per pass)`` of a llama-bench fixture's single-pass pp and tg rows, read
    with the standard library only (the oracle: llama.cpp tools/llama-bench/README.md defines avg_ns
    as the time of the whole test, t/s as its tokens per second; a tgN test is N one-token passes)."""
    text = path.read_text()
    if path.suffix == ".md":
        out = []
        for line in text.splitlines():
            m = re.search(r"\|\s*(pp|tg)(\d+)(?: @ d(\d+))?\s*\|\s*([\d.]+) ±", line)
            if m:
                n = int(m.group(2))
                out.append((m.group(1), n, int(m.group(3) or 0), 1000.0 / float(m.group(4)) * (1 if m.group(1) == "tg" else n)))
        return out
    if path.suffix == ".json":
        recs = json.loads(text)
    elif path.suffix == ".jsonl":
        recs = [d["bench_raw"] for d in map(json.loads, text.splitlines()) if d["bench_raw"]]
    else:
        recs = list(csv.DictReader(text.splitlines()))
    out = []
    for r in recs:
        n_prompt, n_gen, ms = int(r["n_prompt"]), int(r["n_gen"]), float(r["avg_ns"]) / 1e6
        if n_gen:
            out.append(("tg", n_gen, int(r.get("n_depth") or 0), ms / n_gen))
        elif n_prompt <= 512:  # one pass (n_ubatch 512)
            out.append(("pp", n_prompt, int(r.get("n_depth") or 0), ms))
    return out


@pytest.mark.parametrize("fixture", ["llama_bench.json", "llama_bench.csv", "llama_bench.md"])
def test_a_llama_bench_runs_tg_passes_are_its_b1_point_and_price_decode(tmp_path, fixture):
    # review: the tg rows were written to the cost table but no curve selected them, so a B = 1 pass
    # cost the pp512 pass (72 ms instead of 8.4 ms) and one user decoded at 12.7 instead of 119 tok/s
    passes = _lb_fixture_passes(FIX / fixture)
    tg = sorted(p for p in passes if p[0] == "tg")
    _, n_gen, depth, tg_ms = tg[0]                                       # tg128 at depth 0
    out = tmp_path / "p.yaml"
    res = import_profile(FIX / fixture, "llama-bench", out, memory=MEM)
    p = load_profile(out)
    ctx = depth + (n_gen - 1) // 2                                       # the tg passes' mean context
    assert p.decode_table.at_context(1, ctx, ctx).pass_time_s(1) * 1e3 == pytest.approx(tg_ms, rel=1e-9)
    assert p.sps.batch_tokens.tolist() == [1, 512]
    assert res.unused == ()                                              # every written pass is read
    pp512 = next(ms for kind, n, d, ms in passes if (kind, n, d) == ("pp", 512, 0))
    assert p.sps.at_context(1, 0, 0).pass_time_s(512) * 1e3 == pytest.approx(pp512, rel=1e-9)
    # the stated drafter is 0.15 x the target's pass over the same tokens: B = 1 is the tg time
    # (the tg rows of every depth averaged, as drafter rows at one B are)
    assert p.drafter.x.tolist() == [1.0, 512.0]
    assert p.drafter.ms[0] == pytest.approx(statistics.mean(ms for *_, ms in tg), rel=1e-9)
    # one user, a 1-token prompt and n_gen decoded tokens: the benchmark's own passes
    (tmp_path / "t.csv").write_text(f"timestamp,input_length,output_length\n0,1,{n_gen + 1}\n")
    sc = Scenario.model_validate({"hardware": {"profile": str(out)}, "policy": {"name": "no_spec"},
                                  "workload": {"trace": str(tmp_path / "t.csv"), "mode": "closed_loop",
                                               "concurrency": 1, "num_requests": 1}})
    assert memtp_sim.run(sc, seed=0).metrics["tpot_ms_p50"] == pytest.approx(tg_ms, rel=0.01)



def test_a_context_slope_measured_on_prompt_passes_only_is_not_charged_to_decode(tmp_path):
    # fresh check: llama_bench.json measures pp512 at depths 0 and 512 but tg128 at depth 0 only;
    # the fit charged a one-token pass the 512-token pass's slope, so one user's decode at a
    # 1000-token context cost 23.7 ms against the 8.4 ms tg measurement. Oracle: tg measured at two
    # depths (llama_bench.md) rises 3% over 512 tokens of context; the pp pair stays as measured.
    out = tmp_path / "p.yaml"
    import_profile(FIX / "llama_bench.json", "llama-bench", out, memory=MEM)
    p = load_profile(out)
    tg = {d: ms for kind, n, d, ms in _lb_fixture_passes(FIX / "llama_bench.md") if kind == "tg"}
    assert 1.0 < tg[512] / tg[0] < 1.05
    t1_at = [p.decode_table.at_context(1, ctx, ctx).pass_time_s(1) * 1e3 for ctx in (63, 575, 1000, 4000)]
    tg0 = next(ms for kind, n, d, ms in _lb_fixture_passes(FIX / "llama_bench.json") if kind == "tg")
    assert t1_at[0] == pytest.approx(tg0, rel=1e-9)
    assert t1_at == sorted(t1_at) and t1_at[2] <= tg0 * 1.05  # was 2.8x
    with (tmp_path / "p.costs.csv").open() as f:
        pp = [r for r in csv.DictReader(f) if r["kind"] == "verify" and r["batch_tokens"] == "512"]
    for r in pp:  # both pp512 passes, each at its own context, priced as measured
        ctx = int(r["context_tokens"])
        assert p.sps.at_context(1, ctx, ctx).pass_time_s(512) * 1e3 == pytest.approx(float(r["pass_ms"]), rel=1e-6)


def test_multi_ubatch_pp_and_tg_rows_are_on_the_curve(tmp_path):
    # review (same fault): rows at a context other than the curve's reference were dropped: the
    # pp2048 row of llama_bench.jsonl (4 passes of ub = 512 at mean context 768) and the tg128 row
    # of the collection (mean context 63) beside pp1 at depth 0
    out = tmp_path / "jsonl.yaml"
    res = import_profile(FIX / "llama_bench.jsonl", "llama-bench", out, memory=MEM)
    t = load_profile(out).sps
    pp = {n: ms for kind, n, d, ms in _lb_fixture_passes(FIX / "llama_bench.jsonl")}
    assert t.batch_tokens.tolist() == [1, 2, 4, 512]
    assert t.pass_time_s(1) * 1e3 == pytest.approx(pp[1], rel=1e-9)
    assert t.pass_time_s(512) * 1e3 == pytest.approx(39728983155 / 1e6 / 4, rel=1e-9)  # pp2048: avg_ns / 4 passes
    assert res.unused == ()

    out = tmp_path / "coll.yaml"
    res = import_profile(FIX / "measurements.csv", "measurements", out, memory=MEM)
    t = load_profile(out).sps
    with open(FIX / "measurements.csv", newline="") as f:
        ms = {r["test"]: float(r["derived_pass_ms"]) for r in csv.DictReader(f)}
    # pp1 (context 0) and tg128 (mean context 63) are two measurements of B = 1, averaged; they are
    # two kinds of pass, not a context pair (their 0.5 ms difference is not a context slope)
    assert not t.has_context_term
    assert t.pass_time_s(1) * 1e3 == pytest.approx((ms["pp1"] + ms["tg128"]) / 2, rel=1e-9)
    assert t.pass_time_s(512) * 1e3 == pytest.approx(ms["pp1024"], rel=1e-9)
    assert res.unused == ()


def test_a_curve_takes_each_shape_at_its_nearest_context_and_pairs_only_one_kind(tmp_path):
    from memtp_sim.hardware.tables import read_cost_table, verify_curve
    # hand numbers: pp1 at depth 0; tg at depths 0 and 512 (mean contexts 63 and 575); pp512 at 0
    f = tmp_path / "c.csv"
    f.write_text("kind,model,batch_tokens,num_requests,tokens_per_request,context_tokens,pass_ms,p10_ms,p90_ms,source\n"
                 "verify,m,1,1,1,0,10.0,,,a\n"
                 "decode,m,1,1,1,63,10.5,,,b\n"
                 "decode,m,1,1,1,575,10.9,,,c\n"
                 "verify,m,512,1,512,0,70.0,,,d\n")
    rows = read_cost_table(f)
    fit = verify_curve(rows, where="t", reference_context=0, context="fit")
    # the one context pair is the tg one: 0.4 ms over 512 tokens (pp1 vs tg would be 0.9 ms over 575)
    assert fit.pairs == ((1, 1, 63, 10.5, 575, 10.9),)
    a = 0.4 / 512
    assert fit.table.attention.a_points == ((1.0, pytest.approx(a)),)
    assert fit.table.attention.b_ms_per_kv_token == pytest.approx(a)
    # B = 1: pp1 (context 0) and the tg row nearest context 0 (63) brought to context 0, averaged
    assert fit.table.pass_ms.tolist() == pytest.approx([(10.0 + (10.5 - a * 63)) / 2, 70.0])
    assert fit.used_rows == {2, 3, 4, 5}
    # without a context term the tg row at 63 is taken as measured
    assert verify_curve(rows, where="t", context="none").table.pass_ms.tolist() == pytest.approx([10.25, 70.0])


def test_an_import_warns_in_one_line_about_passes_no_curve_or_drafter_reads(tmp_path, capsys):
    # a second draft model in a gpu-costs file: the profile's draft_model drafter reads the first
    src = tmp_path / "two_drafts.csv"
    src.write_text((FIX / "gpu_costs.csv").read_text() + "1,llama32-1b,draft_model,1,1,1,1024,graph,3.1,3.0,3.2,15\n")
    out = tmp_path / "p.yaml"
    mem = ["gpu_allocatable_gib=130", "weights_bytes=16000000000", "kv_shape=36,8,128", "max_model_len=32768",
           "drafter_weights_gib=1"]
    assert cli_import(ns(src, "gpu-costs", out, memory=mem)) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: 1 of the 7 passes in {out.with_name('p.costs.csv')} are read by no curve or drafter of "
                   f"{out}, so they price nothing: two_drafts.csv row 8 (run 1, graph, 15 reps); edit the profile's "
                   "sections to select them (docs/calibration.md)"]


def test_bad_cells_of_a_measurement_file_are_one_line(tmp_path):
    # review: a text stddev_ns was a ValueError traceback; a t/s that makes the time overflow was
    # "sps: pass times ... must be finite" naming no file; a prefill-only file an IndexError
    f = tmp_path / "l.jsonl"
    f.write_text('{"n_prompt": 512, "n_gen": 0, "avg_ns": 72135640, "stddev_ns": "abc"}\n')
    with pytest.raises(CalibrationError, match=r"l.jsonl: row 1, column stddev_ns: 'abc' is not a number >= 0"):
        import_measurements(f, "llama-bench")
    f.write_text('{"n_prompt": 512, "n_gen": 0, "avg_ts": 1e-320}\n')
    with pytest.raises(CalibrationError, match=r"^l.jsonl row 1 \(pp512@d0: one pass\): the pass time it gives, inf ms"):
        import_measurements(f, "llama-bench")
    g = tmp_path / "prefill.csv"
    g.write_text("\n".join(ln for ln in (FIX / "gpu_costs.csv").read_text().splitlines() if "verify" not in ln) + "\n")
    with pytest.raises(CalibrationError, match="only prefill passes"):
        cli_import(ns(g, "gpu-costs", tmp_path / "p.yaml", memory=MEM + ["drafter_weights_gib=1"]))
