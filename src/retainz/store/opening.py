"""Open the store on a device named by a specification string: the device and its store together.

The one place a device spec becomes an open :class:`~retainz.store.Store` on the device itself (a
device file, a zoned block device, a ``remote:`` or ``mem:`` device, :func:`retainz.zoned.parse_device`).
Every face opens through :func:`retainz.jobs.stores.open_store`, which uses a node service's socket when
one answers and this function otherwise; the node service itself (``retainz serve``) calls it directly.

The returned store's device is closed with the store by :func:`close_store`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from retainz.store.store import Store
from retainz.zoned import DeviceSpec, Geometry, parse_device

__all__ = ["open_spec", "close_store"]


def open_spec(spec: str | DeviceSpec, *, readonly: bool = False, policy: str | None = None,
              create: Geometry | None = None, format_blank: bool = False, repair: bool = False,
              progress: Callable[[int, int], None] | None = None) -> Store:
    """Open ``spec``'s device and the store on it (recovery: :meth:`Store.open`).

    Args:
        spec: a device specification (:func:`retainz.zoned.parse_device`) or a parsed one.
        readonly: open both read-only (no recovery repair, no journal record).
        policy: the placement policy (``None``: the one recorded at format; also the policy a store
            this call formats gets, else ``retainz``:
            :data:`~retainz.placement.DEFAULT_POLICY`).
        create: a device file that does not exist is created with this geometry and formatted
            (``None``: a missing file is an error).
        format_blank: a device whose every zone is empty (a blank zoned namespace, a fresh ``mem:``
            device) is formatted rather than refused: it holds nothing to lose.  A device holding
            anything else is opened, never formatted.
        repair: salvage a damaged store (``retainz fsck --repair``; :meth:`Store.open`).
        progress: ``progress(done, total)`` in journal records replayed.

    Raises:
        FileNotFoundError: no such device file (and no ``create``), block device or socket.
        DeviceBusyError: another process holds the device file's lock.
        StoreLockedError: the store is already open in this process.
        ForeignDeviceError: the device holds no RetainZ store (``retainz mkfs`` first).
        DeviceFormatError: a malformed specification.
    """
    dev_spec = spec if isinstance(spec, DeviceSpec) else parse_device(spec)
    fmt = {"policy": policy} if policy else {}
    if create is not None and not dev_spec.exists():
        dev = dev_spec.create(create)
        try:
            return Store.format(dev, **fmt)
        except BaseException:
            dev.close()
            raise
    dev = dev_spec.open(readonly=readonly)
    try:
        if format_blank and not readonly and not dev.report_used_zones():
            return Store.format(dev, **fmt)
        return Store.open(dev, policy=policy, readonly=readonly, repair=repair, progress=progress)
    except BaseException:
        dev.close()
        raise


def close_store(store) -> None:
    """Close ``store`` and then its device (a served store's device closes nothing; an error closing
    the device is not raised: the store's records are already flushed).  Idempotent."""
    device = getattr(store, "device", None)
    try:
        store.close()
    finally:
        close = getattr(device, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
