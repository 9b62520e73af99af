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
release closes it.  A process that opens a device file or zoned block device through :func:`using`
also serves it on its socket while it holds it, so another process that wants it (the ranks it
spawns, a store command) becomes its client instead of waiting: a process never blocks another that
uses the device through this module.  Another process holding the device without serving it (a store
command, a program that opened it with ``Store.open`` itself) makes the open fail with
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

__all__ = ["open_store", "served_store", "served_by_another", "using", "is_store", "open_count", "present", "close_store"]

log = logging.getLogger("retainz.jobs")

_lock = threading.Lock()
_open: dict[str, _Held] = {}  # device key (+ job, + share) -> what this process hands out of it
_owned: dict[str, _Owned] = {}  # device key -> the device this process opened itself
_closing: list[threading.Thread] = []   # devices being closed after their last other process left


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


def served_by_another(device: str | os.PathLike) -> bool:
    """True when a node service of another process serves ``device`` (a socket exists there, and this
    process did not open the device itself: a process that holds a device serves it too, :func:`using`),
    so that processes on other ranks may share it; False for a device this process holds, or one nobody
    serves."""
    from retainz.node import served

    spec = parse_device(device)
    with _lock:
        if spec.key in _owned:
            return False
    return spec.kind in ("file", "zbd") and served(spec.text) is not None


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
    except (ConnectionError, FileNotFoundError):   # ServiceGoneError: it closed while this one connected
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
class _Owned:
    """A device this process opened itself: its store, and the node service that serves that store on
    the device's socket (:func:`retainz.node.socket_path`) to the other processes that want the device
    (``None``: not served: ``serve=False``, or the socket could not be made)."""

    key: str
    store: Any
    service: Any = None
    #: The :class:`_Held` entries handing out its store or a client of its service.
    users: int = 0
    #: Held until this process exits: a job's ranks share it (more may come at any time).
    keep: bool = False
    #: Being closed: its service accepts no new client (those connected are served to their end), and
    #: a new user waits for the close, then opens the device again.
    closing: bool = False
    closed: bool = False

    def others(self) -> int:
        """Clients of the service in other processes (the kernel's peer pid)."""
        return self.service.clients(besides=os.getpid()) if self.service is not None else 0

    def close(self) -> None:
        """End the service's connections (aborting what their clients left open) and remove its socket,
        then close the store (its journal synced).  Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.service is not None:
                self.service.close()
        finally:
            close_store(self.store)


@dataclass
class _Held:
    """What :func:`using` hands out for one key: the store of a device this process opened (``owner``),
    or a node service's client (of this process's own service, or of another process's); and its users
    in this process."""

    store: Any
    refs: int = 1
    owner: _Owned | None = None

    def close(self) -> None:
        """Close a client (the store of an owned device is its owner's to close)."""
        if self.owner is None or self.store is not self.owner.store:
            close_store(self.store)


def _open_owned(spec: DeviceSpec, geometry: Geometry | None, policy: str | None, *, serve: bool,
                must_serve: bool) -> _Owned:
    """Open the device itself (:func:`~retainz.store.opening.open_spec`) and, with ``serve``, serve its
    store on the device's socket from a daemon thread (a :class:`retainz.node.Service` over it, as a
    mount serves its device), so that another process that wants the device (a rank this process
    spawned, a store command) becomes its client instead of waiting for the lock.  A socket that cannot
    be made (no right to its directory, a non-socket at its path) leaves the device unserved, said in
    the log, unless ``must_serve`` (the ranks of a job need it): then the error is raised.

    Raises:
        the errors of :func:`~retainz.store.opening.open_spec`; with ``must_serve``, those of
        :class:`~retainz.node.Service` (``DeviceBusyError``: a live service listens at the socket).
    """
    from retainz.node import Service, socket_path

    store = open_spec(spec, policy=policy, create=geometry, format_blank=True)
    owned = _Owned(spec.key, store)
    if not serve:
        return owned
    try:
        owned.service = Service(store, socket_path(spec.text), own_store=False, on_leave=lambda: _left(owned))
    except (OSError, DeviceBusyError) as e:
        if must_serve:
            close_store(store)
            raise
        log.info("%s: not served to other processes (%s)", spec.text, e)
        return owned
    except BaseException:
        close_store(store)
        raise
    threading.Thread(target=owned.service.serve_forever, name="retainz-node-service", daemon=True).start()
    log.info("%s: serving it to other processes on %s", spec.text, owned.service.path)
    return owned


def _close_if_unused(owner: _Owned) -> bool:
    """(``_lock`` held) Whether ``owner`` is to be closed now: no user in this process, no job's ranks,
    no client of another process.  Its service then stops accepting clients first, and one accepted
    meanwhile keeps it open until it leaves (:func:`_left`): a client is never cut off mid-use."""
    if owner.users or owner.keep or owner.others() or _owned.get(owner.key) is not owner:
        return False
    owner.closing = True
    if owner.service is not None:
        owner.service.stop()
    return not owner.others()


def _closed(owner: _Owned, lock: threading.Lock, owned: dict) -> None:
    """Close ``owner`` (outside ``_lock``), then forget it (a new user of the device waited meanwhile)."""
    try:
        owner.close()
    finally:
        with lock:
            if owned.get(owner.key) is owner:
                del owned[owner.key]


def _left(owner: _Owned) -> None:
    """A client of ``owner``'s service disconnected: close the device when nothing uses it any more
    (:func:`_close_if_unused`), in a thread of its own (the service's close joins the connection
    threads, this one too); :func:`_close_owned` waits for it at exit."""
    with _lock:
        if not _close_if_unused(owner):
            return
        closer = threading.Thread(target=_closed, args=(owner, _lock, _owned), name="retainz-close-device",
                                  daemon=True)
        _closing[:] = [t for t in _closing if t.is_alive()] + [closer]
    closer.start()


def _hold(spec: DeviceSpec, path: str, job: str | None, share: bool, geometry: Geometry | None,
          policy: str | None, serve: bool) -> _Held:
    """A new :class:`_Held` for :func:`using` (called with ``_lock`` held): a device this process opened
    already (its store; for ``share``, a client of its own service), else another process's service
    (its client), else the device itself, opened now and served (:func:`_open_owned`)."""
    from retainz.node import NodeStore

    owner = _owned.get(spec.key)
    if owner is not None and owner.closing:
        raise DeviceBusyError(f"{spec.text}: being closed in this process")      # retried: then opened again
    if owner is None:
        if spec.kind not in ("file", "zbd"):       # nothing to serve it on: opened for this process alone
            return _Held(open_store(path, job=job, geometry=geometry, policy=policy))
        node = served_store(spec, job)
        if node is not None:
            return _Held(node)
        owner = _owned[spec.key] = _open_owned(parse_device(path), geometry, policy, serve=serve or share,
                                               must_serve=share)
    store = owner.store
    if share and owner.service is not None:
        # the ranks of a save join one generation in the service: this process joins as its client too
        try:
            store = _connect(NodeStore, spec.text, job)
        except BaseException:
            if not owner.users:
                del _owned[spec.key]
                owner.close()
            raise
    owner.users += 1
    owner.keep = owner.keep or share
    return _Held(store, owner=owner)


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
    """At exit, give the devices this process serves to other processes (its job's other ranks, a store
    command) up to :data:`OWNER_EXIT_WAIT` seconds for their last calls, then close everything still
    held: the clients first, then each device's service and store (their journals synced)."""
    with _lock:
        owned = list(_owned.values())
    deadline = time.monotonic() + OWNER_EXIT_WAIT
    for owner in owned:
        while owner.others() and time.monotonic() < deadline:
            time.sleep(0.05)
    with _lock:
        closing = list(_closing)
    for t in closing:
        t.join(timeout=30)
    # every store still held (an uncaught error left a DCP writer or a ``retainz://`` file holding one)
    # is closed while the interpreter is whole, its open generations aborted (``Store.close``); left to
    # the holders' finalizers, the release ran during module teardown and printed a ``TypeError``
    with _lock:
        rest = list(_open.values())
        _open.clear()
        owned = list(_owned.values())
        _owned.clear()
    for held in rest:
        held.refs = 0
        with contextlib.suppress(Exception):
            held.close()
    for owner in owned:
        with contextlib.suppress(Exception):
            owner.close()


#: Seconds a process that serves its device to its job's other processes waits at exit for their last calls.
OWNER_EXIT_WAIT = 5.0


@contextlib.contextmanager
def using(device: Any, *, geometry: Geometry | None = None, policy: str | None = None, wait: float = 120.0,
          job: str | None = None, share: bool = False, serve: bool = True) -> Iterator[Any]:
    """Yield an open store for ``device``, shared by every user of it in this process.

    A device file or zoned block device that nothing serves yet is opened here (its lock taken) and,
    while this process holds it, served on its socket (:func:`retainz.node.socket_path`; a
    :class:`~retainz.node.Service` in a daemon thread, as a mount serves its device): the users in this
    process get the store itself, and another process that wants the device (ranks this process
    spawns, ``retainz ls``) becomes the service's client instead of waiting for the lock.  The device
    is closed when its last user here releases it, or, when another process's client is connected then,
    once the last such client has left (a device shared with a job's ranks, ``share``, is held until
    this process exits); at exit the other processes' clients get :data:`OWNER_EXIT_WAIT` seconds for
    their last calls.

    Args:
        device: an open store (yielded as is, never closed here), or a device specification
            (:func:`open_store`; a blank named device is formatted).
        geometry: create and format the device file with this :class:`~retainz.zoned.Geometry` if it
            does not exist.
        policy: placement policy name for ``Store.format``/``Store.open`` (``None``: ``retainz``
            when it formats the device, the recorded one when it opens a store).
        wait: seconds to keep retrying while another process holds the device without serving it.
        job: the job a node service's client declares (:func:`open_store`); each job has its own
            connection.  Ignored when this process opened the device (unless ``share``).
        share: the processes of one job (the ranks of a save) use the device at once: every process,
            the one that opened and serves it too, uses it as the service's client (the ranks of a save
            then join one generation).  The process that serves it holds it until it exits.  Nothing
            needs starting, and no variable set.
        serve: serve a device this call opens (``False``: the caller serves it itself, with its own
            access rules, as the mount does; other processes then wait for its lock).

    Raises:
        TimeoutError: the device stayed busy for ``wait`` seconds (the message names the device).
    """
    if is_store(device):
        yield device
        return
    from retainz.node import served

    # the release below may run in a generator's finalizer at shutdown
    lock, table, owned, close_if_unused, closed = _lock, _open, _owned, _close_if_unused, _closed
    spec = parse_device(device)
    servable = spec.kind in ("file", "zbd")     # only a device file or a block device has a socket to serve it on
    share = share and servable
    path = spec.key if spec.kind == "file" else spec.text
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        with _lock:
            j = job
            if j is not None and not share and (not servable or spec.key in _owned or served(spec.text) is None):
                j = None       # opened directly (here or now): one store per device in a process, whatever the job
            key = f"{spec.key}\0share\0{j!r}" if share else spec.key if j is None else f"{spec.key}\0{j}"
            held = _open.get(key)
            if held is not None:
                held.refs += 1
                break
            try:
                held = _open[key] = _hold(spec, path, j, share, geometry, policy, serve)
                break
            except (DeviceBusyError, StoreLockedError) as e:
                if time.monotonic() > deadline:
                    why = ("; the process holding it does not serve it to other processes (a store command, "
                           "a mount starting or stopping, or a program that opened the device with `Store.open` "
                           "itself): let it finish, or have it open the device through `retainz://`, the DCP "
                           "plugin or `retainz.jobs.stores.using`, which serve it") if share else ""
                    raise TimeoutError(f"{path}: device busy in another process for {wait:.0f} s ({e}){why}") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    try:
        yield held.store
    finally:
        with lock:
            held.refs -= 1
            last = held.refs == 0
            owner = held.owner
            if last and owner is not None and owner.keep:
                last = False        # a job's ranks share it: held until exit
            if last:
                table.pop(key, None)      # closed at exit already: nothing left to release
                if owner is not None:
                    owner.users -= 1
                    if not close_if_unused(owner):
                        owner = None      # still used here, or by another process (closed when it leaves)
        if last:
            try:
                held.close()
            finally:
                if owner is not None:
                    closed(owner, lock, owned)
