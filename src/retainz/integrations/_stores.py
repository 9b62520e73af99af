"""Process-wide shared store handles for the integrations (private).

A :class:`~retainz.zoned.FileDevice` takes an exclusive ``flock`` per process, and a store is opened
once per device.  DCP writers, readers and the fsspec filesystem of one process may use the same device
at once (an async save writing while a load reads the last committed checkpoint), so they share one
open :class:`~retainz.store.Store` per device path, reference counted; the last release closes it.

Another *process* holding the device (another rank reading a peer's device) makes the open fail with
``DeviceBusyError``/``StoreLockedError``; :func:`using` retries until ``wait`` seconds have passed.

When a node service (``retainz serve DEVICE``, :mod:`retainz.node`) listens at the device's socket, the
store is a :class:`~retainz.node.NodeStore` served by it instead: every process of the node shares the
device through the service, and nothing waits for a lock (docs/node.md).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from retainz.errors import DeviceBusyError, StoreLockedError

__all__ = ["using", "is_store", "open_count", "is_device_spec", "present", "join_token", "is_coordinator"]

_lock = threading.Lock()
_open: dict[str, list[Any]] = {}  # realpath or device spec -> [store, refs]


def is_store(obj: Any) -> bool:
    """True for an already-open store object (anything with the store API), as opposed to a path."""
    return hasattr(obj, "begin_generation") and hasattr(obj, "read_shard")


def open_count() -> int:
    """Devices this process currently holds open through the integrations (tests check for leaks)."""
    with _lock:
        return len(_open)


def join_token(name: str) -> str | None:
    """The token the ranks of one torchrun job share for the checkpoint ``name`` (a DCP checkpoint id or
    directory) and no other save does: the run's id (or its rendezvous address) and the name; ``None``
    outside a multi-rank torchrun job (``WORLD_SIZE`` unset or 1).  With it, ranks writing one
    checkpoint to one served device join one generation (``NodeStore.begin_generation(join=...)``)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID") or (f"{os.environ.get('MASTER_ADDR', '')}:"
                                                     f"{os.environ.get('MASTER_PORT', '')}")
    return f"dcp:{run}:{name}"[:1000]


def is_coordinator() -> bool:
    """True unless this process is a torchrun rank other than 0 (``RANK``): the rank that commits a
    checkpoint several ranks joined."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def _served_store(path: str, job: str | None = None):
    """A :class:`~retainz.node.NodeStore` when a node service listens at the device's socket
    (:func:`retainz.node.socket_path`), else ``None`` (no socket, or a stale one a killed service left:
    the device is then opened directly, and fails busy if the service still holds it)."""
    from retainz.node import NodeStore, served

    if served(path) is None:
        return None
    try:
        return NodeStore.connect(path, job=job)
    except (ConnectionRefusedError, FileNotFoundError):
        return None


def _open_store(path: str, geometry, policy: str | None, job: str | None = None):
    from retainz.store import Store
    from retainz.zoned import FileDevice

    node = _served_store(path, job)
    if node is not None:
        return node
    if is_device_spec(path):
        return _open_named_device_store(path, policy)
    if not os.path.exists(path):
        if geometry is None:
            raise FileNotFoundError(f"{path}: no such device file (create it with `retainz device create` "
                                    "or pass geometry= to create and format it)")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        dev = FileDevice.create(path, geometry)
        try:
            return Store.format(dev, **({"policy": policy} if policy else {}))
        except BaseException:
            dev.close()
            raise
    dev = FileDevice(path)
    try:
        return Store.open(dev, policy=policy)
    except BaseException:
        dev.close()
        raise


def is_device_spec(device: str) -> bool:
    """True for a device that is not a device file: a zoned block device ``/dev/NAME`` or a
    ``remote:`` device (:mod:`retainz.zoned.remote`)."""
    return device.startswith(("/dev/", "remote:"))


def present(device: str) -> bool:
    """True when ``device`` names something to open (a device spec, or a device file that exists),
    False when a device file would have to be created."""
    return is_device_spec(device) or os.path.exists(device)


def _open_named_device_store(path: str, policy: str | None):
    """A zoned block device or a remote one: open its store, or format it when every zone is empty (a
    blank namespace holds nothing to lose; a device holding anything else is opened, never formatted)."""
    from retainz.store import Store
    from retainz.zoned import open_device
    from retainz.zoned.model import ZoneCond

    dev = open_device(path)
    try:
        blank = all(z.cond == ZoneCond.EMPTY for z in dev.report_zones())
        if blank:
            return Store.format(dev, **({"policy": policy} if policy else {}))
        return Store.open(dev, policy=policy)
    except BaseException:
        dev.close()
        raise


@contextlib.contextmanager
def using(device: Any, *, geometry=None, policy: str | None = None, wait: float = 120.0,
          job: str | None = None) -> Iterator[Any]:
    """Yield an open store for ``device`` (a store object, or a device file path).

    Args:
        device: an open store (yielded as is, never closed here), a path to a FileDevice file, a
            zoned block device ``/dev/NAME`` or a ``remote:`` device spec (formatted when blank, see
            :func:`_open_named_device_store`).
        geometry: create and format the device file with this :class:`~retainz.zoned.Geometry` if it
            does not exist.
        policy: placement policy name for ``Store.format``/``Store.open`` (``None``: ``retainz``
            when it formats the device, the recorded one when it opens a store).
        wait: seconds to keep retrying while another process holds the device.
        job: the job a node service's client declares (:meth:`retainz.node.NodeStore.connect`; ``None``:
            ``$RETAINZ_JOB``, else the root series); each job has its own connection.  Ignored when
            the device is opened directly.

    Raises:
        TimeoutError: the device stayed busy for ``wait`` seconds (the message names the device).
    """
    if is_store(device):
        yield device
        return
    lock, table = _lock, _open      # the release below may run in a generator's finalizer at shutdown
    path = os.fspath(device)
    if not is_device_spec(path):
        path = os.path.realpath(path)
    if job is not None:
        from retainz.node import served

        if served(path) is None:
            job = None             # opened directly: one store per device in a process, whatever the job
    key = path if job is None else f"{path}\0{job}"
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        with _lock:
            entry = _open.get(key)
            if entry is not None:
                entry[1] += 1
                break
            try:
                entry = _open[key] = [_open_store(path, geometry, policy, job), 1]
                break
            except (DeviceBusyError, StoreLockedError) as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: device busy in another process for {wait:.0f} s ({e})") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    try:
        yield entry[0]
    finally:
        with lock:
            entry[1] -= 1
            if entry[1] == 0:
                del table[key]
                _close(entry[0])


def _close(store) -> None:
    """Close ``store`` and then its device (a device's own close error is not the caller's)."""
    device_obj = getattr(store, "device", None)
    store.close()
    close = getattr(device_obj, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


@atexit.register
def _close_at_exit() -> None:
    """Close every store still held when the interpreter exits (an uncaught error left a DCP writer
    or a ``retainz://`` file holding one): its open generations are aborted (``Store.close``) while
    the interpreter is whole.  Left to the holders' finalizers, the release ran during module
    teardown and printed a ``TypeError`` from a module global already gone.  A holder released
    afterwards finds its entry closed (count below zero) and does nothing."""
    with _lock:
        entries = list(_open.values())
        _open.clear()
        for entry in entries:
            entry[1] = 0
            with contextlib.suppress(Exception):
                _close(entry[0])
