"""The runner: parallel workers, per-case records, refusal to overwrite, failures recorded, traces cached.

These use :class:`tests.replay_double.SyntheticReplayDouble` (closed-form metrics) so the runner's own
behaviour is tested fast; ``test_experiments_real.py`` runs the real replay on tiny traces.
"""

from __future__ import annotations

import json
import os

import pytest

from retainz.experiments.manifest import Case, case_id, expand
from retainz.experiments.record import METRIC_KEYS
from retainz.experiments.runner import RecordExistsError, run_cases
from retainz.experiments.verify import verify_dir
from retainz.runrecord import SCHEMA
from retainz.trace.io import sha256_file
from tests.replay_double import SyntheticReplayDouble, interrupt_then_resume

BASE = {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10", "steps": 5000,
        "zone_size": "64MiB", "zone_capacity": "64MiB", "max_active": 14, "max_open": 14, "pressure": 0.9}


def cases(policies, pressures=(0.9,), **defaults):
    return expand({"manifest": "t", "format": 1, "defaults": {**BASE, **defaults},
                   "blocks": [{"experiment": "pressure", "axes": {"policy": list(policies),
                                                                  "pressure": list(pressures)}}]})


def records(d):
    """The records of ``d`` as verify and analysis read them: ``*.json`` files, not the hidden ``.tmp-*``
    file a worker killed mid-write (Ctrl-C) can leave behind."""
    return {n[:-5]: json.load(open(os.path.join(d, n))) for n in os.listdir(d)
            if n.endswith(".json") and not n.startswith(".")}


def test_parallel_run_writes_one_valid_record_per_case(tmp_path):
    cs = cases(["retainz", "zenfs"], [0.5, 0.9])
    s = run_cases(cs, str(tmp_path), jobs=2, backend=SyntheticReplayDouble(delay=0.3), progress=False)
    assert (s.total, s.ok, s.failed, s.skipped) == (4, 4, [], 0)
    recs = records(tmp_path)
    assert set(recs) == {c.id for c in cs}
    assert len({r["metrics"]["worker_pid"] for r in recs.values()}) == 2          # two worker processes
    assert os.getpid() not in {r["metrics"]["worker_pid"] for r in recs.values()}
    for c in cs:
        r = recs[c.id]
        assert r["schema"] == SCHEMA and r["status"] == "ok" and r["inputs"] == c.inputs
        assert set(METRIC_KEYS) <= set(r["metrics"])
        assert r["metrics"]["waf"] == (r["metrics"]["host_bytes"] + r["metrics"]["gc_bytes"]) / r["metrics"]["host_bytes"]
        assert r["provenance"]["retainz_version"] and r["provenance"]["python"]
        assert "hostname" not in json.dumps(r["provenance"]).lower()
        assert r["timing"]["wall_seconds"] >= 0.3 and r["timing"]["cpu_seconds"] >= 0
    n, problems = verify_dir(str(tmp_path))
    assert (n, problems) == (4, [])


def test_traces_generated_once_cached_and_hashed(tmp_path):
    cs = cases(["retainz", "zenfs", "greedy"])
    run_cases(cs, str(tmp_path), jobs=2, backend=SyntheticReplayDouble(), progress=False)
    traces = [n for n in os.listdir(tmp_path / "traces") if n.endswith(".jsonl")]
    assert traces == [f"{cs[0].trace.key()}.jsonl"]                                # one spec, one trace
    sha = sha256_file(str(tmp_path / "traces" / traces[0]))
    assert {r["trace"]["sha256"] for r in records(tmp_path).values()} == {sha}
    assert {r["trace"]["file"] for r in records(tmp_path).values()} == {f"traces/{traces[0]}"}


def test_refuses_to_overwrite_and_resume_runs_only_the_missing(tmp_path):
    first = cases(["retainz"])
    run_cases(first, str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=False)
    before = (tmp_path / f"{first[0].id}.json").read_bytes()
    more = cases(["retainz", "zenfs"])
    with pytest.raises(RecordExistsError, match="refusing to overwrite"):
        run_cases(more, str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=False)
    assert set(records(tmp_path)) == {first[0].id}                                 # nothing ran
    s = run_cases(more, str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=False, resume=True)
    assert (s.ok, s.skipped) == (1, 1)
    assert (tmp_path / f"{first[0].id}.json").read_bytes() == before               # untouched
    assert set(records(tmp_path)) == {c.id for c in more}


