"""``retainz run``, ``retainz verify`` and ``retainz analyze``: the experiment pipeline.

* ``retainz run MANIFEST [--output DIR] [--jobs N] [--resume] [--executor local|dask[=ADDRESS]]``: run a
  manifest's cases in parallel (local processes or a Dask cluster) and write one JSON record per case
  (``docs/experiments.md``); exit 1 if any case failed.
* ``retainz verify DIR``: validate records (schema, digests, trace hashes, waf consistency); exit 1 on
  any problem.
* ``retainz analyze DIR [--out DIR] [--check]``: figures, the placement table, the claims file and the
  zone map, from the records alone; ``--check`` diffs the rounded claims with the expected file.
"""

from __future__ import annotations

import argparse
import os
import sys

from retainz.cli import int_arg, plural, progress, seconds_arg


def register(sub) -> None:
    p = sub.add_parser("run", help="run an experiment manifest (experiments/*.json)")
    p.add_argument("manifest", help="manifest file, e.g. experiments/quick.json")
    p.add_argument("--output", "-o", help="records folder (default: out/runs/<manifest name>)")
    p.add_argument("--jobs", "-j", type=int_arg(1), default=None, help="worker processes (default: number of cores)")
    p.add_argument("--resume", action="store_true",
                   help="run only the cases without a record (default: refuse if any record exists)")
    p.add_argument("--trace-cache", help="generated traces (default: <output>/traces)")
    p.add_argument("--device", choices=("memory", "file", "guest"),
                   help="run every case on this device instead of the one the manifest names")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (none either when stderr is not a terminal)")
    p.add_argument("--executor", default="local", metavar="local|dask[=ADDRESS]",
                   help="where cases run: local worker processes (default), a Dask LocalCluster of --jobs "
                        "workers (dask), or the Dask scheduler at ADDRESS (dask=tcp://host:8786; the workers "
                        "must share the output folder's file system); needs the dask extra")
    p.add_argument("--connect-timeout", type=seconds_arg, default=5.0, metavar="SECONDS",
                   help="with dask=ADDRESS: give up on an unreachable scheduler after this long (default 5)")
    p.set_defaults(func=_run)

    p = sub.add_parser("verify", help="validate run records (schema, hashes, consistency)")
    p.add_argument("dir", help="records folder")
    p.set_defaults(func=_verify)

    p = sub.add_parser("analyze", help="figures, table and claims from run records")
    p.add_argument("dir", help="records folder")
    p.add_argument("--out", default=None, help="output folder (default: DIR/analysis)")
    p.add_argument("--check", action="store_true",
                   help="compare the rounded claims with --expected; exit 1 on any difference")
    p.add_argument("--expected", default="results/expected_claims.json",
                   help="expected claims for --check (default: results/expected_claims.json)")
    p.add_argument("--write-expected", action="store_true",
                   help="write the computed claims as the expected file (after a new recorded matrix)")
    p.set_defaults(func=_analyze)


def _run(args: argparse.Namespace) -> int:
    from retainz.experiments.manifest import ManifestError, load_manifest
    from retainz.experiments.runner import RecordExistsError, run_cases

    try:
        m, cases = load_manifest(args.manifest, overrides={"device": args.device} if args.device else None)
    except ManifestError as e:
        raise ValueError(str(e)) from None
    out = args.output or os.path.join("out", "runs", m["manifest"])
    if os.path.lexists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"{out}: not a directory (--output names the records folder)")
    if args.trace_cache and os.path.lexists(args.trace_cache) and not os.path.isdir(args.trace_cache):
        raise NotADirectoryError(f"{args.trace_cache}: not a directory (--trace-cache names the traces folder)")
    print(f"{m['manifest']}: {len(cases)} cases -> {out}", file=sys.stderr)
    try:
        summary = run_cases(cases, out, jobs=args.jobs, trace_dir=args.trace_cache, resume=args.resume,
                            progress=progress.enabled(args) and not args.no_progress, executor=args.executor,
                            connect_timeout=args.connect_timeout)
    except RecordExistsError as e:
        raise FileExistsError(str(e)) from None
    print(summary.line())
    for cid in summary.failed[:20]:
        print(f"failed: {os.path.join(out, cid + '.json')}")
    print(f"records: {out}")
    return 1 if summary.failed else 0


def _verify(args: argparse.Namespace) -> int:
    from retainz.experiments.verify import verify_dir

    if not os.path.isdir(args.dir):
        raise FileNotFoundError(f"no records folder {args.dir}")
    n, problems = verify_dir(args.dir)
    for line in problems:
        print(line)
    print(f"{plural(n, 'record')} checked, {plural(len(problems), 'problem')}")
    return 1 if problems else 0


def _analyze(args: argparse.Namespace) -> int:
    from retainz.analysis import analyze

    if not os.path.isdir(args.dir):
        raise FileNotFoundError(f"no records folder {args.dir}")
    out = args.out or os.path.join(args.dir, "analysis")
    if os.path.realpath(out) == os.path.realpath(args.dir):
        raise ValueError(f"--out {args.out}: is the records folder itself; its claims file would be read as a "
                         "record next time (give another folder, default DIR/analysis)")
    if args.check and not args.write_expected:
        from retainz.analysis.claims import read_expected

        read_expected(args.expected)          # a missing or malformed file: refused before anything is written
    if args.write_expected and os.path.realpath(os.path.dirname(os.path.abspath(args.expected))) == \
            os.path.realpath(args.dir):
        raise ValueError(f"--expected {args.expected}: is in the records folder; it would be read as a record next "
                         "time (give a path outside it)")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"--out {out}: not a directory (--out names the folder the analysis goes to)")
    records = sorted(n for n in os.listdir(out) if n.endswith(".json") and n != "paper_claims.json") \
        if os.path.isdir(out) else []
    if records:
        raise ValueError(f"--out {out}: holds {len(records)} other JSON files ({records[0]}...), a records folder? "
                         "The claims file would be read as a record there; give a folder for the analysis")
    report = analyze(args.dir, out, check=args.check, expected=args.expected,
                     write_expected=args.write_expected)
    for line in report.lines:
        print(line)
    return 1 if report.failed else 0
