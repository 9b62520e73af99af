"""``retainz mkfs|ls|put|get|rm|gc|fsck|df``: the store from the command line.

``DEV`` is a device specification (:func:`retainz.zoned.open_device`): a device-file path for the
embedded default.  A device file a node service holds (``retainz serve DEV``) is used through the
service's socket by ls, put, get, rm, gc, fsck and df (job ``$RETAINZ_JOB``, else the whole device:
docs/node.md); mkfs and fsck --repair need the device itself and say who holds it.  A device a mount
holds is refused with one line naming the mount point and its pid.  Exit status: 0 success, 1 a failed operation or check, 2 bad input (one line).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys

from retainz.cli import geometry_lines, int_arg, interrupt, plural, print_json, progress
from retainz.errors import DeviceBusyError, ForeignDeviceError, GenerationExistsError, StoreLockedError
from retainz.hint import Hint
from retainz.placement import DEFAULT_POLICY
from retainz.placement.base import PERMANENT
from retainz.store.format import MAX_META_ZONES
from retainz.store.store import MAX_STEP
from retainz.zoned import format_size, format_sizes, open_device, parse_device
from retainz.zoned.model import MAX_ZONES

#: A training step (``--step``, ``--reclaim-step``): ``0..MAX_STEP``, the store's bound.
step_arg = int_arg(0, MAX_STEP, too_high="{v} is beyond the largest step, {high:,} (a signed 64-bit integer)")


def register(sub) -> None:
    p = sub.add_parser("mkfs", help="format a device as a RetainZ store")
    p.add_argument("device", metavar="DEV")
    p.add_argument("--meta-zones", type=int_arg(2, MAX_META_ZONES), default=None,
                   help="journal zones (default: from the geometry, at least 3; see default_meta_zones)")
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"placement policy NAME[:k=v,...] (default {DEFAULT_POLICY})")
    p.add_argument("--gc-reserve", type=int_arg(0, MAX_ZONES, too_high="{v} is more zones than a device has "
                                                "({high:,})"), default=2, help="empty zones kept for GC (default 2)")
    p.add_argument("--force", action="store_true", help="erase a device that holds data")
    p.set_defaults(func=_mkfs)

    p = sub.add_parser("ls", help="list committed generations")
    p.add_argument("device", metavar="DEV")
    p.add_argument("-l", "--long", action="store_true", help="also list shards")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_ls)

    p = sub.add_parser("put", help="store local files as the shards of a new generation")
    p.add_argument("device", metavar="DEV")
    p.add_argument("generation", metavar="GEN")
    p.add_argument("files", metavar="FILE", nargs="+")
    p.add_argument("--step", type=step_arg, required=True, help="training step of the generation")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--reclaim-step", type=step_arg, help="predicted step at which it will be deleted")
    g.add_argument("--permanent", action="store_true", help="never deleted")
    p.add_argument("--replace", action="store_true",
                   help="replace a committed generation of the same id at this one's commit")
    p.set_defaults(func=_put)

    p = sub.add_parser("get", help="read shards back into files (checksums verified)")
    p.add_argument("device", metavar="DEV")
    p.add_argument("generation", metavar="GEN")
    p.add_argument("shards", metavar="SHARD", nargs="*", help="default: every shard")
    p.add_argument("-o", "--out", default=".", help="output directory (default .), or - for stdout")
    p.add_argument("--from", dest="durable", metavar="URL", default=None,
                   help="fall back to the durable copy at this destination when the local copy is missing or "
                        "fails its checksum (default: the destination DEV promotes to, if any; docs/tiers.md)")
    p.set_defaults(func=_get)

    p = sub.add_parser("rm", help="delete generations")
    p.add_argument("device", metavar="DEV")
    p.add_argument("generations", metavar="GEN", nargs="+")
    p.add_argument("--step", type=step_arg, help="training step of the deletion")
    p.set_defaults(func=_rm)

    p = sub.add_parser("gc", help="run copying garbage collection")
    p.add_argument("device", metavar="DEV")
    p.add_argument("--force", action="store_true",
                   help="collect now what the policy collects when space runs out, however many zones are "
                        "empty (plain gc waits for the GC reserve; docs/cli.md, \"Collecting space\")")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_gc)

    p = sub.add_parser("fsck", help="verify every checksum; cross-check catalog and write pointers")
    p.add_argument("device", metavar="DEV")
    p.add_argument("--json", action="store_true")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--repair", action="store_true",
                     help="write: rewrite damaged metadata copies and salvage every intact committed generation; "
                          "generations a lost record could concern become unknown, never listed again on their own "
                          "(docs/format.md); it first checks read-only, and a store with nothing to repair is "
                          "left as it is: it says `nothing to repair: the store is clean` and writes nothing (the "
                          "device file's bytes stay the same)")
    how.add_argument("--restore", metavar="GEN",
                     help="write: list an unknown generation again after checking its data (an explicit decision "
                          "that it was not deleted)")
    how.add_argument("--upgrade", action="store_true",
                     help="write: migrate a store of an older format version to this one (older RetainZ then "
                          "refuses it); it first checks read-only, and when the store is already of this version "
                          "and the device file has nothing to migrate (a device file of format version 2 gains its "
                          "label copy at the end), it says `nothing to upgrade: the store is already format "
                          "version N` and writes nothing (the device file's bytes stay the same)")
    p.set_defaults(func=_fsck)

    p = sub.add_parser("df", help="free, used, reclaimable space, space amplification and the placement policy")
    p.add_argument("device", metavar="DEV")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_df)


def _persistent(spec: str) -> None:
    """Store commands need a device that outlives the command.

    Raises:
        ValueError: ``spec`` names an in-memory device (``mem:``, ``fdp:``), gone when the command exits."""
    if not parse_device(spec).persistent:
        raise ValueError(f"{spec}: an in-memory device lives only for one command, so no store can be kept on "
                         "it; make a file device (`retainz device create PATH ...`)")


def _busy(spec: str) -> StoreLockedError:
    """The one-line refusal of a device another process holds: who (a mount and where, a node
    service, a pid), from :func:`retainz.mount.runner.held_message`."""
    from retainz.mount.runner import held_message

    dev = parse_device(spec)
    return StoreLockedError(held_message(dev.path) if dev.is_file else
                            f"{spec}: the store is open in another process (the device is locked)")


def repair_hint(e: Exception, spec: str) -> Exception:
    """``e`` (damage that stops an open: :class:`CorruptJournalError`, :class:`CorruptDeviceError`)
    with the way out in the CLI's words appended, or ``e`` itself for any other error.  An
    :class:`OldFormatError` already names ``fsck --upgrade``."""
    from retainz.errors import CorruptDeviceError, CorruptJournalError

    if not isinstance(e, (CorruptJournalError, CorruptDeviceError)) or "fsck --repair" in str(e):
        return e
    out = type(e)(f"{e}; run `retainz fsck --repair {spec}` to repair it (it keeps every generation a copy "
                  "holds and names any it cannot keep)")
    out.__cause__ = None
    return out


def lost_label_geometry(spec: str):
    """The geometry of a device file whose every label copy is lost, from the store superblock in its
    zone 0 (issue 41 trial: a lost first block and a lost last block of the file), or ``None``.  Zone 0
    starts after the label block and four zone-state slots of ``state_slot_size(zones)`` bytes, so the
    superblock is looked for after each candidate slot size and kept only when its zone count gives that
    size and the file's length is the layout it gives.  The open and active zone limits, which only the
    label held, are ``retainz device create``'s defaults."""
    import types

    from retainz.cli.device import DEFAULT_ZONE_LIMIT
    from retainz.errors import RetainZError
    from retainz.store.format import Superblock
    from retainz.zoned.file import device_file_sizes, state_slot_size, zone0_candidates
    from retainz.zoned.model import Geometry

    path = spec.removeprefix("file:")
    if not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    any_limits = types.SimpleNamespace(max_open=0, max_active=0)
    with open(path, "rb") as f:
        for start, slot in zone0_candidates(size):
            for copy in (0, 512, 4096):              # superblock copy 0, copy 1 (block size 512 or 4096)
                f.seek(start + copy)
                try:
                    sb = Superblock.decode(f.read(4096), any_limits)
                except (RetainZError, ValueError):
                    sb = None
                if sb is None or copy and copy != sb.geometry.block_size:
                    continue
                g = sb.geometry
                if state_slot_size(g.nr_zones) != slot or size not in device_file_sizes(g):
                    continue
                limit = min(DEFAULT_ZONE_LIMIT, g.nr_zones)
                return Geometry(nr_zones=g.nr_zones, zone_size=g.zone_size, zone_capacity=g.zone_capacity,
                                block_size=g.block_size, max_open=limit, max_active=limit)
    return None


