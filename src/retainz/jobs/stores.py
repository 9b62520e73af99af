"""The one way to open a store for any device spec, local or served, and share it within a process.

A device spec (:func:`retainz.zoned.parse_device`: a device file, ``zbd:``/``/dev/`` zoned block device,
``remote:``, ``mem:``) becomes an open store here for every command and face:

* when a node service (``retainz serve DEVICE``, or a mount holding the device, :mod:`retainz.node`)
  listens at the device's socket (:func:`retainz.node.socket_path`), the store is a
  :class:`~retainz.node.NodeStore`, the service's client: every process of the node shares the device
  through it and nothing waits for a lock (docs/node.md);
* otherwise the device itself is opened (:func:`retainz.store.opening.open_spec`).

A :class:`~retainz.zoned.FileDevice` takes an exclusive ``flock`` per process, and a store is opened
once per device.  DCP writers, readers, the fsspec filesystem and the mount of one process may use the
same device at once (an async save writing while a load reads the last committed checkpoint), so
:func:`using` shares one open store per device (and job) in a process, reference counted; the last
release closes it.  Another *process* holding the device makes the open fail with
``DeviceBusyError``/``StoreLockedError``; :func:`using` retries until ``wait`` seconds have passed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from retainz.errors import DeviceBusyError, StoreLockedError
from retainz.store.opening import close_store, open_spec
from retainz.zoned import DeviceSpec, Geometry, parse_device

__all__ = ["open_store", "served_store", "using", "is_store", "open_count", "present", "close_store"]

_lock = threading.Lock()
_open: dict[str, list[Any]] = {}  # device key (+ job) -> [store, refs]


def is_store(obj: Any) -> bool:
    """True for an already-open store object (anything with the store API), as opposed to a spec."""
    return hasattr(obj, "begin_generation") and hasattr(obj, "read_shard")


def open_count() -> int:
    """Devices this process currently holds open through :func:`using` (tests check for leaks)."""
    with _lock:
        return len(_open)


def present(device: str | os.PathLike) -> bool:
    """True when ``device`` names something to open (any spec but a device file that does not exist),
    False when a device file would have to be created."""
    return parse_device(device).exists()


def served_store(spec: str | os.PathLike | DeviceSpec, job: str | None = None):
    """A :class:`~retainz.node.NodeStore` of job ``job`` when a node service listens at the device's
    socket, else ``None`` (not a device file nor a block device; no socket; or a stale one a killed
    service left: the device is then opened directly, and fails busy if the service still holds it)."""
    from retainz.node import NodeStore, served

    dev = spec if isinstance(spec, DeviceSpec) else parse_device(spec)
    if dev.kind not in ("file", "zbd") or served(dev.text) is None:
        return None
    try:
        return NodeStore.connect(dev.text, job=job)
    except (ConnectionRefusedError, FileNotFoundError):
        return None


def open_store(device: str | os.PathLike, *, job: str | None = None, geometry: Geometry | None = None,
               policy: str | None = None, readonly: bool = False, format_blank: bool = True,
               progress: Callable[[int, int], None] | None = None):
    """Open the store of ``device`` for this process alone: its node service's client when one answers
    (:func:`served_store`), else the device itself (:func:`retainz.store.opening.open_spec`).  Close it
    with :func:`close_store`.

    Args:
        device: a device specification (:func:`retainz.zoned.parse_device`).
        job: the job a node service's client declares (:meth:`retainz.node.NodeStore.connect`; ``None``:
            ``$RETAINZ_JOB``, else the root series); unused when the device is opened directly.
        geometry: create and format a missing device file with it (``None``: a missing file is an error).
        policy: placement policy for ``Store.format``/``Store.open`` (``None``: the store's).
        readonly: open the device read-only (ignored through a service).
        format_blank: format a device whose every zone is empty (a blank zoned namespace: nothing to lose).
        progress: ``progress(done, total)`` in journal records replayed.

    Raises:
        the errors of :func:`~retainz.store.opening.open_spec` (``DeviceBusyError`` when another process
        holds the device file).
    """
    spec = parse_device(device)
    node = served_store(spec, job)
    if node is not None:
        return node
    return open_spec(spec, readonly=readonly, policy=policy, create=geometry,
                     format_blank=format_blank and not readonly, progress=progress)


@contextlib.contextmanager
def using(device: Any, *, geometry: Geometry | None = None, policy: str | None = None, wait: float = 120.0,
          job: str | None = None) -> Iterator[Any]:
    """Yield an open store for ``device``, shared by every user of it in this process.

    Args:
        device: an open store (yielded as is, never closed here), or a device specification
            (:func:`open_store`; a blank named device is formatted).
        geometry: create and format the device file with this :class:`~retainz.zoned.Geometry` if it
            does not exist.
        policy: placement policy name for ``Store.format``/``Store.open`` (``None``: the store's).
        wait: seconds to keep retrying while another process holds the device.
        job: the job a node service's client declares (:func:`open_store`); each job has its own
            connection.  Ignored when the device is opened directly.

    Raises:
        TimeoutError: the device stayed busy for ``wait`` seconds (the message names the device).
    """
    if is_store(device):
        yield device
        return
    from retainz.node import served

    spec = parse_device(device)
    if job is not None and (spec.kind not in ("file", "zbd") or served(spec.text) is None):
        job = None             # opened directly: one store per device in a process, whatever the job
    key = spec.key if job is None else f"{spec.key}\0{job}"
    path = spec.key if spec.kind == "file" else spec.text
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        with _lock:
            entry = _open.get(key)
            if entry is not None:
                entry[1] += 1
                break
            try:
                entry = _open[key] = [open_store(path, job=job, geometry=geometry, policy=policy), 1]
                break
            except (DeviceBusyError, StoreLockedError) as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: device busy in another process for {wait:.0f} s ({e})") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    try:
        yield entry[0]
    finally:
        with _lock:
            entry[1] -= 1
            if entry[1] == 0:
                del _open[key]
                close_store(entry[0])
