"""One generation's promotion, start to finish (docs/tiers.md, "The protocol").

1. If the destination holds a manifest that matches the local generation and every object it names
   has its size, the generation is durable already (a restart after the manifest was written).
2. Each shard, in order: an object already there with the shard's size is read back; if its size and
   crc32c match, it is kept (a resumed promotion re-sends nothing verified).  Otherwise the shard is
   streamed from the store (every extent verified on the way out), through the bandwidth cap, and the
   object is read back: size and crc32c must equal the shard's, or the copy fails
   (:class:`~retainz.errors.DurableCopyError`) and is retried later.
3. The manifest is written last and read back.  Only then is the generation durable.

A crash (or an error) at any point leaves at most objects without a manifest: not durable, and the
next attempt resumes at the first shard not yet verified.

Several nodes (``node``/``nodes``): each node runs these steps for the shards its own device holds and
writes its node manifest last; the generation is durable once every node's is there
(:func:`world_holds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import quote

from retainz.errors import DurableCopyError
from retainz.store.types import GenerationInfo
from retainz.tier.bandwidth import RateLimit
from retainz.tier.destination import Destination
from retainz.tier.manifest import Manifest

__all__ = ["promote_generation", "shard_key", "manifest_holds", "world_holds"]


def shard_key(name: str) -> str:
    """The object key of shard ``name`` inside its generation's folder: ``data/<quoted name>``."""
    return "data/" + quote(name, safe="-_.~")


def manifest_holds(dest: Destination, gen: GenerationInfo, node: str | None = None) -> Manifest | None:
    """The destination's manifest of ``gen`` (``node``: that node's manifest of its part) when it
    matches the local generation and every object it names is there with its size (a cheap check: no
    read-back); else ``None``.  A damaged manifest counts as none.

    Raises:
        DestinationError: the destination did not answer (durability is then unknown: not durable)."""
    try:
        m = dest.node_manifest(gen.id, node)
    except DurableCopyError:
        return None
    if m is None or not m.matches(gen):
        return None
    for c in m.shards:
        if dest.size(dest.shard_path(gen.id, c.key)) != c.size:
            return None
    return m


def world_holds(dest: Destination, gen: GenerationInfo, node: str | None = None) -> Manifest | None:
    """The manifest of the whole generation when it is durable at ``dest``: without ``node``,
    :func:`manifest_holds`; with it, this node's part holds and every other node of the world has its
    node manifest there, agreeing, with every object it names of its size (the union,
    :meth:`Manifest.union`); else ``None``.

    Raises:
        DestinationError: the destination did not answer."""
    own = manifest_holds(dest, gen, node)
    if own is None or node is None:
        return own
    try:
        whole = dest.manifest(gen.id)
    except DurableCopyError:
        return None
    if whole is None or whole.nodes != own.nodes:
        return None
    mine = {c.name for c in own.shards}
    for c in whole.shards:
        if c.name not in mine and dest.size(dest.shard_path(gen.id, c.key)) != c.size:
            return None
    return whole


def promote_generation(store, gen: GenerationInfo, dest: Destination, *, limit: RateLimit | None = None,
                       progress: Callable[[int], None] | None = None,
                       stop: Callable[[], bool] | None = None, node: str | None = None,
                       nodes: tuple[str, ...] = ()) -> Manifest:
    """Copy committed ``gen`` of ``store`` to ``dest`` and verify it (the module docstring's steps).

    Args:
        store: the open store (read-only is enough): ``read_shard`` is all it is asked for.
        gen: the committed generation (``store.generation(id)``).
        limit: the bandwidth cap on bytes sent.
        progress: called with the bytes of each chunk sent or found already verified.
        stop: polled between chunks; True aborts the copy (``InterruptedError``), leaving no manifest.
        node, nodes: this node's name and the world's nodes, when several nodes each promote their
            own shards of the generation: the manifest written is this node's (``MANIFEST.<node>.json``).

    Returns:
        The manifest written (or found): this node's, with ``node``.

    Raises:
        DestinationError: the destination failed (unreachable, an error mid-upload, full).
        DurableCopyError: an object read back does not match its shard.
        GenerationNotFoundError: the generation was deleted locally meanwhile.
        ChecksumError: the local copy fails its checksum (it cannot be promoted).
        InterruptedError: ``stop`` said so.
    """
    found = manifest_holds(dest, gen, node)
    if found is not None and found.nodes == tuple(sorted(nodes)):
        if progress is not None:
            progress(gen.size)
        return found
    # a manifest describing other bytes (a generation replaced under the same id, a damaged one) goes
    # first, so it never vouches for the objects about to be rewritten
    dest.remove(dest.manifest_path(gen.id, node))
    keys = {}
    for s in gen.shards.values():
        key = keys[s.name] = shard_key(s.name)
        path = dest.shard_path(gen.id, key)
        if dest.size(path) == s.size and dest.checksum(path) == (s.size, s.crc):
            if progress is not None:
                progress(s.size)
            continue
        dest.write(path, _paced(store.read_shard(gen.id, s.name), limit, stop), progress=progress)
        got = dest.checksum(path)
        if got != (s.size, s.crc):
            have = "nothing" if got is None else f"{got[0]} bytes with crc32c {got[1]:08x}"
            raise DurableCopyError(f"{dest.where(path)}: read back {have}; the shard has {s.size} bytes with "
                                   f"crc32c {s.crc:08x}", generation=gen.id, shard=s.name,
                                   expected=s.crc, actual=None if got is None else got[1])
    m = Manifest.of(store.uuid, gen, keys, node=node, nodes=tuple(nodes))
    dest.put_manifest(m)
    return m


def _paced(chunks: Iterator[bytes], limit: RateLimit | None, stop: Callable[[], bool] | None) -> Iterator[bytes]:
    """``chunks`` through the cap; under a cap, in pieces of at most a quarter second's worth (4 KiB at
    least), so a stop is seen within about that long however slow the cap (a close of the promoter
    does not wait for a whole extent at the capped rate)."""
    piece = None if limit is None or limit.rate is None else max(int(limit.rate // 4), 4096)
    for chunk in chunks:
        view = memoryview(chunk)
        step = len(view) if piece is None else piece
        for start in range(0, len(view), max(step, 1)):
            if stop is not None and stop():
                raise InterruptedError("promotion stopped")
            part = view[start:start + step]
            if limit is not None:
                limit.take(len(part))
            yield part