def label_hint(e: Exception, spec: str) -> Exception:
    """``e`` (a device file without any intact label copy) naming ``fsck --repair`` when the file holds
    a store whose superblock gives the geometry (:func:`lost_label_geometry`), else ``e``: such a file
    was called 'not a RetainZ device file' and sent to `retainz device create`."""
    from retainz.errors import CorruptDeviceError, NotADeviceError

    if not isinstance(e, (NotADeviceError, CorruptDeviceError)) or "label" not in str(e) \
            or lost_label_geometry(spec) is None:
        return e
    return CorruptDeviceError(f"{spec.removeprefix('file:')}: every copy of the device label is lost (its first and "
                              "last blocks), but it holds a RetainZ store whose superblock gives the geometry; run "
                              f"`retainz fsck --repair {spec}` to rebuild the label")


def _open(spec: str, readonly: bool = False, args=None):
    """The store of ``spec`` and its device: through a node service answering at the device's socket
    (job ``$RETAINZ_JOB``, else ``*``, the whole device: the service's own user; a client of another user
    is refused it with one line), else the device itself (:func:`retainz.jobs.stores.open_store`).
    Damage that stops the open names the way out (:func:`repair_hint`, :func:`label_hint`)."""
    from retainz.errors import CorruptDeviceError, CorruptJournalError, NotADeviceError
    from retainz.jobs.stores import open_store

    _persistent(spec)
    try:
        with progress.bar(None, "open", args, unit="record") as bar:
            store = open_store(spec, job=os.environ.get("RETAINZ_JOB", "*"), readonly=readonly,
                               format_blank=False, progress=progress.callback(bar))
    except DeviceBusyError:
        raise _busy(spec) from None
    except NotADeviceError as e:
        raise label_hint(e, spec) from None
    except (CorruptJournalError, CorruptDeviceError) as e:
        raise repair_hint(label_hint(e, spec), spec) from None
    return store, store.device


