"""The on-disk records of the metadata journal, in one place: framing, record kinds, zone attributes,
generation entries, snapshot building and snapshot sizing.  The journal (:mod:`.journal`), recovery
(:mod:`.recovery`), the store's metadata log (:mod:`.metalog`) and the crash test
(:mod:`retainz.testing.crashtest`) all read and write records through this module.

**Framing** (after ZenFS's ``ZenMetaLog`` and LevelDB's log)::

    u32 masked crc32c over (u32 length || payload) | u32 length | payload | zero padding to a block

**Payload**: ``KIND b" " JSON`` (compact JSON; ``Infinity`` stands for a permanent reclaim step).

======  ==================================================================================
kind    body
======  ==================================================================================
snap    snapshot head: ``now``, ``commit_seq``, ``metrics``, ``o``
sz      snapshot: zone attributes ``{"z": [[zone, *ZoneAttrs]...]}`` (2,000 per record)
sg      snapshot: a batch of committed generations ``{"g": [entry...]}`` (:func:`encode_gen`)
send    snapshot end: ``n`` generations (a chain is usable only once this is durable)
c       commit: ``g`` one generation entry, ``now``, ``z`` changed zone attributes, ``o``; a
        replacing commit (version 2) also ``rp`` 1 and ``r`` the zones to reset after it
d       deletion: ``g`` generation id, ``r`` zones to reset after it, ``now``, ``z``, ``o``
m       GC move: ``s`` ``[[generation, shard, new extent list]...]``, ``r`` victims to reset,
        ``now``, ``z``, ``o``
x       sync (clean close): ``now``, ``metrics``, ``z``, ``o``
h       hint update (version 2): ``g`` generation id, ``h`` its new hint, ``now``, ``z``, ``o``
zc      zone close (version 6): ``e``, the byte of the zone where its records end; in the chain's
        appended zone also ``q`` and ``lv`` of the state after its last record (a seal, not a
        record of the sequence: its ``q`` is its last record's)
======  ==================================================================================

**Copies** (version 3): a snapshot's head (``snap``) and end (``send``) records are written twice,
one after the other, the first with ``"cp":0`` and the second with ``"cp":1`` as the body's first
member (:func:`copies`, :func:`copy_of`); replaying either is the same, so a mount that finds one
copy damaged uses the other (:func:`retainz.store.journal.parse_zone`).  From version 5 every
appended record (commit, deletion, move, hint, sync) is written so too, each copy framed in its own
blocks and written by its own device write (:func:`append_frames`), and a fresh store's empty
snapshot writes its ``sz`` record twice: one lost, zeroed or torn 4 KiB block leaves the other copy
(btrfs's DUP profile keeps two copies of every metadata block likewise).  A mount replays copy 0 and
skips an intact copy 1 after it; a damaged copy is replaced by its twin.  A snapshot's batches
(``sz``, ``sg``) are written once: their second copy is the previous chain, kept until the next
rollover (:mod:`retainz.store.journal`, "Previous chain"), in other meta zones.

**Record sequence and live-set digest** (version 4; btrfs stamps every tree block with the
transaction ``generation`` so a reader tells a stale or missing block from the current one): every
appended record carries ``q``, its place in the store's record sequence (the snapshot head carries
the ``q`` of the last record before it), and ``lv`` = ``[n, digest, commit_seq]``, the generations
held before it: their count, the XOR of a 64-bit hash of each one's id and commit sequence
(:func:`live_hash`), and the last commit sequence number.  A repair that lost a record knows where (a gap in ``q`` or a damaged frame)
and, at the next intact record, whether the lost records changed the set of generations (and which
one, when one deletion explains the digest) (:func:`retainz.store.recovery.replay`).

**Zone close** (version 6): a chain zone is finished only after a ``zc`` record (twice, each copy in
its own block, flushed) that says where its records end (:func:`close_record`); appends and a
rollover's packing keep :func:`close_bytes` free in every chain zone for it (an append may instead
fill the zone exactly: :func:`fits`).  A Full chain zone whose
records stop before a close has lost its tail: zeros there are no padding, so the generations the
lost records could concern become unknown instead of the records reading as the journal's end
(:func:`retainz.store.journal.parse_zone`).  Bytes between ``e`` and the close are what a write that
failed or was torn left (the writer saw them, and a rollover closed the zone after them): dropped,
never replayed.  The appended zone's close carries the live set after its last record, so a repair
that lost the records before it settles the gap as the next record would (a lost deletion found by
the digest stays deleted).  ZenFS writes an end record into its old log zone before it finishes it
(``ZenFS::RollMetaZoneLocked`` calls ``ZenFS::WriteEndRecord``; ``ZenFS::RecoverFrom`` stops at
``kEndRecord``); here the close is also required, so that zeros before it are damage and not the
end, as f2fs's checkpoint pack repeats its header block at its end (``validate_checkpoint``) so that
a pack cut short is never taken as whole.

**Bounds**: a record's payload is at most :data:`MAX_RECORD_BYTES` and a frame never spans a meta
zone, so :func:`record_limit` bounds what a mount reads for one record before its checksum.

``o`` is the zone table's opening counter (``ZoneTable.open_seq``).  Zone attributes
(:class:`ZoneAttrs`) are absolute, so replaying one twice is harmless.  They carry what placement
decisions depend on and the catalog cannot give: each zone's written bytes, whether it was
finished, its reclaim step, lifetime class, opening step, place in the opening order (greedy writes
to the first open zone, so a remount decides exactly as before: ZenFS issue #266, zone hints lost
on remount) and last write step.  Attributes journaled by an older version lack the trailing fields,
which read as 0.

A generation entry is ``[id, step, hint, commit_seq, [[shard, size, crc, [[zone, offset, length,
crc]...]]...]]`` with ``hint = [reclaim_step, lifetime, condition, actual_reclaim_step]``; a sixth
member (version 4), a string, marks a generation *unknown* after a repair (the reason): kept, not
listed nor read, until ``retainz fsck --restore`` or ``retainz rm``.
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

from retainz.hint import Hint, Lifetime
from retainz.placement.base import ZoneSummary
from retainz.store.format import FORMAT_VERSION, head_bytes
from retainz.store.types import GenerationInfo, GenState, ShardInfo
from retainz.zoned.model import ZoneCond, round_up

__all__ = ["Kind", "Record", "ZoneAttrs", "frame", "frame_size", "unframe", "FRAME_HEADER", "decode", "kind_of",
           "encode_gen", "decode_gen", "gen_entry_size", "commit_record", "delete_record", "move_record",
           "sync_record", "hint_record", "snapshot_records", "empty_snapshot", "plan_zones", "snapshot_record_limit",
           "snapshot_zones", "pack_zones", "SNAPSHOT_RECORD", "ZONE_ATTR_BYTES", "SNAPSHOT_HEAD_BYTES",
           "EXTENT_BYTES", "ZONES_PER_RECORD", "BATCH_WRAP_BYTES", "SNAPSHOT_END_BYTES", "MAX_RECORD_BYTES",
           "record_limit", "write_limit", "append_frames", "close_record", "close_bytes", "fits", "CLOSE_RECORD_BYTES", "COPY_MEMBER_BYTES", "copy_of", "copies", "stamp", "live_hash", "LOST"]

# -- framing -------------------------------------------------------------------------------------------
_HEADER = struct.Struct("<II")
_LEN = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
#: Bytes of a frame header (masked crc, length).
FRAME_HEADER = _HEADER.size
#: The largest record payload written or read (64 MiB: a commit of about 1.4 million extents).
MAX_RECORD_BYTES = 64 << 20


#: The payload :func:`retainz.store.journal.parse_zone` puts where a repair skipped records it could
#: not read (a gap: :func:`retainz.store.recovery.replay` makes what they could concern unknown).
LOST = b""


def record_limit(zone_capacity: int, block_size: int, head: int | None = None) -> int:
    """The largest payload (bytes) of a record in a meta zone of ``zone_capacity`` bytes whose records
    start after ``head`` bytes (default: this version's superblock copies): the frame must fit the
    zone and the payload :data:`MAX_RECORD_BYTES`.  What the journal writes and what a mount reads."""
    head = head_bytes(FORMAT_VERSION, block_size) if head is None else head
    return max(0, min(MAX_RECORD_BYTES, zone_capacity - head - FRAME_HEADER))


#: Bytes the ``"cp":N,`` member adds to a copy of a record (:func:`copies`).
COPY_MEMBER_BYTES = 7


def write_limit(zone_capacity: int, block_size: int) -> int:
    """The largest payload (bytes) of a record this version appends: both copies' frames
    (:func:`append_frames`, format version 5) fit a meta zone after its superblock copies (filling
    it: :func:`fits`), and at most :data:`MAX_RECORD_BYTES`.  (A mount reads records up to :func:`record_limit`: an older
    version's single copy may be larger.)"""
    half = (zone_capacity - head_bytes(FORMAT_VERSION, block_size)) // 2 // block_size * block_size
    return max(0, min(MAX_RECORD_BYTES, half - FRAME_HEADER - COPY_MEMBER_BYTES))


def _mask(crc: int) -> int:
    """LevelDB's crc mask (a crc stored next to the data it covers is masked)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _crc(payload) -> int:
    return _mask(crc32c.crc32c(payload, crc32c.crc32c(_LEN.pack(len(payload)))))


def frame(payload: bytes, block_size: int) -> bytes:
    """Frame one record: header, payload, zero padding to a multiple of ``block_size`` bytes."""
    n = len(payload)
    return _HEADER.pack(_crc(payload), n) + payload + bytes(-(n + FRAME_HEADER) % block_size)


def frame_size(payload_bytes: int, block_size: int) -> int:
    """Bytes of the frame of a ``payload_bytes`` payload (header and padding included)."""
    return round_up(payload_bytes + FRAME_HEADER, block_size)


def append_frames(payload: bytes, block_size: int) -> list[bytes]:
    """The frames format version 5 appends for one record: copy 0's, then copy 1's
    (:func:`copies`), each padded to whole blocks, so that no block holds part of both.  A payload
    that already names its copy (``cp``) is one copy: framed once."""
    if copy_of(payload) is not None:
        return [frame(payload, block_size)]
    return [frame(c, block_size) for c in copies(payload)]


def unframe(buf, pos: int, end: int, block_size: int) -> tuple[int, int, bool]:
    """Read the frame header at ``buf[pos:]``: ``(payload length, frame bytes, crc matches)``.

    A zero header (crc 0, length 0) returns ``(0, 0, False)``; a frame that runs past ``end``
    returns its length and size with ``False`` (its payload was not all written)."""
    crc, n = _HEADER.unpack_from(buf, pos)
    if crc == 0 and n == 0:
        return 0, 0, False
    total = round_up(FRAME_HEADER + n, block_size)
    if pos + total > end:
        return n, total, False
    return n, total, _crc(buf[pos + FRAME_HEADER:pos + FRAME_HEADER + n]) == crc


# -- kinds and decoding ----------------------------------------------------------------------------------
class Kind(enum.StrEnum):
    """Record kinds (the payload's first word)."""

    SNAP = "snap"
    ZONES = "sz"
    GENS = "sg"
    SNAP_END = "send"
    COMMIT = "c"
    DELETE = "d"
    MOVE = "m"
    SYNC = "x"
    HINT = "h"
    CLOSE = "zc"


_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode
_loads = json.loads


class ZoneAttrs(NamedTuple):
    """A data zone's journaled attributes (see the module docstring); bytes and training steps."""

    written: int = 0
    full: int = 0
    reclaim_step: float | None = None
    lifetime: int = 0
    opened_step: int = 0
    open_seq: int = 0
    last_write_step: int = 0

    @classmethod
    def of(cls, s: ZoneSummary) -> ZoneAttrs:
        """The attributes of a zone summary."""
        return cls(s.written, 1 if s.cond is ZoneCond.FULL else 0, s.reclaim_step, s.lifetime,
                   s.opened_step, s.open_seq, s.last_write_step)

    @classmethod
    def decode(cls, item: list) -> tuple[int, ZoneAttrs]:
        """``[zone, written, full, ...]`` (older, shorter lists pad with 0) -> ``(zone, attrs)``."""
        return item[0], cls(*item[1:8])


#: A zone the journal says nothing about (empty).
NO_ATTRS = ZoneAttrs()


def zone_attr_item(z: int, s: ZoneSummary) -> list:
    """The on-disk form of zone ``z``'s attributes: ``[zone, *ZoneAttrs.of(s)]`` (the hot path)."""
    return [z, s.written, 1 if s.cond is ZoneCond.FULL else 0, s.reclaim_step, s.lifetime, s.opened_step,
            s.open_seq, s.last_write_step]


@dataclass(slots=True)
class Record:
    """One decoded record.  Fields a kind does not carry keep their defaults (empty and shared:
    read-only; mount decodes every record, so no empty containers are built for them).

    Attributes:
        kind: :class:`Kind`.
        zones: ``[(zone, ZoneAttrs)]`` (``sz``, ``c``, ``d``, ``m``, ``x``).
        open_seq: ``o``, or ``None`` when absent.
        now: the logical time (training step), or ``None`` when absent.
        gens: generations (``c``: one; ``sg``: a batch), committed.
        deleted: the retired generation id (``d``).
        replaces: the commit retires the committed generation of the same id (``c`` with ``rp``).
        resets: zones to reset after the record (``d``, ``m``, a replacing ``c``).
        moves: ``[(generation id, shard, extents)]`` (``m``).
        metrics: ``StoreMetrics`` fields (``snap``, ``x``; ``None`` for other kinds).
        commit_seq: the last commit sequence number (``snap``), or ``None``.
        hint: ``(generation id, new hint)`` (``h``).
        count: generations in the snapshot (``send``).
        q: the record's place in the record sequence (version 4; ``snap``: the last before it), or
            ``None``.
        lv: ``[count, digest, commit_seq]`` of the generations before it (version 4), or ``None``;
            a close's: after its zone's last record.
        end: where the zone's records end (``zc``, version 6), else ``None``.
    """

    kind: Kind
    zones: Sequence[tuple[int, ZoneAttrs]] = ()
    open_seq: int | None = None
    now: int | None = None
    gens: Sequence[GenerationInfo] = ()
    deleted: str | None = None
    replaces: bool = False
    resets: Sequence[int] = ()
    moves: Sequence[tuple[str, str, tuple]] = ()
    metrics: dict | None = None
    commit_seq: int | None = None
    count: int = 0
    hint: tuple[str, Hint] | None = None
    q: int | None = None
    lv: list | None = None
    end: int | None = None


#: Kinds by their payload word (a dict lookup: mount decodes every record of a chain).
_KINDS = {k.value.encode(): k for k in Kind}


def kind_of(payload: bytes) -> Kind | None:
    """The kind of a payload without decoding its body (``None``: not a known kind)."""
    i = payload.find(b" ")
    return _KINDS.get(payload[:i] if i >= 0 else payload)


def decode(payload: bytes) -> Record:
    """Decode a record payload.

    Raises:
        ValueError: an unknown kind, a body that is not JSON (``json.JSONDecodeError`` is a
            ValueError, as is ``UnicodeDecodeError``) or not a JSON object; a missing member raises
            KeyError, a malformed one TypeError or IndexError.
    """
    word, _, raw = payload.partition(b" ")
    kind = _KINDS.get(word)
    if kind is None:
        raise ValueError(f"unknown record kind {word[:16]!r}")
    body = _loads(raw.decode())   # the encoder writes ASCII (ensure_ascii); str skips detect_encoding
    if not isinstance(body, dict):
        raise ValueError(f"a {kind.value!r} record's body is not a JSON object")
    rec = Record(kind, open_seq=body.get("o"), now=body.get("now"), q=body.get("q"), lv=body.get("lv"))
    if "z" in body:
        rec.zones = [ZoneAttrs.decode(a) for a in body["z"]]
    if kind is Kind.COMMIT:
        rec.gens = [decode_gen(body["g"])]
        rec.replaces = bool(body.get("rp"))
        rec.resets = body.get("r", [])
    elif kind is Kind.GENS:
        rec.gens = [decode_gen(item) for item in body["g"]]
    elif kind is Kind.DELETE:
        rec.deleted, rec.resets = body["g"], body["r"]
    elif kind is Kind.MOVE:
        rec.moves = [(gid, name, tuple(map(tuple, ext))) for gid, name, ext in body["s"]]
        rec.resets = body["r"]
    elif kind in (Kind.SNAP, Kind.SYNC):
        rec.metrics = body.get("metrics", {})
        rec.commit_seq = body.get("commit_seq")
    elif kind is Kind.SNAP_END:
        rec.count = body["n"]
    elif kind is Kind.HINT:
        rec.hint = (body["g"], _hint_of(body["h"]))
    elif kind is Kind.CLOSE:
        rec.end = body["e"]
        if not isinstance(rec.end, int) or rec.end < 0:
            raise TypeError(f"a close record's end {rec.end!r} is not a byte offset")
    return rec


# -- generation entries ---------------------------------------------------------------------------------
def _hint_item(h: Hint) -> list:
    return [h.reclaim_step, h.lifetime, h.condition, h.actual_reclaim_step]


#: ``Lifetime(value)`` as a dict lookup (a bad value raises KeyError, as decoding reports it).
_LIFETIME = {int(lt): lt for lt in Lifetime}


def _hint_of(item: list) -> Hint:
    rs, lt, cond, actual = item
    return Hint(reclaim_step=rs, lifetime=_LIFETIME[lt], condition=cond, actual_reclaim_step=actual)


def encode_gen(gen: GenerationInfo) -> list:
    """A generation's entry (see the module docstring); an unknown one carries its reason."""
    item = [gen.id, gen.step, _hint_item(gen.hint), gen.commit_seq,
            [[s.name, s.size, s.crc, s.extents] for s in gen.shards.values()]]
    if gen.state is GenState.UNKNOWN:
        item.append(gen.unknown_reason)
    return item


def decode_gen(item: list) -> GenerationInfo:
    """A committed (or, with a sixth member, unknown) :class:`GenerationInfo` from its entry."""
    gid, step, hint, seq, shards, *why = item
    if why and not isinstance(why[0], str) or len(why) > 1:
        raise ValueError("a generation entry's sixth member is not a reason string")
    return GenerationInfo(id=gid, step=step, hint=_hint_of(hint),
                          state=GenState.UNKNOWN if why else GenState.COMMITTED,
                          shards={name: ShardInfo(name, size, crc, tuple(map(tuple, ext)))
                                  for name, size, crc, ext in shards},
                          commit_seq=seq, unknown_reason=why[0] if why else "")


def live_hash(gen_id: str, commit_seq: int) -> int:
    """The 64-bit hash of one committed generation in a record's live-set digest (``lv``, version
    4): BLAKE2b-64 of ``id NUL commit_seq``.  The digest is the XOR of the hashes of every committed
    generation, so adding or removing one is one XOR (:class:`~retainz.store.catalog.Catalog`)."""
    return int.from_bytes(hashlib.blake2b(f"{gen_id}\0{commit_seq}".encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "little")


def gen_entry_bytes(gen: GenerationInfo) -> bytes:
    """The entry of ``gen`` as compact JSON bytes (what a commit record and a snapshot carry)."""
    return _dumps(encode_gen(gen)).encode()


def gen_entry_size(gen: GenerationInfo) -> int:
    """Bytes ``gen``'s entry takes in a snapshot ``sg`` record (JSON and its separator)."""
    return len(_dumps(encode_gen(gen))) + 1


# -- record encoders -----------------------------------------------------------------------------------
def _update(kind: Kind, body: dict, zones: list, open_seq: int) -> bytes:
    body["z"] = zones
    body["o"] = open_seq
    return kind.encode() + b" " + _dumps(body).encode()


def commit_record(entry: bytes, now: int, zones: list, open_seq: int, replace_resets: list[int] | None = None) -> bytes:
    """A ``c`` record for the generation entry ``entry`` (:func:`gen_entry_bytes`, spliced in as is
    so a commit encodes its generation once) and the changed zones' attribute items.

    ``replace_resets`` (format version 2): the commit replaces the committed generation of the same
    id, retired by this same record (``rp``); the zones it leaves with no live data (``r``) are
    reset after it.  ``None``: a plain commit."""
    body = {"now": now, "z": zones, "o": open_seq}
    if replace_resets is not None:
        body = {"rp": 1, "r": replace_resets, **body}
    return b'c {"g":' + entry + b"," + _dumps(body)[1:].encode()


def delete_record(gen_id: str, resets: list[int], now: int, zones: list, open_seq: int) -> bytes:
    """A ``d`` record: ``gen_id`` retired; ``resets`` are reset after it."""
    return _update(Kind.DELETE, {"g": gen_id, "r": resets, "now": now}, zones, open_seq)


def move_record(moves: list, resets: list[int], now: int, zones: list, open_seq: int) -> bytes:
    """An ``m`` record: ``moves`` ``[[generation, shard, new extents]...]``; victims ``resets``."""
    return _update(Kind.MOVE, {"s": moves, "r": resets, "now": now}, zones, open_seq)


def hint_record(gen_id: str, hint: Hint, now: int, zones: list, open_seq: int) -> bytes:
    """An ``h`` record: committed generation ``gen_id`` has a new hint (format version 2)."""
    return _update(Kind.HINT, {"g": gen_id, "h": _hint_item(hint), "now": now}, zones, open_seq)


def sync_record(now: int, metrics: dict, zones: list, open_seq: int) -> bytes:
    """An ``x`` record (clean close)."""
    return _update(Kind.SYNC, {"now": now, "metrics": metrics}, zones, open_seq)


#: The largest payload of a close record (``zc`` with ``cp``, ``e``, ``q`` and ``lv``: about 110 bytes).
CLOSE_RECORD_BYTES = 192


def close_record(end: int, seal: tuple[int, tuple[int, int, int]] | None = None) -> bytes:
    """A ``zc`` record (version 6, module docstring "Zone close"): the zone's records end at byte
    ``end``; ``seal`` = ``(q, (count, digest, commit_seq))`` of the state after its last record (the
    chain's appended zone), ``None`` for a snapshot's zone.  Written twice (:func:`append_frames`)."""
    body = {"e": end} if seal is None else {"e": end, "q": seal[0], "lv": list(seal[1])}
    return _rec(Kind.CLOSE, body)


def fits(used: int, size: int, zone_capacity: int, tail: int) -> bool:
    """Whether ``size`` more bytes of records fit a chain zone holding ``used`` bytes whose close
    record takes ``tail`` bytes (:func:`close_bytes`): they fill it exactly (a zone Full by its
    records has no zero tail to misread, and needs no close), or leave room for the close (version
    6, module docstring "Zone close").  Every byte count in bytes."""
    return used + size == zone_capacity or used + size + tail <= zone_capacity


def close_bytes(version: int, block_size: int) -> int:
    """Bytes a chain zone of format ``version`` keeps free for its close record's two copies (0
    before version 6)."""
    return 2 * frame_size(CLOSE_RECORD_BYTES + COPY_MEMBER_BYTES, block_size) if version >= 6 else 0


def _rec(kind: Kind, body: dict) -> bytes:
    return kind.encode() + b" " + _dumps(body).encode()


def _splice(payload: bytes, members: bytes) -> bytes:
    """``payload`` (``KIND {...}``) with ``members`` (``"a":1,``) first in its body."""
    i = payload.index(b" {") + 2
    if payload[i:i + 1] == b"}":
        members = members[:-1]
    return payload[:i] + members + payload[i:]


def copies(payload: bytes) -> list[bytes]:
    """A record as written twice (module docstring, "Copies"): ``cp`` 0, then ``cp`` 1."""
    return [_splice(payload, b'"cp":%d,' % i) for i in (0, 1)]


def stamp(payload: bytes, q: int, live: tuple[int, int, int]) -> bytes:
    """An appended record with its sequence number ``q`` and the live set ``(count, digest, commit
    sequence)`` before it (module docstring; version 4)."""
    return _splice(payload, b'"q":%d,"lv":[%d,%d,%d],' % (q, *live))


def _copies(kind: Kind, body: dict) -> list[bytes]:
    return copies(_rec(kind, body))


def copy_of(payload) -> int | None:
    """Which copy of a duplicated record ``payload`` is (0 or 1), ``None`` for a record written once.
    Looks only at the payload's first bytes (``KIND {"cp":N``)."""
    head = bytes(payload[:16])
    i = head.find(b' {"cp":')
    if i < 0 or i + 8 > len(head) or head[:i] not in _KINDS:
        return None
    return {0x30: 0, 0x31: 1}.get(head[i + 7])


#: Zone attribute items per snapshot ``sz`` record.
ZONES_PER_RECORD = 2000


def empty_snapshot() -> list[bytes]:
    """The snapshot of a freshly formatted store (what ``Store.format`` writes after the superblock)."""
    return [*_copies(Kind.SNAP, {"now": 0, "commit_seq": 0, "metrics": {}, "q": 0}), *_copies(Kind.ZONES, {"z": []}),
            *_copies(Kind.SNAP_END, {"n": 0})]


def snapshot_records(now: int, commit_seq: int, metrics: dict, open_seq: int, zones: list,
                     gens: Iterable[GenerationInfo], n_gens: int, limit: int, q: int = 0) -> list[bytes]:
    """The payloads of a snapshot: head (twice), zone attribute batches, generation batches of at
    most ``limit`` bytes (a single larger entry gets a record of its own), end (twice).

    Args:
        q: the sequence number of the last record before the snapshot (the head carries it).
        zones: attribute items (:func:`zone_attr_item`) of every zone that is not empty.
        gens: the committed generations, in catalog order; ``n_gens`` of them.
        limit: :func:`snapshot_record_limit`.
    """
    out = _copies(Kind.SNAP, {"now": now, "commit_seq": commit_seq, "metrics": metrics, "o": open_seq, "q": q})
    for i in range(0, len(zones), ZONES_PER_RECORD):
        out.append(_rec(Kind.ZONES, {"z": zones[i:i + ZONES_PER_RECORD]}))
    batch: list = []
    size = 0
    for gen in gens:
        item = encode_gen(gen)
        n = len(_dumps(item)) + 1
        if batch and size + n > limit:
            out.append(_rec(Kind.GENS, {"g": batch}))
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        out.append(_rec(Kind.GENS, {"g": batch}))
    out += _copies(Kind.SNAP_END, {"n": n_gens})
    return out


# -- sizing --------------------------------------------------------------------------------------------
#: Snapshot records batch generations up to this many bytes (or a quarter of a meta zone).
SNAPSHOT_RECORD = 64 * 1024
#: Bytes of one zone's attributes in a snapshot ``sz`` record, at most (eight JSON numbers).
ZONE_ATTR_BYTES = 112
#: Bytes of a snapshot's fixed records (``snap`` head with the metrics, ``send``), at most.
SNAPSHOT_HEAD_BYTES = 2048
#: Bytes of one extent in a snapshot, at most (``[zone,offset,length,crc],``).
EXTENT_BYTES = 48
#: Bytes a batch record (``sz`` zone attributes, ``sg`` generations) adds around its items, at most.
BATCH_WRAP_BYTES = 16
#: Bytes of a snapshot's end record (``send``), at most.
SNAPSHOT_END_BYTES = 64


def snapshot_record_limit(zone_capacity: int, block_size: int) -> int:
    """Bytes of generations batched into one snapshot record (``sg``)."""
    return min(SNAPSHOT_RECORD, (zone_capacity - head_bytes(FORMAT_VERSION, block_size) - FRAME_HEADER) // 4)


def plan_zones(frame_sizes: Iterable[int], zone_capacity: int, block_size: int, reserve: int = 0) -> list[list[int]]:
    """Pack frames into meta zones in order, as a rollover writes them: each zone starts with its
    superblock copies (:func:`~retainz.store.format.head_bytes`); a frame that does not fit the
    current zone opens the next; the last zone
    keeps ``reserve`` bytes free (else one more, empty zone is planned).  Returns the frame
    indexes per zone.  Every zone keeps :func:`close_bytes` free for its close record (version 6;
    unlike an append, :func:`fits`, a frame never fills a zone exactly: more bytes never take fewer
    zones, so an estimate from larger sizes bounds the real packing).  The one packing rule:
    :meth:`Journal.roll` and :func:`pack_zones` use it."""
    plan: list[list[int]] = [[]]
    head = used = head_bytes(FORMAT_VERSION, block_size)
    room = zone_capacity - close_bytes(FORMAT_VERSION, block_size)
    for i, f in enumerate(frame_sizes):
        if used + f > room:
            plan.append([])
            used = head
        plan[-1].append(i)
        used += f
    if used + reserve > room:
        plan.append([])
    return plan


def pack_zones(entries, zone_capacity: int, block_size: int, *, zones: int = 0, reserve: int = 0) -> int:
    """Meta zones a snapshot takes, batched as :func:`snapshot_records` does and packed as a
    rollover packs it (:func:`plan_zones`), for generation entries of the given sizes (bytes, in
    catalog order), ``zones`` attribute items of at most ``ZONE_ATTR_BYTES`` each and a head of at
    most ``SNAPSHOT_HEAD_BYTES``, keeping ``reserve`` bytes free in the last zone.  O(entries)."""
    limit = snapshot_record_limit(zone_capacity, block_size)
    payloads = [SNAPSHOT_HEAD_BYTES, SNAPSHOT_HEAD_BYTES]
    for i in range(0, zones, ZONES_PER_RECORD):
        payloads.append(BATCH_WRAP_BYTES + min(ZONES_PER_RECORD, zones - i) * ZONE_ATTR_BYTES)
    size = 0
    for n in entries:
        if size and size + n > limit:
            payloads.append(size + BATCH_WRAP_BYTES)
            size = 0
        size += n
    if size:
        payloads.append(size + BATCH_WRAP_BYTES)
    payloads += [SNAPSHOT_END_BYTES, SNAPSHOT_END_BYTES]
    return len(plan_zones((frame_size(p, block_size) for p in payloads), zone_capacity, block_size, reserve))


def snapshot_zones(gen_bytes: int, zone_capacity: int, block_size: int, *, items: int | None = None,
                   biggest: int = 0, zones: int = 0, next_copies: int = 2, closing: bool = True) -> int:
    """Meta zones a snapshot takes when a rollover packs it, with room left for one more record
    (the one that triggers the roll): an O(1) upper bound of :func:`pack_zones`.

    Args:
        gen_bytes: bytes of the generations' snapshot entries (:func:`gen_entry_size` each).
        zone_capacity, block_size: bytes.
        items: generations (``None``: unknown, as many as ``gen_bytes`` allows).
        biggest: the largest entry, in bytes.
        zones: zone attribute items (``sz`` records batch 2,000 each).
        next_copies: copies of the next record room is kept for (2: format version 5 appends every
            record twice; :func:`retainz.store.journal.default_meta_zones` sizes with 1, format
            4's rule, so that the default meta-zone count does not move).
        closing: every zone keeps :func:`close_bytes` free (format version 6); ``False``: format 5's
            rule (:func:`~retainz.store.journal.default_meta_zones`, likewise).

    The bound: batching closes a generation record before it passes the limit
    (:func:`snapshot_record_limit`), so each record but the last holds more than ``limit -
    biggest`` bytes and at least ``limit // biggest`` entries (an entry larger than half the limit
    may get a record of its own); every record frame adds a header and less than a block of
    padding.  The frames total ``T`` (head and end, twice each, ``sz`` frames of ``ZONE_ATTR_BYTES`` per zone,
    the generation frames, and two frames as large as the largest entry for the next record: it is
    appended twice, format version 5).
    Everything fits one zone when ``T`` fits its capacity after the superblock copies; otherwise every
    zone but the last is filled to within one frame (``F``, the largest) of its end, so
    ``ceil(T / (capacity - superblock - F))`` zones.
    """
    limit = snapshot_record_limit(zone_capacity, block_size)
    usable = zone_capacity - head_bytes(FORMAT_VERSION, block_size) - (close_bytes(FORMAT_VERSION, block_size)
                                                                       if closing else 0)
    pad = FRAME_HEADER + block_size - 1
    attr_records = -(-zones // ZONES_PER_RECORD)
    attr_frames = zones * ZONE_ATTR_BYTES + attr_records * pad
    if gen_bytes <= 0:
        n_gen = 0
    elif biggest >= limit // 2:
        n_gen = -(-gen_bytes // (limit // 2)) if items is None else items
    else:
        n_gen = -(-gen_bytes // (limit - biggest)) + 1
        if items is not None:   # a batch takes at least limit // biggest entries
            n_gen = min(n_gen, items, -(-items // (limit // max(biggest, 1))))
    nxt = next_copies * round_up(max(biggest, 1024) + (COPY_MEMBER_BYTES if next_copies > 1 else 0) + pad,
                                 block_size)
    total = (2 * round_up(SNAPSHOT_HEAD_BYTES + FRAME_HEADER, block_size) + 2 * block_size + attr_frames
             + gen_bytes + n_gen * pad + nxt)
    if total <= usable:
        return 1
    frame_max = max(nxt if next_copies > 1 else 0, round_up(max(limit, biggest, min(zones, ZONES_PER_RECORD) * ZONE_ATTR_BYTES) + pad,
                                  block_size))
    return -(-total // max(usable - frame_max, usable // 4, block_size))
