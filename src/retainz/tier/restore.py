"""Reading a durable copy back: stream a shard from the destination (verified against its manifest),
and pull a whole generation onto a local store (docs/tiers.md, "Restore").
"""

from __future__ import annotations

from collections.abc import Iterator

import crc32c

from retainz.errors import DurableCopyError, GenerationNotFoundError
from retainz.store.types import GenerationInfo
from retainz.tier.destination import Destination
from retainz.tier.manifest import Manifest

__all__ = ["durable_manifest", "read_durable_shard", "restore_generation"]


def durable_manifest(dest: Destination, gen_id: str) -> Manifest:
    """The manifest of ``gen_id`` at ``dest``.

    Raises:
        GenerationNotFoundError: the destination holds no manifest for it (no durable copy).
        DurableCopyError: a damaged manifest; DestinationError: the destination did not answer."""
    m = dest.manifest(gen_id)
    if m is None:
        raise GenerationNotFoundError(f"no durable copy of generation {gen_id!r} at {dest.url}")
    return m


def read_durable_shard(dest: Destination, m: Manifest, name: str) -> Iterator[bytes]:
    """Stream shard ``name`` of the durable copy ``m``; its size and crc32c are checked against the
    manifest, and a mismatch raises at the end of the stream (as the store's own reader does).

    Raises:
        ShardNotFoundError-like ``KeyError``: no such shard in the manifest; DurableCopyError: the object
        differs from the manifest; DestinationError: the read failed."""
    copy = next((c for c in m.shards if c.name == name), None)
    if copy is None:
        raise GenerationNotFoundError(f"durable copy of generation {m.id!r} has no shard {name!r}")
    path = dest.shard_path(m.id, copy.key)
    n, crc = 0, 0
    try:
        for data in dest.read(path):
            n += len(data)
            if n > copy.size:
                break
            crc = crc32c.crc32c(data, crc)
            if n == copy.size and crc != copy.crc32c:
                break
            yield data
    except FileNotFoundError:
        raise DurableCopyError(f"{dest.where(path)}: the durable copy's object is missing",
                               generation=m.id, shard=name) from None
    if n != copy.size or crc != copy.crc32c:
        raise DurableCopyError(f"{dest.where(path)}: the durable copy of shard {name!r} fails its size or crc32c "
                               f"({n} bytes read, {copy.size} expected)", generation=m.id, shard=name,
                               expected=copy.crc32c, actual=crc)


def restore_generation(store, dest: Destination, gen_id: str, *, node: str | None = None) -> GenerationInfo:
    """Pull the durable copy of ``gen_id`` onto ``store`` as a committed generation of the same id,
    step and hint (every shard verified as it arrives; a failure aborts, leaving nothing).  A
    generation of several nodes comes whole (every node's shards, onto one device: a node layout other
    than the save's), or with ``node`` only that node's part (its replacement device), and only once
    the whole generation is durable.

    Raises:
        GenerationNotFoundError: no durable copy (or not every node's part yet); GenerationExistsError:
        the store has ``gen_id``; DurableCopyError, DestinationError; NoSpaceError: the store cannot
        admit it."""
    m = durable_manifest(dest, gen_id)
    if node is not None:
        if node not in m.nodes:
            raise GenerationNotFoundError(f"durable copy of generation {gen_id!r} at {dest.url} has no node "
                                          f"{node!r} (nodes: {', '.join(m.nodes) or 'none'})")
        m = dest.node_manifest(gen_id, node)
    w = store.begin_generation(gen_id, m.step, hint=m.hint(), declared_size=m.size)
    try:
        for c in m.shards:
            w.write_shard(c.name, read_durable_shard(dest, m, c.name), size=c.size)
        return w.commit()
    except BaseException:
        w.abort()
        raise
