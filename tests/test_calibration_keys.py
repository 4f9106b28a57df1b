"""A misspelled key in a calibration file is refused, wherever it is (a fresh user's report: a
hardware profile's ``memory.kv_blok_tokens: 12`` ran with the default 16-token blocks and no word).

The kind: every hand-read input mapping. The oracle is each shipped file itself: at every mapping
a reader checks (all but the free ones: column filters, the user's own names for drafters and
domains, Table 1's model rows, provenance), a misspelled copy of a key it holds must stop the load
with one line naming the file, the key's dotted path and ``unknown key``.
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from memtp_sim.acceptance import load_acceptance
from memtp_sim.cli import main
from memtp_sim.errors import CalibrationError
from memtp_sim.hardware.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "calibration"
FILES = sorted(CALIBRATION.glob("*/*.yaml"))
#: mappings whose keys are the user's: column filters, free notes, model rows
FREE = {"select", "parallel_select", "table1_tau", "provenance"}
#: mappings of the user's own names (drafters, domains), each value checked
NAMED = {"drafters", "domains"}


def _checked_mappings(doc, path=()):
    """The dotted paths of every mapping in ``doc`` whose keys a reader knows."""
    if not isinstance(doc, dict):
        return
    if not path or path[-1] not in NAMED:
        yield path
    for k, v in doc.items():
        if k not in FREE:
            yield from _checked_mappings(v, (*path, k))


def _copy(f: Path, doc: dict, folder: Path) -> Path:
    """``doc`` written as ``f``'s copy in ``folder``, beside a copy of the data file it names."""
    for key in ("measurements", "costs"):
        if key in doc:
            shutil.copy(f.parent / doc[key], folder / doc[key])
    out = folder / f.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.mark.parametrize("f", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_misspelled_key_anywhere_in_a_shipped_calibration_file_is_refused(tmp_path, f):
    doc = yaml.safe_load(f.read_text())
    loader = load_acceptance if f.parent.name == "acceptance" else load_profile
    loader(str(_copy(f, doc, tmp_path)))  # the copy as it is loads
    paths = list(_checked_mappings(doc))
    assert len(paths) >= (2 if f.parent.name == "acceptance" else 4), paths  # the walk reached the sections
    for i, path in enumerate(paths):
        bad_doc = copy.deepcopy(doc)
        node = bad_doc
        for k in path:
            node = node[k]
        typo = f"{next(iter(node))}x"  # a key one letter off one the mapping holds
        node[typo] = 1
        (tmp_path / str(i)).mkdir()  # a file of its own: a cache keyed by stat sees no old version
        out = _copy(f, bad_doc, tmp_path / str(i))
        want = re.escape(f"{out}: {'.'.join((*path, typo))}: unknown key; allowed: ")
        with pytest.raises(CalibrationError, match=want):
            loader(str(out))


def _refused_study(tmp_path, capsys, **base):
    """A one-run study of ``base`` (two requests, one user) that ``run`` must refuse with exit 2:
    (the study file, the lines on stderr)."""
    study = tmp_path / "s.yaml"
    trace = REPO / "data" / "traces" / "azure2023_conv.csv"
    study.write_text(yaml.safe_dump({"name": "t", "base": {
        "workload": {"trace": str(trace), "mode": "closed_loop", "concurrency": 1, "num_requests": 2}, **base},
        "seeds": [0]}))
    assert main(["run", str(study), "--out", str(tmp_path / "out")]) == 2
    return study, capsys.readouterr().err.strip().splitlines()


def test_a_misspelled_optional_profile_key_is_one_line_from_the_cli(tmp_path, capsys):
    # the report: kv_blok_tokens ran with the default block size
    src = CALIBRATION / "gfx1151" / "llama31-8b-q4km-vulkan.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["memory"]["kv_blok_tokens"] = doc["memory"].pop("kv_block_tokens", 16)
    prof = _copy(src, doc, tmp_path)
    _, err = _refused_study(tmp_path, capsys, hardware={"profile": str(prof)}, policy={"name": "no_spec"})
    assert len(err) == 1 and "memory.kv_blok_tokens: unknown key; allowed: " in err[0] and "kv_block_tokens" in err[0], err


def test_an_edited_calibration_file_is_read_again_by_the_next_run_in_the_process(tmp_path):
    # the kind: a long-running process (the dashboard) caching a file by its path alone ran on
    # the old numbers. Oracle: the new file's own figures (KV capacity follows the memory budget;
    # a per_position profile's flat acceptance 0.99 against 0.05 moves tau by far more than noise)
    from memtp_sim import Scenario, run

    src = CALIBRATION / "gfx1151" / "llama31-8b-q4km-vulkan.yaml"
    doc = yaml.safe_load(src.read_text())
    prof = _copy(src, doc, tmp_path)
    acc = tmp_path / "acc.yaml"

    def write_acceptance(c: float) -> None:
        acc.write_text(yaml.safe_dump({"name": "flat", "kind": "per_position", "sigma_request": 0.0,
                                       "sigma_round": 0.0, "domains": {"chat": {"conditional_acceptance": [c] * 4}}}))

    write_acceptance(0.99)
    trace = REPO / "data" / "traces" / "azure2023_conv.csv"
    scen = Scenario.model_validate({
        "workload": {"trace": str(trace), "mode": "closed_loop", "concurrency": 2, "num_requests": 6},
        "hardware": {"profile": str(prof)}, "acceptance": {"profile": str(acc)},
        "policy": {"name": "static", "k": 4}})
    first = run(scen, seed=0).metrics
    doc["memory"]["gpu_allocatable_gib"] = doc["memory"]["gpu_allocatable_gib"] * 2 + 0.125  # (a new size too)
    _copy(src, doc, tmp_path)
    write_acceptance(0.05)
    second = run(scen, seed=0).metrics
    assert second["kv_capacity_blocks"] > 1.9 * first["kv_capacity_blocks"], (first["kv_capacity_blocks"],
                                                                                 second["kv_capacity_blocks"])
    assert first["tau"] > 4.5 and second["tau"] < 1.2, (first["tau"], second["tau"])


def test_a_misspelled_acceptance_profile_key_is_named_at_the_profile_field(tmp_path, capsys):
    # as a hardware profile's error sits at base.hardware.profile (it sat at base.acceptance)
    doc = yaml.safe_load((CALIBRATION / "acceptance" / "dspark-qwen3.yaml").read_text())
    doc["sigma_rond"] = doc["sigma_round"]
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump(doc))
    study, err = _refused_study(tmp_path, capsys, acceptance={"profile": str(acc)}, policy={"name": "dspark"})
    assert len(err) == 1 and err[0].startswith(f"error: {study}: base.acceptance.profile: {acc}: sigma_rond: unknown key"), err
