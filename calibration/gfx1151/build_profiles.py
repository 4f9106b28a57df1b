"""Build the format-2 gfx1151 profiles from the shared measurement collection (run by hand).

    python calibration/gfx1151/build_profiles.py [PATH/TO/gfx1151_measurements.csv]

(default: ../shared/data/calibration/gfx1151_measurements.csv next to the repository). For every
model with a usable curve, at least MIN_POINTS distinct B of single-forward-pass llama-bench rows
(``measurement_kind`` "llama-bench pp, single forward pass", KV depth 0) of one build, backend and
flag set, it keeps the newest llama.cpp build, and among that build's curves with the most
measured B the best backend: the smallest geometric mean of pass time over the B they share. A
curve that fails the plausibility check of ``hardware.profile.check_curve`` gives way to the next
best. It then writes ``<name>.costs.csv`` (the curve and the drafter's measured passes, converted
by ``calibrate import --format measurements``) and ``<name>.yaml`` beside this script, and checks
that each profile loads. The collection is not needed at run time: every row keeps its source URL.

Model facts (architecture, context length, llama-bench ``model_size``) are in MODELS below, each
with its source. Qwen3.8-27B (halo-box/strix-llama.cpp PR #27, B = 1..8) is left out: its
architecture is not published in any source this collection cites, so its KV bytes per token and
weights cannot be stated.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from memtp_sim.errors import CalibrationError  # noqa: E402
from memtp_sim.hardware.importers import from_measurements_csv, write_cost_table  # noqa: E402
from memtp_sim.hardware.profile import load_profile  # noqa: E402

MIN_POINTS = 6
LHL = "https://github.com/lhl/strix-halo-testing/blob/5ee14b5b0ecfbd16b7fd0aa41a91581c32b33b61/llm-bench"
GTT_GIB = 117.1875
BANDWIDTH_GB_S = 212.0
DRAFTER_MODEL = "llama32-1b"
#: Llama-3.2-1B (the measured drafter stand-in): 1,235,814,400 parameters (model card: 1.24B), Q4_K_M
#: at the 4.894 bits per weight llama-bench reports for Q4_K_M 8B (4,912,898,304 B x 8 / 8,030,261,312).
DRAFTER_PARAMS, Q4KM_BPW = 1.2358e9, 4.894

# name key, hidden, layers, KV heads, head dim, max_model_len, model_size (llama-bench), params, notes
# Architecture: the model's Hugging Face config.json (model card); model_size / params: llama-bench's
# model_size / model_n_params in lhl/strix-halo-testing llm-bench/<model>/results.jsonl.
MODELS = {
    "GLM-4.5-Air-UD-Q4_K_XL": ("glm45-air-q4kxl", 4096, 46, 8, 128, 131072, 73028549632, 110468824832,
                               "GLM-4.5-Air (zai-org): 106B MoE, 12B active; 46 layers, 96 query / 8 KV heads of 128; 128K context"),
    "Hunyuan-A13B-Instruct-UD-Q6_K_XL": ("hunyuan-a13b-q6kxl", 4096, 32, 8, 128, 262144, 70490511104, 80393183232,
                                         "Hunyuan-A13B (tencent): 80B MoE, 13B active; 32 layers, 8 KV heads of 128; 256K context"),
    "Llama-4-Scout-17B-16E-Instruct-UD-Q4_K_XL": ("llama4-scout-q4kxl", 5120, 48, 8, 128, 10485760, 61985006336,
                                                  107769861184, "Llama 4 Scout (meta-llama): 109B MoE (16 experts), 17B "
                                                  "active; 48 layers, 40 query / 8 KV heads of 128; 10M context "
                                                  "(GGUF context_length 10,485,760)"),
    "Mistral-Small-3.1-24B-Instruct-2503-UD-Q4_K_XL": ("mistral-small31-24b-q4kxl", 5120, 40, 8, 128, 131072,
                                                       14497730560, 23572403200,
                                                       "Mistral-Small-3.1-24B (mistralai): dense; 40 layers, 32 query / "
                                                       "8 KV heads of 128; 128K context"),
    "Qwen3-235B-A22B-Instruct-2507-UD-Q3_K_XL": ("qwen3-235b-a22b-q3kxl", 4096, 94, 4, 128, 262144, 104146921472,
                                                 235093634560, "Qwen3-235B-A22B-Instruct-2507 (Qwen): 235B MoE, 22B "
                                                 "active; 94 layers, 64 query / 4 KV heads of 128; 262,144 context"),
    "Qwen3-30B-A3B-UD-Q4_K_XL": ("qwen3-30b-a3b-q4kxl", 2048, 48, 4, 128, 32768, 17709692928, 30532122624,
                                 "Qwen3-30B-A3B (Qwen): 30.5B MoE, 3.3B active; 48 layers, 32 query / 4 KV heads of 128; "
                                 "32,768 context natively"),
    "Qwen3-32B-Q8_0": ("qwen3-32b-q8", 5120, 64, 8, 128, 32768, 34811744256, 32762123264,
                       "Qwen3-32B (Qwen): dense; 64 layers, 64 query / 8 KV heads of 128; 32,768 context natively"),
    "dots.llm1.inst-UD-Q4_K_XL": ("dots1-q4kxl", 4096, 62, 32, 128, 32768, 86838137344, 142774381696,
                                  "dots.llm1.inst (rednote-hilab): 142B MoE, 14B active; 62 layers, 32 query / 32 KV "
                                  "heads of 128 (transformers Dots1Config: 62 layers, 32/32 heads); 32K context"),
    "gemma-3-27b-it-UD-Q4_K_XL": ("gemma3-27b-q4kxl", 5376, 62, 16, 128, 131072, 16819763840, 27009346304,
                                  "Gemma 3 27B (google): dense; 62 layers, 32 query / 16 KV heads of 128, 5 of 6 layers "
                                  "sliding-window (1,024); 128K context"),
    "gpt-oss-120b-F16": ("gpt-oss-120b-mxfp4", 2880, 36, 8, 64, 131072, 65355994368, 116829156672,
                         "gpt-oss-120b (openai): 117B MoE (MXFP4 experts; the GGUF is named F16), 5.1B active; 36 "
                         "layers, 64 query / 8 KV heads of 64, alternate layers sliding-window (128); 128K context"),
    "gpt-oss-20b-F16": ("gpt-oss-20b-mxfp4", 2880, 24, 8, 64, 131072, 13779630336, 20914757184,
                        "gpt-oss-20b (openai): 21B MoE (MXFP4 experts; the GGUF is named F16), 3.6B active; 24 layers, "
                        "64 query / 8 KV heads of 64, alternate layers sliding-window (128); 128K context"),
    "llama-2-7b.Q4_0": ("llama2-7b-q40", 4096, 32, 32, 128, 4096, 3825065984, 6738415616,
                        "Llama-2-7B (meta-llama): dense, multi-head attention (32 KV heads of 128); 4,096 context"),
    "llama-2-7b.Q4_K_M": ("llama2-7b-q4km", 4096, 32, 32, 128, 4096, 4080263168, 6738415616,
                          "Llama-2-7B (meta-llama): dense, multi-head attention (32 KV heads of 128); 4,096 context"),
    "shisa-v2-llama3.1-8b.i1-Q4_K_M": ("llama31-8b-q4km", 4096, 32, 8, 128, 131072, 4912898304, 8030261312,
                                       "Shisa V2 Llama-3.1-8B (Llama-3.1-8B architecture): 32 layers, 32 query / 8 KV "
                                       "heads of 128; 131,072 context"),
    "shisa-v2-llama3.3-70b.i1-Q4_K_M": ("llama33-70b-q4km", 8192, 80, 8, 128, 131072, 42512531712, 70553706560,
                                        "Shisa V2 Llama-3.3-70B (Llama-3.3-70B architecture): 80 layers, 64 query / 8 "
                                        "KV heads of 128; 131,072 context"),
}
MOE = {"GLM-4.5-Air-UD-Q4_K_XL", "Hunyuan-A13B-Instruct-UD-Q6_K_XL", "Llama-4-Scout-17B-16E-Instruct-UD-Q4_K_XL",
       "Qwen3-235B-A22B-Instruct-2507-UD-Q3_K_XL", "Qwen3-30B-A3B-UD-Q4_K_XL", "dots.llm1.inst-UD-Q4_K_XL",
       "gpt-oss-120b-F16", "gpt-oss-20b-F16"}
WINDOWED = {"gemma-3-27b-it-UD-Q4_K_XL", "gpt-oss-120b-F16", "gpt-oss-20b-F16",
            "Llama-4-Scout-17B-16E-Instruct-UD-Q4_K_XL"}


def backend_key(detail: str, fa: float) -> str:
    d = detail.lower()
    if "vulkan" in d:
        key = "vulkan-radv" if "radv" in d else "vulkan-amdvlk"
    else:
        key = "hip-rocwmma" if "rocwmma" in d else "hip"
        if "hipblaslt=1" in d:
            key += "-hipblaslt"
    return key + ("-fa" if fa == 1 else "")


def build_number(build: str) -> int:
    m = re.search(r"\((\d+)\)", str(build))
    return int(m.group(1)) if m else -1


def candidates(df: pd.DataFrame, model: str) -> list[tuple[float, pd.DataFrame]]:
    """Usable curves of one model, best first: newest build, most B, then fastest (geometric mean)."""
    s = df[(df["model"] == model) & (df["measurement_kind"] == "llama-bench pp, single forward pass")
           & (df["kv_depth"] == 0)]
    groups = []
    for _, g in s.groupby(["llama_cpp_build", "backend_detail", "flash_attn", "n_batch", "n_ubatch"], dropna=False):
        g = g.drop_duplicates("tokens_per_pass_B", keep="first")
        if g["tokens_per_pass_B"].nunique() >= MIN_POINTS:
            groups.append(g)
    if not groups:
        return []
    newest = max(build_number(g["llama_cpp_build"].iloc[0]) for g in groups)
    groups = [g for g in groups if build_number(g["llama_cpp_build"].iloc[0]) == newest]
    most = max(len(g) for g in groups)
    groups = [g for g in groups if len(g) == most]
    common = set.intersection(*(set(g["tokens_per_pass_B"]) for g in groups))
    scored = []
    for g in groups:
        t = g[g["tokens_per_pass_B"].isin(common)]["derived_pass_ms"].astype(float)
        scored.append((float(np.exp(np.log(t).mean())), g))
    return sorted(scored, key=lambda x: x[0])


def drafter_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Llama-3.2-1B pp512 and tg128 at depth 0, default HIP build (the legacy profiles' drafter)."""
    d = df[(df["model"] == DRAFTER_MODEL) & (df["kv_depth"] == 0)
           & (df["backend_detail"] == "HIP build, default FA kernels (TheRock ROCm 7)")
           & (df["test"].isin(["pp512", "tg128"]))]
    assert len(d) == 2, d
    return d