class StoreSession:
    """A store open for one command; ``readonly`` (ls, get, df, fsck) writes nothing to the device:
    no recovery repair, no journal record (``Store.open(readonly=True)``).  A read-write session
    holds SIGINT/SIGTERM from the open to the close (:func:`retainz.cli.interrupt.deferred`): the
    command sees them at its safe points (``put``: between input chunks) or after the close."""

    def __init__(self, spec: str, readonly: bool = False, args=None):
        self.spec = spec
        self.readonly = readonly
        self.args = args
        self._held = contextlib.ExitStack()

    def __enter__(self):
        if not self.readonly:
            self._held.enter_context(interrupt.deferred())
        try:
            self.store, self.dev = _open(self.spec, self.readonly, self.args)
        except BaseException:
            self._held.close()
            raise
        return self.store

    def __exit__(self, *exc):
        with self._held:
            try:
                self.store.close()
            finally:
                self.dev.close()


def _mkfs(args) -> int:

    _persistent(args.device)
    with interrupt.deferred():
        try:
            return _format(args)
        except DeviceBusyError:
            raise _busy(args.device) from None


def _format(args) -> int:
    from retainz.store import Store

    dev = open_device(args.device)
    try:
        try:
            with progress.bar(None, "mkfs", args, unit="zone") as bar:   # a large device: seconds (issue 44.2)
                store = Store.format(dev, meta_zones=args.meta_zones, policy=args.policy,
                                     gc_reserve_zones=args.gc_reserve, force=args.force,
                                     progress=progress.callback(bar))
        except ForeignDeviceError as e:     # the store's remedy is the API's (force=True): give the flag
            raise ForeignDeviceError(f"{e.found}; `retainz mkfs --force {args.device}` erases it",
                                     found=e.found) from None
        g = dev.geometry
        print(f"{args.device}: RetainZ store {store.uuid}: {g.nr_zones - store.meta_zones} data zones of "
              f"{format_size(g.zone_capacity)}, {store.meta_zones} meta zones, policy {store.policy}")
        for line in geometry_lines(g):
            print(line)
        print(f"    data: {format_sizes((g.nr_zones - store.meta_zones) * g.zone_capacity)} writable in data zones")
        store.close()
    finally:
        dev.close()
    return 0


def _ls(args) -> int:
    with StoreSession(args.device, readonly=True, args=args) as store:
        gens = store.generations()
        unknown = store.unknown()
        if args.json:
            print_json([{"id": g.id, "step": g.step, "size": g.size,
                               "reclaim_step": g.hint.reclaim_step, "condition": g.hint.condition,
                               "shards": [{"name": s.name, "size": s.size, "crc32c": s.crc,
                                           "extents": _extents(s)} for s in g.shards.values()]}
                              for g in gens], indent=2)
            if unknown:      # stdout stays the list of listed generations; the note is for the reader
                print(unknown_note(unknown, args.device), file=sys.stderr)
            return 0
        for g in gens:
            print(f"{g.id}\tstep {g.step}\t{format_size(g.size)}\t{plural(len(g.shards), 'shard')}\t"
                  f"reclaim {_reclaim_text(g.hint)}")
            if args.long:
                for s in g.shards.values():
                    crc = "-" if s.crc is None else f"{s.crc:08x}"
                    print(f"    {s.name}\t{s.size} B\tcrc32c {crc}\t{plural(_extents(s), 'extent')}")
        if unknown:
            print(unknown_note(unknown, args.device))
    return 0


