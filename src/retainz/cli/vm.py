"""``retainz vm setup``, ``retainz vm run`` and ``retainz vm serve``: a QEMU guest with real zoned block devices.

::

    retainz vm setup                      # install QEMU, busybox, cpio, kmod; fetch a Debian kernel
    retainz vm run -- blkzone report /dev/nvme0n1
    retainz vm run --zones 32 --zone-size 64MiB --zone-capacity 48MiB --max-open 4 --max-active 6 \\
        --out out/vm -- .venv/bin/python -m bench.device_write --guest-part
    retainz vm serve --zones 32 --zone-size 64MiB    # the namespace as a remote: device on this host

``run`` returns the command's exit status (124 if the guest hung and was killed, 125 if it stopped
without recording one); the command's files are in ``--out`` and the console log in
``<out>/.retainz-guest/console.log``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from retainz.cli import int_arg, seconds_arg, size_arg


def register(sub) -> None:
    vm = sub.add_parser("vm", help="boot a QEMU guest with an NVMe ZNS namespace and null_blk zoned")
    vsub = vm.add_subparsers(dest="vm_command", metavar="ACTION", required=True)
    setup = vsub.add_parser("setup", help="install or find QEMU, busybox and a guest kernel")
    setup.add_argument("--check", action="store_true", help="only report what is missing")
    setup.add_argument("--fdp", action="store_true",
                       help="also the FDP lane's QEMU (>= 8.0, unpacked from bookworm-backports into cache/vm/qemu)")
    setup.set_defaults(func=_setup)
    run = vsub.add_parser("run", help="run a command in a fresh guest: retainz vm run [OPTIONS] -- CMD...")
    _namespace_args(run)
    run.add_argument("--no-nvme", action="store_true", help="no NVMe ZNS namespace")
    run.add_argument("--no-nullblk", action="store_true", help="no null_blk zoned device (/dev/nullb0)")
    run.add_argument("--nullblk-zones", type=int, default=16)
    run.add_argument("--nullblk-zone-size", type=size_arg, default=2 << 20,
                     help="null_blk zone size, whole MiB (null_blk's unit; default 2MiB)")
    run.add_argument("--nullblk-zone-capacity", type=size_arg, default=1 << 20,
                     help="null_blk zone capacity, whole MiB (default 1MiB)")
    run.add_argument("--out", default="out/vm", help="output folder shared read-write (default out/vm)")
    run.add_argument("--timeout", type=float, default=600.0, help="kill a hung guest after this many s")
    run.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    run.add_argument("--cpus", type=int, default=2)
    run.add_argument("--scheduler", default="", help="I/O scheduler for the zoned devices, e.g. mq-deadline")
    run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="environment variable for the command (repeatable)")
    run.add_argument("--quiet", action="store_true", help="do not stream the guest console")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    run.set_defaults(func=_run)
    serve = vsub.add_parser("serve", help="serve the guest's NVMe ZNS namespace to this host (a remote: "
                                          "device) until Ctrl-C or --timeout; the namespace is a "
                                          "temporary file: what it holds is gone when the guest stops")
    _namespace_args(serve)
    serve.add_argument("--out", default="out/vm-serve", help="output folder (console log, served.json)")
    serve.add_argument("--timeout", type=seconds_arg, default=3600.0,
                       help="stop serving after this many seconds (default 3600)")
    serve.add_argument("--memory", type=ram_mb_arg, default=512, help="guest RAM in MiB (default 512, at least 128)")
    serve.add_argument("--scheduler", default="mq-deadline", help="I/O scheduler of the namespace")
    serve.set_defaults(func=_serve)


#: Guest RAM in MiB: a whole number, at least 128.
ram_mb_arg = int_arg(128, too_low="{v} MiB is too little for the guest (at least {low})")


def _namespace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zones", type=int_arg(1), default=16, help="NVMe ZNS zones (default 16)")
    p.add_argument("--zone-size", type=size_arg, default=1 << 20, help="zone size, a power of two (default 1MiB)")
    p.add_argument("--zone-capacity", type=size_arg, default=768 << 10,
                   help="writable bytes per zone (default 768KiB)")
    p.add_argument("--max-open", type=int, default=3, help="max open zones (default 3; 0 = unlimited)")
    p.add_argument("--max-active", type=int, default=4, help="max active zones (default 4; 0 = unlimited)")
    p.add_argument("--block-size", type=int, default=4096, choices=(512, 4096))


def _whole_mib(flag: str, value: int) -> int:
    """``value`` bytes in MiB, null_blk's unit for zone sizes.

    Raises:
        ValueError: not a positive whole number of MiB (one line naming the flag and value)."""
    if value <= 0 or value % (1 << 20):
        raise ValueError(f"{flag} {value:,} B is not a positive whole number of MiB (null_blk sizes zones in MiB)")
    return value >> 20


def _zns(args: argparse.Namespace):
    from retainz.vm.guest import ZNSConfig

    return ZNSConfig(zones=args.zones, zone_size=args.zone_size, zone_capacity=args.zone_capacity,
                     max_open=args.max_open, max_active=args.max_active, block_size=args.block_size)


def _setup(args: argparse.Namespace) -> int:
    from retainz.vm.setup import main

    return main((["--check"] if args.check else []) + (["--fdp"] if args.fdp else []))


def _run(args: argparse.Namespace) -> int:
    from retainz.vm.guest import GuestConfig, NullBlkConfig, run_in_guest
    from retainz.vm.setup import VMSetupError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no command: use `retainz vm run [OPTIONS] -- CMD...`")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {item!r} is not KEY=VALUE")
        env[key] = value
    zns = None if args.no_nvme else _zns(args)
    nullblk = None if args.no_nullblk else NullBlkConfig(
        zones=args.nullblk_zones, zone_size_mb=_whole_mib("--nullblk-zone-size", args.nullblk_zone_size),
        zone_capacity_mb=_whole_mib("--nullblk-zone-capacity", args.nullblk_zone_capacity), max_open=args.max_open,
        max_active=args.max_active, block_size=args.block_size)
    cfg = GuestConfig(zns=zns, nullblk=nullblk, memory_mb=args.memory, cpus=args.cpus,
                      timeout=args.timeout, env=env, scheduler=args.scheduler)
    try:
        result = run_in_guest(command, args.out, cfg, stream=not args.quiet)
    except VMSetupError as e:
        print(f"retainz: error: {e}", file=sys.stderr)
        return 1
    print(f"\nretainz vm: exit status {result.status} after {result.seconds:.1f} s; output in "
          f"{result.out_dir}; console log {result.console_log}", file=sys.stderr)
    return result.status


def _serve(args: argparse.Namespace) -> int:
    from retainz.vm.channel import serving
    from retainz.vm.guest import GuestConfig
    from retainz.vm.setup import VMSetupError, ensure_all

    zns = _zns(args)
    zns.check()                       # ValueError: exit 2, before anything boots
    try:
        ensure_all(install=False)
    except VMSetupError as e:
        print(f"retainz: error: {e} (run `retainz vm setup`)", file=sys.stderr)
        return 1
    cfg = GuestConfig(zns=zns, nullblk=None, memory_mb=args.memory, timeout=args.timeout,
                      scheduler=args.scheduler)
    # Ctrl-C and SIGTERM both stop the guest cleanly (a background job may have inherited SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with serving(args.out, cfg) as guest:
            print(f"retainz vm: the guest's /dev/nvme0n1 is being served; open it as\n  {guest.spec}\n"
                  "(e.g. `retainz device info DEV`, `retainz mkfs DEV`). The namespace is a temporary file: "
                  f"what it holds is gone when the guest stops (Ctrl-C, or after {args.timeout:g} s).\n",
                  file=sys.stderr)
            try:
                while guest.result is None and guest.error is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                print("\nretainz vm: stopping the guest", file=sys.stderr)
    except RuntimeError as e:                 # the guest never served: one line, exit 1
        print(f"retainz: error: {e}", file=sys.stderr)
        return 1
    if guest.error is not None:
        print(f"retainz: error: the guest failed: {guest.error}", file=sys.stderr)
        return 1
    st = guest.stats()
    if not st:
        status = guest.result.status if guest.result is not None else "unknown"
        print(f"retainz: error: the guest stopped without a record of what it served (status {status}); "
              f"see {args.out}/.retainz-guest/console.log", file=sys.stderr)
        return 1
    print(f"retainz vm: served {st['connections']} connection(s); the guest's kernel counted "
          f"{st['device_bytes_written']:,} bytes written to and {st['device_bytes_read']:,} read from "
          f"{st['device']}", file=sys.stderr)
    return 0