def write_profile(model: str, curve: pd.DataFrame, drafter: pd.DataFrame, tmp_csv: Path, alt: int) -> Path:
    key, hidden, layers, kvh, hd, max_len, size, params, facts = MODELS[model]
    fa = float(curve["flash_attn"].iloc[0])
    build = str(curve["llama_cpp_build"].iloc[0])
    name = f"gfx1151-{key}-{backend_key(curve['backend_detail'].iloc[0], fa)}-b{build_number(build)}"
    both = pd.concat([curve, drafter])
    both.to_csv(tmp_csv, index=False)
    rows = from_measurements_csv(tmp_csv)
    rows.loc[rows["model"] == DRAFTER_MODEL, "kind"] = "draft_model"
    # the importer names rows of the temporary file: give each its row in the shared collection
    orig = [f"(gfx1151_measurements.csv row {i + 2}," for i in both.index]
    rows["source"] = [re.sub(rf"\({re.escape(tmp_csv.name)} row \d+,", o, s) for s, o in zip(rows["source"], orig)]
    costs = HERE / f"{name}.costs.csv"
    write_cost_table(rows, costs)
    bpw = size * 8 / params
    kv = layers * kvh * hd * 2 * 2
    drafter_params = 5 * 13 * hidden ** 2
    scale = round(drafter_params / DRAFTER_PARAMS * bpw / Q4KM_BPW, 2)
    doc = profile_doc(model, name, curve, build, fa, kv, bpw, scale, drafter_params, costs.name)
    (HERE / f"{name}.yaml").write_text(header(model, alt) + yaml.safe_dump(doc, sort_keys=False, width=110))
    return HERE / f"{name}.yaml"