def unknown_note(unknown: list, spec: str) -> str:
    """``ls``'s line for the generations a repair kept as unknown (issue 41: neither listed nor
    read until a decision): how many, their bytes, and the commands that name and decide them, so
    a store that holds only unknown generations never lists as empty (issue 44)."""
    return (f"{plural(len(unknown), 'unknown generation')} ({format_size(sum(g.size for g in unknown))}) "
            f"not listed: a repair could not decide whether they were deleted; `retainz fsck {spec}` names "
            f"them, `retainz fsck --restore GEN {spec}` lists one again, `retainz rm {spec} GEN` discards it")


def _extents(s) -> int:
    """A shard's extent count (a served store's listing carries the count, not the extents)."""
    return getattr(s, "extent_count", None) or len(s.extents)


def _reclaim_text(hint) -> str:
    """``ls``'s reclaim column: the predicted step, ``permanent`` for a save no rule retires, or
    ``not in this run`` for one a rule would retire later than the run's last save (e.g. the last
    ``k`` of keep-latest-k), with its retirement condition."""
    rs = hint.reclaim_step
    text = "-" if rs is None else str(rs) if rs != PERMANENT else (
        "permanent" if hint.kind in ("", "permanent") else "not in this run")
    return f"{text} ({hint.condition})" if hint.condition else text


def _chunks(path: str, expected: int, size: int = 1 << 20, bar=None):
    """The file's bytes, ``size`` at a time; each chunk boundary is an interrupt safe point;
    ``bar`` (a progress bar) counts them.

    Raises:
        ValueError: the file gives more or fewer than ``expected`` bytes (its size when put began:
            a file still being written, a /proc file that says 0)."""
    def changed() -> ValueError:
        return ValueError(f"{path}: its size changed while put read it ({expected:,} bytes when put began); put "
                          "stores files that do not change while it reads them")

    done = 0
    with open(path, "rb") as f:
        while True:
            interrupt.checkpoint()
            chunk = f.read(size)
            if not chunk:
                if done != expected:
                    raise changed()
                return
            done += len(chunk)
            if done > expected:
                raise changed()
            if bar is not None:
                bar.update(len(chunk))
            yield chunk


def _file_kind(path: str) -> str:
    """What ``path`` is, in words, for a refusal (``a directory``, ``a FIFO``...)."""
    mode = os.stat(path).st_mode
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device")):
        if test(mode):
            return kind
    return "a special file"


def _committed(store, gen_id: str) -> bool:
    """Whether ``gen_id`` is a committed generation of ``store`` (a Store or a node client)."""
    from retainz.errors import GenerationNotFoundError

    try:
        store.generation(gen_id)
    except GenerationNotFoundError:
        return False
    return True


def _put(args) -> int:
    for path in args.files:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        if not os.path.isfile(path):
            raise ValueError(f"{path}: not a regular file but {_file_kind(path)}; put stores regular files")
    names = [os.path.basename(p) for p in args.files]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        same = [p for p in args.files if os.path.basename(p) == twice[0]]
        files: dict[str, list[str]] = {}         # one file (its real path) -> the paths naming it
        for p in same:
            files.setdefault(os.path.realpath(p), []).append(p)
        again = next((given for given in files.values() if len(given) > 1), None)
        if again:
            raise ValueError(f"{again[0]} is given {len(again)} times" + (
                f" (as {', '.join(again)})" if len(set(again)) > 1 else ""))
        raise ValueError(f"{len(same)} files have the same name {twice[0]!r} ({', '.join(same)}); a shard is named "
                         "by its file name, unique in a generation (a checkpoint tree keeps its paths through "
                         "`retainz mount`)")
    if args.reclaim_step is not None and args.reclaim_step < args.step:
        raise ValueError(f"--reclaim-step {args.reclaim_step} is before --step {args.step} (a generation cannot "
                         "be retired before it is saved)")
    rs = PERMANENT if args.permanent else args.reclaim_step
    with StoreSession(args.device, args=args) as store:
        declared = sum(os.path.getsize(p) for p in args.files)
        try:
            w = store.begin_generation(args.generation, args.step, declared_size=declared, replace=args.replace,
                                       hint=Hint(reclaim_step=rs))
        except GenerationExistsError:
            if args.replace or not _committed(store, args.generation):
                raise
            raise GenerationExistsError(
                f"generation {args.generation!r} already exists on {args.device}; `retainz put --replace "
                f"{args.device} {args.generation} FILE...` replaces it at the new one's commit") from None
        try:
            with progress.bar(declared, f"put {args.generation}") as bar:
                for path, name in zip(args.files, names, strict=True):
                    n = os.path.getsize(path)
                    w.write_shard(name, _chunks(path, n, bar=bar), size=n)
            gen = w.commit()
        except BaseException:
            w.abort()
            raise
    print(f"{gen.id}: {plural(len(gen.shards), 'shard')}, {format_size(gen.size)} committed at step {gen.step}")
    return 0


