"""The node service: one process owns a device's store; many client processes write their data to the
device themselves and send only metadata here.

Per connection a thread runs the requests in order (docs/node.md lists them).  The service holds the
:class:`~retainz.store.Store` (its journal, zone book and allocator: one placement decision stream for
every client) and executes every request on it; the store's lock orders them.  A client's bytes never
cross the socket: ``claim`` runs placement for the next bytes of a shard and answers the extents
(``ShardWriter.claim``: the device's write pointers advance over them), the client ``pwrite``\\ s its
bytes there and reports their crc32c (``written``), and the commit flushes the device file (which
syncs what every client wrote) before its commit record.

Access (:mod:`.access`): each connection declares its job in ``hello``; every request naming a
generation outside the job's scope is refused (``AccessDeniedError``), listings show only the scope;
the whole-device job ``*`` is checked against the peer's kernel credentials (``SO_PEERCRED``).

Untrusted input: every field is checked against :mod:`.protocol`'s bounds; a malformed or refused
request gets an error reply and the connection goes on (a frame that breaks the framing ends the
connection); a bug answering a request becomes an ``InternalError`` reply, logged, never a crash.

What a crash leaves: a client that dies (its connection ends) has its open shards and generations
aborted, as a writer aborted in-process (their bytes dead, zones left with no live data reset).  A
service that dies leaves the store as a killed writer process does: recovery at the next open (the
next ``retainz serve``) reclaims everything uncommitted; its clients get
:class:`~retainz.errors.ServiceGoneError`.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import socket
import stat
import threading
from collections.abc import Callable

from retainz.errors import (
    DeviceBusyError,
    GenerationExistsError,
    ProtocolError,
    RetainZError,
    ShardNotFoundError,
)
from retainz.node.access import Scope, parse_job, scope_for
from retainz.node.protocol import (
    MAX_CLAIM,
    MAX_CRCS,
    MAX_NAME,
    MAX_PAGE,
    MAX_REQUEST,
    PROTOCOL,
    decode_hint,
    encode_gen,
    error_reply,
    field,
    recv_exact,
    recv_frame,
    send_frame,
    socket_path,
)
from retainz.store import Store
from retainz.store.writer import WRITE_BUFFER

__all__ = ["Service", "serve", "MAX_CONNECTIONS"]

log = logging.getLogger("retainz.node")

#: Connections served at once; one more is refused with an error reply.
MAX_CONNECTIONS = 256
#: Handles (open generations plus open shards) one connection may hold.
MAX_HANDLES = 4096


class _Shard:
    """An open shard of a connection: its store stream, its generation's handle, the crcs reported for
    its claimed extents, and how its bytes come (``mode``: ``None`` until the first, then ``"claim"``
    -- the client writes the device -- or ``"put"`` -- the bytes come through the service)."""

    __slots__ = ("stream", "writer", "crcs", "mode", "leases")

    def __init__(self, stream, writer: int):
        self.stream = stream
        self.writer = writer
        self.crcs: list[int] = []
        self.mode: str | None = None
        #: ``(extent index, (zone, offset, padded length))`` of claimed extents not yet found written
        #: on the device (a zoned block device's leases, ``ZonedDevice.claim_turn``).
        self.leases: list[tuple[int, tuple[int, int, int]]] = []


class _Shared:
    """A generation several connections write (``begin`` with a ``join`` token: the ranks of one DCP
    save on one device): the writer, its token, the sessions holding it, how many clients write it
    (``ranks``, ``None``: unknown) and how many have joined so far."""

    __slots__ = ("writer", "token", "holders", "ranks", "joins")

    def __init__(self, writer, token: str, ranks: int | None):
        self.writer = writer
        self.token = token
        self.holders: set = set()
        self.ranks = ranks
        self.joins = 0


class _Session:
    """One connection: its job, the generations and shards it opened (handles are its own)."""

    def __init__(self, service: Service, sock: socket.socket):
        self.service = service
        self.sock = sock
        self.job: str | None = None
        self.scope: Scope | None = None
        self.retention: str | None = None
        self.peer = _peer(sock)
        self.writers: dict[int, object] = {}
        self.shards: dict[int, _Shard] = {}
        self._next = 1
        self.shm: mmap.mmap | None = None       # the client's shared buffer (``shm``), mapped here
        self._fds: list[int] = []               # descriptors that came with the request being answered
        self._payload: bytes | None = None      # the data part that came with it (``put`` on the socket)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while True:
                try:
                    req = recv_frame(self.sock, MAX_REQUEST, self._fds)
                    self._payload = _data_part(self.sock, req)
                except ProtocolError as e:      # the framing is lost: say why, then hang up
                    with contextlib.suppress(OSError):
                        send_frame(self.sock, error_reply(e))
                    return
                if req is None:
                    return
                if self._fds and req.get("op") != "shm":
                    self._close_fds()           # descriptors only the shm request takes
                try:
                    reply = self.answer(req)
                finally:
                    self._close_fds()
                    self._payload = None
                data = reply.pop("_data", None)
                try:
                    send_frame(self.sock, reply, data)
                except (TypeError, ValueError) as e:   # a reply JSON cannot carry: a bug, said so
                    log.exception("reply to %r cannot be sent", req.get("op"))
                    send_frame(self.sock, {"ok": False, "error": "InternalError", "message": f"reply: {e}"})
                if req.get("op") == "bye":
                    return
        except OSError:
            return
        finally:
            self._close_fds()
            self.drop()

    def _close_fds(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def answer(self, req: dict) -> dict:
        """The reply to one request (never raises)."""
        op = req.get("op")
        try:
            if type(op) is not str or op not in _OPS:
                raise ProtocolError(f"unknown request {str(op)[:40]!r}")
            if self.job is None and op != "hello":
                raise ProtocolError(f"request {op!r} before hello")
            out = _OPS[op](self, req) or {}
            out["ok"] = True
            if op in _CHANGES:
                self.service._changed()
            return out
        except RetainZError as e:
            return error_reply(e)
        except (ValueError, KeyError, OSError) as e:   # the store's own refusals of bad values
            return error_reply(e)
        except Exception as e:   # a bug: keep serving, say so
            log.exception("request %r failed", op)
            return {"ok": False, "error": "InternalError", "message": f"{type(e).__name__}: {e}"[:2000]}

    def drop(self) -> None:
        """The connection ended: abort what it left open (its bytes become dead, as an aborted
        writer's; the leases it left unwritten on a zoned block device are filled first)."""
        for sh in list(self.shards.values()):
            try:
                self._release(sh)
            except Exception:     # the zone's leases are broken: its waiting writers get the error
                log.exception("filling the leases a dropped connection left failed")
            with contextlib.suppress(Exception):
                sh.stream.abort()
        self.shards.clear()
        writers = list(self.writers.items())
        self.writers.clear()
        for h, w in writers:
            with contextlib.suppress(Exception):
                self._unshare(w, h, abort=True)
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.shm is not None:
            with contextlib.suppress(BufferError):
                self.shm.close()
            self.shm = None
        self.service._forget(self)

    def _handle(self) -> int:
        if len(self.writers) + len(self.shards) >= MAX_HANDLES:
            raise ProtocolError(f"a connection holds at most {MAX_HANDLES} open generations and shards")
        h = self._next
        self._next += 1
        return h

    def _writer(self, req: dict):
        h = field(req, "writer", "int")
        w = self.writers.get(h)
        if w is None:
            raise ProtocolError(f"no open generation handle {h} on this connection")
        return h, w

    def _shard(self, req: dict) -> tuple[int, _Shard]:
        h = field(req, "shard", "int")
        sh = self.shards.get(h)
        if sh is None:
            raise ProtocolError(f"no open shard handle {h} on this connection")
        return h, sh

    # -- requests ----------------------------------------------------------------------------------
    def hello(self, req: dict) -> dict:
        if self.job is not None:
            raise ProtocolError("hello was already said on this connection (its job is fixed: connect again "
                                "for another job)")
        proto = field(req, "protocol", "int")
        if proto != PROTOCOL:
            raise ProtocolError(f"protocol {proto} is not served (this service speaks {PROTOCOL})")
        job = field(req, "job", "text", default="")
        if len(job) > MAX_NAME:
            raise ProtocolError(f"request 'hello': field 'job' is longer than {MAX_NAME} characters")
        job = parse_job(job)
        rule = field(req, "retention", "text", default=None)
        if rule:
            from retainz.retention import parse_rule

            parse_rule(rule)                    # a malformed rule is refused now, not at a save
        svc = self.service
        self.scope = scope_for(job, peer_uid=self.peer[1], owner_uid=svc.owner_uid, allow_all=svc.allow_all,
                               grants=svc.grants)
        self.job = job
        self.retention = rule or None
        s, g = svc.store, svc.store.device.geometry
        region = svc.store.device.direct_region()
        return {"protocol": PROTOCOL, "region": list(region) if region else None,
                "direct_io": svc.store.device.direct_io() if region else None,
                "geometry": {"block_size": g.block_size, "zone_size": g.zone_size,
                             "zone_capacity": g.zone_capacity, "nr_zones": g.nr_zones,
                             "max_open": g.max_open, "max_active": g.max_active},
                "uuid": str(s.uuid), "format_version": s.format_version, "policy": s.policy, "meta_zones": s.meta_zones,
                "gc_reserve_zones": s.gc_reserve_zones, "write_buffer": WRITE_BUFFER, "max_claim": MAX_CLAIM,
                "job": job, "scope": self.scope.to_json()}

    def begin(self, req: dict) -> dict:
        gen = field(req, "gen", "name")
        step = field(req, "step", "int")
        self.scope.check(gen, "write")
        hint = decode_hint(req.get("hint"))
        if hint is None:
            from retainz.retention.online import rule_hint

            hint = rule_hint(self.retention, step)
        size = field(req, "declared_size", "int", default=None)
        replace = field(req, "replace", "bool", default=False)
        token = field(req, "join", "text", default=None)
        ranks = field(req, "ranks", "int", default=None, low=1, high=1 << 16)
        h = self._handle()
        svc = self.service
        with svc._lock:        # begin-or-join is one step: two ranks racing to begin both join one writer
            shared = svc._shared.get(gen) if token else None
            if shared is not None and shared.writer.state.value == "writing" and not shared.holders \
                    and shared.token != token:
                shared.writer.abort()      # left by every rank of another run that never committed it
                del svc._shared[gen]
                shared = None
            if shared is not None and shared.writer.state.value == "writing":
                if shared.token != token:
                    raise GenerationExistsError(f"generation {gen!r} is being written by other clients (a "
                                                "different join token)")
                w = shared.writer
            else:
                w = svc.store.begin_generation(gen, step, hint=hint, declared_size=size, replace=replace)
                if token:
                    shared = svc._shared[gen] = _Shared(w, token, ranks)
            if token:
                shared.holders.add(self)
                shared.joins += 1
        self.writers[h] = w
        return {"writer": h, "joined": bool(token) and len(shared.holders) > 1}

    def open_shard(self, req: dict) -> dict:
        wh, w = self._writer(req)
        name = field(req, "name", "name")
        size = field(req, "size", "int", default=None)
        h = self._handle()
        self.shards[h] = _Shard(w.open_shard(name, size=size), wh)
        return {"shard": h}

    def claim(self, req: dict) -> dict:
        h, sh = self._shard(req)
        n = field(req, "nbytes", "int", low=1, high=MAX_CLAIM)
        if sh.mode == "put":
            raise ValueError(f"shard {sh.stream.name!r} takes its bytes through the service (put); it takes "
                             "no claims")
        sh.mode = "claim"
        first = len(sh.stream.extents)
        dev = self.service.store.device
        bs = dev.geometry.block_size
        try:
            ext = sh.stream.claim(n)
        except BaseException:
            sh.leases += [(first + i, (e[0], e[1], -(-e[2] // bs) * bs))
                          for i, e in enumerate(sh.stream.extents[first:])]
            if sh.stream not in self.writers[sh.writer].open_shards:
                self.shards.pop(h, None)        # the store aborted the shard
                self._release(sh)
            raise
        leases = [(z, off, -(-length // bs) * bs) for z, off, length in ext]
        sh.leases += [(first + i, le) for i, le in enumerate(leases)]
        dev.claim_turn(leases)                  # a zoned block device: this client's turn in each zone
        return {"extents": [list(e) for e in ext]}

    def _release(self, sh: _Shard) -> None:
        """End the leases ``sh`` leaves unwritten (``ZonedDevice.release_claims``)."""
        if sh.leases:
            leases, sh.leases = [le for _, le in sh.leases], []
            self.service.store.device.release_claims(leases)

    def written(self, req: dict) -> dict:
        _, sh = self._shard(req)
        crcs = field(req, "crcs", "ints", high=MAX_CRCS)
        if len(sh.crcs) + len(crcs) > len(sh.stream.extents):
            raise ProtocolError(f"shard {sh.stream.name!r}: {len(sh.crcs) + len(crcs)} crcs reported for "
                                f"{len(sh.stream.extents)} claimed extents")
        upto = len(sh.crcs) + len(crcs)
        due = [le for i, le in sh.leases if i < upto]
        if due:
            short = self.service.store.device.claims_written(due)
            if short:
                z, off, n = short[0]
                raise ProtocolError(f"shard {sh.stream.name!r}: the extent at zone {z} offset {off} ({n} bytes) is "
                                    "reported written, but the device's write pointer has not passed it")
            sh.leases = [(i, le) for i, le in sh.leases if i >= upto]
        sh.crcs += crcs
        return {"reported": len(sh.crcs)}

    def close_shard(self, req: dict) -> dict:
        h, sh = self._shard(req)
        self.shards.pop(h)
        try:
            info = sh.stream.close(sh.crcs if sh.stream.extents and sh.mode == "claim" else None)
        except BaseException:
            self._release(sh)
            raise
        return {"info": [info.name, info.size, info.crc, len(info.extents)]}

    # -- the data paths for clients that cannot write the device (docs/node.md, "Data paths") --------
    def shm(self, req: dict) -> dict:
        """Take the client's shared buffer: one memfd sent with this request (``SCM_RIGHTS``), sealed
        against shrinking (``F_SEAL_SHRINK``, so no later ``ftruncate`` can make a read of the mapping
        fault: memfd_create(2), "File sealing" in fcntl(2)), of ``size`` bytes (1 .. ``MAX_CLAIM``).
        It replaces a buffer given before."""
        import fcntl

        size = field(req, "size", "int", low=1, high=MAX_CLAIM)
        if len(self._fds) != 1:
            raise ProtocolError(f"request 'shm' carries {len(self._fds)} file descriptors, not one memfd")
        fd = self._fds[0]
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProtocolError("request 'shm': the descriptor is not a memfd (not a regular file)")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise ProtocolError("request 'shm': the descriptor takes no seals (not a memfd made with "
                                "MFD_ALLOW_SEALING)") from None
        if not seals & fcntl.F_SEAL_SHRINK:
            raise ProtocolError("request 'shm': the memfd is not sealed against shrinking (F_SEAL_SHRINK)")
        if st.st_size < size:
            raise ProtocolError(f"request 'shm': the memfd holds {st.st_size} bytes, not the {size} announced")
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        if self.shm is not None:
            self.shm.close()
        self.shm = m
        return {"size": size}

    def _put_shard(self, req: dict) -> tuple[int, _Shard]:
        h, sh = self._shard(req)
        if sh.mode == "claim":
            raise ValueError(f"shard {sh.stream.name!r} takes claims (its client writes the device); it takes "
                             "no bytes through the service")
        return h, sh

    def put(self, req: dict) -> dict:
        """Write the shard's next ``nbytes`` bytes, which the client put in its shared buffer (from byte
        ``offset``, ``via`` ``"shm"``) or sent after this frame (``via`` ``"socket"``): the store writes
        them as an in-process writer's (``ShardWriter.write``: placement, write-pointer order, crcs)."""
        h, sh = self._put_shard(req)
        n = field(req, "nbytes", "int", low=1, high=MAX_CLAIM)
        if self._payload is not None:
            data = self._payload
        else:
            off = field(req, "offset", "int", default=0, high=MAX_CLAIM)
            if self.shm is None:
                raise ProtocolError("request 'put' via shm before a shared buffer was given (shm)")
            if off + n > len(self.shm):
                raise ProtocolError(f"request 'put': bytes {off} .. {off + n} are outside the {len(self.shm)}-byte "
                                    "shared buffer")
            data = self.shm[off:off + n]       # a copy: the client may reuse its buffer at the reply
        sh.mode = "put"
        try:
            sh.stream.write(data)
        except BaseException:
            if sh.stream not in self.writers[sh.writer].open_shards:
                self.shards.pop(h, None)        # the store aborted the shard
            raise
        return {"written": sh.stream.written}

    def read(self, req: dict) -> dict:
        """The verified extent holding data byte ``pos`` of a committed shard (``Store.read_shard_extent``)
        for a client that cannot read the device: its bytes go to the shared buffer (``via`` ``"shm"``,
        from byte 0) or follow the reply (``via`` ``"socket"``).  Replies ``at`` (the extent's first data
        byte in the shard), ``length``, ``size`` and ``crc`` (the shard's)."""
        gen, name = field(req, "gen", "name"), field(req, "shard", "name")
        pos = field(req, "pos", "int")
        via = field(req, "via", "text", default="socket")
        if via not in ("shm", "socket"):
            raise ProtocolError(f"request 'read': via {via[:20]!r} is not 'shm' or 'socket'")
        self.scope.check(gen, "read")
        store = self.service.store
        sh = store.generation(gen).shards.get(name)
        if sh is None:
            raise ShardNotFoundError(f"generation {gen!r} has no shard {name!r}")
        at, data = store.read_shard_extent(gen, name, pos)
        out = {"at": at, "length": len(data), "size": sh.size, "crc": sh.crc}
        if via == "shm":
            if self.shm is None or len(data) > len(self.shm):
                raise ProtocolError(f"request 'read' via shm: an extent of {len(data)} bytes needs a shared buffer "
                                    "at least that large (shm)")
            self.shm[:len(data)] = data
        else:
            out["_data"] = data
        return out

    def abort_shard(self, req: dict) -> dict:
        h, sh = self._shard(req)
        self.shards.pop(h)
        self._release(sh)
        sh.stream.abort()
        return {}

    def _end(self, req: dict, how: str) -> dict:
        """``commit``, ``abort`` or ``leave`` the generation of handle ``writer``."""
        h, w = self._writer(req)
        for sh_h in [k for k, sh in self.shards.items() if sh.writer == h]:
            if how == "commit":
                raise ValueError(f"generation {w.id!r}: shard {self.shards[sh_h].stream.name!r} is still "
                                 "open; close or abort it before the commit")
            sh = self.shards.pop(sh_h)
            self._release(sh)
            sh.stream.abort()
        if how == "commit":
            gen = w.commit()
            del self.writers[h]
            self._unshare(w, h, abort=False)
            return {"gen": encode_gen(gen)}
        del self.writers[h]
        if how == "leave":
            self._unshare(w, h, abort=True, leaving=True)
        else:
            self._unshare(w, h, abort=False)
            w.abort()
        return {}

    def _unshare(self, w, _h: int, *, abort: bool, leaving: bool = False) -> None:
        """This session lets go of ``w``; with ``abort``, the generation is aborted when no other
        session holds it (a writer begun without a join token has no other holder) -- unless this
        session ``leaving`` it was not the last of its ``ranks`` to join: a rank that finished before
        the coordinator began leaves the generation open for it (a lost connection never does)."""
        svc = self.service
        with svc._lock:
            shared = svc._shared.get(w.id)
            if shared is None or shared.writer is not w:
                last = True
            else:
                shared.holders.discard(self)
                last = not shared.holders
                waiting = (leaving and shared.ranks is not None and shared.joins < shared.ranks
                           and w.state.value == "writing")
                if last and waiting:
                    return                 # kept, with no holder, for the ranks still to come
                if last or w.state.value != "writing":
                    del svc._shared[w.id]
        if abort and last and w.state.value == "writing":
            w.abort()

    def commit(self, req: dict) -> dict:
        return self._end(req, "commit")

    def abort(self, req: dict) -> dict:
        return self._end(req, "abort")

    def leave(self, req: dict) -> dict:
        """Let go of a joined generation, leaving it to the other clients that joined it (its shards
        closed here stay in it); the last to leave without a commit aborts it."""
        return self._end(req, "leave")

    def admit(self, req: dict) -> dict:
        """Grow an open generation's reservation to ``bytes`` now (``Store.admit``), under the store's
        lock as the store's own callers do."""
        _, w = self._writer(req)
        nbytes = field(req, "bytes", "int")
        with self.service.store.lock:
            self.service.store.admit(w, nbytes)
        return {}

    def rename(self, req: dict) -> dict:
        """Give an open generation this connection began alone another id (``GenerationWriter.rename``);
        the new id must be in the client's scope.  A joined generation keeps its id (other clients
        hold it by that id)."""
        h, w = self._writer(req)
        gen = field(req, "gen", "name")
        self.scope.check(gen, "write")
        if any(sh.writer is w for sh in self.service._shared.values()):
            raise GenerationExistsError(f"generation {w.id!r} is written by several clients: it keeps its id")
        w.rename(gen)
        return {}

    def unknown(self, req: dict) -> dict:
        """The generations recovery found whose commit record is missing (``Store.unknown``), those in
        the client's scope."""
        gens = [g for g in self.service.store.unknown() if self.scope.everything or self.scope.allows(g.id)]
        return {"gens": [encode_gen(g) for g in gens[:MAX_PAGE]]}

    def restore(self, req: dict) -> dict:
        gen = field(req, "gen", "name")
        self.scope.check(gen, "write")
        return {"gen": encode_gen(self.service.store.restore(gen))}

    def delete(self, req: dict) -> dict:
        gen = field(req, "gen", "name")
        step = field(req, "step", "int", default=None)
        self.scope.check(gen, "delete")
        self.service.store.delete(gen, step=step)
        return {}

    def list(self, req: dict) -> dict:
        start = field(req, "start", "int", default=0)
        count = field(req, "count", "int", default=MAX_PAGE, high=MAX_PAGE)
        gens = self.service.store.generations()
        if not self.scope.everything:
            gens = [g for g in gens if self.scope.allows(g.id)]
        return {"total": len(gens), "gens": [encode_gen(g) for g in gens[start:start + count]]}

    def generation(self, req: dict) -> dict:
        gen = field(req, "gen", "name")
        self.scope.check(gen, "read")
        return {"gen": encode_gen(self.service.store.generation(gen))}

    def locations(self, req: dict) -> dict:
        gen_id, name = field(req, "gen", "name"), field(req, "shard", "name")
        start = field(req, "start", "int", default=0)
        count = field(req, "count", "int", default=MAX_PAGE, high=MAX_PAGE)
        self.scope.check(gen_id, "read")
        sh = self.service.store.generation(gen_id).shards.get(name)
        if sh is None:
            raise ShardNotFoundError(f"generation {gen_id!r} has no shard {name!r}")
        ext = sh.extents      # one tuple: GC replaces it whole when it moves the shard
        return {"size": sh.size, "crc": sh.crc, "total": len(ext),
                "extents": [list(e) for e in ext[start:start + count]]}

    def update_hint(self, req: dict) -> dict:
        hint = decode_hint(field(req, "hint", "dict"))
        gen = field(req, "gen", "name")
        step = field(req, "step", "int", default=None)
        self.scope.check(gen, "re-hint")
        self.service.store.update_hint(gen, hint, step=step)
        return {}

    def advance(self, req: dict) -> dict:
        self.service.store.advance(field(req, "step", "int"))
        return {}

    def now(self, req: dict) -> dict:
        return {"now": self.service.store.now}

    def df(self, req: dict) -> dict:
        return {"report": self.service.store.df().to_dict()}

    def fsck(self, req: dict) -> dict:
        rep = self.service.store.fsck().to_dict()
        rep.pop("ok", None)
        return {"report": rep}

    def gc(self, req: dict) -> dict:
        return {"report": self.service.store.gc(force=field(req, "force", "bool", default=False)).to_dict()}

    def metrics(self, req: dict) -> dict:
        return {"metrics": self.service.store.metrics.to_dict()}

    def bye(self, req: dict) -> dict:
        return {}


#: Requests that change the committed generations (after them the service's ``on_change`` runs).
_CHANGES = frozenset({"commit", "delete"})

_OPS: dict[str, Callable[[_Session, dict], dict]] = {
    name: getattr(_Session, name) for name in (
        "hello", "begin", "open_shard", "claim", "written", "close_shard", "abort_shard", "commit", "abort", "leave",
        "admit", "rename", "unknown", "restore", "shm", "put", "read",
        "delete", "list", "generation", "locations", "update_hint", "advance", "now", "df", "fsck", "gc",
        "metrics", "bye")
}


class Service:
    """The node service of one device: a listening Unix socket and the store it serves.

    Call sequence: ``svc = Service(store, path)`` (binds the socket, mode 0600), ``svc.serve_forever()``
    (returns after :meth:`stop`), then ``svc.close()`` (ends every connection, aborting what it left
    open, closes the store unless ``own_store`` is false; the caller closes the device).  :func:`serve`
    does all of it; ``retainz mount`` serves its own store this way beside its FUSE loop
    (:func:`retainz.mount.runner.serve`).

    Args:
        store: the open store (the service's only user of it from now on).
        path: the socket path (:func:`~retainz.node.protocol.socket_path` of the device).
        mode: the socket's permission bits (0o600: its owner only; 0o660 with ``group`` for a group).
        group: a group name or id to own the socket (``None``: the caller's).
        allow_all: every client's scope is the whole device (:mod:`.access`).
        grants: ``{job: {series, ...}}``: more series a job may see and change (``*``: all).
        on_change: called (no arguments, in the client's thread, before its reply is sent) after a
            client's ``commit`` or ``delete`` changed the committed generations, so another user of
            the same store (the mount's namespace) can bring its view up to date; an exception it
            raises is logged and the reply stays the request's.
        own_store: :meth:`close` closes the store (``False``: its opener closes it, as the mount
            does after its own unmount).
        on_leave: called (no arguments, in the ending connection's thread, once :meth:`clients` no
            longer counts it) when a client's connection ends, so an opener that serves its device only
            while someone uses it can close it then; an exception it raises is logged.

    Raises:
        DeviceBusyError: a service already listens on ``path``.
        FileExistsError: ``path`` exists and is not a socket (it is left alone).
    """

    def __init__(self, store: Store, path: str, *, mode: int = 0o600, group: str | int | None = None,
                 allow_all: bool = False, grants: dict[str, frozenset[str]] | None = None,
                 on_change: Callable[[], None] | None = None, own_store: bool = True,
                 on_leave: Callable[[], None] | None = None):
        self.store = store
        self.path = path
        self.on_change = on_change
        self.on_leave = on_leave
        self.own_store = own_store
        self.owner_uid = os.geteuid()
        self.allow_all = allow_all
        self.grants = dict(grants or {})
        self._sessions: set[_Session] = set()
        self._shared: dict[str, _Shared] = {}     # generation id -> the joined writer
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        _clear_stale(path)
        parent = os.path.dirname(path)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700 if group is None else 0o711, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)          # owner-only from the bind on; the group gets it after the chown
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        try:
            if group is not None:
                import grp

                gid = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
                os.chown(path, -1, gid)
            os.chmod(path, mode)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        sock.listen(64)
        self._sock = sock

    def serve_forever(self) -> None:
        """Accept connections, one thread each, until :meth:`stop`."""
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            with self._lock:
                if self._stopping.is_set():     # stopped meanwhile: close() may have counted the sessions
                    conn.close()
                    return
                busy = len(self._sessions) >= MAX_CONNECTIONS
                s = None if busy else _Session(self, conn)
                if s is not None:
                    self._sessions.add(s)
            if s is None:
                with contextlib.suppress(OSError):
                    send_frame(conn, error_reply(ProtocolError(
                        f"the service serves at most {MAX_CONNECTIONS} connections")))
                conn.close()
                continue
            t = threading.Thread(target=s.run, name="retainz-node-client", daemon=True)
            t.start()
            with self._lock:      # close() joins only started threads
                self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _changed(self) -> None:
        """A client changed the committed generations: tell ``on_change`` (errors logged, never a
        client's)."""
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:   # noqa: BLE001 - the request succeeded; its reply must say so
                log.exception("on_change after a client's change failed")

    def clients(self, *, besides: int | None = None) -> int:
        """The clients connected now; ``besides``: not counting those of the process with that pid (the
        kernel's ``SO_PEERCRED``: a process that serves its own device and uses it through a client too)."""
        with self._lock:
            return sum(1 for s in self._sessions if besides is None or s.peer[0] != besides)

    def _forget(self, s: _Session) -> None:
        with self._lock:
            self._sessions.discard(s)
        if self.on_leave is not None:
            try:
                self.on_leave()
            except Exception:   # noqa: BLE001 - the connection is gone either way
                log.exception("on_leave after a client's connection ended failed")

    def stop(self) -> None:
        """Make :meth:`serve_forever` return (callable from a signal handler or another thread)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """End every connection, close the store (when ``own_store``) and remove the socket.  Idempotent."""
        self.stop()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            sessions = list(self._sessions)
        for s in sessions:
            with contextlib.suppress(OSError):
                s.sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=30)
        if self.own_store:
            self.store.close()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)


def _data_part(sock: socket.socket, req: dict | None) -> bytes | None:
    """The data part that follows a ``put`` frame sent ``via`` ``"socket"`` (``nbytes`` bytes), else
    ``None``.

    Raises:
        ProtocolError: ``nbytes`` missing or out of bounds (how many bytes follow is unknown: the framing
            is lost), or the stream ended inside the data.
    """
    if not isinstance(req, dict) or req.get("op") != "put" or req.get("via") != "socket":
        return None
    return recv_exact(sock, field(req, "nbytes", "int", low=1, high=MAX_CLAIM))


def _peer(sock: socket.socket) -> tuple[int | None, int | None, int | None]:
    """The connected client's ``(pid, uid, gid)`` from the kernel (``SO_PEERCRED``; ``None`` each where
    the platform does not say)."""
    import struct

    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", raw)
    except (AttributeError, OSError):
        return None, None, None


def _clear_stale(path: str) -> None:
    """Remove a socket nobody listens on (a killed service's); refuse a live one or a non-socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; remove it or pass --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise DeviceBusyError(f"{path}: a node service already listens there")


def serve(device: str, *, socket: str | None = None, policy: str | None = None, mode: int = 0o600,
          group: str | int | None = None, allow_all: bool = False, grants: dict[str, frozenset[str]] | None = None,
          ready: Callable[[Service], None] | None = None) -> None:
    """Serve the store on ``device`` until SIGTERM or SIGINT (``retainz serve``): a device spec
    (:func:`retainz.zoned.parse_device`: a device file, a zoned block device ``zbd:``/``/dev/NAME``, ``remote:``).

    Opens the device (its exclusive lock: no other process opens it directly meanwhile) and the store
    (recovery), listens on ``socket`` (default :func:`~retainz.node.protocol.socket_path`), calls
    ``ready(service)``, serves, and on a signal closes everything and removes the socket.

    Raises:
        FileNotFoundError, NotADeviceError, DeviceBusyError (the device or the socket in use),
        ForeignDeviceError (no store on it: ``retainz mkfs`` first), the errors of ``Store.open``.
    """
    import signal

    from retainz.store.opening import open_spec

    store = open_spec(device, policy=policy)
    dev = store.device
    try:
        try:
            svc = Service(store, socket or socket_path(device), mode=mode, group=group, allow_all=allow_all,
                          grants=grants)
        except BaseException:
            store.close()
            raise
        old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, lambda *_: svc.stop())
        try:
            if ready is not None:
                ready(svc)
            svc.serve_forever()
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            svc.close()
    finally:
        dev.close()
