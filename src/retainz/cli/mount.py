"""``retainz mount|umount``: serve a store on a device file as a directory tree (FUSE).

While it holds the device the mount also serves ``DEVICE.sock`` (the node service's socket, with
``retainz serve``'s access flags ``--group``, ``--grant``, ``--allow-all``), so the store commands
and other processes use the mounted device; on a device a ``retainz serve`` holds it is that service's
client.  ``umount`` returns once the mount's server is done (docs/mount.md "Inspecting and sharing a
mounted store").

Exit status: 0 success; 1 the mount failed (FUSE unavailable, the server failed, the device in use:
held by another process, a second mount of it whatever its mount point); 2 bad input (no such device
file, a directory or other non-file as the device, no such mount point, a mount point another device is
mounted on, a device without a store, a malformed retention rule, a malformed ``--grant`` or an unknown
``--group``).
"""

from __future__ import annotations

import logging
import sys

from retainz.cli import size_arg


def register(sub) -> None:
    p = sub.add_parser("mount", help="mount a store as a directory tree (FUSE) for any training runtime")
    p.add_argument("device", metavar="DEVICE", help="a device file holding a RetainZ store (retainz mkfs)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing directory")
    p.add_argument("--retention", metavar="RULE|auto", default=None,
                   help="the runtime's retention rule (e.g. hf:save_steps=500,save_total_limit=2), or auto "
                        "to infer it from the saves and deletions seen")
    p.add_argument("--foreground", action="store_true", help="serve in this process until unmounted")
    from retainz.cli.node import add_access_options

    add_access_options(p)     # the mount serves DEVICE.sock to other processes, as retainz serve does
    p.add_argument("--promote", metavar="URL", default=None,
                   help="promote what is saved to this fsspec URL (docs/tiers.md); deletions wait until durable, "
                        "and a shard whose local copy fails is read from the durable copy")
    p.add_argument("--promote-policy", metavar="POLICY", default=None,
                   help="all (default), every:n=STEPS, requested or none")
    p.add_argument("--promote-bandwidth", metavar="SIZE", type=size_arg, default=None,
                   help="cap on promotion, bytes per second (100MiB)")
    p.set_defaults(func=_mount)

    p = sub.add_parser("umount", help="unmount a RetainZ mount (waits until the store is closed)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.set_defaults(func=_umount)


def _mount(args) -> int:
    from retainz.cli.node import access_options
    from retainz.mount.runner import FuseUnavailableError, mount

    access = access_options(args)         # bad input (a --grant, a --group) before anything starts
    if args.foreground:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
    promote = None
    if args.promote is not None:
        if args.promote_policy is not None:
            from retainz.tier import parse_policy

            try:
                parse_policy(args.promote_policy)
            except ValueError as e:
                print(f"retainz: error: {e}", file=sys.stderr)
                return 2
        promote = {"url": args.promote, "policy": args.promote_policy, "bandwidth": args.promote_bandwidth}
    elif args.promote_policy is not None or args.promote_bandwidth is not None:
        print("retainz: error: --promote-policy and --promote-bandwidth need --promote URL", file=sys.stderr)
        return 2
    # libfuse 3 and mount(8) mount over a non-empty directory; say what the mount hides, once it is up
    hidden = _entries(args.mountpoint)
    warning = (f"retainz: warning: {args.mountpoint} is not empty: its {hidden} entr"
               f"{'y is' if hidden == 1 else 'ies are'} hidden until `retainz umount {args.mountpoint}`")
    if hidden and args.foreground:
        print(warning, file=sys.stderr)
    try:
        mount(args.device, args.mountpoint, retention=args.retention, foreground=args.foreground, access=access,
              promote=promote)
    except FuseUnavailableError as e:
        print(f"retainz: error: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError) as e:
        print(f"retainz: error: {e}", file=sys.stderr)
        return 1
    if hidden and not args.foreground:
        print(warning, file=sys.stderr)
    return 0


def _entries(path: str) -> int:
    """Entries of the directory ``path`` (0 when it cannot be listed: mount() names that problem)."""
    import os

    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def _umount(args) -> int:
    from retainz.mount.runner import umount

    try:
        said = umount(args.mountpoint)
    except (RuntimeError, TimeoutError) as e:
        print(f"retainz: error: {e}", file=sys.stderr)
        return 1
    for line in said:        # each checkpoint directory the unmount dropped, and why
        print(line)
    return 0
