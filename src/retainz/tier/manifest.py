"""The manifest: the object written last at the destination, which alone makes a promoted generation
durable (docs/tiers.md, "The protocol").

It is JSON (``MANIFEST.json`` in the generation's folder at the destination)::

    {"format": 1, "store": UUID, "id": GEN, "step": N, "reclaim_step": R | "inf" | null,
     "condition": TEXT, "shards": [{"name": NAME, "key": OBJECT, "size": BYTES, "crc32c": CRC}...],
     ["node": NODE, "nodes": [NODE...],]
     "crc32c": CRC of the canonical JSON of every other member}

A manifest counts only when it parses, its own crc32c matches, and every shard it lists has the size
and crc32c of the local generation's shard of that name (:meth:`Manifest.matches`); it is written
only after every shard object was read back and verified.

Several nodes (docs/tiers.md, "Several nodes"): each node promotes the shards its own device holds
and writes a **node manifest** (``MANIFEST.<node>.json``) naming itself (``node``) and the world's
nodes (``nodes``, sorted).  The generation is durable only when every node of ``nodes`` has a node
manifest that agrees on the id, step and world; :meth:`Manifest.union` makes them one manifest of the
whole generation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import crc32c

from retainz.errors import DurableCopyError
from retainz.hint import Hint
from retainz.store.types import GenerationInfo

__all__ = ["Manifest", "ShardCopy", "MANIFEST_NAME", "MANIFEST_FORMAT"]

#: The manifest's object name inside a generation's folder.
MANIFEST_NAME = "MANIFEST.json"
#: The manifest's own format version.
MANIFEST_FORMAT = 1
#: A manifest larger than this is not read (a destination is input too).
MAX_MANIFEST_BYTES = 16 << 20


@dataclass(frozen=True)
class ShardCopy:
    """One shard at the destination: its name in the generation, its object key (relative to the
    generation's folder), its size in bytes and its crc32c."""

    name: str
    key: str
    size: int
    crc32c: int


@dataclass(frozen=True)
class Manifest:
    """A promoted generation (module docstring)."""

    store: str
    id: str
    step: int
    reclaim_step: float | None
    condition: str
    shards: tuple[ShardCopy, ...]
    #: the node whose shards this node manifest lists (``None``: a whole generation's manifest)
    node: str | None = None
    #: the world's nodes, sorted (empty for a single device's manifest)
    nodes: tuple[str, ...] = ()

    @classmethod
    def of(cls, store_uuid: str, gen: GenerationInfo, keys: dict[str, str], *, node: str | None = None,
           nodes: tuple[str, ...] = ()) -> Manifest:
        """The manifest of committed ``gen`` whose shard ``name`` lives at ``keys[name]`` (with ``node``
        and ``nodes``: that node's manifest of its part of a generation of several nodes).

        Raises:
            ValueError: a counted shard (no crc32c: a payload-less device holds no bytes to promote).
        """
        shards = []
        for s in gen.shards.values():
            if s.crc is None:
                raise ValueError(f"generation {gen.id!r} shard {s.name!r} has no bytes (a payload-less device): "
                                 "nothing to promote")
            shards.append(ShardCopy(s.name, keys[s.name], s.size, s.crc))
        return cls(str(store_uuid), gen.id, gen.step, gen.hint.reclaim_step, gen.hint.condition, tuple(shards),
                   node, tuple(sorted(nodes)))

    @classmethod
    def union(cls, parts: list[Manifest], where: str) -> Manifest:
        """One manifest of a whole generation from the node manifests of every node of its world.

        Args:
            parts: one node manifest per node of ``parts[0].nodes``.
            where: the generation's folder, for messages.

        Raises:
            DurableCopyError: the parts disagree on the id, step or world, a node of the world is
                missing or given twice, or two nodes name the same shard (one line naming ``where``).
        """
        first = parts[0]
        world = first.nodes
        if sorted(p.node for p in parts) != list(world):
            raise DurableCopyError(f"{where}: node manifests of {sorted(str(p.node) for p in parts)} do not make "
                                   f"the world {list(world)}")
        shards: dict[str, ShardCopy] = {}
        for p in parts:
            if (p.id, p.step, p.nodes) != (first.id, first.step, world):
                raise DurableCopyError(f"{where}: node {p.node!r}'s manifest describes generation {p.id!r} step "
                                       f"{p.step} of nodes {list(p.nodes)}, node {first.node!r}'s {first.id!r} "
                                       f"step {first.step} of nodes {list(world)}")
            for c in p.shards:
                if c.name in shards:
                    raise DurableCopyError(f"{where}: shard {c.name!r} is named by two nodes' manifests")
                shards[c.name] = c
        stores = ",".join(sorted({p.store for p in parts}))
        return cls(stores, first.id, first.step, first.reclaim_step, first.condition,
                   tuple(shards[n] for n in sorted(shards)), None, world)

    @property
    def size(self) -> int:
        """Bytes of shard data."""
        return sum(s.size for s in self.shards)

    def hint(self) -> Hint:
        """The retention hint the generation was committed with (for a restore)."""
        return Hint(reclaim_step=self.reclaim_step, condition=self.condition)

    def matches(self, gen: GenerationInfo) -> bool:
        """True when this manifest describes exactly ``gen``'s bytes: same id and step, the same shard
        names, and each shard's size and crc32c equal."""
        if self.id != gen.id or self.step != gen.step or len(self.shards) != len(gen.shards):
            return False
        for c in self.shards:
            s = gen.shards.get(c.name)
            if s is None or s.size != c.size or s.crc != c.crc32c:
                return False
        return True

    def _body(self) -> dict:
        rs = self.reclaim_step
        body = {"format": MANIFEST_FORMAT, "store": self.store, "id": self.id, "step": self.step,
                "reclaim_step": "inf" if rs is not None and math.isinf(rs) else rs,
                "condition": self.condition,
                "shards": [{"name": c.name, "key": c.key, "size": c.size, "crc32c": c.crc32c}
                           for c in self.shards]}
        if self.node is not None:
            body["node"] = self.node
            body["nodes"] = list(self.nodes)
        return body

    def encode(self) -> bytes:
        """The manifest's bytes (canonical JSON with its own crc32c)."""
        body = self._body()
        canon = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return json.dumps({**body, "crc32c": crc32c.crc32c(canon.encode())}, sort_keys=True, indent=1).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> Manifest:
        """Read a manifest's bytes.

        Raises:
            DurableCopyError: not JSON, a format it does not know, a member missing or of the wrong
                type, or its crc32c does not match (one line naming ``where``).
        """
        if len(data) > MAX_MANIFEST_BYTES:
            raise DurableCopyError(f"{where}: manifest of {len(data)} bytes is larger than {MAX_MANIFEST_BYTES}")
        try:
            obj = json.loads(data)
            crc = obj.pop("crc32c")
            canon = json.dumps(obj, sort_keys=True, separators=(",", ":"))
            if crc32c.crc32c(canon.encode()) != crc:
                raise DurableCopyError(f"{where}: the manifest fails its crc32c (damaged or torn)")
            if obj["format"] != MANIFEST_FORMAT:
                raise DurableCopyError(f"{where}: manifest format {obj['format']!r} is not {MANIFEST_FORMAT}")
            rs = obj["reclaim_step"]
            shards = tuple(ShardCopy(str(c["name"]), str(c["key"]), int(c["size"]), int(c["crc32c"]))
                           for c in obj["shards"])
            node = obj.get("node")
            nodes = tuple(str(n) for n in obj.get("nodes", ()))
            if node is not None and (str(node) not in nodes or list(nodes) != sorted(set(nodes))):
                raise DurableCopyError(f"{where}: node {node!r} is not one of the manifest's nodes {list(nodes)}")
            return cls(str(obj["store"]), str(obj["id"]), int(obj["step"]),
                       math.inf if rs == "inf" else (rs if rs is None or type(rs) is int else float(rs)),
                       str(obj["condition"]), shards, None if node is None else str(node), nodes)
        except DurableCopyError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise DurableCopyError(f"{where}: not a RetainZ manifest ({type(e).__name__}: {e})") from None
