"""``retainz trace``: checkpoint layouts, retention rules, trace generation and validation.

* ``retainz trace layouts`` - the layouts with their files, sizes and sources;
* ``retainz trace rules`` - the retention rules and their keys;
* ``retainz trace generate --layout NAME --retention SPEC --steps N [--seed S] [--crash-every N] -o FILE``;
* ``retainz trace fleet [--config FLEET.json] [--concurrency X] [--churn X] [--steps N] [--seed S] -o FILE`` -
  jobs arriving, checkpointing and leaving one node-local device (:mod:`retainz.trace.fleet`,
  docs/fleet.md); ``--show-config`` prints the effective config instead;
* ``retainz trace validate FILE`` - exit 0 if valid, 2 (bad input) with ``FILE:LINE: what`` if not.
* ``retainz trace mix A.jsonl B.jsonl ... [--offsets 0,250,...] -o M.jsonl`` - several jobs on one
  device: their traces merged in step order (:mod:`retainz.trace.mix`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from retainz.cli import UsageError, int_arg, plural
from retainz.retention import RULES, rule_keys
from retainz.trace.format import TraceFormatError
from retainz.trace.generate import write_generated
from retainz.trace.io import TraceReader
from retainz.trace.layouts import list_layouts


def register(sub) -> None:
    p = sub.add_parser("trace", help="checkpoint layouts, retention rules, trace generation and validation")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", parser_class=type(p))
    tsub.required = True

    q = tsub.add_parser("layouts", help="list checkpoint layouts with their files and sources")
    q.set_defaults(func=_layouts)

    q = tsub.add_parser("rules", help="list retention rules and their keys")
    q.set_defaults(func=_rules)

    q = tsub.add_parser("generate", help="generate a trace from a layout and a retention rule")
    q.add_argument("--layout", required=True, help="layout name, e.g. llama3-8b-fsdp:ranks=8")
    q.add_argument("--retention", required=True, help="RULE:key=value,... e.g. torchtitan:interval=500,keep_latest_k=10")
    q.add_argument("--steps", required=True, type=int_arg(1), help="training steps of the run")
    q.add_argument("--seed", type=int, default=0, help="seed for synthetic metrics (default 0)")
    q.add_argument("--crash-every", type=int_arg(1), default=None, metavar="N",
                   help="crash during every N-th save (it never commits and is repeated)")
    q.add_argument("-o", "--output", required=True, help="trace file to write ('-' for stdout)")
    q.add_argument("--force", action="store_true", help="overwrite OUTPUT even if it is not a RetainZ trace")
    q.set_defaults(func=_generate)

    q = tsub.add_parser("mix", help="merge several jobs' traces into one (jobs sharing a device)")
    q.add_argument("traces", nargs="+", metavar="TRACE", help="v1 trace files, one per job (at least 2)")
    q.add_argument("--offsets", type=_offsets, default=None, metavar="S0,S1,...",
                   help="steps added to each job's steps (one per trace; default all 0)")
    q.add_argument("-o", "--output", required=True, help="mixed trace to write ('-' for stdout)")
    q.add_argument("--force", action="store_true", help="overwrite OUTPUT even if it is not a RetainZ trace")
    q.set_defaults(func=_mix)

    q = tsub.add_parser("fleet", help="generate a fleet trace: jobs arriving, checkpointing and leaving one device")
    q.add_argument("--config", default=None, metavar="FLEET.json",
                   help="fleet config (docs/fleet.md); default: the built-in config")
    q.add_argument("--concurrency", type=_positive, default=None, metavar="X",
                   help="mean jobs offered to the node at once (overrides the config)")
    q.add_argument("--churn", type=_positive, default=None, metavar="X",
                   help="mean job length / checkpoint interval (overrides the config)")
    q.add_argument("--steps", type=int_arg(1), default=None, help="steps the trace covers (overrides the config)")
    q.add_argument("--seed", type=int, default=0, help="fleet seed (default 0)")
    q.add_argument("-o", "--output", default=None, help="trace file to write ('-' for stdout)")
    q.add_argument("--show-config", action="store_true", help="print the effective config as JSON and exit")
    q.add_argument("--force", action="store_true", help="overwrite OUTPUT even if it is not a RetainZ trace")
    q.set_defaults(func=_fleet)

    q = tsub.add_parser("validate", help="validate a trace file")
    q.add_argument("file", help="trace file")
    q.set_defaults(func=_validate)


def check_output(path: str, force: bool) -> None:
    """Refuse to overwrite ``path`` unless it is missing, empty or already a RetainZ trace (its first
    line a trace header), or ``force``: a trace written over a device file would destroy its store.

    Raises:
        FileExistsError: ``path`` holds something else (a device, a store, any other file).
        IsADirectoryError: ``path`` is a directory.
    """
    if path == "-" or force or not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a trace file")
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return                            # /dev/stdout, a FIFO, an empty file: nothing to lose
    with open(path, "rb") as f:
        first = f.readline(1 << 16).lstrip(b"\xef\xbb\xbf")
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not (isinstance(header, dict) and header.get("type") == "header"):
        raise FileExistsError(f"{path} exists and is not a RetainZ trace; pass --force to overwrite it")


def _offsets(raw: str) -> list[int]:
    try:
        out = [int(x) for x in raw.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated steps like 0,250, got {raw!r}") from None
    if any(x < 0 for x in out):
        raise argparse.ArgumentTypeError(f"offsets must be >= 0 steps, got {raw!r}")
    return out


def _positive(raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{raw} must be a positive, finite number")
    return v


def _fleet(args: argparse.Namespace) -> int:
    from retainz.trace.fleet import DEFAULT_CONFIG, FleetConfig, load_config, write_fleet

    raw = dict(load_config(args.config).raw if args.config else DEFAULT_CONFIG)
    for key in ("concurrency", "churn", "steps"):
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    config = FleetConfig.from_json(raw)
    if args.show_config:
        print(json.dumps(config.to_json(), indent=2))
        return 0
    if args.output is None:
        raise UsageError("retainz trace fleet: the following arguments are required: -o/--output")
    check_output(args.output, args.force)
    t0 = time.perf_counter()
    target = sys.stdout if args.output == "-" else args.output
    st = write_fleet(target, config, args.seed)
    causes = ", ".join(f"{n} {k}" for k, n in st.causes.items())
    print(f"{args.output}: {plural(st.jobs, 'job')} ({causes}; at most {st.peak_jobs} at once), "
          f"{plural(st.saves, 'save')}, {plural(st.deletes, 'delete')}; {st.bytes_saved:,} B saved, "
          f"peak live {st.peak_live_bytes:,} B, mean live {round(st.mean_live_bytes):,} B"
          + (f"; node: {st.mean_node_gpus:.2f} of {config.raw['gpus_per_node']} GPUs busy on average, "
             f"{plural(st.not_on_node, 'job')} not run on it ({config.raw['placement']})"
             if config.raw["fleet"] >= 2 else "")
          + f"; trace {st.trace_bytes:,} B in {time.perf_counter() - t0:.2f} s",
          file=sys.stderr if target is sys.stdout else sys.stdout)
    return 0


def _mix(args: argparse.Namespace) -> int:
    from retainz.trace.mix import mix

    if args.output != "-" and args.output in args.traces:
        raise ValueError(f"the output {args.output} is also an input trace")
    check_output(args.output, args.force)
    target = sys.stdout if args.output == "-" else args.output
    st = mix(args.traces, target, offsets=args.offsets)
    print(f"{args.output}: {st.jobs} jobs, {st.saves} saves, {st.deletes} deletes, {st.steps} steps; "
          f"trace {st.trace_bytes:,} B", file=sys.stderr if target is sys.stdout else sys.stdout)
    return 0


def _layouts(args: argparse.Namespace) -> int:
    del args
    for lay in list_layouts():
        print(f"{lay.name}: {lay.description}")
        print(f"  full save {lay.total_bytes:,} B in {len(lay.shards)} files; "
              f"model-only {lay.model_only_bytes:,} B in {len(lay.model_only)} files; sources: {lay.source}")
        for label, files in (("full", lay.shards), ("model-only", lay.model_only)):
            groups: dict[tuple[int, str], list[str]] = {}
            for s in files:
                groups.setdefault((s.nbytes, s.source), []).append(s.name)
            for (nbytes, source), names in groups.items():
                shown = names[0] if len(names) == 1 else f"{len(names)} files {names[0]} .. {names[-1]}"
                print(f"  [{label}] {shown}: {nbytes:,} B each" if len(names) > 1 else
                      f"  [{label}] {shown}: {nbytes:,} B")
                print(f"      {source}")
        for note in lay.notes:
            print(f"  note: {note}")
        print()
    return 0


def _rules(args: argparse.Namespace) -> int:
    del args
    for name, cls in RULES.items():
        print(f"{name}: {cls.source}")
        for k in rule_keys(cls):
            d = k["default"]
            shown = "unset" if d is None else str(d).lower() if isinstance(d, bool) else d
            req = "required" if k["required"] else f"default {shown}"
            choices = f"; one of {'|'.join(k['choices'])}" if k["choices"] else ""
            print(f"  {k['key']} ({k['type']}, {req}{choices}): {k['help']}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    check_output(args.output, args.force)
    t0 = time.perf_counter()
    target = sys.stdout if args.output == "-" else args.output
    st = write_generated(target, args.layout, args.retention, args.steps, seed=args.seed,
                         crash_every=args.crash_every)
    dt = time.perf_counter() - t0
    print(f"{args.output}: {plural(st.saves, 'save')}, {plural(st.commits, 'commit')}, "
          f"{plural(st.deletes, 'delete')}, {plural(st.crashes, 'crash', 'crashes')}; "
          f"{st.bytes_saved:,} B saved, peak live {st.peak_live_bytes:,} B; trace {st.trace_bytes:,} B "
          f"in {dt:.2f} s", file=sys.stderr if target is sys.stdout else sys.stdout)
    return 0


def _validate(args: argparse.Namespace) -> int:
    counts = {"save": 0, "commit": 0, "delete": 0, "crash": 0}
    try:
        with TraceReader(args.file) as r:
            for ev in r:
                counts[ev.type] += 1
            header = r.header
    except TraceFormatError as e:   # bad input: status 2, as every command (replay) gives for this file
        print(f"retainz: invalid trace: {e}", file=sys.stderr)
        return 2
    print(f"{args.file}: valid trace v{header.version}: layout {header.layout['name']}, retention {header.retention}, "
          f"{plural(counts['save'], 'save')}, {plural(counts['commit'], 'commit')}, "
          f"{plural(counts['delete'], 'delete')}, {plural(counts['crash'], 'crash', 'crashes')}")
    return 0
