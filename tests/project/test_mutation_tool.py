"""``tools/mutation.py`` (``make mutation``) without running mutmut: the mutant runs' test order,
which mutants a resumed run takes up again, how a narrowed run merges into the report, and what the
report says about it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def items(*ids: str) -> list:
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_mutant_runs_take_the_fastest_tests_first_and_unknown_ones_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = items("t::slow", "t::new", "t::fast", "t::mid")
    tool.pytest_collection_modifyitems(got)                     # no stats yet: the order stands
    assert [i.nodeid for i in got] == ["t::slow", "t::new", "t::fast", "t::mid"]
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(
        {"duration_by_test": {"t::slow": 20.0, "t::fast": 0.1, "t::mid": 2.5}}))
    tool.pytest_collection_modifyitems(got)
    assert [i.nodeid for i in got] == ["t::fast", "t::mid", "t::slow", "t::new"]


def test_a_resumed_run_takes_up_survivors_and_unrun_mutants_but_not_kills_or_equivalents(tmp_path):
    meta = tmp_path / "mutants" / "src" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": 0, "m.x_f__mutmut_3": None, "m.x_f__mutmut_4": 33,
             "m.x_f__mutmut_5": 0, "m.x_f__mutmut_6": -24}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    assert tool._open_mutants(tmp_path, ["src/m.py"], {"m.x_f__mutmut_5": "why"}) == [
        "m.x_f__mutmut_2", "m.x_f__mutmut_3", "m.x_f__mutmut_4"]


def test_a_narrowed_run_replaces_its_modules_and_the_report_says_how_it_ran(tmp_path):
    old = {"date": "2026-01-01", "files": ["a.py", "b.py"], "tests": ["t1"], "skipped": {}, "only": [],
           "minutes": 5.0, "stopped": False,
           "modules": {"a.py": {"generated": 4, "killed": 2, "survived": 2, "not covered": 0, "not run": 0},
                       "b.py": {"generated": 2, "killed": 2, "survived": 0, "not covered": 0, "not run": 0}},
           "survivors": [{"name": "a1", "module": "a.py", "status": "survived", "diff": "-x\n+y"},
                         {"name": "a2", "module": "a.py", "status": "survived", "diff": "-p\n+q"}]}
    new = {"date": "2026-02-02", "files": ["a.py"], "tests": ["t1", "t2"], "skipped": {}, "only": ["a.py"],
           "minutes": 1.5, "stopped": False, "resumed": 2,
           "modules": {"a.py": {"generated": 4, "killed": 3, "survived": 1, "not covered": 0, "not run": 0}},
           "survivors": [{"name": "a2", "module": "a.py", "status": "survived", "diff": "-p\n+q"}]}
    merged = tool._merge(old, new)
    assert merged["modules"]["a.py"]["killed"] == 3 and merged["modules"]["b.py"]["killed"] == 2
    assert [s["name"] for s in merged["survivors"]] == ["a2"] and merged["tests"] == ["t1"]
    assert merged["module_dates"] == {"a.py": "2026-02-02"}
    assert merged["reruns"] == [{"date": "2026-02-02", "files": ["a.py"], "minutes": 1.5, "tests": ["t1", "t2"],
                                 "stopped": False, "resumed": 2}]
    tool.write_report({"journal": merged}, {}, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| journal | `a.py` | 4 | 3 | 1 | 0 | 0 | 0 | 75.0 % | 2026-02-02 |" in md
    assert "| journal | `b.py` | 2 | 2 | 0 | 0 | 0 | 0 | 100.0 % | 2026-01-01 |" in md
    assert "| **journal** | all | 6 | 5 | 1 | 0 | 0 | 0 | **83.3 %** | 2026-01-01 to 2026-02-02 |" in md
    assert ("Re-measured 2026-02-02 (1.5 min; resumed: 2 mutants not killed before (survivors or not run) were "
            "run again with the then current tests, earlier kills kept): `a.py`; tests: `t1`, `t2`.") in md
    assert json.loads((tmp_path / "report.json").read_text()) == {"journal": merged}


def test_the_report_sums_each_package_over_the_groups_its_modules_are_in(tmp_path):
    """The target is per package (``store/``): its files are split over the journal and store groups,
    and the by-package row sums them, less equivalents, over the mutants run."""
    def group(modules: dict, survivors: list) -> dict:
        return {"date": "2026-03-03", "files": list(modules), "tests": ["t"], "skipped": {}, "only": [],
                "minutes": 1.0, "stopped": False, "modules": modules, "survivors": survivors}

    def counts(gen, killed, survived, not_run=0):
        return {"generated": gen, "killed": killed, "survived": survived, "not covered": 0, "not run": not_run}

    journal = group({"src/retainz/store/journal.py": counts(10, 8, 2)},
                    [{"name": "j1", "module": "src/retainz/store/journal.py", "status": "survived", "diff": ""},
                     {"name": "j2", "module": "src/retainz/store/journal.py", "status": "survived", "diff": ""}])
    store = group({"src/retainz/store/store.py": counts(20, 15, 1, not_run=4),
                   "src/retainz/hint.py": counts(3, 3, 0)},
                  [{"name": "s1", "module": "src/retainz/store/store.py", "status": "survived", "diff": ""}])
    tool.write_report({"journal": journal, "store": store}, {"j2": "why"}, tmp_path)
    md = (tmp_path / "report.md").read_text()
    # store/: 30 generated, 23 killed, 2 survived (j1, s1), 1 equivalent (j2), 4 not run: 23 / 25
    assert "| `retainz/store/` | 30 | 23 | 2 | 0 | 1 | 4 | 92.0 % |" in md
    assert "| `retainz/` | 3 | 3 | 0 | 0 | 0 | 0 | 100.0 % |" in md


def test_bad_flags_are_refused_before_any_run_with_exit_2(tmp_path, monkeypatch, capsys):
    """A bad flag must not start mutmut nor remove a group's scratch copy (a run replaces it)."""
    import pytest

    ran = []
    monkeypatch.setattr(tool, "_run_group", lambda *a, **k: ran.append(a))
    out = ["--out", str(tmp_path)]
    for argv, message in ((["--budget", "-1"], "--budget must be a number of minutes >= 0 (0: no limit), not -1.0"),
                          (["--budget", "nan"], "--budget must be a number of minutes >= 0"),
                          (["--max-children", "0"], "--max-children must be at least 1, not 0"),
                          (["--unrun"], "--unrun goes with --resume"),
                          (["--groups", ","], "--groups names no group; valid: placement, journal, store, retention"),
                          (["--groups", "nosuch"], "unknown group(s) nosuch; valid: placement, journal"),
                          (["--only", "nosuchfile.py"], "--only nosuchfile.py: no file of group(s) (none) matches"),
                          (["--groups", "placement", "--only", "store/journal.py"],
                           "--only store/journal.py: no file of group(s) placement matches"),
                          (["--report-only"], f"--report-only: no report.json in {tmp_path} to rewrite")):
        with pytest.raises(SystemExit) as e:
            tool.main(argv + out)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err.splitlines()[-1], (argv, err)
    assert ran == []


