"""``retainz serve``: the node service of a device (one process owns it; clients write directly).

Exit status: 0 the service stopped on SIGTERM/SIGINT; 1 it could not start (the device or its socket in
use, no store on the device); 2 bad input (no such device file, a path that is not a socket).
"""

from __future__ import annotations

import logging
import sys


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a device's store to many processes (the node service)")
    p.add_argument("device", metavar="DEVICE", help="a device holding a RetainZ store (retainz mkfs): a device "
                                                    "file, a zoned block device /dev/NAME or zbd:/dev/NAME")
    p.add_argument("--socket", metavar="PATH", default=None,
                   help="the Unix socket to listen on (default: DEVICE.sock beside a device file, where "
                        "clients look for it)")
    add_access_options(p)
    p.add_argument("--policy", default=None, help="placement policy (default: the one recorded at mkfs)")
    p.set_defaults(func=_serve)


def add_access_options(p) -> None:
    """The socket's access flags, the same for ``retainz serve`` and ``retainz mount`` (docs/node.md
    "Access control")."""
    p.add_argument("--group", metavar="GROUP", default=None,
                   help="let this group use the service too (socket mode 0660 instead of 0600)")
    p.add_argument("--allow-all", action="store_true",
                   help="every client may see and delete every job's generations (default: only its own job's)")
    p.add_argument("--grant", metavar="JOB=SERIES", action="append", default=[],
                   help="job JOB may also see and delete the generations of series SERIES (* for every "
                        "series); repeatable")


def access_options(args) -> dict:
    """``{"mode", "group", "allow_all", "grants"}`` from :func:`add_access_options`'s flags, as
    :class:`retainz.node.Service` takes them.

    Raises:
        ValueError: a malformed ``--grant`` (:func:`retainz.node.access.parse_grant`), or a ``--group``
            that names no group (one line)."""
    from retainz.node.access import parse_grant

    grants: dict[str, set[str]] = {}
    for text in args.grant:
        job, series = parse_grant(text)
        grants.setdefault(job, set()).add(series)
    if args.group is not None:
        import grp

        try:
            grp.getgrnam(args.group)
        except KeyError:
            if not args.group.isdigit():
                raise ValueError(f"--group {args.group!r}: no such group") from None
    return {"mode": 0o660 if args.group else 0o600,
            "group": int(args.group) if args.group and args.group.isdigit() else args.group,
            "allow_all": args.allow_all, "grants": {j: frozenset(s) for j, s in grants.items()}}


def _serve(args) -> int:
    from retainz.node import serve

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from retainz.zoned import parse_device

    spec = parse_device(args.device)
    if not spec.persistent:
        raise ValueError(f"{args.device}: an in-memory device lives only in this process; serve a device file "
                         "or a zoned block device")
    if not spec.exists():
        raise FileNotFoundError(f"{spec.path}: no such device file (create it with `retainz device create` "
                                "and `retainz mkfs`)")

    def ready(svc) -> None:
        print(f"retainz: serving {args.device} on {svc.path}", file=sys.stderr, flush=True)

    from retainz.errors import DeviceBusyError

    access = access_options(args)
    try:
        serve(args.device, socket=args.socket, policy=args.policy, ready=ready, **access)
    except DeviceBusyError:
        from retainz.mount.runner import held_message, lock_holders

        if not spec.is_file or not lock_holders(spec.path):
            raise
        raise DeviceBusyError(held_message(spec.path)) from None    # who holds it: a mount, a pid
    return 0
