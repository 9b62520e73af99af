"""The catalog: committed generations -> shards -> extents, and which generations live in which zone.
Its on-disk form (generation entries in commit and snapshot records) is :mod:`.records`."""

from __future__ import annotations

from retainz.store.records import live_hash
from retainz.store.types import GenerationInfo

__all__ = ["Catalog"]


class Catalog:
    """Committed generations and a per-zone index of them.

    Attributes:
        gens: ``{id: GenerationInfo}`` of committed generations, in commit order.
        zone_gens: ``{zone: {generation id: None}}``: committed generations with an extent in the
            zone (an insertion-ordered set, so GC visits them deterministically).
        commit_seq: the last commit sequence number handed out.
        digest: the XOR of :func:`~retainz.store.records.live_hash` over ``gens`` (with ``len(gens)``,
            the live set every appended record carries: format version 4).
    """

    def __init__(self):
        self.gens: dict[str, GenerationInfo] = {}
        self.zone_gens: dict[int, dict[str, None]] = {}
        self.commit_seq = 0
        self.digest = 0

    @property
    def live(self) -> tuple[int, int, int]:
        """``(count, digest, commit_seq)`` of the generations held (committed and unknown)."""
        return len(self.gens), self.digest, self.commit_seq

    def add(self, gen: GenerationInfo) -> None:
        """Index a committed (or unknown) generation (one of the same id is removed first)."""
        if gen.id in self.gens:
            self.remove(gen.id)
        self.gens[gen.id] = gen
        self.digest ^= live_hash(gen.id, gen.commit_seq)
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
        """Drop generation ``gid`` (KeyError when absent)."""
        gen = self.gens.pop(gid)
        self.digest ^= live_hash(gid, gen.commit_seq)
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