def test_only_without_groups_runs_the_groups_holding_those_files(tmp_path, monkeypatch):
    ran = []

    def fake(name, group, only, *a, **k):
        ran.append((name, tuple(only)))
        return {"date": "2026-04-04", "files": [], "tests": [], "skipped": {}, "only": only, "modules": {},
                "survivors": [], "minutes": 0.0, "stopped": False, "resumed": None}

    monkeypatch.setattr(tool, "_run_group", fake)
    assert tool.main(["--only", "store/journal.py", "store/store.py", "--out", str(tmp_path)]) == 0
    assert ran == [("journal", ("store/journal.py", "store/store.py")),
                   ("store", ("store/journal.py", "store/store.py"))]


def test_a_new_time_limit_reruns_the_timeouts_and_an_interrupted_mutant_counts_as_not_run(tmp_path):
    """Timeouts count as kills, so a limit a loaded machine could trip is widened and the mutants it
    stopped run again; a mutant whose run was interrupted (mutmut's exit code 2) was never checked."""
    meta = tmp_path / "mutants" / "src" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": -24, "m.x_f__mutmut_3": 2, "m.x_f__mutmut_4": 0,
             "m.x_f__mutmut_5": 152, "m.x_f__mutmut_6": None}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    assert tool._open_mutants(tmp_path, ["src/m.py"], {}, unrun_only=True) == ["m.x_f__mutmut_3", "m.x_f__mutmut_6"]
    assert tool._open_mutants(tmp_path, ["src/m.py"], {"m.x_f__mutmut_5": "why"}, unrun_only=True, timeouts=True) == [
        "m.x_f__mutmut_2", "m.x_f__mutmut_3", "m.x_f__mutmut_6"]
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.mutmut]\ntimeout_multiplier = 3.0\nalso_copy = ["examples"]\n')
    assert tool._retime(tmp_path) is True
    assert f"timeout_multiplier = {tool.TIMEOUT_MULTIPLIER}\n" in config.read_text()
    assert tool._retime(tmp_path) is False                           # already today's limit: nothing reruns
    group = {"date": "2026-05-05", "files": ["src/m.py"], "tests": ["t"], "skipped": {}, "only": [], "minutes": 1.0,
             "stopped": False, "survivors": [],
             "modules": {"src/m.py": {"generated": 6, "killed": 3, "survived": 1, "not covered": 0, "not run": 2,
                                      "timeouts": 2}}}
    tool.write_report({"store": group}, {}, tmp_path)
    assert "| store | `m.py` | 6 | 3 (2 timed out) | 0 | 0 | 0 | 2 | 75.0 % | 2026-05-05 |" in (
        tmp_path / "report.md").read_text()