def _get(args) -> int:
    from retainz.errors import ChecksumError, GenerationNotFoundError

    durable = _durable_source(args)
    with StoreSession(args.device, readonly=True, args=args) as store:
        try:
            gen, local = store.generation(args.generation), True
        except GenerationNotFoundError:
            if durable is None:
                raise
            try:
                gen, local = durable.generation(args.generation), False
            except GenerationNotFoundError:
                raise GenerationNotFoundError(f"no committed generation {args.generation!r} on {args.device}, "
                                              f"and no durable copy of it at {durable.url}") from None
            print(f"{args.generation}: no local copy on {args.device}; reading the durable copy at {durable.url}",
                  file=sys.stderr)
        names = args.shards or list(gen.shards)
        for name in names:
            if name not in gen.shards:
                raise FileNotFoundError(f"generation {gen.id!r} has no shard {name!r}")

        def chunks(name, from_local):
            return store.read_shard(gen.id, name) if from_local else durable.read(gen.id, name)

        if args.out == "-":
            for name in names:
                for chunk in chunks(name, local):
                    sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return 0
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise NotADirectoryError(f"{args.out}: not a directory (-o names the output directory, or - for "
                                     "standard output)")
        os.makedirs(args.out, exist_ok=True)
        for name in names:
            dest = os.path.join(args.out, name)
            try:
                _get_shard(dest, gen.shards[name].size, name, chunks(name, local))
                used = "local copy" if local else f"durable copy at {durable.url}"
            except ChecksumError as e:
                if not local or durable is None:
                    raise
                print(f"{name}: the local copy fails its checksum ({e}); reading the durable copy at "
                      f"{durable.url}", file=sys.stderr)
                _get_shard(dest, gen.shards[name].size, name, chunks(name, False))
                used = f"durable copy at {durable.url}"
            which = f" ({used})" if durable is not None else ""   # only a fallback makes the source a question
            print(f"{dest}: {plural(gen.shards[name].size, 'byte')}, crc32c verified{which}", file=sys.stderr)
    return 0