def test_cli_refuses_an_existing_output(tmp_path, capsys):
    from retainz.cli import main

    m = {"manifest": "t", "format": 1, "defaults": BASE, "blocks": [{"experiment": "pressure",
                                                                      "axes": {"policy": ["retainz"]}}]}
    (tmp_path / "m.json").write_text(json.dumps(m))
    cid = expand(m)[0].id
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{cid}.json").write_text("{}")
    assert main(["run", str(tmp_path / "m.json"), "--output", str(out), "--no-progress"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (out / f"{cid}.json").read_text() == "{}"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_case_is_recorded_and_the_others_go_on(tmp_path, jobs):
    # The manifest refuses an unknown policy, so the failing case is injected after expansion.
    cs = [c if c.inputs["policy"] != "greedy" else Case(case_id(c.tags, {**c.inputs, "policy": "fail"}),
                                                        c.manifest, c.tags, {**c.inputs, "policy": "fail"})
          for c in cases(["retainz", "greedy", "zenfs"])]
    s = run_cases(cs, str(tmp_path), jobs=jobs, backend=SyntheticReplayDouble(), progress=False)
    bad = [c for c in cs if c.inputs["policy"] == "fail"][0]
    assert s.ok == 2 and s.failed == [bad.id]
    recs = records(tmp_path)
    assert recs[bad.id]["status"] == "failed"
    assert recs[bad.id]["error"]["type"] == "ValueError"
    assert "injected failure" in recs[bad.id]["error"]["message"]
    assert "Traceback" in recs[bad.id]["error"]["traceback"] and "replay_double.py" in recs[bad.id]["error"]["traceback"]
    assert "metrics" not in recs[bad.id]
    assert {recs[c.id]["status"] for c in cs if c is not bad} == {"ok"}
    assert verify_dir(str(tmp_path))[1] == []                                       # failed records are valid


def test_resume_runs_a_failed_case_again_and_replaces_its_record(tmp_path):
    ok_case = cases(["retainz"])[0]
    bad = Case(case_id(ok_case.tags, {**ok_case.inputs, "policy": "fail"}), ok_case.manifest, ok_case.tags,
               {**ok_case.inputs, "policy": "fail"})
    s = run_cases([ok_case, bad], str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=False)
    assert s.failed == [bad.id] and records(tmp_path)[bad.id]["status"] == "failed"
    before = (tmp_path / f"{ok_case.id}.json").read_bytes()

    class _Fixed(SyntheticReplayDouble):             # the cause of the failure is gone on the rerun
        def replay(self, trace_path, case, workdir):
            if case.inputs["policy"] == "fail":
                case = Case(case.id, case.manifest, case.tags, {**case.inputs, "policy": "retainz"})
            return super().replay(trace_path, case, workdir)

    s = run_cases([ok_case, bad], str(tmp_path), jobs=1, backend=_Fixed(), progress=False, resume=True)
    assert (s.ok, s.failed, s.skipped) == (1, [], 1)                               # only the failed one ran
    assert records(tmp_path)[bad.id]["status"] == "ok"
    assert (tmp_path / f"{ok_case.id}.json").read_bytes() == before                # the ok record untouched


class _BrokenTraces(SyntheticReplayDouble):
    def generate_trace(self, spec, path):
        raise RuntimeError("no such layout")


def test_trace_generation_failure_fails_its_cases(tmp_path):
    s = run_cases(cases(["retainz", "zenfs"]), str(tmp_path), jobs=2, backend=_BrokenTraces(), progress=False)
    assert s.ok == 0 and len(s.failed) == 2
    for r in records(tmp_path).values():
        assert r["status"] == "failed" and "trace generation failed" in r["error"]["message"]
        assert "no such layout" in r["error"]["message"]


def test_capacity_stops_are_ok_records_with_the_step(tmp_path):
    s = run_cases(cases(["greedy"], [0.5, 0.98]), str(tmp_path), jobs=1, backend=SyntheticReplayDouble(),
                  progress=False)
    assert s.ok == 2 and s.capacity_stops == 1
    stops = sorted((r["inputs"]["pressure"], r["capacity_stop_step"]) for r in records(tmp_path).values())
    assert stops[0] == (0.5, None) and stops[1][1] is not None and 0 < stops[1][1] < 5000



def test_sigint_stops_the_run_keeps_written_records_and_resume_completes(tmp_path):
    interrupt_then_resume(tmp_path, BASE, [], appear=60, stop=15, resume=120)


def test_progress_shows_cases_and_rate_without_eta_and_no_bar_on_a_rerun(tmp_path, capsys):
    cs = cases(["retainz", "zenfs"], pressures=(0.8, 0.9))
    run_cases(cs, str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=True)
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "cases: 4/4 |" in err and "case/s]" in err
    assert "<" not in err                      # no ETA: cases differ in cost by orders of magnitude
    s = run_cases(cs, str(tmp_path), jobs=1, backend=SyntheticReplayDouble(), progress=True, resume=True)
    assert s.skipped == 4 and capsys.readouterr().err == ""     # nothing to run: no (empty) bars


def test_a_case_becomes_one_replay_configuration():
    """Every replay input of a case reaches :class:`ReplayConfig` under its own name; the guest's
    command line and namespace come from the same configuration."""
    from retainz.trace.replay import ReplayConfig

    (c,) = cases(["zenfs:migrate=all"], pressures=(0.85,), reserve_zones=3, seed=5, zone_map=True,
                 verify_summaries=True)
    cfg = c.replay_config("file:/tmp/x.img")
    assert cfg == ReplayConfig(policy="zenfs:migrate=all", pressure=0.85, reserve_zones=3, zone_size=64 << 20,
                               zone_capacity=64 << 20, max_active=14, max_open=14, device="file:/tmp/x.img",
                               seed=5, zone_map=True, verify_summaries=True)
    (z,) = cases(["greedy"], pressures=(None,), zones=40, zone_size="128MiB", zone_capacity="96MiB")
    cfg = z.replay_config("/dev/nvme0n1")
    assert (cfg.zones, cfg.pressure, cfg.zone_capacity, cfg.reserve_zones) == (40, None, 96 << 20, 4)
    assert cfg.geometry(cfg.zones).nr_zones == 3 + 4 + 40          # the guest namespace's zone count
    argv = cfg.cli_args()
    assert argv[argv.index("--zones") + 1] == "40" and "--pressure" not in argv
    assert argv[argv.index("--device") + 1] == "/dev/nvme0n1"
