"""The node-service client: a store (the :class:`~retainz.store.contract.CheckpointStore` calls the
integrations make) whose metadata goes to the service over its socket and whose bytes go straight to the
device file.

The reads and the write batching are the store's own parts, composed with this client's.  A shard's
bytes are cut into units of :data:`BATCH` bytes (:class:`~retainz.store.writer.WriteUnits`, as the
in-process ``ShardWriter`` cuts them into extents); for each unit one ``claim`` asks the service where
they go (placement runs there), the client ``pwrite``\\ s each extent at ``region + zone * zone_size +
offset`` of the device file and reports the extents' crc32c (``written``).  A read is the store's
:class:`~retainz.store.reader.Reader` over the service's ``locations`` (:class:`ServedShards`) and this
client's ``pread`` of the device file (:class:`DeviceFileExtents`): every extent's crc32c and the
shard's verified; an extent that fails is looked up again once (GC may have moved the shard meanwhile)
before :class:`~retainz.errors.ChecksumError`.

Thread safety: one connection per :class:`NodeStore`, its requests serialised by a lock; reads of the
device run outside it.  A lost connection raises :class:`~retainz.errors.ServiceGoneError` from then on.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import crc32c

from retainz.errors import ChecksumError, GenerationNotFoundError, ProtocolError, ServiceGoneError
from retainz.hint import Hint
from retainz.node.protocol import (
    DATA_PATHS,
    MAX_CLAIM,
    MAX_PAGE,
    MAX_REPLY,
    PROTOCOL,
    decode_gen,
    encode_hint,
    raise_reply,
    recv_exact,
    recv_frame,
    send_frame,
    socket_path,
)
from retainz.store import contract
from retainz.store.crc import crc32c_combine
from retainz.store.reader import Reader, verified_stream
from retainz.store.types import (
    FsckReport,
    GCReport,
    GenerationInfo,
    GenState,
    ShardInfo,
    SpaceReport,
    StoreMetrics,
)
from retainz.store.writer import WriteUnits
from retainz.zoned.model import DeviceInfo, Geometry

__all__ = ["NodeStore", "NodeGenerationWriter", "NodeShardStream", "ServedDevice", "ServedShards",
           "DeviceFileExtents", "BATCH", "served"]

log = logging.getLogger("retainz.node")

#: Bytes a shard stream buffers before it claims and writes them (8 extents of 1 MiB).
BATCH = 8 << 20


def served(device: str | os.PathLike) -> str | None:
    """The socket of ``device``'s node service when one exists there (a socket file; it may still be
    a stale one a killed service left: :meth:`NodeStore.connect` says), else ``None``."""
    import stat

    path = socket_path(device)
    try:
        return path if stat.S_ISSOCK(os.stat(path).st_mode) else None
    except OSError:
        return None


class ServedDevice:
    """The device a service serves, as its clients see it (``NodeStore.device``): geometry and name only;
    its I/O goes through the :class:`NodeStore`, its lock is the service's, and :meth:`close` does
    nothing."""

    def __init__(self, path: str, geometry: Geometry):
        self.info = DeviceInfo(geometry=geometry, kind="served", path=path, payload=True)
        self.geometry = geometry
        self.name = path

    def close(self) -> None:
        """Nothing to release (the service holds the device)."""

    def __repr__(self) -> str:
        return f"ServedDevice({self.name!r})"


class NodeStore:
    """A store served by a node service (``retainz serve DEVICE``); see the module docstring.

    Open one with :meth:`connect`.  ``generations``, ``generation``, ``begin_generation``, ``delete``,
    ``update_hint``, ``advance``, ``read_shard``, ``read_shard_extent``, ``gc``, ``fsck``, ``df``,
    ``metrics`` and ``close`` behave as :class:`~retainz.store.Store`'s (same errors, raised again by
    class); the zone table and the allocator live in the service and are not offered here.

    Attributes:
        device: a :class:`ServedDevice` (geometry and name; the service holds the device, this client
            opens only its file's data).
        path: the device path; socket: the socket path; job: the job this client writes for.
        uuid, policy, meta_zones, gc_reserve_zones: the served store's.
    """

    def __init__(self, sock: socket.socket, device: str, socket_file: str, job: str, retention: str | None):
        self._sock = sock
        self._lock = threading.Lock()
        #: This client's lock (reentrant; the store contract's ``lock``): a caller that checks and then
        #: admits holds it across both; the service takes the store's own lock for each request.
        self.lock = threading.RLock()
        #: A served store is written through the service (a read-only store is not served).
        self.readonly = False
        self._gone: str | None = None
        self.path = device
        self.socket = socket_file
        self.job = job
        hello = self._call("hello", protocol=PROTOCOL, job=job, retention=retention, pid=os.getpid())
        g = hello["geometry"]
        self.block_size, self.zone_size = g["block_size"], g["zone_size"]
        self.device = ServedDevice(device, Geometry(nr_zones=g["nr_zones"], zone_size=g["zone_size"],
                                                    zone_capacity=g["zone_capacity"], block_size=g["block_size"],
                                                    max_open=g["max_open"], max_active=g["max_active"]))
        self.uuid = uuidlib.UUID(hello["uuid"])
        self.job = hello.get("job", job)
        #: The series folders this client may see and change (``None``: the whole device).
        self.scope = hello.get("scope")
        self.policy = hello["policy"]
        #: The store format version the service's store is at (its ``hello``; the store contract's).
        self.format_version = hello["format_version"]
        self.meta_zones = hello["meta_zones"]
        self.gc_reserve_zones = hello["gc_reserve_zones"]
        self.write_buffer = hello["write_buffer"]
        self.batch = max(self.write_buffer, min(BATCH, hello.get("max_claim", MAX_CLAIM)))
        self._fd = -1
        self._writable = False
        self._region = 0
        self._shm = None                       # the shared buffer of the shm path (an mmap of a memfd)
        #: How this client's bytes reach the device: ``"direct"`` (it writes the device at claimed
        #: extents), ``"shm"`` (a shared buffer the service writes from) or ``"socket"`` (the bytes go
        #: over the socket); :data:`~retainz.node.protocol.DATA_PATHS`.  ``data_reason`` says why.
        self.data_path = "direct"
        self.data_reason = ""
        #: How direct writes go (``ZonedDevice.direct_io``): ``{}`` for a device file, ``O_DIRECT``
        #: and its block size and largest write for a zoned block device.
        self.direct_io = hello.get("direct_io") or {}
        self._wfd = -1                         # the descriptor direct writes go through
        self._abuf = None                      # a page-aligned buffer for O_DIRECT writes
        self._choose_data_path(hello.get("region"))
        #: The verified reads (the store's :class:`~retainz.store.reader.Reader` over the service's
        #: ``locations`` and this client's reads of the device file); ``None`` when this client cannot
        #: read the device (the service reads each extent for it).
        self.reader = None if self._fd < 0 else Reader(ServedShards(self._call),
                                                       DeviceFileExtents(self._fd, self._region, self.zone_size,
                                                                         self.block_size))
        log.info("%s: data path %s (%s)", device, self.data_path, self.data_reason)

    def _choose_data_path(self, region) -> None:
        """Open the device's direct region when the service offers one and this process may write it,
        else take the shared-memory path, else the socket (``$RETAINZ_NODE_DATA`` = ``direct``,
        ``shm`` or ``socket`` asks for one; ``auto`` or unset: the best that works).

        Raises:
            ValueError: ``$RETAINZ_NODE_DATA`` names no data path.
            PermissionError: ``direct`` asked for and the device cannot be written from here.
        """
        want = os.environ.get("RETAINZ_NODE_DATA", "auto").strip() or "auto"
        if want not in ("auto", *DATA_PATHS):
            raise ValueError(f"RETAINZ_NODE_DATA={want!r}: expected auto, {', '.join(DATA_PATHS)}")
        why = ""
        if region is None:
            why = "the service offers no direct region"
        elif want in ("auto", "direct"):
            file, self._region = region
            try:
                if self.direct_io.get("o_direct"):     # reads go through the page cache, writes around it
                    self._wfd = os.open(file, os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC)
                    try:
                        self._fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
                    except BaseException:
                        os.close(self._wfd)
                        self._wfd = -1
                        raise
                else:
                    self._fd = self._wfd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
                self._writable = True
                self.data_path, self.data_reason = "direct", f"writes {file} at the claimed extents"
                return
            except OSError as e:
                why = f"cannot write {file}: {e.strerror or e}"
                try:         # reads may still go straight to the device
                    self._fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    self._fd = -1
        else:
            why = f"RETAINZ_NODE_DATA={want}"
            file, self._region = region
            with contextlib.suppress(OSError):
                self._fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        if want == "direct":
            raise PermissionError(f"{self.path}: RETAINZ_NODE_DATA=direct, but {why}")
        if want in ("auto", "shm"):
            try:
                self._shm = self._give_shm()
                self.data_path, self.data_reason = "shm", f"{why}: bytes through a shared memfd the service writes"
                return
            except (OSError, AttributeError, ProtocolError) as e:
                if want == "shm":
                    raise
                why = f"{why}; no shared memory ({e})"
        self.data_path, self.data_reason = "socket", f"{why}: bytes through the socket"

    def _give_shm(self):
        """Make a memfd of :attr:`batch` bytes sealed against shrinking, hand it to the service
        (``shm``, ``SCM_RIGHTS``) and map it here."""
        import fcntl
        import mmap

        fd = os.memfd_create("retainz-node", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, self.batch)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            m = mmap.mmap(fd, self.batch, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                self._call("shm", _fds=(fd,), size=self.batch)
            except BaseException:
                m.close()
                raise
            return m
        finally:
            os.close(fd)

    def _write_direct(self, piece, pos: int) -> None:
        """Write ``piece`` at device byte ``pos`` with ``O_DIRECT`` (a zoned block device): from a
        page-aligned buffer, zero-padded to the block size, in pieces of at most ``max_write`` bytes one
        after the other (the discipline of ``LinuxZonedDevice.write``: the kernel may reorder the
        requests a large write is split into unless the queue orders them)."""
        import mmap

        bs = self.direct_io.get("block_size") or 4096
        n = len(piece)
        padded = -(-n // bs) * bs
        if self._abuf is None or len(self._abuf) < padded:
            if self._abuf is not None:
                self._abuf.close()
            self._abuf = mmap.mmap(-1, -(-padded // mmap.PAGESIZE) * mmap.PAGESIZE)
        buf = self._abuf
        buf[:n] = piece
        if padded > n:
            buf[n:padded] = bytes(padded - n)
        step = self.direct_io.get("max_write") or padded
        view = memoryview(buf)
        try:
            done = 0
            while done < padded:
                k = os.pwrite(self._wfd, view[done:min(padded, done + step)], pos + done)
                if k <= 0:
                    raise OSError(5, f"{self.path}: short O_DIRECT write at byte {pos + done}")
                done += k
        finally:
            view.release()

    @property
    def direct(self) -> bool:
        """True when this client writes the device itself (the ``direct`` data path)."""
        return self.data_path == "direct"

    @classmethod
    def connect(cls, device: str | os.PathLike, *, socket_file: str | None = None, job: str | None = None,
                retention: str | None = None, timeout: float | None = None) -> NodeStore:
        """Connect to the node service of ``device`` (at ``socket_file``, default
        :func:`~retainz.node.protocol.socket_path`) and say hello.

        Args:
            job: the job this client writes for: a series folder (``"jobs/a"``), ``""`` the root series, or
                ``"*"`` the whole device (the service's own user, or a grant); default ``$RETAINZ_JOB``,
                else the root series.  The client sees and changes only the generations of its job's
                scope (:mod:`retainz.node.access`).
            retention: the job's retention rule: the service predicts the hint of a generation begun
                without one from it.
            timeout: seconds every reply may take (``None``: no bound).

        Raises:
            ConnectionRefusedError, FileNotFoundError: no service listens there.
            ProtocolError: the service speaks another protocol, or refused the hello.
            AccessDeniedError: job ``*`` without the right to it.
        """
        device = os.fspath(device)
        path = socket_file or socket_path(device)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
            if job is None:
                job = os.environ.get("RETAINZ_JOB", "")
            return cls(sock, device, path, job, retention)
        except BaseException:
            sock.close()
            raise

    # -- the connection ----------------------------------------------------------------------------
    def _call(self, op: str, *, _data=None, _fds: tuple[int, ...] = (), _into=None, **fields) -> dict:
        """One request and its reply; raises the error a refusal names, ServiceGoneError when the
        connection is lost.  ``_data``: a data part sent after the frame; ``_fds``: descriptors sent
        with it; ``_into``: a list that gets the data part of a successful reply (``length`` bytes)."""
        req = {"op": op, **{k: v for k, v in fields.items() if v is not None}}
        with self._lock:
            if self._gone is not None:
                raise ServiceGoneError(self._gone)
            try:
                send_frame(self._sock, req, _data, _fds)
                reply = recv_frame(self._sock, MAX_REPLY)
                if reply is None:
                    raise EOFError("the connection closed")
                if _into is not None and reply.get("ok") is True:
                    _into.append(recv_exact(self._sock, reply["length"]))
            except (OSError, EOFError, ProtocolError) as e:
                self._gone = (f"{self.path}: the node service at {self.socket} went away ({e}); what was not "
                              f"committed is gone: restart `retainz serve {self.path}` and retry")
                raise ServiceGoneError(self._gone) from None
        return raise_reply(reply)

    def close(self) -> None:
        """Say bye and disconnect (the service aborts generations this client left open).  Idempotent."""
        if self._sock is None:
            return
        try:
            if self._gone is None:
                self._call("bye")
        except (ServiceGoneError, ProtocolError):
            pass
        finally:
            self._sock.close()
            self._sock = None
            if self._shm is not None:
                self._shm.close()
                self._shm = None
            if self._wfd >= 0 and self._wfd != self._fd:
                os.close(self._wfd)
            self._wfd = -1
            if self._abuf is not None:
                self._abuf.close()
                self._abuf = None
            if self._fd >= 0:
                if self.reader is not None:
                    self.reader.extents.fd = -1
                os.close(self._fd)
                self._fd = -1
            self._gone = self._gone or f"{self.path}: this client of the node service is closed"

    def __enter__(self) -> NodeStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NodeStore({self.path!r}, socket={self.socket!r}, job={self.job!r}, data={self.data_path!r})"

    # -- the store contract ------------------------------------------------------------------------
    def begin_generation(self, gen_id: str, step: int, *, hint: Hint | None = None,
                         declared_size: int | None = None, replace: bool = False,
                         join: str | None = None, ranks: int | None = None) -> NodeGenerationWriter:
        """Begin a generation in the service (``Store.begin_generation``; admission runs there).

        Args:
            join: a token shared by the clients that write this one generation together (the ranks of
                one DCP save on one device): the first to begin it begins it, the others join the same
                writer (their shards go into it); one commits it, the others :meth:`~NodeGenerationWriter.leave`.
            ranks: how many clients join it (default ``$WORLD_SIZE`` with ``join``): until that many have
                joined, the last to leave leaves it open for the others (a rank that finished before the
                committer began) instead of aborting it.

        Raises:
            GenerationExistsError: as ``Store.begin_generation``; also when other clients write the
                generation under a different token.
        """
        if join is not None and ranks is None:
            world = os.environ.get("WORLD_SIZE", "")
            ranks = int(world) if world.isdigit() and 0 < int(world) <= 1 << 16 else None
        r = self._call("begin", gen=gen_id, step=step, hint=encode_hint(hint), declared_size=declared_size,
                       replace=replace or None, join=join, ranks=ranks if join is not None else None)
        gen = GenerationInfo(id=gen_id, step=step, hint=hint or Hint())
        return NodeGenerationWriter(self, r["writer"], gen, declared_size, joined=join is not None)

    def generations(self) -> list[GenerationInfo]:
        """Committed generations, ascending step then id (paged from the service)."""
        out: list[GenerationInfo] = []
        while True:
            r = self._call("list", start=len(out), count=MAX_PAGE)
            out += [decode_gen(d) for d in r["gens"]]
            if len(out) >= r["total"] or not r["gens"]:
                return out

    def generation(self, gen_id: str) -> GenerationInfo:
        """The committed generation ``gen_id`` (its shards without extents)."""
        return decode_gen(self._call("generation", gen=gen_id)["gen"])

    def unknown(self) -> list[GenerationInfo]:
        """The generations the served store's recovery found without a commit record
        (``Store.unknown``; the first ``MAX_PAGE`` in this client's scope)."""
        return [decode_gen(d) for d in self._call("unknown")["gens"]]

    def restore(self, gen_id: str) -> GenerationInfo:
        """Commit an unknown generation in the service (``Store.restore``; a write in this client's scope)."""
        return decode_gen(self._call("restore", gen=gen_id)["gen"])

    def admit(self, w: NodeGenerationWriter, nbytes: int) -> None:
        """Grow ``w``'s reservation to ``nbytes`` in the service now (``Store.admit``): a save that cannot
        fit is refused before its bytes are written.

        Raises:
            NoSpaceError: ``cause`` ``"admission"``.
        """
        self._call("admit", writer=w._handle, bytes=nbytes)

    def delete(self, gen_id: str, *, step: int | None = None) -> None:
        self._call("delete", gen=gen_id, step=step)

    def update_hint(self, gen_id: str, hint: Hint, *, step: int | None = None) -> None:
        self._call("update_hint", gen=gen_id, hint=encode_hint(hint), step=step)

    def advance(self, step: int) -> None:
        self._call("advance", step=step)

    @property
    def now(self) -> int:
        """The latest training step the served store has seen."""
        return self._call("now")["now"]

    @property
    def metrics(self) -> StoreMetrics:
        """The served store's counters (a copy)."""
        d = self._call("metrics")["metrics"]
        d.pop("waf", None)
        return StoreMetrics(**d)

    def gc(self, *, force: bool = False, progress=None) -> GCReport:
        """GC in the service (``progress`` is not called: the work runs there)."""
        return GCReport(**self._call("gc", force=force)["report"])

    def fsck(self, *, progress=None) -> FsckReport:
        """fsck in the service: every extent's crc, the catalog against the zones (``progress`` is
        not called: the work runs there)."""
        return FsckReport(**self._call("fsck")["report"])

    def df(self) -> SpaceReport:
        return SpaceReport(**self._call("df")["report"])

    # -- reads -------------------------------------------------------------------------------------
    def read_shard(self, gen_id: str, name: str) -> Iterator[bytes]:
        """Stream a committed shard, every extent verified (the store's :class:`~retainz.store.reader.Reader`
        over the service's ``locations`` and this client's reads of the device file; a client that
        cannot read the device gets each extent from the service, which verifies it).

        Raises:
            GenerationNotFoundError, ShardNotFoundError (at the call); ChecksumError (while streaming).
        """
        if self.reader is None:
            r = self._call("locations", gen=gen_id, shard=name, start=0, count=0)
            size, crc = r["size"], r["crc"]

            def extent_at(pos: int) -> tuple[int, bytes, None]:
                at, data, now = self._read_via_service(gen_id, name, pos)
                if now != (size, crc):
                    raise GenerationNotFoundError(f"generation {gen_id!r} was deleted while being read")
                return at, data, None

            return verified_stream(gen_id, name, size, crc, extent_at)
        return self.reader.read_shard(gen_id, name)

    def read_shard_extent(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes]:
        """Random access: the verified extent holding data byte ``pos`` (``Store.read_shard_extent``)."""
        if self.reader is None:
            if type(pos) is not int or pos < 0:
                raise ValueError(f"generation {gen_id!r} shard {name!r}: byte {pos} is outside the shard")
            return self._read_via_service(gen_id, name, pos)[:2]
        return self.reader.read_shard_extent(gen_id, name, pos)

    def read_shard_into(self, gen_id: str, name: str, pos: int, out) -> int:
        """Whole verified extents from data byte ``pos`` straight into ``out``; bytes filled
        (``Store.read_shard_into``).  A client that cannot read the device gives 0 (the caller reads
        through :meth:`read_shard_extent`)."""
        if self.reader is None:
            return 0
        return self.reader.read_shard_into(gen_id, name, pos, out)

    def _read_via_service(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes, tuple[int, int | None]]:
        """``(at, bytes, (shard size, shard crc))``: the verified extent holding byte ``pos``, read by the
        service (a client that cannot read the device).

        Raises:
            ProtocolError: the bytes answered do not hold byte ``pos``.
        """
        if self.data_path == "shm":
            r = self._call("read", gen=gen_id, shard=name, pos=pos, via="shm")
            data = self._shm[:r["length"]]
        else:
            got: list = []
            r = self._call("read", gen=gen_id, shard=name, pos=pos, via="socket", _into=got)
            data = got[0]
        at = r["at"]
        if not at <= pos < at + len(data):
            raise ProtocolError(f"generation {gen_id!r} shard {name!r}: the service read bytes {at} .. "
                                f"{at + len(data)}, not byte {pos}")
        return at, data, (r["size"], r["crc"])


class ServedShards:
    """A node client's :class:`~retainz.store.reader.ShardLookup`: the service's ``locations``, paged
    (``call``: :meth:`NodeStore._call`).  Unknown generations are not offered (the service refuses
    their reads)."""

    def __init__(self, call: Callable[..., dict]):
        self._call = call

    def shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> ShardInfo:
        """The committed shard's size, crc32c and extents as the service has them now.

        Raises:
            GenerationNotFoundError, ShardNotFoundError, AccessDeniedError: the service's refusal.
        """
        ext: list = []
        while True:
            r = self._call("locations", gen=gen_id, shard=name, start=len(ext), count=MAX_PAGE)
            ext += [tuple(e) for e in r["extents"]]
            if len(ext) >= r["total"] or not r["extents"]:
                return ShardInfo(name, r["size"], r["crc"], tuple(ext))


class DeviceFileExtents:
    """A node client's :class:`~retainz.store.reader.ExtentBytes`: ``pread`` of the device file the
    service offers (``fd``, read-only or read-write), at ``region + zone * zone_size + offset``
    (``ZonedDevice.direct_region``).  Bytes past the file's end read as zeros (they fail their crc)."""

    def __init__(self, fd: int, region: int, zone_size: int, block_size: int):
        self.fd = fd
        self.region = region
        self.zone_size = zone_size
        self.block_size = block_size

    def read_extent(self, zone: int, offset: int, length: int) -> bytes:
        """``length`` bytes of the extent at ``offset`` of ``zone``.

        Raises:
            OSError: EBADF once the client is closed (``fd`` -1); the errors of ``pread``.
        """
        if self.fd < 0:
            raise OSError(errno.EBADF, "this client of the node service is closed")
        pos = self.region + zone * self.zone_size + offset
        out = os.pread(self.fd, length, pos)
        while len(out) < length:
            more = os.pread(self.fd, length - len(out), pos + len(out))
            if not more:
                out += bytes(length - len(out))
                break
            out += more
        return out

    def read_extent_into(self, zone: int, offset: int, out: memoryview) -> None:
        """``len(out)`` bytes of the extent at ``offset`` of ``zone`` straight into ``out``
        (``os.preadv``); bytes past the file's end read as zeros.

        Raises:
            OSError: EBADF once the client is closed (``fd`` -1); the errors of ``preadv``.
        """
        if self.fd < 0:
            raise OSError(errno.EBADF, "this client of the node service is closed")
        pos = self.region + zone * self.zone_size + offset
        done = 0
        while done < len(out):
            got = os.preadv(self.fd, [out[done:]], pos + done)
            if not got:
                out[done:] = bytes(len(out) - done)
                break
            done += got


class NodeGenerationWriter:
    """A generation being written through the service (``GenerationWriting``); returned by
    :meth:`NodeStore.begin_generation`.  Commit and abort run in the service."""

    def __init__(self, store: NodeStore, handle: int, gen: GenerationInfo, declared_size: int | None, *,
                 joined: bool = False):
        self._store = store
        self._handle = handle
        self.gen = gen
        self.declared_size = declared_size
        self.joined = joined

    @property
    def id(self) -> str:
        return self.gen.id

    @property
    def state(self) -> GenState:
        return self.gen.state

    def open_shard(self, name: str, *, size: int | None = None) -> NodeShardStream:
        """Open a shard (``GenerationWriter.open_shard``); its bytes go to the device file."""
        if self.gen.state is not GenState.WRITING:
            raise ValueError(f"generation {self.gen.id!r} is {self.gen.state.value}, not writing")
        r = self._store._call("open_shard", writer=self._handle, name=name, size=size)
        return NodeShardStream(self, r["shard"], name)

    def write_shard(self, name: str, chunks: Iterable[bytes | bytearray | memoryview], *,
                    size: int | None = None) -> ShardInfo:
        """Stream one shard from an iterable of chunks (``GenerationWriter.write_shard``)."""
        return contract.write_shard(self, name, chunks, size=size)

    def write_counted_shard(self, name: str, size: int) -> ShardInfo:
        """Refused: a served device keeps payload (counted shards are for trace replay in-process)."""
        raise ValueError(f"shard {name!r}: a counted shard (size without bytes) needs a payload-less device; "
                         "a served device keeps payload")

    def commit(self) -> GenerationInfo:
        """Commit in the service (it flushes the device file, then journals the commit record)."""
        r = self._store._call("commit", writer=self._handle)
        info = decode_gen(r["gen"])
        self.gen.state = GenState.COMMITTED
        self.gen.commit_seq = info.commit_seq
        return info

    def rename(self, gen_id: str) -> None:
        """Give the uncommitted generation another id in the service (``GenerationWriter.rename``).

        Raises:
            GenerationExistsError: ``gen_id`` exists, or the generation is joined by other clients.
            AccessDeniedError: ``gen_id`` is outside this client's scope.
        """
        if self.gen.state is not GenState.WRITING:
            raise ValueError(f"generation {self.gen.id!r} is {self.gen.state.value}, not writing")
        self._store._call("rename", writer=self._handle, gen=gen_id)
        self.gen.id = gen_id

    def leave(self) -> None:
        """Let go of a generation begun with a ``join`` token, leaving it to the clients that joined
        it (the shards this client closed stay in it; the last client to leave without a commit
        aborts it).  Nothing can be written through this writer afterwards."""
        if self.gen.state is not GenState.WRITING:
            return
        self._store._call("leave", writer=self._handle)
        self.gen.state = GenState.ABORTED

    def abort(self) -> None:
        """Drop the generation in the service.  A no-op once committed or aborted, or when the service
        is gone (its restart reclaims the generation anyway)."""
        if self.gen.state is not GenState.WRITING:
            return
        self.gen.state = GenState.ABORTED
        try:
            self._store._call("abort", writer=self._handle)
        except ServiceGoneError:
            pass

    def __enter__(self) -> NodeGenerationWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        contract.exit_writing(self, exc_type is not None)

    def __repr__(self) -> str:
        return f"NodeGenerationWriter({self.gen.id!r}, step={self.gen.step}, {self.gen.state.value})"


class NodeShardStream:
    """One shard being written (``ShardStream``): its bytes cut into units of the client's batch
    (:class:`~retainz.store.writer.WriteUnits`), each unit claimed, written to the device file with
    ``pwrite`` and its crcs reported (or handed to the service: ``put``)."""

    def __init__(self, writer: NodeGenerationWriter, handle: int, name: str):
        self._w = writer
        self._s = writer._store
        self._handle = handle
        self.name = name
        self.written = 0
        self._units = WriteUnits(self._s.batch, self._emit)
        self._open = True
        self._crc = 0             # the shard's crc32c over the extents written so far

    def _emit(self, view: memoryview, n: int) -> None:
        """Claim the ``n`` bytes of ``view``, write each extent, report the crcs (the direct path); or
        hand them to the service through the shared buffer or the socket (``put``)."""
        s = self._s
        if not s.direct:
            if s.data_path == "shm":
                s._shm[:n] = view
                s._call("put", shard=self._handle, nbytes=n, offset=0, via="shm")
            else:
                s._call("put", shard=self._handle, nbytes=n, via="socket", _data=view)
            self._crc = crc32c_combine(self._crc, crc32c.crc32c(view), n)
            return
        if not s._writable:
            raise PermissionError(f"{s.path}: this client cannot write the device file (its permissions)")
        ext = s._call("claim", shard=self._handle, nbytes=n)["extents"]
        crcs, p = [], 0
        for z, off, length in ext:
            piece = view[p:p + length]
            pos = s._region + z * s.zone_size + off
            if s.direct_io.get("o_direct"):
                s._write_direct(piece, pos)
            else:
                done = 0
                while done < length:
                    done += os.pwrite(s._wfd, piece[done:], pos + done)
            c = crc32c.crc32c(piece)
            crcs.append(c)
            self._crc = crc32c_combine(self._crc, c, length)
            p += length
        if p != n:
            raise ProtocolError(f"shard {self.name!r}: the service claimed {p} bytes for {n}")
        s._call("written", shard=self._handle, crcs=crcs)

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the shard (written to the device a unit at a time).

        Raises:
            the errors of ``ShardWriter.write`` (the shard is aborted), ValueError once closed.
        """
        if not self._open:
            raise ValueError(f"shard {self.name!r} of generation {self._w.id!r} is closed")
        try:
            mv = memoryview(chunk).cast("B")
            self.written += mv.nbytes
            self._units.take(mv)
        except BaseException:
            self.abort()
            raise

    def close(self, crcs: Sequence[int] | None = None) -> ShardInfo:
        """Write the buffered tail and close the shard in the service; returns its :class:`ShardInfo`
        (extent count only: the extents stay in the service).

        Raises:
            ValueError: ``crcs`` given (a client computes them itself), or the shard is closed.
        """
        if crcs is not None:
            raise ValueError("a node client reports crcs itself; close() takes none")
        if not self._open:
            raise ValueError(f"shard {self.name!r} of generation {self._w.id!r} is closed")
        try:
            self._units.flush()
            name, size, crc, _n = self._s._call("close_shard", shard=self._handle)["info"]
        except BaseException:
            self.abort()
            raise
        self._open = False
        if crc is not None and size and crc != self._crc:
            raise ChecksumError(f"shard {name!r}: the service combined crc32c {crc:#x}, this client "
                                f"computed {self._crc:#x}", shard=name, expected=self._crc, actual=crc)
        info = ShardInfo(name, size, crc, ())
        self._w.gen.shards[name] = info
        return info

    def abort(self) -> None:
        """Drop the shard in the service (its bytes become dead).  A no-op once closed."""
        if not self._open:
            return
        self._open = False
        self._units.drop()
        try:
            self._s._call("abort_shard", shard=self._handle)
        except (ServiceGoneError, ProtocolError, ValueError):
            pass
