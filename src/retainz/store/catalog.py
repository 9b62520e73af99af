"""The catalog (generations -> shards -> extents, and which generations live in which zone) and the
journal's record payloads.

Record payloads are ``KIND b" " JSON`` (compact JSON; ``Infinity`` stands for a permanent reclaim
step).  Kinds:

======  ==================================================================================
snap    snapshot head: ``now``, ``commit_seq``, ``metrics``
sz      snapshot: zone attributes ``[[zone, written, full, reclaim_step, lifetime, opened_step,
        open_seq]...]``
sg      snapshot: a batch of committed generations (the :func:`encode_gen` form)
send    snapshot end: ``n`` generations (a chain is usable only once this is durable)
c       commit: one generation, its extents, and the zone attributes changed since the last record
d       deletion: generation id, zones to reset after it, zone attributes
m       GC move: ``[[generation, shard, new extent list]...]``, victim zones to reset, attributes
x       sync (clean close): zone attributes, ``now``, ``metrics``
======  ==================================================================================

Every record but ``sz``/``sg``/``send`` also carries ``o``, the zone table's opening counter
(``ZoneTable.open_seq``).

Zone attributes are absolute (replaying one twice is harmless).  They carry what placement
decisions depend on and the catalog cannot give: each zone's reclaim step, lifetime class, opening
step, written bytes, whether it was finished, and its place in the opening order (``open_seq``:
``ZoneTable.open`` iterates in it, and greedy writes to the first open zone), so a remount decides
exactly as before (ZenFS issue #266, zone hints lost on remount).  Older journals without
``open_seq`` read as 0 (zone-index order).
"""

from __future__ import annotations

import json

from retainz.hint import Hint, Lifetime
from retainz.store.types import GenerationInfo, GenState, ShardInfo

__all__ = ["Catalog", "encode", "decode", "encode_gen", "decode_gen", "hint_to_list", "hint_from_list"]

dumps = _dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode
_loads = json.loads


def encode(kind: str, body: dict) -> bytes:
    """A record payload."""
    return kind.encode() + b" " + _dumps(body).encode()


def decode(payload: bytes) -> tuple[str, dict]:
    kind, _, body = payload.partition(b" ")
    return kind.decode(), _loads(body)


def hint_to_list(h: Hint) -> list:
    return [h.reclaim_step, h.lifetime, h.condition, h.actual_reclaim_step]


def hint_from_list(v: list) -> Hint:
    rs, lt, cond, actual = v
    return Hint(reclaim_step=rs, lifetime=Lifetime(lt), condition=cond, actual_reclaim_step=actual)


def encode_gen(gen: GenerationInfo) -> list:
    """``[id, step, hint, commit_seq, [[shard, size, crc, [[zone, offset, length, crc]...]]...]]``."""
    return [gen.id, gen.step, hint_to_list(gen.hint), gen.commit_seq,
            [[s.name, s.size, s.crc, s.extents] for s in gen.shards.values()]]


def decode_gen(item: list) -> GenerationInfo:
    gid, step, hint, seq, shards = item
    return GenerationInfo(id=gid, step=step, hint=hint_from_list(hint), state=GenState.COMMITTED,
                          shards={name: ShardInfo(name, size, crc, tuple(map(tuple, ext)))
                                  for name, size, crc, ext in shards},
                          commit_seq=seq)


class Catalog:
    """Committed generations and a per-zone index of them.

    Attributes:
        gens: ``{id: GenerationInfo}`` of committed generations, in commit order.
        zone_gens: ``{zone: {generation id: None}}``: committed generations with an extent in the
            zone (an insertion-ordered set, so GC visits them deterministically).
        commit_seq: the last commit sequence number handed out.
    """

    def __init__(self):
        self.gens: dict[str, GenerationInfo] = {}
        self.zone_gens: dict[int, dict[str, None]] = {}
        self.commit_seq = 0

    def add(self, gen: GenerationInfo) -> None:
        """Index a committed generation."""
        self.gens[gen.id] = gen
        zg = self.zone_gens
        gid = gen.id
        for s in gen.shards.values():
            for e in s.extents:
                d = zg.get(e[0])
                if d is None:
                    zg[e[0]] = {gid: None}
                else:
                    d[gid] = None
        if gen.commit_seq > self.commit_seq:
            self.commit_seq = gen.commit_seq

    def remove(self, gid: str) -> GenerationInfo:
        gen = self.gens.pop(gid)
        zg = self.zone_gens
        for s in gen.shards.values():
            for e in s.extents:
                d = zg.get(e[0])
                if d is not None:
                    d.pop(gid, None)
                    if not d:
                        del zg[e[0]]
        return gen

    def replace_extents(self, gid: str, shard: str, extents: tuple) -> tuple:
        """Give a shard a new extent list (a GC move); returns the old one."""
        gen = self.gens[gid]
        s = gen.shards[shard]
        old = s.extents
        s.extents = extents
        zg = self.zone_gens
        still = {e[0] for sh in gen.shards.values() for e in sh.extents}
        for e in old:
            if e[0] not in still:
                d = zg.get(e[0])
                if d is not None:
                    d.pop(gid, None)
                    if not d:
                        del zg[e[0]]
        for z in still:
            d = zg.get(z)
            if d is None:
                zg[z] = {gid: None}
            else:
                d[gid] = None
        return old

    def ordered(self) -> list[GenerationInfo]:
        """Committed generations, ascending step then id."""
        return sorted(self.gens.values(), key=lambda g: (g.step, g.id))
