"""`python -m memtp_sim depth`: the docs/model.md section 2 formula from the command line."""

from __future__ import annotations

import json

import pytest

from memtp_sim.cli import main
from memtp_sim.telemetry import KNOWN_TELEMETRY_SOURCES


def test_reference_point_from_the_command_line(capsys):
    # docs/model.md section 2: 21.49 GiB free, 4 GiB heads -> 5 at R = 1.0, 1 at R = 0.3
    assert main(["depth", "--free-gib", "21.49", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth"] == 5
    assert main(["depth", "--free-gib", "21.49", "--coherence", "0.3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth"] == 1


def test_live_names_its_memory_source(capsys):
    assert main(["depth", "--live", "--json"]) == 0
    tel = json.loads(capsys.readouterr().out)
    assert tel["depth"] >= 1 and tel["free_gib"] > 0
    assert any(tel["source"].startswith(k.split(":")[0]) for k in KNOWN_TELEMETRY_SOURCES)


@pytest.mark.parametrize("argv, field", [
    # named as the flag the user typed, not as the library argument (r_low)
    (["depth", "--free-gib", "10", "--r-low", "0.9", "--r-high", "0.3"], "--r-low"),
    (["depth", "--free-gib", "-1"], "--free-gib"),
    (["depth", "--free-gib", "10", "--head-cost-gib", "0"], "--head-cost-gib"),
    (["depth"], "--free-gib"),
    # review: without --live the reserve was ignored (and a negative one accepted), exit 0
    (["depth", "--free-gib", "10", "--reserve-gib", "3"], "--reserve-gib: only used with --live"),
    (["depth", "--free-gib", "10", "--reserve-gib", "-3"], "--reserve-gib"),
    (["depth", "--live", "--reserve-gib", "-3"], "--reserve-gib"),
])
def test_bad_input_is_one_line_and_exit_2(argv, field, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "Traceback" not in err[0]


def test_live_says_the_reserve_it_kept_back(capsys):
    assert main(["depth", "--live", "--reserve-gib", "0.5"]) == 0
    assert " - reserve 0.5 GiB from " in capsys.readouterr().out