def _part_path(dest: str) -> str:
    """Where ``get`` writes ``dest`` before its rename: ``dest.part``, or, when that name is longer than
    the folder's file names may be (NAME_MAX, ``pathconf``; 255 bytes on ext4, xfs, tmpfs), as it is for a
    shard named with 251 bytes or more, the name's first bytes (whole UTF-8 characters) then ``.part``."""
    folder, base = os.path.split(dest)
    try:
        limit = os.pathconf(folder or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    raw = base.encode("utf-8", "surrogateescape")
    if len(raw) + len(b".part") <= limit:
        return dest + ".part"
    return os.path.join(folder, raw[:limit - len(b".part")].decode("utf-8", "ignore") + ".part")


def _get_shard(dest: str, size: int, name: str, chunks) -> None:
    """Write ``chunks`` to ``dest`` through ``dest.part`` (renamed once whole and verified; never left
    behind on a failure, a refused rename or a signal); :func:`_part_path` names it."""
    tmp = _part_path(dest)
    try:
        with open(tmp, "wb") as f, progress.bar(size, f"get {name}") as bar:
            for chunk in chunks:
                f.write(chunk)
                bar.update(len(chunk))
        with interrupt.deferred():
            os.replace(tmp, dest)
    except BaseException:
        with interrupt.deferred(), contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class _Durable:
    """``get``'s fallback: the durable copy of generations at a destination (:mod:`retainz.tier`)."""

    def __init__(self, url: str):
        self.url = url
        self._dest = None
        self._manifests: dict = {}

    @property
    def dest(self):
        """The destination, reached on first need: a healthy local copy never touches it."""
        if self._dest is None:
            from retainz.tier import Destination

            self._dest = Destination(self.url)
        return self._dest

    def manifest(self, gen_id: str):
        from retainz.tier import durable_manifest

        if gen_id not in self._manifests:
            self._manifests[gen_id] = durable_manifest(self.dest, gen_id)
        return self._manifests[gen_id]

    def generation(self, gen_id: str):
        """The durable copy as a ``GenerationInfo`` (id, step, shards with sizes and crcs).

        Raises:
            GenerationNotFoundError: no durable copy either."""
        from retainz.store.types import GenerationInfo, GenState, ShardInfo

        m = self.manifest(gen_id)
        return GenerationInfo(m.id, m.step, m.hint(), GenState.COMMITTED,
                              {c.name: ShardInfo(c.name, c.size, c.crc32c) for c in m.shards})

    def read(self, gen_id: str, name: str):
        from retainz.tier import read_durable_shard

        return read_durable_shard(self.dest, self.manifest(gen_id), name)


def _durable_source(args):
    """The durable copy ``get`` may fall back to: ``--from URL``, else the destination remembered for
    the device (``DEV.tier.json``), else ``None``."""
    url = getattr(args, "durable", None)
    if url is None:
        from retainz.tier import TierSettings, state_path_for

        path = state_path_for(args.device)
        saved = TierSettings.load(path) if path else None
        url = saved.url if saved is not None else None
    return _Durable(url) if url else None


def _rm(args) -> int:

    with StoreSession(args.device, args=args) as store:
        # an unknown generation (after a repair): in process, or through a node service (in its scope)
        unknown = {g.id for g in store.unknown()}
        for gid in args.generations:
            if gid not in unknown:       # an unknown one (after a repair) is discarded by name
                gen = store.generation(gid)
                if args.step is not None and args.step < gen.step:
                    raise ValueError(f"--step {args.step} is before step {gen.step} of generation {gid!r} (a "
                                     "generation cannot be retired before it is saved)")
        for gid in args.generations:
            store.delete(gid, step=args.step)
            print(f"{gid}: deleted" + (" (it was unknown)" if gid in unknown else ""))
    return 0


def _gc(args) -> int:
    with StoreSession(args.device, args=args) as store, progress.bar(None, "gc", args, unit="zone") as bar:
        rep = store.gc(force=args.force, progress=progress.callback(bar))
    if args.json:
        print_json(rep.to_dict(), indent=2)
    else:
        print(f"GC: {plural(len(rep.victims), 'zone')} collected {rep.victims}, {plural(rep.extents_moved, 'extent')} "
              f"({format_size(rep.bytes_copied)}) moved, {plural(rep.zones_reset, 'zone')} reset")
        for e in rep.errors:
            print(f"  gave up: {e}")
        if rep.held_back:     # an unforced pass left space a forced one would collect: say why, and what to run
            flag = " (mkfs --gc-reserve)" if rep.empty_zones >= rep.gc_reserve_zones else ""
            print(f"  left: {format_size(rep.held_back_reclaimable)} reclaimable in full "
                  f"zone{'s' if len(rep.held_back) > 1 else ''} {', '.join(map(str, sorted(rep.held_back)))}: "
                  f"{rep.waiting}{flag}; `retainz gc --force` collects it now, copying "
                  f"{format_size(rep.held_back_live)} of live data")
    return 1 if rep.errors else 0


def _fsck(args) -> int:
    from retainz.errors import CorruptDeviceError, CorruptJournalError

    try:
        if args.repair or args.upgrade or args.restore is not None:
            rep = _repair(args.device, upgrade_only=args.upgrade, restore=args.restore)
        else:
            with StoreSession(args.device, readonly=True, args=args) as store:
                total = sum(g.size for g in store.generations())
                with progress.bar(total, "fsck", args) as bar:
                    rep = store.fsck(progress=bar.update)
    except (CorruptDeviceError, CorruptJournalError) as e:
        if not args.json:
            raise
        # damage that stops the mount: a JSON reader still gets a report (what was found, not ok)
        print_json({"ok": False, "mounted": False, "problems": [str(repair_hint(e, args.device))], "repairs": [],
                    "notes": [], "dropped": [], "unknown": []}, indent=2)
        return 1
    if args.json:
        print_json(rep.to_dict(), indent=2)
    else:
        print(f"fsck: {plural(rep.generations, 'generation')}, {plural(rep.shards, 'shard')}, "
              f"{plural(rep.extents, 'extent')}, "
              f"{format_size(rep.bytes_verified)} verified"
              + (f", {format_size(rep.unverifiable_bytes)} counted only" if rep.unverifiable_bytes else ""))
        for p in rep.problems:
            print(f"  problem: {p}")
        for r in rep.repairs:
            print(f"  a read-write open would: {r}")
        for n in rep.notes:
            print(f"  note: {n}")
        for d in rep.dropped:
            step = d["step"] if d["step"] is not None else "unknown: only the lost record held it"
            who = f"generation {d['id']!r} (step {step})" if d["id"] is not None else "a generation"
            print(f"  lost: {who}: {d['reason']}")
        for u in rep.unknown:
            print(f"  unknown: generation {u['id']!r} (step {u['step']}, {format_size(u['bytes'])}): {u['reason']}; "
                  f"not listed nor read: `retainz fsck --restore {u['id']} {args.device}` lists it again, "
                  f"`retainz rm {args.device} {u['id']}` discards it")
        if not rep.ok:
            print(plural(len(rep.problems), "problem"))
        elif rep.unknown:     # consistent, but generations wait for the user's decision: not "clean"
            print(f"{plural(len(rep.unknown), 'unknown generation')} (not listed nor read until "
                  f"`retainz fsck --restore GEN {args.device}` or `retainz rm {args.device} GEN`)")
        else:
            print("clean")
    checking = not (args.repair or args.upgrade or args.restore is not None)
    # a plain check exits 1 while unknown generations wait for a decision (a script must not read
    # them as fine); the writing forms exit 0 when what they were asked to do was done
    return 0 if rep.ok and not (checking and rep.unknown) else 1


def _repair(spec: str, *, upgrade_only: bool = False, restore: str | None = None):
    """``fsck --repair``: the device's own metadata copies first (a FileDevice's label and zone-state
    slots), then a salvaging read-write open (``Store.open(repair=True)``), then the check.
    ``upgrade_only`` (``fsck --upgrade``): a read-write open that migrates an older format version;
    ``restore`` (``fsck --restore GEN``): a read-write open that lists unknown ``GEN`` again."""
    from retainz.store import Store
    from retainz.store.format import FORMAT_VERSION

    _persistent(spec)
    from retainz.errors import CorruptDeviceError
    from retainz.zoned import FileDevice

    if upgrade_only:
        rep = _already_current(spec)
        if rep is not None:
            return rep
    elif restore is None:
        rep = _nothing_to_repair(spec)
        if rep is not None:
            return rep
    relabeled = []
    if not upgrade_only and restore is None:
        from retainz.errors import NotADeviceError

        where = parse_device(spec)
        try:
            if where.is_file and os.path.isfile(where.path):
                FileDevice.check_label(where.path)
        except (NotADeviceError, CorruptDeviceError) as e:
            geometry = lost_label_geometry(spec) if "label" in str(e) else None
            if geometry is None:
                raise
            relabeled.append(FileDevice.relabel(where.path, geometry))
    try:
        dev = open_device(spec)
    except DeviceBusyError:
        raise _busy(spec) from None
    except CorruptDeviceError as e:
        if upgrade_only or restore is not None or "zone-state" not in str(e):
            raise repair_hint(e, spec) from None
        dev = FileDevice(spec.removeprefix("file:"), lost_state=True)   # rebuilt from the journal
    try:
        if upgrade_only or restore is not None:
            try:
                store = Store.open(dev, upgrade=upgrade_only)
            except Exception as e:
                raise repair_hint(e, spec) from None
            with store:
                if restore is not None:
                    store.restore(restore)
                rep = store.fsck()
                if upgrade_only:
                    done = dev.upgrade() if hasattr(dev, "upgrade") else []
                    rep.notes += [f"upgraded: {line}" for line in done]
                    if not done and not any(n.startswith("upgraded: the store") for n in rep.notes):
                        rep.notes.append(f"nothing to upgrade: the store is already format version {FORMAT_VERSION}")
                else:
                    rep.notes.append(f"restored: generation {restore!r} is listed again")
            return rep
        done = relabeled + (dev.repair_metadata() if hasattr(dev, "repair_metadata") else [])
        with Store.open(dev, repair=True) as store:
            rep = store.fsck()
            rep.notes += [f"repaired: {line}" for line in done]
            rep.notes.append("repaired: the journal rolled over to a fresh chain (every superblock and snapshot "
                             "copy rewritten)")
        return rep
    finally:
        dev.close()


def _nothing_to_repair(spec: str):
    """``fsck --repair`` of a clean store: the check's report with the note "nothing to repair",
    from a read-only open that writes nothing (issue 44: a repair rolled the journal over and
    rewrote every superblock and snapshot copy of a store that had no damage).  ``None`` when
    anything would be repaired, so the caller repairs read-write: a device whose own metadata
    copies are damaged or of an older version (``ZonedDevice.notes``), a store that does not open
    read-only (a damaged journal or superblock), or a check that finds a problem, something a
    read-write open would do (``FsckReport.repairs``: a torn tail, stale meta zones, damaged
    copies), a copy used in place of a damaged one, a newer chain skipped, or an older format.

    Raises:
        StoreLockedError: another process holds the device."""
    from retainz.store.format import FORMAT_VERSION

    def clean(dev, store):
        if dev.notes or getattr(dev, "upgradable", False) or store.format_version < FORMAT_VERSION:
            return None
        rep = store.fsck()      # a torn tail or a newer chain skipped is among its repairs (a roll-over, stale meta zones)
        if not rep.ok or rep.repairs or rep.notes or rep.dropped:
            return None
        rep.notes.append("nothing to repair: the store is clean (nothing was written)")
        return rep

    return _read_only_verdict(spec, clean)


def _already_current(spec: str):
    """``fsck --upgrade`` of a store with nothing to migrate: the check's report with the note
    "nothing to upgrade", from a read-only open that writes nothing (a read-write open would journal
    its close); ``None`` when the store's format version (:attr:`CheckpointStore.format_version`) is
    older than :data:`~retainz.store.format.FORMAT_VERSION` or the device file is
    (``FileDevice.upgradable``), so the caller migrates them read-write.

    Raises:
        StoreLockedError: another process holds the device."""
    from retainz.store.format import FORMAT_VERSION

    def current(dev, store):
        if store.format_version < FORMAT_VERSION or getattr(dev, "upgradable", False):
            return None
        rep = store.fsck()
        rep.notes.append(f"nothing to upgrade: the store is already format version {store.format_version}")
        return rep

    return _read_only_verdict(spec, current)


def _read_only_verdict(spec: str, verdict):
    """``verdict(device, store)`` over a read-only open of ``spec`` (which writes nothing): the
    report of a writing ``fsck`` form with nothing to do, or ``None`` to do it read-write.  A device
    or store that does not open read-only is left to the read-write open (``None``), which names the
    damage and the way out as before (:func:`repair_hint`).

    Raises:
        StoreLockedError: another process holds the device."""
    from retainz.store import Store

    try:
        dev = open_device(spec, readonly=True)
    except DeviceBusyError:
        raise _busy(spec) from None
    except Exception:
        return None            # the read-write open meets it and says so, as it always did
    try:
        try:
            store = Store.open(dev, readonly=True)
        except Exception:
            return None
        with store:
            return verdict(dev, store)
    finally:
        dev.close()


def _df(args) -> int:
    from retainz.tier import promotion_counters

    with StoreSession(args.device, readonly=True, args=args) as store:
        rep = store.df()
        policy = store.policy
        metrics = store.metrics.to_dict()
        tier = promotion_counters(store, args.device)
    if args.json:
        print_json({**rep.to_dict(), "policy": policy, "metrics": metrics, **({"tier": tier} if tier is not None else {})}, indent=2)
        return 0
    # zenfs df's lines, in MiB (1,048,576 B) rounded to two decimals (zenfs prints truncated "MB")
    mib = 1 << 20
    print(f"Free: {rep.free / mib:,.2f} MiB")
    print(f"Admissible: {rep.admissible / mib:,.2f} MiB (before GC: free less writers' reservations and "
          f"the GC reserve of {rep.gc_reserve / mib:,.2f} MiB)")
    print(f"Used: {rep.used / mib:,.2f} MiB")
    print(f"Reclaimable: {rep.reclaimable / mib:,.2f} MiB")
    print(f"Space amplification: {rep.space_amplification:.0f}%")
    print(f"Zones: {rep.data_zones} data ({rep.empty_zones} empty, {rep.open_zones} open, {rep.full_zones} "
          f"full), {rep.meta_zones} meta; {plural(rep.generations, 'generation')}; WAF {metrics['waf']:.3f}")
    print(f"Policy: {policy}")
    if tier is not None:
        bl = tier["backlog"]
        print(f"Promotion: {plural(tier['durable'], 'generation')} durable at {tier['url']}; backlog "
              f"{plural(bl['generations'], 'generation')}, {bl['bytes'] / mib:,.2f} MiB"
              + (f"; {tier['failed']} failed ({tier['error']})" if tier["failed"] else ""))
    return 0
