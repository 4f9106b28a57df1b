"""``python -m memtp_sim dashboard`` start-up errors: one line, exit 2, nothing started."""

from __future__ import annotations

import socket

from memtp_sim.cli import main


def test_a_busy_port_is_one_error_line(tmp_path, capsys):
    # fault (review): werkzeug printed two lines without "error:" and exited 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rc = main(["dashboard", "--port", str(port), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines() == [f"error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in "
                                "use); another program uses it: stop it, or pass another --port (0: any free one)"]
    assert not (tmp_path / "cache").exists()  # it failed before creating anything


def test_a_port_outside_0_65535_is_refused_by_the_flag(capsys):
    # review: --port 99999 served on 34463 (99999 mod 65536); --port -1 was a traceback
    import pytest

    for bad in ("99999", "-1", "http"):
        with pytest.raises(SystemExit) as e:
            main(["dashboard", f"--port={bad}"])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("python -m memtp_sim dashboard: error: argument --port: expected a TCP port 0-65535")


def test_a_path_flag_that_is_not_there_is_one_error_line(tmp_path, capsys, monkeypatch):
    # fault (fresh user): `dashboard --study NONEXISTENT.yaml` started and served empty pages without a word
    from memtp_sim.dashboard import _app

    def started(*_):
        raise AssertionError("the server started")

    monkeypatch.setattr(_app, "_bind", started)  # a missed refusal fails here instead of serving forever
    missing, a_file = tmp_path / "NONEXISTENT.yaml", tmp_path / "a_file"
    a_file.write_text("x")
    spec = tmp_path / "tune.yaml"
    spec.write_text("name: t\n")
    cases = [(["--study", str(missing)], f"--study {missing}: takes a tuning results folder"),
             (["--study", str(spec)], f"--study {spec}: takes a tuning results folder"),  # a spec, not its results
             (["--study", str(tmp_path / "nope")], f"--study {tmp_path / 'nope'}: no Optuna study here"),
             (["--study", str(tmp_path)], f"--study {tmp_path}: no Optuna study here"),
             (["--results", str(tmp_path / "nope")], f"--results {tmp_path / 'nope'}: no such folder"),
             (["--results", str(a_file)], f"--results {a_file}: is a file"),
             (["--cache-dir", str(a_file)], f"--cache-dir {a_file}: is a file")]
    for flags, says in cases:
        rc = main(["dashboard", "--port", "0", *flags])
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: {says}"), (flags, err)
