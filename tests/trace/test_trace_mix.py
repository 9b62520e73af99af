"""``retainz trace mix``: several jobs' traces on one device, merged in step order."""

from __future__ import annotations

import json
import math

import pytest

from retainz.cli import main
from retainz.retention import parse_condition
from retainz.trace.format import CommitEvent, DeleteEvent, SaveEvent
from retainz.trace.generate import write_generated
from retainz.trace.io import read_trace
from retainz.trace.mix import mix


@pytest.fixture
def jobs(tmp_path):
    a = str(tmp_path / "a.jsonl")
    b = str(tmp_path / "b.jsonl")
    write_generated(a, "smollm2-135m-dcp", "torchtitan:interval=100,keep_latest_k=2", 600)
    write_generated(b, "smollm2-135m-dcp", "lightning:every_n_train_steps=100,save_top_k=2,metric=plateau", 600,
                    seed=3)
    return a, b


def test_mix_interleaves_in_step_order_and_keeps_each_jobs_hints(jobs, tmp_path):
    a, b = jobs
    out = str(tmp_path / "m.jsonl")
    st = mix([a, b], out, offsets=[0, 50])
    m, ta, tb = read_trace(out), read_trace(a), read_trace(b)
    assert st.jobs == 2 and st.saves == sum(isinstance(e, SaveEvent) for e in ta.events + tb.events)
    steps = [e.step for e in m.events]
    assert steps == sorted(steps)
    # each job's events, taken from the mix and un-shifted, are its own trace's events in order
    by_name = {e.gen: e.name for e in m.events if isinstance(e, SaveEvent)}
    for job, t, off in ((0, ta, 0), (1, tb, 50)):
        mine = [e for e in m.events if by_name.get(e.gen, "").startswith(f"j{job}:")]
        assert [(type(e), e.step - off) for e in mine] == [(type(e), e.step) for e in t.events]
        saves = [e for e in mine if isinstance(e, SaveEvent)]
        orig = [e for e in t.events if isinstance(e, SaveEvent)]
        for s, o in zip(saves, orig, strict=True):
            assert s.name == f"j{job}:{o.name}" and s.cls == o.cls and s.shards == o.shards
            assert s.hint.lifetime == o.hint.lifetime and s.hint.kind == o.hint.kind
            p = o.hint.reclaim_step
            assert s.hint.reclaim_step == (p if p is None or math.isinf(p) else p + off)
            if o.hint.kind == "uncertain" and parse_condition(o.hint.condition).earliest != math.inf:
                assert parse_condition(s.hint.condition).earliest == parse_condition(o.hint.condition).earliest + off
    # generation numbers are unique in the mix, and the header names every job
    gens = [e.gen for e in m.events if isinstance(e, SaveEvent)]
    assert gens == list(range(len(gens)))
    jobs_h = m.header.layout["jobs"]
    assert [j["offset"] for j in jobs_h] == [0, 50] and jobs_h[1]["retention"].startswith("lightning:")
    assert m.header.schedule["steps"] == 650
    # exact predictions still equal the deletion step, shifted with it
    dels = {e.gen: e.step for e in m.events if isinstance(e, DeleteEvent)}
    for e in m.events:
        if isinstance(e, SaveEvent) and e.hint.kind == "after_newer" and e.gen in dels:
            assert e.hint.reclaim_step == dels[e.gen]


def test_equal_steps_keep_job_order_and_commit_pairs(jobs, tmp_path):
    a, b = jobs
    out = str(tmp_path / "m.jsonl")
    mix([a, b], out)
    ev = read_trace(out).events
    # at step 100 both jobs save: job 0's save and commit come before job 1's
    at = [(type(e).__name__, e.gen) for e in ev if e.step == 100]
    assert at[:2] == [("SaveEvent", 0), ("CommitEvent", 0)]
    assert isinstance(ev[0], SaveEvent) and isinstance(ev[1], CommitEvent)


def test_mixed_trace_replays_through_the_store(jobs, tmp_path):
    from retainz.trace.replay import ReplayConfig, replay

    a, b = jobs
    out = str(tmp_path / "m.jsonl")
    mix([a, b], out, offsets=[0, 30])
    r = replay(out, ReplayConfig(policy="retainz", zones=12, zone_size=1 << 30, zone_capacity=1 << 30))
    assert r["capacity_stop_step"] is None
    assert r["generations_committed"] == sum(isinstance(e, CommitEvent) for e in read_trace(out).events)
    assert r["trace"]["layout"] == "mix:2"


def test_cli_mix_and_bad_input(jobs, tmp_path, capsys):
    a, b = jobs
    out = str(tmp_path / "m.jsonl")
    assert main(["trace", "mix", a, b, "--offsets", "0,10", "-o", out]) == 0
    assert main(["trace", "validate", out]) == 0
    assert json.loads(open(out).readline())["layout"]["name"] == "mix:2"
    assert main(["trace", "mix", a, "-o", out]) == 2
    assert "at least 2 traces" in capsys.readouterr().err
    assert main(["trace", "mix", a, b, "--offsets", "5", "-o", out]) == 2
    assert "1 offsets for 2 traces" in capsys.readouterr().err
    assert main(["trace", "mix", a, b, "--offsets", "0,-3", "-o", out]) == 2
    assert "offsets must be >= 0" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type":"header","version":7}\n')
    assert main(["trace", "mix", a, str(bad), "-o", out]) == 2
    assert "unsupported trace version 7" in capsys.readouterr().err