def header(model: str, alt: int) -> str:
    why = "" if alt == 0 else f" (the {alt + 1}. best curve: the better ones failed the plausibility check)"
    return (f"# Hardware profile: AMD Strix Halo (Radeon 8060S, gfx1151) serving {model}, written by\n"
            f"# calibration/gfx1151/build_profiles.py{why}: the newest llama.cpp build and the best backend\n"
            "# with a complete single-pass llama-bench curve in the shared collection. Every number names its\n"
            "# source or a stated assumption (SOURCES.md in this folder).\n")


def profile_doc(model: str, name: str, curve: pd.DataFrame, build: str, fa: float, kv: int, bpw: float,
                scale: float, drafter_params: int, costs: str) -> dict:
    key, hidden, layers, kvh, hd, max_len, size, params, facts = MODELS[model]
    bs = sorted(int(b) for b in curve["tokens_per_pass_B"])
    detail = str(curve["backend_detail"].iloc[0])
    url = f"{LHL}/{model}/results.jsonl"
    ms_per_kv = kv / (BANDWIDTH_GB_S * 1e9) * 1e3
    moe = " MoE: the pass time grows with the experts a batch activates, which the curve measures." if model in MOE else ""
    doc = {
        "format": 2, "name": name,
        "description": f"Verify cost from ONE measured llama-bench curve of {model} ({detail}, -fa {int(fa)}, llama.cpp "
                       f"{build}, KV depth 0), B = {', '.join(map(str, bs))}.{moe} Drafter: Llama-3.2-1B measured on "
                       f"the same chip, scaled to a 5-layer drafter at this model's width.",
        "chip": "AMD Ryzen AI Max+ 395 / Radeon 8060S (gfx1151), 128 GB LPDDR5X-8000, pre-production Framework Desktop",
        "model": model,
        "engine": f"llama.cpp {detail}, flash attention {'on' if fa == 1 else 'off'} (llama-bench)",
        "build": f"llama.cpp {build}", "costs": costs, "select": {"model": model},
        "verify": {"select": {"kind": "verify"}, "reference_context": 0, "below_min": "error", "beyond_max": "roofline",
                   "context": {"ms_per_kv_token": float(f"{ms_per_kv:.4g}"),
                               "source": f"stated: KV bytes per token ({kv}) read once per pass at the measured "
                                         f"{BANDWIDTH_GB_S:g} GB/s (rocm_bandwidth_test, lhl hardware-test); the curve "
                                         "itself is measured at KV depth 0"}},
        "caveats": caveats(model),
        "drafters": {"llama32_1b_block": drafter_section(hidden, bpw, scale, drafter_params)},
        "default_drafter": "llama32_1b_block",
        "overheads": {"host_ms_per_round": 0.0,
                      "host_source": "llama-bench times whole llama_decode calls, host work included",
                      "planner_ms_per_round": 0.05,
                      "planner_source": "assumption: a confidence-ranking policy planning on the CPU in the critical "
                                        "path; numpy Algorithm 1 takes tens of microseconds at 64 requests "
                                        "(benchmarks/bench_engine.py)"},
        "memory": memory_section(model, kv, url),
    }
    return doc


