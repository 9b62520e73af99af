"""Mutation testing of the core (``make mutation``): how much of what the tests claim do they catch?

Runs mutmut 3 (the ``mutation`` extra) over each module group below against the fast lane's tests
for that group (``-m "not slow and not zns_guest and not payload and not dcp"``), in a scratch copy of
the tree (``out/mutation/<group>``: mutmut writes its mutants next to the sources it mutates), and
records what it found in ``results/mutation/report.json`` and ``report.md``:

* per module: mutants generated, killed (a test failed or timed out), survived (no test failed),
  not covered (no selected test runs the function), equivalent, and the kill rate
  ``killed / (generated - equivalent)``;
* every surviving mutant with its diff, unless ``results/mutation/equivalent.json`` marks it
  equivalent (``{"mutant name": "one-line reason"}``): a mutant that changes no behaviour a caller can
  observe (an error message's wording is *not* such a change: its test should check the text).

Groups that were not run keep their previous entry (with its date) in the report.  A full run takes
hours on 2 cores, so this never runs in CI; ``--groups`` picks groups, ``--only`` narrows a group to
some of its files (their rows and survivors replace the earlier ones of the group).  mutmut runs each mutant only against the selected tests that execute the mutated
function (it records which tests reach which function in a first, instrumented run), and this file,
loaded into those runs as a pytest plugin, orders them fastest first: with ``-x`` a killed mutant
stops at its cheapest failing test, and only a survivor pays for the power-cut campaigns.
``--resume`` re-runs, in an ``--only`` run's scratch copy and with today's tests, just the mutants
that survived or were never run (less those marked equivalent): adding tests cannot revive a killed
mutant, so its kill stands; the report says which figures were resumed.

Usage: ``python tools/mutation.py [--groups placement,journal] [--only FILE ...] [--max-children N]
[--budget MIN] [--resume]``.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST_LANE = "not slow and not zns_guest and not payload and not dcp"

#: group -> files to mutate (globs, relative to the repository), files left out (with the reason
#: printed in the report), and the fast-lane tests run against them.
GROUPS: dict[str, dict] = {
    "placement": {
        # the hint vocabulary placement reads (lifetime classes) and the policy spec grammar
        "mutate": ["src/retainz/placement/*.py", "src/retainz/hint.py", "src/retainz/spec.py"],
        "skip": {},
        "tests": ["tests/placement/test_placement_controls.py", "tests/placement/test_placement_table.py", "tests/placement/test_hint_routes.py",
                  "tests/placement/test_placement_retainz.py", "tests/placement/test_placement_zenfs.py", "tests/placement/test_zenfs_active_limit.py",
                  "tests/placement/test_store_placement.py"],
    },
    "journal": {
        "mutate": ["src/retainz/store/journal.py", "src/retainz/store/records.py", "src/retainz/store/metalog.py"],
        "skip": {},
        # the journal's own tests, and the store's fast ones that journal moves, hints and refusals of
        # a full journal (the power-cut campaigns reach every journal function and would run for every
        # mutant: minutes each on 2 cores)
        "tests": ["tests/store/test_store_journal.py", "tests/store/test_store_corruption.py", "tests/store/test_store_readonly.py",
                  "tests/store/test_store_metalog.py", "tests/store/test_store_admission.py", "tests/store/test_store_gc.py",
                  "tests/store/test_store_hint_update.py", "tests/store/test_store_journal_scan.py"],
    },
    "store": {
        "mutate": ["src/retainz/store/*.py"],
        "skip": {"src/retainz/store/journal.py": "its own group (journal)",
                 "src/retainz/store/records.py": "its own group (journal)",
                 "src/retainz/store/metalog.py": "its own group (journal)",
                 # mutmut wraps the Protocol's stubs in trampolines that break inspect.signature on them
                 "src/retainz/store/contract.py": "Protocol declarations only, no statement to mutate "
                                                  "(tests/store/test_store_contract.py checks the store keeps them)"},
        "tests": ["tests/store/test_store_api.py", "tests/store/test_store_corruption.py", "tests/store/test_store_gc.py",
                  "tests/store/test_store_journal.py", "tests/store/test_store_metrics.py",
                  "tests/placement/test_store_placement.py", "tests/store/test_store_readonly.py",
                  "tests/store/test_store_recovery.py", "tests/store/test_store_stateful.py", "tests/cli/test_store_cli.py",
                  # I/O errors (zone reconcile, failed resets), replacement, hint updates, admission
                  "tests/store/test_store_io_errors.py", "tests/store/test_store_replace.py", "tests/store/test_store_hint_update.py",
                  "tests/store/test_store_admission.py", "tests/store/test_store_time_order.py",
                  # the format's version refusal and the contract the rest of the code calls
                  "tests/store/test_store_format_version.py", "tests/store/test_store_contract.py",
                  "tests/store/test_store_writer.py", "tests/store/test_store_metalog.py", "tests/store/test_store_crc.py"],
    },
    "retention": {
        "mutate": ["src/retainz/retention/*.py"],
        "skip": {},
        # inference and the hint routes are tested with the mount's layout and the hint routes
        "tests": ["tests/retention/test_retention.py", "tests/trace/test_replay.py", "tests/placement/test_hint_routes.py",
                  "tests/mount/test_mount_layout.py", "tests/dcp/test_rehint_on_resume.py"],
    },
}

#: pytest plugins installed with the dependencies that no test uses (``-p no:NAME``).
UNUSED_PLUGINS = ("typeguard", "anyio", "platformdirs")

STATUS = {1: "killed", 3: "killed", 36: "killed", 24: "killed", -24: "killed", 152: "killed", 255: "killed",
          0: "survived", 5: "not covered", 33: "not covered", None: "not run",
          2: "not run"}   # mutmut's "check was interrupted by user": a run stopped by its budget
#: mutmut's exit codes of a mutant stopped by its time limit (counted as killed, and shown apart).
TIMEOUT_CODES = frozenset({36, 24, -24, 152, 255})
#: A mutant's time limit, as a multiple of its tests' recorded time: mutmut stops it after
#: ``2 x (t + 1) x`` this in CPU seconds or ``(t + 1) x`` this in wall seconds.  The wall limit
#: also stops a mutant that is only slow because the machine is loaded, and that would count as a
#: kill: 3 x turned survivors into timeouts on 2 cores shared with other work, so the margin is
#: wide (mutmut's default, 30 x, let one hung mutant run 43 minutes).
TIMEOUT_MULTIPLIER = 10.0


def _files(group: dict, only: list[str]) -> list[str]:
    out = []
    for pattern in group["mutate"]:
        for p in sorted(ROOT.glob(pattern)):
            rel = p.relative_to(ROOT).as_posix()
            if rel in group["skip"] or p.name == "__init__.py" and p.stat().st_size < 64:
                continue
            if only and not any(fnmatch.fnmatch(rel, o) or rel.endswith(o) for o in only):
                continue
            out.append(rel)
    return out


def _workdir(name: str, only: list[str]) -> Path:
    """The scratch copy of a group's run (one per ``--only`` selection, so runs of other files keep theirs)."""
    tag = "-".join(Path(o).stem for o in only)
    return ROOT / "out" / "mutation" / (f"{name}-{tag}" if tag else name)


