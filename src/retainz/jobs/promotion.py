"""One promoter per store in a process, for every face.

The DCP writer, ``retainz://`` and the mount each promote what they commit to a durable tier
(:class:`retainz.tier.Promoter`, docs/tiers.md).  Two promoters of one store would copy each save
twice and disagree on which deletions wait for a copy; so every face takes the store's promoter here
(:func:`acquire`), reference counted: the first call makes and starts it and records the destination in
the device's settings file (``retainz tier status``, ``df`` and ``get`` then know it), later calls share
it, and the last :func:`release` stops it.  fsspec caches one filesystem instance per thread
(TorchTitan's purge thread gets its own ``retainz://`` instance over the same shared store): they all
share this one promoter.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["acquire", "release"]

log = logging.getLogger("retainz.tier")

_lock = threading.Lock()
_shared: dict[int, list[Any]] = {}     # id(store) -> [promoter, references]


def acquire(store: Any, url: str, *, state_path: str | None = None, policy: str = "all",
            bandwidth: float | None = None, storage_options: dict | None = None, node: str | None = None,
            nodes: list[str] | None = None) -> Any:
    """The process's one started :class:`~retainz.tier.Promoter` of ``store`` to ``url`` (made on first
    use; each call takes a reference that :func:`release` gives back).

    Args:
        store: an open store (:func:`retainz.jobs.stores.using`'s, shared in the process).
        url: the destination (a relative local path is made absolute:
            :func:`retainz.tier.destination.absolute_url`).
        state_path: the device's settings file (:func:`retainz.tier.state_path_for`), where the
            destination, policy, bandwidth and nodes are recorded; ``None``: none (a block device).
        policy, bandwidth, storage_options, node, nodes: as :class:`~retainz.tier.Promoter` takes them
            (used by the first call only).

    Raises:
        ValueError: the store already promotes to another destination in this process; a malformed
            URL, policy or bandwidth.
    """
    from retainz.tier import Promoter
    from retainz.tier.destination import absolute_url

    url = absolute_url(url)          # recorded for commands run from anywhere (a relative path would move)
    with _lock:
        entry = _shared.get(id(store))
        if entry is not None:
            if entry[0].url != url:
                raise ValueError(f"{store.device.name}: already promoting to "
                                 f"{entry[0].url} in this process, not {url}")
            entry[1] += 1
            return entry[0]
        several = {"node": node, "nodes": list(nodes)} if node is not None else {}
        promoter = Promoter(store, url, policy=policy, bandwidth=bandwidth, storage_options=storage_options,
                            state_path=state_path, **several)
        _shared[id(store)] = [promoter, 1]
    if state_path is not None:
        from retainz.tier.state import remember

        try:
            remember(state_path, url, promoter.policy.describe(), bandwidth, **several)
        except OSError as e:
            log.warning("%s: could not record the promotion settings: %s", state_path, e)
    return promoter.start()


def release(promoter: Any) -> None:
    """Give back a reference to ``promoter``; the last stops it (a copy in flight resumes at the next
    start; deferred deletions are forgotten: the generations stay on the device and show again)."""
    with _lock:
        entry = _shared.get(id(promoter.store))
        if entry is not None and entry[0] is promoter:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _shared[id(promoter.store)]
    promoter.close()
