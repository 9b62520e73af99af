"""Issue 15 item 8: the black-box crash test (RocksDB ``db_crashtest.py`` style): a writer process on
a FileDevice SIGKILLed at random moments, each kill followed by a verifying reopen (every
acknowledged commit present and byte-exact, nothing unacknowledged visible).  The slow lane runs
``RETAINZ_BLACKBOX_ITERATIONS`` (500) rounds."""

from __future__ import annotations

import os

import pytest

from retainz.testing.blackbox import run

ITERATIONS = int(os.environ.get("RETAINZ_BLACKBOX_ITERATIONS", "500"))


def _summary(label, rep):
    print(f"black-box {label}: {rep.iterations} kills, {rep.commits_acknowledged} commits acknowledged, "
          f"in-flight commit present {rep.in_flight_present} / absent {rep.in_flight_absent}, "
          f"{rep.generations_verified} generations and {rep.bytes_verified} bytes verified, "
          f"{rep.seconds:.1f} s, {len(rep.failures)} failures")


def test_black_box_kills_a_few_writers(tmp_path):
    rep = run(tmp_path, 25, seed=1)
    _summary("default lane", rep)
    assert rep.failures == []
    assert rep.iterations == 25 and rep.commits_acknowledged > 25
    assert rep.generations_verified > 0 and rep.bytes_verified > 0


@pytest.mark.slow
def test_black_box_crash_test_at_scale(tmp_path):
    rep = run(tmp_path, ITERATIONS, seed=2)
    _summary("slow lane", rep)
    assert rep.failures == []
    assert rep.iterations == ITERATIONS
    # the kills land everywhere: some in-flight commits survive, others do not
    assert rep.in_flight_absent > 0 and rep.commits_acknowledged > ITERATIONS


def test_black_box_catches_a_writer_that_acknowledges_before_the_commit(tmp_path):
    """The check can fail: a writer that acknowledges a commit before ``commit()`` is caught when a
    kill lands between the acknowledgement and the commit record's flush."""
    rep = run(tmp_path, 60, seed=3, early_ack=True)
    assert any("acknowledged commits missing" in f for f in rep.failures), rep.failures[:3]


def test_cli_black_box_reports_points_and_failures(tmp_path, capsys):
    import json

    from retainz.cli import main

    assert main(["crashtest", str(tmp_path / "bb"), "--black-box", "6", "--seed", "4", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["points"] == 6 and rep["failures"] == [] and rep["commits_acknowledged"] > 0
    (tmp_path / "file").write_text("x")
    assert main(["crashtest", str(tmp_path / "file"), "--black-box", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a directory" in err
