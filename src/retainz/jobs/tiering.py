"""Promotion for the namespace faces, ``retainz://`` and the mount (docs/tiers.md, "The mount and
retainz://"): a :class:`~retainz.tier.Promoter` on the face's store, wired into its
:class:`~retainz.namespace.Namespace`.

:class:`NamespaceTier` is the namespace's durable tier (``retainz.namespace.hooks.DurableTier``, passed
to the ``Namespace`` constructor as ``tier``):

* every generation the face commits is handed to the promoter (:meth:`NamespaceTier.committed`);
* the runtime's own deletions (``rm -r`` of a checkpoint through the mount, TorchTitan's or HF's purge
  through ``retainz://``) keep until durable (:meth:`NamespaceTier.retire` is
  :meth:`Promoter.retire`): a generation the policy selects whose copy is not verified leaves the
  view at once but stays on the device until its copy is verified, then the promoter deletes it;
* a read whose local copy fails its checksum, or whose generation is gone meanwhile, is served from the
  durable copy (:meth:`NamespaceTier.durable_copy`): the shard is fetched whole, verified against the
  manifest's size and crc32c into a temporary file, logged (``retainz.tier`` warning naming the
  copy), and recorded in :attr:`NamespaceTier.used`.

One promoter per store in a process (:func:`retainz.jobs.promotion.acquire`, shared with the DCP writer),
and one tier per store (:meth:`NamespaceTier.shared`): fsspec caches a filesystem
instance per thread (TorchTitan's purge thread gets its own ``retainz://`` instance, with its own
namespace over the same shared store), so every namespace of the store shares one
:class:`NamespaceTier`, its deferred deletions are out of every namespace's view
(:meth:`NamespaceTier.retiring`), and nothing is promoted twice.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from typing import Any

from retainz.errors import DurableCopyError, GenerationNotFoundError
from retainz.jobs import life, promotion

__all__ = ["NamespaceTier", "destination_for"]

log = logging.getLogger("retainz.tier")

_lock = threading.Lock()
_shared: dict[int, NamespaceTier] = {}     # id(store) -> its tier, while any face holds it


def destination_for(url: str, device: str) -> str:
    """``url`` with ``{device}`` replaced by the device file's name and ``{rank}`` by this process's
    torchrun rank (``RANK``, else 0): one destination per device when a face serves several."""
    return url.replace("{device}", os.path.basename(os.fspath(device))).replace(
        "{rank}", os.environ.get("RANK", "0") or "0")


class NamespaceTier:
    """A promoter for one face's store, and the durable tier of the face's namespaces (``tier=``).

    Args:
        store: the face's open store.
        url: the destination (``{device}``, ``{rank}``: :func:`destination_for`).
        device: the device file (for the placeholders and its settings file ``DEVICE.tier.json``).
        policy: the promotion policy (default: the settings file's when it names the same
            destination, else ``all``).
        bandwidth: the cap in bytes per second (default: the settings file's, as ``policy``).
        storage_options: fsspec options for the destination.

    Raises:
        ValueError: a malformed URL, policy or bandwidth.
    """

    def __init__(self, store: Any, url: str, device: str | None = None, *, policy: str | None = None,
                 bandwidth: float | None = None, storage_options: dict | None = None):
        from retainz.tier import TierSettings, state_path_for
        from retainz.tier.destination import absolute_url

        self.url = absolute_url(destination_for(url, device) if device is not None else url)
        state = state_path_for(os.fspath(device)) if device is not None else None
        saved = TierSettings.load(state) if state is not None else None
        if saved is not None and saved.url == self.url:
            policy = policy or saved.policy
            bandwidth = bandwidth if bandwidth is not None else saved.bandwidth
        self.store = store
        #: the store's one promoter in this process (:func:`retainz.jobs.promotion.acquire`)
        self.promoter = promotion.acquire(store, self.url, state_path=state, policy=policy or "all",
                                          bandwidth=bandwidth, storage_options=storage_options)
        #: ``(generation, shard)`` -> ``"durable copy at URL"`` for each shard a read took from there
        self.used: dict[tuple[str, str], str] = {}
        self._refs = 1

    @classmethod
    def shared(cls, store: Any, url: str, device: str | None = None, **kw) -> NamespaceTier:
        """The process's one tier of ``store`` (made on first use; each call takes a reference that
        :meth:`close` gives back; the last stops the promoter).

        Raises:
            ValueError: the store already promotes to another destination in this process; what the
                constructor raises."""
        with _lock:
            tier = _shared.get(id(store))
            if tier is not None:
                want = destination_for(url, device) if device is not None else url
                if want != tier.url:
                    raise ValueError(f"{device or 'the store'}: already promoting to {tier.url} in this process, "
                                     f"not {want}")
                tier._refs += 1
                return tier
            tier = _shared[id(store)] = cls(store, url, device, **kw)
            return tier

    def committed(self, gid: str) -> None:
        """A namespace of the store committed ``gid``: the promoter queues it (the promoter runs from
        :func:`retainz.jobs.promotion.acquire`)."""
        self.promoter.committed(gid)

    def retiring(self):
        """Ids of the store's generations whose deletion waits for their durable copy."""
        return self.promoter.deferred

    def retire(self, gid: str) -> bool:
        """The runtime deletes ``gid``: now when it is durable or not selected, else deferred until its
        copy is verified (:meth:`~retainz.tier.Promoter.retire`).  True when deleted now."""
        return life.retire(self.store, gid, promoter=self.promoter)

    def durable_copy(self, gid: str, shard: str, why: BaseException | None):
        """A temporary file holding shard ``shard`` of ``gid`` from the durable copy, verified whole
        (size and crc32c against the manifest, and against the local generation's record of the shard
        when the device still has it).

        Raises:
            GenerationNotFoundError: no durable copy of ``gid``; DurableCopyError: it differs from the
                manifest or from the local record; DestinationError: the destination did not answer.
        """
        from retainz.tier import durable_manifest, read_durable_shard

        m = durable_manifest(self.promoter.dest, gid)
        copy = next((c for c in m.shards if c.name == shard), None)
        if copy is None:
            raise GenerationNotFoundError(f"the durable copy of {gid!r} at {self.url} has no shard {shard!r}")
        try:
            local = self.store.generation(gid).shards.get(shard)
        except GenerationNotFoundError:
            local = None
        if local is not None and (local.size, local.crc) != (copy.size, copy.crc32c):
            raise DurableCopyError(f"the durable copy of {gid!r} shard {shard!r} at {self.url} holds other bytes "
                                   "than the local generation recorded", generation=gid, shard=shard)
        f = tempfile.TemporaryFile(prefix="retainz-durable-")
        try:
            for data in read_durable_shard(self.promoter.dest, m, shard):
                f.write(data)
        except BaseException:
            f.close()
            raise
        where = f"durable copy at {self.url}"
        log.warning("%s/%s: the local copy is unusable (%s); reading the %s", gid, shard, why, where)
        self.used[(gid, shard)] = where
        return f

    def close(self) -> None:
        """Give back a reference; the last stops the promoter (a copy in flight resumes at the next
        start; deferred deletions are forgotten: the generations stay on the device and show again at
        the next mount)."""
        with _lock:
            self._refs -= 1
            if self._refs > 0:
                return
            if _shared.get(id(self.store)) is self:
                del _shared[id(self.store)]
        promotion.release(self.promoter)
