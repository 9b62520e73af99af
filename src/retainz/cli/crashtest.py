"""``retainz crashtest``: the crash campaigns (:mod:`retainz.testing`) from the command line, a lab command.

Power cuts at every write boundary of a workload on a memory device or a scratch device file, each
followed by recovery and verification; or ``--black-box N``: N writer processes SIGKILLed at a random
moment, each followed by a verifying reopen.  Exit status: 0 no failure, 1 a failed point, 2 bad input.
"""

from __future__ import annotations

import os

from retainz.cli import plural, print_json, progress
from retainz.zoned import format_size, parse_device


def register(sub) -> None:
    p = sub.add_parser("crashtest", help="power-cut campaign: cut at every write, recover, verify")
    p.add_argument("device", metavar="DEV-SPEC",
                   help="mem:KEY=VALUE,... (a fresh memory device per point) or a device-file path (a "
                        "scratch file recreated per point with that geometry; never a store)")
    p.add_argument("--workload", default="mixed",
                   help="basic, gc, rollover, spill, mixed, shared, replace, hint or all (default mixed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-points", type=int, default=0, help="cut at most this many boundaries (0: all)")
    p.add_argument("--black-box", type=int, default=0, metavar="N",
                   help="instead: N rounds of a writer process SIGKILLed at a random moment, each followed by "
                        "a verifying reopen (DEV-SPEC is then a scratch directory for its device file)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_crashtest)


def _black_box(args) -> int:
    from retainz.testing.blackbox import run

    if args.black_box < 0:
        raise ValueError(f"--black-box must be a positive number of rounds, not {args.black_box}")
    if os.path.exists(args.device) and not os.path.isdir(args.device):
        raise ValueError(f"{args.device} is not a directory; --black-box needs a scratch directory")
    with progress.bar(args.black_box, "black box", args, unit="round") as bar:
        rep = run(args.device, args.black_box, seed=args.seed, progress=progress.callback(bar))
    if args.json:
        print_json({"black_box": True, "seed": args.seed, "points": rep.iterations,
                    "commits_acknowledged": rep.commits_acknowledged, "in_flight_present": rep.in_flight_present,
                    "in_flight_absent": rep.in_flight_absent, "generations_verified": rep.generations_verified,
                    "bytes_verified": rep.bytes_verified, "seconds": rep.seconds, "failures": rep.failures},
                   indent=2)
    else:
        print(f"black box: {rep.iterations} writers killed and verified, {rep.commits_acknowledged} commits "
              f"acknowledged, {plural(rep.generations_verified, 'generation')} and "
              f"{format_size(rep.bytes_verified)} verified, {plural(len(rep.failures), 'failure')} "
              f"({rep.seconds:.1f} s)")
        for f in rep.failures[:20]:
            print(f"    FAIL {f}")
    return 0 if rep.ok else 1


def _crashtest(args) -> int:
    from retainz.testing.crashtest import WORKLOADS

    if args.black_box:
        return _black_box(args)
    from retainz.zoned import FileDevice, MemoryDevice

    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for n in names:
        if n not in WORKLOADS:
            raise ValueError(f"unknown workload {n!r}; valid: {', '.join(WORKLOADS)}, all")
    if args.max_points < 0:
        raise ValueError(f"--max-points must be >= 0 (0: every boundary), not {args.max_points}")
    spec = parse_device(args.device)
    if spec.kind == "mem":
        probe = spec.open()
        geometry = probe.geometry
        make = lambda g: MemoryDevice(g)  # noqa: E731
    elif spec.kind != "file":
        raise ValueError(f"{args.device}: crashtest recreates its device at every point: give a mem: device or "
                         "a scratch device file")
    else:
        path = spec.path
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such device file (create one with `retainz device create`)")
        with FileDevice(path) as dev:
            geometry = dev.geometry
            if any(z.cond.name != "EMPTY" for z in dev.report_zones()):
                raise ValueError(f"{path} is not empty; crashtest recreates it at every point, so give it "
                                 "an empty scratch device")
        make = lambda g: FileDevice.create(path, g, force=True)  # noqa: E731
    try:
        return _campaigns(args, names, geometry, make)
    finally:
        if spec.kind == "file":
            FileDevice.create(path, geometry, force=True).close()   # leave the scratch device empty again


def _campaigns(args, names: list[str], geometry, make) -> int:
    from retainz.testing.crashtest import campaign

    results = []
    failed = False
    for n in names:
        points = list(range(1, args.max_points + 1)) if args.max_points else None
        with progress.bar(None, f"crashtest {n}", args, unit="point") as bar:
            rep = campaign(n, args.seed, geometry=geometry, points=points, make_device=make,
                           progress=progress.callback(bar))
        failed |= not rep.ok
        results.append(rep)
        if not args.json:
            print(f"{n}: {rep.points} crash points tried ({rep.write_boundaries} write boundaries, each zone "
                  "keeping a prefix of its unflushed writes), "
                  f"{plural(rep.generations_recovered, 'generation')} recovered, {format_size(rep.bytes_verified)} "
                  f"verified, {plural(len(rep.failures), 'failure')}")
            print("    classes: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.classes.items())))
            print("    states: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.states.items())))
            for f in rep.failures[:20]:
                print(f"    FAIL {f}")
    if args.json:
        print_json([{"workload": r.workload, "seed": r.seed, "write_boundaries": r.write_boundaries,
                     "points": r.points, "classes": r.classes, "states": r.states,
                     "generations_recovered": r.generations_recovered,
                     "bytes_verified": r.bytes_verified, "failures": r.failures} for r in results],
                   indent=2)
    return 1 if failed else 0