def caveats(model: str) -> list[str]:
    out = ["llama-bench pp computes logits for the last token only; a verify pass needs logits at every draft "
           "position, so the LM-head cost is understated for B > 1.",
           "Measured at KV depth 0; the context term is the stated bandwidth slope of verify.context.",
           "Measured B = 1..512; above 512 the roofline rule extrapolates and runs report extrapolated_cost_frac.",
           "Pre-production machine (lhl/strix-halo-testing, mid-2025 builds with kernel-selection cliffs that later "
           "builds changed; see SOURCES.md)."]
    if model in WINDOWED:
        out.append("Sliding-window / chunked-attention layers are counted as full-attention layers in "
                   "kv_bytes_per_token (an upper bound: llama.cpp's iSWA cache keeps only the window for them).")
    return out


def drafter_section(hidden: int, bpw: float, scale: float, drafter_params: int) -> dict:
    return {
        "kind": "block", "select": {"kind": "draft_model", "model": DRAFTER_MODEL}, "time_scale": scale,
        "note": f"Mapping (as in llama31-8b-q4km-vulkan.yaml): a 5-layer DSpark drafter at this model's width (hidden "
                f"{hidden}) holds about 5 x 13 x hidden^2 = {drafter_params / 1e9:.2f}B parameters (13 h^2 per dense "
                f"layer: Llama-3.1-8B's 218M at h = 4096) and shares the target's LM head. Its pass over n tokens is "
                f"the measured Llama-3.2-1B pass (1.24B params, Q4_K_M, 4.894 bits per weight) over n tokens, "
                f"interpolated between the measured tg128 (n = 1) and pp512 (n = 512) passes, x time_scale = "
                f"{drafter_params / 1e9:.2f}B / 1.24B x {bpw:.2f} / 4.894 bits per weight = {scale}.",
        "sequential_head": {"rank": 256, "vocab": 151936, "bytes_per_param": 2, "mem_bandwidth_gb_s": BANDWIDTH_GB_S},
        "sequential_head_source": "Markov head r x V factor read once per step (docs/model.md section 1); vocabulary "
                                  "151,936 taken for every model (the largest of these, an upper bound); 212 GB/s "
                                  "rocm_bandwidth_test (lhl hardware-test)",
        "weights_gib": round(drafter_params * bpw / 8 / 2**30, 3),
        "weights_source": f"assumption: {drafter_params / 1e9:.2f}B drafter parameters at the target's "
                          f"{bpw:.2f} bits per weight; LM head shared with the target",
    }