def _scratch(name: str, group: dict, files: list[str], only: list[str]) -> Path:
    work = _workdir(name, only)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for d in ("src", "tests", "examples"):   # examples: the CLI tests run examples/lifecycle.py
        shutil.copytree(ROOT / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    config = (ROOT / "pyproject.toml").read_text()
    config += "\n[tool.mutmut]\n" + "\n".join([
        'source_paths = ["src/retainz"]',
        f"only_mutate = {json.dumps(files)}",
        # -p mutation: this file, as the pytest plugin below (fastest tests first)
        f'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "mutation", "-q", "-m", "{FAST_LANE}"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(group['tests'])}",
        "use_git_change_detection = false",
        # a mutant that hangs a test loop (a store that never fills) is stopped; a timeout counts as killed
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
        'also_copy = ["examples"]',
    ]) + "\n"
    (work / "pyproject.toml").write_text(config)
    return work


def _open_mutants(work: Path, files: list[str], equivalent: dict[str, str], unrun_only: bool = False,
                  timeouts: bool = False) -> list[str]:
    """Mutants of ``files`` in the scratch copy ``work`` that survived or were never run (``unrun_only``:
    only those never run), and those that timed out when ``timeouts`` (their time limit changed), less
    those marked equivalent (they would survive again: a full run of the tests for nothing)."""
    names = []
    for rel in files:
        meta = work / "mutants" / (rel + ".meta")
        if meta.exists():
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            names += [k for k, code in codes.items() if k not in equivalent and (
                      timeouts and code in TIMEOUT_CODES
                      or STATUS.get(code, "survived") != "killed" and (STATUS.get(code) == "not run"
                                                                       or not unrun_only))]
    return names


def _retime(work: Path) -> bool:
    """Give a scratch copy today's :data:`TIMEOUT_MULTIPLIER`; True if it had another one (mutmut
    then runs its timed-out mutants again)."""
    config = (work / "pyproject.toml").read_text()
    old = tomllib.loads(config)["tool"]["mutmut"].get("timeout_multiplier")
    if old == TIMEOUT_MULTIPLIER:
        return False
    (work / "pyproject.toml").write_text(config.replace(f"timeout_multiplier = {old}",
                                                        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}"))
    return True


def _run_group(name: str, group: dict, only: list[str], max_children: int, budget: float = 0,
               collect: bool = False, known: dict[str, str] | None = None, resume: bool = False,
               equivalent: dict[str, str] | None = None, unrun_only: bool = False) -> dict:
    files = _files(group, only)
    if not files:
        raise SystemExit(f"group {name}: no file matches {only}")
    work = _workdir(name, only)
    mutmut = Path(sys.executable).with_name("mutmut")
    started = datetime.datetime.now(datetime.UTC)
    stopped = False
    retried: list[str] = []
    tests = group["tests"]
    if collect:   # an earlier (possibly stopped) run's results, from its scratch copy
        if not (work / "mutants").is_dir():
            raise SystemExit(f"group {name}: nothing to collect in {work}")
        started = datetime.datetime.fromtimestamp((work / "mutmut.log").stat().st_mtime, datetime.UTC)
    elif resume:  # the same scratch copy with today's tests: only survivors and unrun mutants run again
        if not (work / "mutants").is_dir():
            raise SystemExit(f"group {name}: nothing to resume in {work}")
        shutil.rmtree(work / "tests")
        shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        retried = _open_mutants(work, files, equivalent or {}, unrun_only, timeouts=_retime(work))
        # the scratch copy keeps the test files it was made with (a new selection would reset mutmut's results)
        tests = tomllib.loads((work / "pyproject.toml").read_text())["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    else:
        work = _scratch(name, group, files, only)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work / "mutants" / "src"), str(ROOT / "tools")]),
               # every mutant starts pytest afresh: skip the plugins no test uses (a third of its start-up);
               # an environment variable, not mutmut's pytest arguments, whose change would void a run's results
               PYTEST_ADDOPTS=" ".join(f"-p no:{p}" for p in UNUSED_PLUGINS))
    if not collect and (retried or not resume):
        # subprocesses (CLI tests) import the mutated tree too; the directory must exist before
        # Python starts, or its import machinery caches it as missing
        (work / "mutants" / "src").mkdir(parents=True, exist_ok=True)
        print(f"== {name}: mutmut over {len(files)} file(s)" + (f", re-running {len(retried)} mutants" if resume
              else "") + f", tests: {' '.join(tests)}", flush=True)
        with open(work / "mutmut.log", "a" if resume else "w") as log:
            # SIGINT stops mutmut at the budget: a job started in the background inherits it ignored
            proc = subprocess.Popen([str(mutmut), "run", "--max-children", str(max_children), *retried], cwd=work,
                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            try:
                code = proc.wait(timeout=budget * 60 if budget else None)
            except subprocess.TimeoutExpired:   # out of time: stop, keep what was measured
                proc.send_signal(signal.SIGINT)
                code = proc.wait()
                stopped = True
        if code and not stopped:
            print((work / "mutmut.log").read_text()[-3000:])
            raise SystemExit(f"group {name}: mutmut exited {code} (log: {work / 'mutmut.log'})")
    modules: dict[str, dict] = {}
    survivors = []
    for rel in files:
        meta = work / "mutants" / (rel + ".meta")
        counts = {"generated": 0, "killed": 0, "survived": 0, "not covered": 0, "not run": 0, "timeouts": 0}
        if meta.exists():
            for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
                status = STATUS.get(code, "survived")
                counts["generated"] += 1
                counts[status] += 1
                counts["timeouts"] += code in TIMEOUT_CODES
                if status in ("survived", "not covered"):
                    survivors.append({"name": key, "module": rel, "status": status,
                                      "diff": (known or {}).get(key) if collect else None})
        modules[rel] = counts
    # a run that finished its mutants while being stopped (or ignored the signal) was not cut short
    stopped = stopped and any(c["not run"] for c in modules.values())
    todo = [(s["name"], s["module"]) for s in survivors if s["diff"] is None]
    if todo:   # what `mutmut show` prints, for all of them in one process
        out = subprocess.run([sys.executable, "-c", _DIFFS, json.dumps(todo)], cwd=work, env=env, text=True,
                             stdout=subprocess.PIPE, check=True).stdout
        diffs = json.loads(out)
        for s in survivors:
            if s["diff"] is None:
                s["diff"] = _diff_body(diffs[s["name"]])
    minutes = round((datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60, 1)
    if collect:
        minutes = None
    return {"date": started.strftime("%Y-%m-%d"), "files": files, "tests": tests,
            "skipped": group["skip"], "only": only, "modules": modules, "survivors": survivors,
            "minutes": minutes, "stopped": stopped or collect and any(c["not run"] for c in modules.values()),
            "resumed": len(retried) if resume else None}


def pytest_collection_modifyitems(items: list) -> None:
    """pytest hook: in a mutant's run (this file is loaded as a plugin, ``-p mutation``) the selected
    tests run fastest first, by the durations mutmut recorded in its instrumented run
    (``mutmut-stats.json``, in the working directory of the mutant runs); with ``-x`` a killed mutant
    then stops at its cheapest failing test instead of after a power-cut campaign.  Which tests run,
    and so what a kill means, is unchanged; outside a mutant run (no stats file) the order is kept."""
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    took = json.loads(stats.read_text()).get("duration_by_test", {})
    items.sort(key=lambda item: took.get(item.nodeid, float("inf")))


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps({name: get_diff_for_mutant(name, path=path) for name, path in json.loads(sys.argv[1])}))
"""


def _merge(old: dict | None, new: dict) -> dict:
    """A run narrowed by ``--only`` replaces its modules' rows and survivors in the group's entry."""
    if not old:
        return new
    mods = set(new["modules"])
    out = dict(old)
    out["modules"] = {**old["modules"], **new["modules"]}
    out["module_dates"] = {**old.get("module_dates", {}), **{m: new["date"] for m in mods}}
    out["survivors"] = [s for s in old["survivors"] if s["module"] not in mods] + new["survivors"]
    out["reruns"] = old.get("reruns", []) + [{"date": new["date"], "files": sorted(mods),
                                             "minutes": new["minutes"], "tests": new["tests"],
                                             "stopped": new["stopped"], "resumed": new.get("resumed")}]
    return out


def _diff_body(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith(("-", "+")) and not ln.startswith(("---", "+++"))]
    return "\n".join(lines)


def _rate(killed: int, generated: int, equivalent: int, not_run: int = 0) -> str:
    n = generated - equivalent - not_run
    return f"{100 * killed / n:.1f} %" if n else "-"


def _module_counts(g: dict, mod: str, c: dict, equivalent: dict[str, str]) -> dict[str, int]:
    """One module's row: mutmut's counts, its survivors split into survived, not covered and
    equivalent (marked in ``equivalent.json``)."""
    mine = [s for s in g["survivors"] if s["module"] == mod]
    return {"generated": c["generated"], "killed": c["killed"],
            "survived": sum(1 for s in mine if s["name"] not in equivalent and s["status"] == "survived"),
            "not covered": sum(1 for s in mine if s["name"] not in equivalent and s["status"] == "not covered"),
            "equivalent": sum(1 for s in mine if s["name"] in equivalent), "not run": c["not run"],
            "timeouts": c.get("timeouts", 0)}


def _cell(row: dict[str, int], key: str) -> str:
    """A count of the report's tables; the killed count says how many of its mutants timed out."""
    if key == "killed" and row.get("timeouts"):
        return f"{row[key]} ({row['timeouts']} timed out)"
    return str(row[key])


def write_report(data: dict, equivalent: dict[str, str], out: Path) -> None:
    """Write ``report.json`` (``data``) and ``report.md`` (kill rates, survivors) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    lines = ["# Mutation testing report", "",
             "Written by `make mutation` (`tools/mutation.py`, mutmut 3) from `report.json`; mutants marked",
             "equivalent are listed in `equivalent.json` with the reason.  Kill rate = killed / (generated -",
             "equivalent - not run); a timeout counts as killed (\"killed\" says how many timed out, where",
             "the run recorded it), a mutant no selected test reaches as survived; \"not run\" counts",
             "mutants a run stopped by its time budget never tried.", "",
             "| group | module | generated | killed | survived | not covered | equivalent | not run | kill rate | "
             "measured |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    keys = ("generated", "killed", "survived", "not covered", "equivalent", "not run")
    by_dir: dict[str, dict[str, int]] = {}
    for name in GROUPS:
        g = data.get(name)
        if not g:
            lines.append(f"| {name} | (not run) | | | | | | | | |")
            continue
        tot = dict.fromkeys((*keys, "timeouts"), 0)
        for mod, c in g["modules"].items():
            row = _module_counts(g, mod, c, equivalent)
            lines.append(f"| {name} | `{mod.removeprefix('src/')}` | "
                         + " | ".join(_cell(row, k) for k in keys)
                         + f" | {_rate(row['killed'], row['generated'], row['equivalent'], row['not run'])} | "
                         f"{g.get('module_dates', {}).get(mod, g['date'])} |")
            folder = by_dir.setdefault(Path(mod.removeprefix("src/")).parent.as_posix() + "/",
                                       dict.fromkeys((*keys, "timeouts"), 0))
            for k in (*keys, "timeouts"):
                tot[k] += row[k]
                folder[k] += row[k]
        dates = sorted({g["date"], *g.get("module_dates", {}).values()})
        lines.append(f"| **{name}** | all | " + " | ".join(_cell(tot, k) for k in keys) + " | "
                     f"**{_rate(tot['killed'], tot['generated'], tot['equivalent'], tot['not run'])}** | "
                     f"{' to '.join(dict.fromkeys([dates[0], dates[-1]]))} |")
    # the target is per package (store/ and placement/), whichever groups their files are in
    lines += ["", "By package (the groups' rows summed by the folder of each module):", "",
              "| package | generated | killed | survived | not covered | equivalent | not run | kill rate |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for folder, c in sorted(by_dir.items()):
        lines.append(f"| `{folder}` | " + " | ".join(_cell(c, k) for k in keys)
                     + f" | {_rate(c['killed'], c['generated'], c['equivalent'], c['not run'])} |")
    lines.append("")
    for name in GROUPS:
        g = data.get(name)
        if not g:
            continue
        took = f" in {g['minutes']} min" if g.get("minutes") is not None else ""
        lines += [f"## {name}", "", f"Measured {g['date']}{took}"
                  + (" (stopped by its time budget: the \"not run\" mutants were never tried)" if g.get("stopped")
                     else "") + "; tests: "
                  + ", ".join(f"`{t}`" for t in g["tests"]) + f" (`-m \"{FAST_LANE}\"`)."]
        if g.get("only"):
            lines.append(f"Run narrowed to: {', '.join(g['only'])}.")
        for r in g.get("reruns", []):
            lines.append(f"Re-measured {r['date']} ("
                         + (f"{r['minutes']} min" if r["minutes"] is not None else "collected from its scratch copy")
                         + (", stopped by its time budget" if r.get("stopped") else "")
                         + (f"; resumed: {r['resumed']} mutants not killed before (survivors or not run) were run "
                            "again with the then current tests, earlier kills kept" if r.get("resumed") is not None
                            else "")
                         + "): "
                         + ", ".join(f"`{f}`" for f in r["files"])
                         + (("; tests: " + ", ".join(f"`{t}`" for t in r["tests"])) if r.get("tests", g["tests"])
                            != g["tests"] else "") + ".")
        for f, why in g["skipped"].items():
            lines.append(f"Not mutated: `{f}`: {why}.")
        lines.append("")
        left = [s for s in g["survivors"] if s["name"] not in equivalent]
        eqs = [s for s in g["survivors"] if s["name"] in equivalent]
        lines.append(f"Surviving mutants: {len(left)}" + (":" if left else "."))
        for s in left:
            lines += ["", f"- `{s['name']}` ({s['status']})", "", "  ```diff"]
            lines += ["  " + ln for ln in s["diff"].splitlines()] + ["  ```"]
        if eqs:
            lines += ["", f"Equivalent mutants: {len(eqs)}:", ""]
            lines += [f"- `{s['name']}`: {equivalent[s['name']]}" for s in eqs]
        lines.append("")
    (out / "report.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", help="comma-separated: " + ", ".join(GROUPS)
                    + " (default: every group, or with --only the groups holding those files)")
    ap.add_argument("--only", nargs="*", default=[], help="mutate only these files of the group(s)")
    ap.add_argument("--max-children", type=int, default=2, help="mutants run at once (at least 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "mutation")
    ap.add_argument("--budget", type=float, default=0,
                    help="minutes per group; then stop and report what ran (0: no limit)")
    ap.add_argument("--collect", action="store_true",
                    help="report an earlier (stopped) run from its scratch copy instead of running")
    ap.add_argument("--resume", action="store_true",
                    help="re-run only the surviving and unrun mutants of an earlier --only run's scratch copy, "
                         "with the current tests (a kill stands: tests are only ever added)")
    ap.add_argument("--unrun", action="store_true",
                    help="with --resume: only the mutants never run (the survivors were run with today's tests)")
    ap.add_argument("--report-only", action="store_true", help="rewrite report.md from report.json")
    args = ap.parse_args(argv)
    # bad input is refused before anything is run or removed (a run replaces its group's scratch copy)
    if not args.budget >= 0:
        ap.error(f"--budget must be a number of minutes >= 0 (0: no limit), not {args.budget}")
    if args.max_children < 1:
        ap.error(f"--max-children must be at least 1, not {args.max_children}")
    if args.unrun and not args.resume:
        ap.error("--unrun goes with --resume (it narrows a resumed run to the mutants never run)")
    if args.groups is None:
        names = [g for g in GROUPS if not args.only or _files(GROUPS[g], args.only)]
    else:
        names = [g for g in args.groups.split(",") if g]
        if not names:
            ap.error(f"--groups names no group; valid: {', '.join(GROUPS)}")
    bad = [g for g in names if g not in GROUPS]
    if bad:
        ap.error(f"unknown group(s) {', '.join(bad)}; valid: {', '.join(GROUPS)}")
    if args.only and not args.report_only:
        missing = [o for o in args.only if not any(_files(GROUPS[g], [o]) for g in names)]
        if missing:
            ap.error(f"--only {' '.join(missing)}: no file of group(s) {', '.join(names) or '(none)'} matches")
    if args.report_only and not (args.out / "report.json").exists():
        ap.error(f"--report-only: no report.json in {args.out} to rewrite the report from")
    path = args.out / "report.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    eq_path = args.out / "equivalent.json"
    equivalent = json.loads(eq_path.read_text()) if eq_path.exists() else {}
    if not args.report_only:
        for name in names:
            known = {v["name"]: v["diff"] for v in data.get(name, {}).get("survivors", [])}
            got = _run_group(name, GROUPS[name], args.only, args.max_children, args.budget, args.collect, known,
                             args.resume, equivalent, args.unrun)
            # another run may have written the report meanwhile: merge into what is there now
            data = json.loads(path.read_text()) if path.exists() else {}
            data[name] = _merge(data.get(name), got) if args.only else got
            write_report(data, equivalent, args.out)
    write_report(data, equivalent, args.out)
    print(f"report: {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
