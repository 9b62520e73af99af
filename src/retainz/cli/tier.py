"""``retainz tier promote|status|restore``: the durable tier from the command line (docs/tiers.md).

The destination is an fsspec URL (``file:///mnt/lustre/ckpt``, ``s3://bucket/prefix``; s3fs reads its
credentials and endpoint from the usual AWS environment: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``...).
``--to``/``--from`` name it; ``promote`` remembers it, the policy and the bandwidth beside a device
file (``DEV.tier.json``), so ``status``, ``restore`` and ``get --from`` need not repeat it.

Exit status: 0 success (``promote``: every selected generation durable); 1 a failed operation (a
destination error, a copy that fails verification, generations still not durable); 2 bad input.
"""

from __future__ import annotations

import sys

from retainz.cli import plural, print_json, progress, size_arg
from retainz.zoned import format_size


def register(sub) -> None:
    t = sub.add_parser("tier", help="promote checkpoints to durable storage, show their state, restore them")
    ts = t.add_subparsers(dest="tier_command", metavar="COMMAND")
    ts.required = True

    p = ts.add_parser("promote", help="copy the generations a policy selects to the destination (verified)")
    p.add_argument("device", metavar="DEV")
    p.add_argument("--gen", dest="generations", metavar="GEN", action="append", default=[],
                   help="also promote this generation, whatever the policy (repeat it; remembered)")
    _destination_flags(p, "--to")
    p.add_argument("--bandwidth", type=size_arg, default=None, metavar="SIZE",
                   help="cap on bytes sent per second (e.g. 100MiB; default: no cap)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_promote)

    p = ts.add_parser("status", help="per-generation promotion state and the backlog")
    p.add_argument("device", metavar="DEV")
    _destination_flags(p, "--to")
    p.add_argument("--verify", action="store_true",
                   help="read every durable copy back and check its crc32c (a bad one loses its manifest)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_status)

    p = ts.add_parser("restore", help="pull a durable generation back onto a (fresh) local device")
    p.add_argument("device", metavar="DEV")
    p.add_argument("generation", metavar="GEN")
    p.add_argument("--from", dest="url", metavar="URL", default=None,
                   help="the destination (default: the one DEV promotes to)")
    p.set_defaults(func=_restore)


def _destination_flags(p, flag: str) -> None:
    p.add_argument(flag, dest="url", metavar="URL", default=None,
                   help="the destination, an fsspec URL (default: the one remembered in DEV.tier.json)")
    p.add_argument("--policy", default=None,
                   help="all, every:n=STEPS, requested or none (default: the remembered one, else all)")


def settings(device: str, url: str | None, policy: str | None = None, bandwidth: int | None = None):
    """The device's tier settings with the command's flags applied: ``(TierSettings, path or None)``.

    A relative local path or ``file://`` URL is made absolute (:func:`retainz.tier.destination.absolute_url`).

    Raises:
        ValueError: no destination given and none remembered (exit 2), a malformed policy."""
    from retainz.tier import TierSettings, parse_policy, state_path_for
    from retainz.tier.destination import absolute_url

    path = state_path_for(device)
    saved = TierSettings.load(path) if path else None
    if url is not None:
        url = absolute_url(url)           # remembered: it must name the same place from anywhere
    else:
        if saved is None:
            raise ValueError(f"{device}: no destination: pass --to URL (or --from URL) once; it is remembered "
                             "beside a device file")
        url = saved.url
    s = saved if saved is not None and saved.url == url else TierSettings(url)
    if policy is not None:
        parse_policy(policy)
        s.policy = policy
    if bandwidth is not None:
        if bandwidth <= 0:
            raise ValueError(f"--bandwidth must be a positive size per second, not {bandwidth}")
        s.bandwidth = bandwidth
    return s, path


def _promoter(store, s, path, **kw):
    from retainz.tier import Promoter

    return Promoter.from_settings(store, s, path, **kw)


def _promote(args) -> int:
    from retainz.cli.store import StoreSession

    s, path = settings(args.device, args.url, args.policy, args.bandwidth)
    with StoreSession(args.device, readonly=True) as store:
        for gid in args.generations:
            store.generation(gid)
        with progress.bar(None, "promote", args) as bar:
            p = _promoter(store, s, path, on_progress=bar.update)    # reaches the destination (or raises)
            if path is not None:
                s.save(path)             # remembered once reached: a failed promote leaves the old settings
            for gid in args.generations:
                p.request(gid)
            p.refresh()
            n, b = p.backlog()
            bar.total = b
            bar.refresh()
            ok = p.run_pending()
        rows = p.status()
    if args.json:
        print_json({"url": s.url, "policy": s.policy, "ok": ok, "generations": [r.to_dict() for r in rows]},
                   indent=2)
        return 0 if ok else 1
    for r in rows:
        if r.state != "local":
            print(f"{r.id}\t{r.state}" + (f"\t{r.error}" if r.error else ""))
    n, b = p.backlog()
    print(f"{s.url}: {plural(sum(r.state == 'durable' for r in rows), 'generation')} durable, backlog "
          f"{plural(n, 'generation')} ({format_size(b)}); {format_size(p.bytes_sent)} sent or verified")
    return 0 if ok else 1


def _status(args) -> int:
    from retainz.cli.store import StoreSession

    s, path = settings(args.device, args.url, args.policy)
    with StoreSession(args.device, readonly=True) as store:
        p = _promoter(store, s, path)
        p.refresh()
        bad = p.verify(deep=True) if args.verify else []
        rows = p.status()
        n, b = p.backlog()
    if args.json:
        print_json({"url": s.url, "policy": s.policy, "backlog": {"generations": n, "bytes": b},
                    "bad_copies": bad, "generations": [r.to_dict() for r in rows]}, indent=2)
        return 1 if bad else 0
    print(f"destination {s.url}, policy {s.policy}")
    for r in rows:
        print(f"{r.id}\tstep {r.step}\t{format_size(r.size)}\t{r.state}" + (f"\t{r.error}" if r.error else ""))
    for line in bad:
        print(f"  bad copy: {line} (its manifest was removed; promote copies it again)")
    print(f"backlog: {plural(n, 'generation')}, {format_size(b)}")
    return 1 if bad else 0


def _restore(args) -> int:
    from retainz.cli.store import StoreSession
    from retainz.errors import GenerationExistsError
    from retainz.tier import Destination, restore_generation

    s, _ = settings(args.device, args.url)
    with StoreSession(args.device) as store:
        if args.generation in {g.id for g in store.generations()}:
            raise GenerationExistsError(
                f"generation {args.generation!r} is already on {args.device}: `retainz tier restore` brings back "
                f"a generation the device lacks (`retainz get {args.device} {args.generation}` reads it)")
        gen = restore_generation(store, Destination(s.url), args.generation)
    print(f"{gen.id}: {plural(len(gen.shards), 'shard')}, {format_size(gen.size)} restored from {s.url} "
          f"(crc32c verified) at step {gen.step}", file=sys.stderr)
    return 0