def memory_section(model: str, kv: int, url: str) -> dict:
    key, hidden, layers, kvh, hd, max_len, size, params, facts = MODELS[model]
    return {
        "gpu_allocatable_gib": GTT_GIB,
        "gpu_allocatable_source": "lhl/strix-halo-testing llm-bench/README.md: amdgpu gttsize=120000 (MiB) on the "
                                  "machine that measured the curve; 120000 MiB = 117.19 GiB",
        "weights_bytes": size,
        "weights_source": f"llama-bench model_size ({params:,} params), {url}",
        "kv_bytes_per_token": kv,
        "kv_source": f"{layers} layers x {kvh} KV heads x {hd} head dim x 2 (K and V) x 2 bytes (f16 cache, llama-bench "
                     f"type_k/type_v f16) = {kv} B/token; architecture from the model's config.json: {facts}",
        "kv_block_tokens": 16,
        "reserve_gib": 3.0,
        "reserve_source": "assumption: runtime context, compute buffers and logits; llama-bench's peak GTT exceeded "
                          "model_size by under 1 GiB in lhl's runs (results.jsonl gtt_peak_mib, e.g. Qwen3-235B "
                          "100,017 MiB vs 99,323 MiB of weights at pp512)",
        "max_model_len": max_len,
        "max_model_len_source": f"model card context length ({facts.rsplit('; ', 1)[-1]})",
    }


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else REPO.parent / "shared" / "data" / "calibration" / "gfx1151_measurements.csv"
    df = pd.read_csv(src)
    drafter = drafter_rows(df)
    tmp = HERE / ".build_rows.csv"
    written = []
    try:
        for model in MODELS:
            for alt, (_, curve) in enumerate(candidates(df, model)):
                path = write_profile(model, curve, drafter, tmp, alt)
                try:
                    load_profile(path)
                except CalibrationError as e:
                    print(f"skip {path.name}: {e}", file=sys.stderr)
                    path.unlink()
                    path.with_name(path.stem + ".costs.csv").unlink()
                    continue
                written.append(path)
                break
    finally:
        tmp.unlink(missing_ok=True)
    for p in written:
        prof = load_profile(p)
        print(f"{prof.name}: B {int(prof.sps.batch_tokens[0])}..{int(prof.sps.batch_tokens[-1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
