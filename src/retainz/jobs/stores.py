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

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from retainz.errors import DeviceBusyError, StoreLockedError
from retainz.store.opening import close_store, open_spec
from retainz.zoned import DeviceSpec, Geometry, parse_device

__all__ = ["open_store", "served_store", "using", "is_store", "open_count", "present", "close_store"]

log = logging.getLogger("retainz.jobs")

_lock = threading.Lock()
_open: dict[str, _Held] = {}  # device key (+ job) -> what this process holds of it


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
    """A :class:`~retainz.node.NodeStore` of job ``job`` (``None``: ``$RETAINZ_JOB``, else the whole device
    when the service gives it to this user, else the root series) when a node service listens at the
    device's socket, else ``None`` (not a device file nor a block device; no socket; or a stale one a killed
    service left: the device is then opened directly, and fails busy if the service still holds it)."""
    from retainz.node import NodeStore, served

    dev = spec if isinstance(spec, DeviceSpec) else parse_device(spec)
    if dev.kind not in ("file", "zbd") or served(dev.text) is None:
        return None
    try:
        return _connect(NodeStore, dev.text, job)
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
        job: the job a node service's client declares (:func:`served_store`); unused when the device is
            opened directly.
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


@dataclass
class _Held:
    """One device held by this process: the store handed out, its users, and when this process owns the
    device for other processes too (:func:`using` with ``share``), the service and the store behind it."""

    store: Any
    refs: int = 1
    service: Any = None
    backing: Any = None
    thread: threading.Thread | None = None

    def others(self) -> int:
        """Clients of the service besides this process's own."""
        return max(0, self.service.clients() - 1) if self.service is not None else 0

    def close(self) -> None:
        try:
            close_store(self.store)
        finally:
            if self.service is not None:
                self.service.close()
                close_store(self.backing)


def _open_shared(spec: DeviceSpec, job: str | None, geometry: Geometry | None, policy: str | None) -> _Held:
    """The device for a job of several processes: its node service's client when one answers, else the
    device itself, served from now on to the others on its socket (:func:`retainz.node.socket_path`,
    as a mount serves its device) while this process uses it through a client of its own, so that
    every rank of a save joins one generation alike."""
    from retainz.node import NodeStore, Service, socket_path

    node = served_store(spec, job)
    if node is not None:
        return _Held(node)
    backing = open_spec(spec, policy=policy, create=geometry, format_blank=True)
    try:
        service = Service(backing, socket_path(spec.text), own_store=False)
    except BaseException:
        close_store(backing)
        raise
    thread = threading.Thread(target=service.serve_forever, name="retainz-node-service", daemon=True)
    thread.start()
    try:
        client = _connect(NodeStore, spec.text, job)
    except BaseException:
        service.close()
        close_store(backing)
        raise
    log.info("%s: serving it to the other processes of the job on %s", spec.text, service.path)
    return _Held(client, service=service, backing=backing, thread=thread)


def _connect(node_store, device: str, job: str | None):
    """A client of ``device``'s service for ``job``; no job: ``$RETAINZ_JOB``, else the whole device
    (``*``: a job of one user, as the mount and the store commands default to), else the root series
    for a client the service does not give the whole device."""
    from retainz.errors import AccessDeniedError

    if job is not None or os.environ.get("RETAINZ_JOB") is not None:
        return node_store.connect(device, job=job)
    try:
        return node_store.connect(device, job="*")
    except AccessDeniedError:
        return node_store.connect(device, job="")


@atexit.register
def _close_owned() -> None:
    """At exit, give the devices this process serves to its job's other processes up to
    :data:`OWNER_EXIT_WAIT` seconds for their last calls, then close them (their journals synced)."""
    with _lock:
        owned = [(k, h) for k, h in _open.items() if h.service is not None]
    deadline = time.monotonic() + OWNER_EXIT_WAIT
    for key, held in owned:
        while held.others() and time.monotonic() < deadline:
            time.sleep(0.05)
        with _lock:
            _open.pop(key, None)
        with contextlib.suppress(Exception):
            held.close()
    # every other store still held (an uncaught error left a DCP writer or a ``retainz://`` file holding
    # one): closed while the interpreter is whole, its open generations aborted (``Store.close``); left to
    # the holders' finalizers, the release ran during module teardown and printed a ``TypeError``
    with _lock:
        rest = list(_open.values())
        _open.clear()
    for held in rest:
        held.refs = 0
        with contextlib.suppress(Exception):
            held.close()


#: Seconds a process that serves its device to its job's other processes waits at exit for their last calls.
OWNER_EXIT_WAIT = 5.0


@contextlib.contextmanager
def using(device: Any, *, geometry: Geometry | None = None, policy: str | None = None, wait: float = 120.0,
          job: str | None = None, share: bool = False) -> Iterator[Any]:
    """Yield an open store for ``device``, shared by every user of it in this process.

    Args:
        device: an open store (yielded as is, never closed here), or a device specification
            (:func:`open_store`; a blank named device is formatted).
        geometry: create and format the device file with this :class:`~retainz.zoned.Geometry` if it
            does not exist.
        policy: placement policy name for ``Store.format``/``Store.open`` (``None``: ``retainz``
            when it formats the device, the recorded one when it opens a store).
        wait: seconds to keep retrying while another process holds the device.
        job: the job a node service's client declares (:func:`open_store`); each job has its own
            connection.  Ignored when the device is opened directly.
        share: the processes of one job (the ranks of a save) use the device at once: the first to open
            it serves it to the others on its socket, and every process, the first too, uses it as the
            service's client (the ranks of a save then join one generation).  The first process holds
            and serves the device until it exits (as a mount does until it is unmounted; at exit it
            gives the others' clients :data:`OWNER_EXIT_WAIT` seconds).  Nothing needs starting, and no
            variable set.

    Raises:
        TimeoutError: the device stayed busy for ``wait`` seconds (the message names the device).
    """
    if is_store(device):
        yield device
        return
    from retainz.node import served

    lock, table = _lock, _open      # the release below may run in a generator's finalizer at shutdown
    spec = parse_device(device)
    if share and spec.kind not in ("file", "zbd"):
        share = False          # only a device file or a block device has a socket to serve it on
    if job is not None and not share and (spec.kind not in ("file", "zbd") or served(spec.text) is None):
        job = None             # opened directly: one store per device in a process, whatever the job
    key = spec.key if job is None else f"{spec.key}\0{job}"
    path = spec.key if spec.kind == "file" else spec.text
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        with _lock:
            held = _open.get(key)
            if held is not None:
                held.refs += 1
                break
            try:
                held = _open[key] = (_open_shared(parse_device(path), job, geometry, policy) if share else
                                     _Held(open_store(path, job=job, geometry=geometry, policy=policy)))
                break
            except (DeviceBusyError, StoreLockedError) as e:
                if time.monotonic() > deadline:
                    why = ("; it holds the device without serving it to a job's processes (a process of one "
                           "rank that used `retainz://` or the DCP plugin, or a store command): a program "
                           "that starts the ranks after using the device itself calls "
                           "`RetainZFileSystem.close_all()` first") if share else ""
                    raise TimeoutError(f"{path}: device busy in another process for {wait:.0f} s ({e}){why}") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    try:
        yield held.store
    finally:
        with lock:
            held.refs -= 1
            last = held.refs == 0 and held.service is None    # a served device stays until exit
            if last:
                table.pop(key, None)      # closed at exit already: nothing left to release
        if last:
            held.close()
