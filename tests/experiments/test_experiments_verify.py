"""``retainz verify``: valid records pass; tampered ones (waf, hashes, missing fields, ids) are caught."""

from __future__ import annotations

import json
import os

import pytest

from retainz.cli import main
from retainz.experiments.manifest import expand
from retainz.experiments.record import finalize
from retainz.experiments.runner import run_cases
from retainz.experiments.verify import verify_dir
from tests.replay_double import SyntheticReplayDouble

BASE = {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10", "steps": 5000,
        "zone_size": "64MiB", "zone_capacity": "64MiB", "max_active": 14, "max_open": 14, "pressure": 0.9}


@pytest.fixture
def run_dir(tmp_path):
    cs = expand({"manifest": "t", "format": 1, "defaults": BASE,
                 "blocks": [{"experiment": "pressure", "axes": {"policy": ["retainz", "zenfs"]}}]})
    run_cases(cs, str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=False)
    return tmp_path, sorted(c.id for c in cs)


def edit(d, cid, fn, *, redigest):
    p = os.path.join(d, f"{cid}.json")
    rec = json.load(open(p))
    fn(rec)
    if redigest:
        rec = finalize(rec)
    json.dump(rec, open(p, "w"))


def test_valid_records_pass_and_cli_says_so(run_dir, capsys):
    d, _ = run_dir
    assert verify_dir(str(d)) == (2, [])
    assert main(["verify", str(d)]) == 0
    assert "2 records checked, 0 problems" in capsys.readouterr().out


def test_wrong_waf_is_caught_even_with_a_fresh_digest(run_dir, capsys):
    d, ids = run_dir
    edit(d, ids[0], lambda r: r["metrics"].update(waf=r["metrics"]["waf"] + 0.01), redigest=True)
    _, problems = verify_dir(str(d))
    assert len(problems) == 1 and "waf" in problems[0] and "(host_bytes + gc_bytes) / host_bytes" in problems[0]
    assert main(["verify", str(d)]) == 1
    assert ids[0] in capsys.readouterr().out


def test_any_edit_breaks_the_digest(run_dir):
    d, ids = run_dir
    edit(d, ids[1], lambda r: r["metrics"].update(gc_bytes=r["metrics"]["gc_bytes"] + 4096), redigest=False)
    problems = verify_dir(str(d))[1]
    assert any("digest mismatch" in p for p in problems)
    assert any("waf" in p for p in problems)


def test_wrong_trace_hash_is_caught(run_dir):
    d, ids = run_dir
    edit(d, ids[0], lambda r: r["trace"].update(sha256="0" * 64), redigest=True)
    problems = verify_dir(str(d))[1]
    assert any("differs from the cached trace file" in p for p in problems)
    assert any("has sha256" in p for p in problems)                 # disagrees with the other record


def test_tampered_cached_trace_is_caught(run_dir):
    d, _ = run_dir
    t = [n for n in os.listdir(d / "traces") if n.endswith(".jsonl")][0]
    with open(d / "traces" / t, "a") as f:
        f.write("{}\n")
    problems = verify_dir(str(d))[1]
    assert len(problems) == 2 and all("cached trace file" in p for p in problems)


@pytest.mark.parametrize("field", ["metrics", "provenance", "digest", "inputs"])
def test_missing_field_is_caught(run_dir, field):
    d, ids = run_dir
    edit(d, ids[0], lambda r: r.pop(field), redigest=field != "digest")
    problems = verify_dir(str(d))[1]
    assert any(f"missing field(s) {field}" in p for p in problems)


def test_missing_metric_and_changed_inputs_are_caught(run_dir):
    d, ids = run_dir
    edit(d, ids[0], lambda r: r["metrics"].pop("resets"), redigest=True)
    edit(d, ids[1], lambda r: r["inputs"].update(pressure=0.5), redigest=True)
    problems = verify_dir(str(d))[1]
    assert any("metrics lack resets" in p for p in problems)
    assert any("does not match its tags and inputs" in p for p in problems)


def test_capacity_stop_must_agree_and_lie_within_the_trace(run_dir):
    d, ids = run_dir
    edit(d, ids[0], lambda r: r.update(capacity_stop_step=10**9) or r["metrics"].update(capacity_stop_step=10**9),
         redigest=True)
    assert any("outside the trace's steps" in p for p in verify_dir(str(d))[1])


def test_empty_or_unreadable(tmp_path):
    assert verify_dir(str(tmp_path))[1] == [f"{tmp_path}: no records"]
    (tmp_path / "x.json").write_text("{oops")
    assert "unreadable" in verify_dir(str(tmp_path))[1][0]
