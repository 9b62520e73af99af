"""A zoned device driven from another process, machine or QEMU guest: the :class:`ZonedDevice` verbs
over a byte stream, with an optional shared-memory window for the data.

NBD exports a regular block device this way but has no zone verbs (report, reset, finish, zone
append); this does the same for a zoned one.  :func:`serve` executes the requests of one connection on
its device; :class:`RemoteZonedDevice` is a :class:`ZonedDevice` whose every call is a request.  The
store above it cannot tell: the write pointer, the zone conditions, the open/active limits and every
refusal are the serving device's own (its :mod:`retainz.errors` exception is raised again on the
client, with the same class, message, zone, offset and errno).

The QEMU guest uses it (:mod:`retainz.vm.channel`) to put a host process's store onto the guest's NVMe
ZNS namespace: the stream is a virtio-serial port and the window an ``ivshmem`` PCI region, because
under TCG a virtio-serial port carries host-to-guest data at a few MB/s while shared memory moves it
at the guest's copy speed.

Wire format (protocol 1).  Every message, either way, is::

    u32 little-endian  n, the header's length (at most 1 MiB)
    n bytes            the header: a UTF-8 JSON object
    k bytes            the data, when the header has "data": k and the connection has no window

With a window (both ends map the same shared memory of the same size) the data is in the window's
first ``k`` bytes instead.  Requests and replies strictly alternate, so one window serves both ways.
Every request carries an ``id`` that its reply repeats: a client drops a reply that is not to its own
request (one left over from a client killed mid-request, which a virtio-serial port delivers to the
next one).  The hello proves the window: the client writes a random token into the window's first
bytes and the server echoes what it finds there, so a window file that is not the server's shared
memory is refused before anything is written through it.

===========================================  ===========================================================
request                                      reply
===========================================  ===========================================================
``hello {protocol}``                         ``{protocol, info: DeviceInfo.to_dict(), window, token}``
``report {start, count}``                    ``{zones: [[index, start, size, capacity, wp, cond, type]]}``
``zone {action: open|close|finish|reset,``   ``{}``
``zone}``
``reset {zones: [...]}``                     ``{}`` (:meth:`ZonedDevice.reset_zones`)
``write {offset, data}`` + data              ``{}``; ``{offset, count}`` writes a byte count
                                             (devices without payload)
``append {zone, data}`` + data               ``{offset}``
``read {offset, length}``                    ``{data: length}`` + data
``flush``                                    ``{}``
``stage`` + data                             ``{}``: a leading part of the next write or append
``bye``                                      none; the connection ends
``shutdown``                                 ``{}``; the server stops serving
===========================================  ===========================================================

A refused request gets ``{error: class name, message, zone, offset, length, errno}``.  Data larger
than the window (or than :data:`INLINE_CHUNK` inline) travels in parts: ``stage`` requests (reply
``{}``) hand the server the leading parts, which it keeps, and the ``write`` or ``append`` carrying
the last part runs on the whole, so a refused write still writes nothing.  A read is split into reads
at successive offsets.
"""

from __future__ import annotations

import errno as _errno
import json
import os
import socket
import stat
import struct
import sys
from typing import Protocol

from retainz import errors
from retainz.zoned.device import WriteData, ZonedDevice, ZoneOp, check_io_range
from retainz.zoned.model import DeviceInfo, Geometry, Zone, ZoneCond, ZoneType

__all__ = ["PROTOCOL", "Stream", "SocketStream", "FdStream", "RemoteZonedDevice", "serve",
           "RemoteDeviceError"]

PROTOCOL = 1
_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20
#: Largest data of one request without a window (bytes): bounds both ends' buffers.
INLINE_CHUNK = 16 << 20
#: Bytes of the random token that proves a shared window at hello.
_TOKEN = 16
#: Seconds a hello waits before saying so on stderr (another client holds the device, or a guest boots).
HELLO_NOTICE = 5.0


class RemoteDeviceError(errors.ZonedDeviceError):
    """The connection to a remote zoned device failed: closed, timed out, a malformed message, or a
    refusal of a kind the client does not know."""


class Stream(Protocol):
    """A reliable, ordered byte stream (a connected socket, a virtio-serial port)."""

    def send(self, data: bytes | memoryview) -> None:
        """Send every byte.  Raises OSError."""

    def recv_exact(self, n: int) -> bytes:
        """Receive exactly ``n`` bytes.  Raises EOFError when the stream ends first, OSError."""


class SocketStream:
    """A :class:`Stream` over a connected socket; ``timeout`` (seconds, None = wait forever) bounds
    every receive."""

    def __init__(self, sock: socket.socket, timeout: float | None = None):
        self.sock = sock
        sock.settimeout(timeout)

    def send(self, data) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise EOFError(f"the stream ended after {got} of {n} bytes")
            got += k
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


class FdStream:
    """A :class:`Stream` over a file descriptor (a virtio-serial port, a pipe pair)."""

    def __init__(self, rfd: int, wfd: int | None = None):
        self.rfd, self.wfd = rfd, rfd if wfd is None else wfd

    def send(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view):]

    def recv_exact(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            b = os.read(self.rfd, n - got)
            if not b:
                raise EOFError(f"the stream ended after {got} of {n} bytes")
            parts.append(b)
            got += len(b)
        return b"".join(parts)


class _Link:
    """One end of a connection: message framing, with the data inline or in the shared window."""

    def __init__(self, stream: Stream, window=None):
        self.stream = stream
        self.window = window          # a writable buffer both ends map, or None

    def send(self, header: dict, data: bytes | memoryview = b"") -> None:
        n = memoryview(data).nbytes
        if n:
            header = {**header, "data": n}
            if self.window is not None:
                self.window[:n] = data
        body = json.dumps(header, separators=(",", ":")).encode()
        inline = n and self.window is None
        self.stream.send(_LEN.pack(len(body)) + body + (bytes(data) if inline and n < 65536 else b""))
        if inline and n >= 65536:
            self.stream.send(data)

    def recv(self) -> tuple[dict, bytes]:
        (size,) = _LEN.unpack(self.stream.recv_exact(_LEN.size))
        if size > MAX_HEADER:
            raise RemoteDeviceError(f"remote device: a message header of {size} bytes (at most {MAX_HEADER})")
        try:
            header = json.loads(self.stream.recv_exact(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RemoteDeviceError(f"remote device: a malformed message header ({e})") from None
        if not isinstance(header, dict):
            raise RemoteDeviceError("remote device: a message header that is not a JSON object")
        n = header.get("data", 0)
        # bounded before anything is allocated for it: the window, or one inline part
        if (not isinstance(n, int) or isinstance(n, bool) or n < 0
                or n > (len(self.window) if self.window is not None else INLINE_CHUNK)):
            raise RemoteDeviceError(f"remote device: a data length of {n!r} bytes")
        if not n:
            return header, b""
        return header, (bytes(self.window[:n]) if self.window is not None else self.stream.recv_exact(n))


# -- server --------------------------------------------------------------------------------------------

def _zone_row(z: Zone) -> list:
    return [z.index, z.start, z.size, z.capacity, z.wp, int(z.cond), int(z.type)]


def _refusal(e: Exception) -> dict:
    if isinstance(e, errors.ZonedDeviceError):
        return {"error": type(e).__name__, "message": str(e), "zone": e.zone, "offset": e.offset,
                "length": e.length, "errno": e.errno}
    if isinstance(e, OSError):
        return {"error": "OSError", "message": e.strerror or str(e), "errno": e.errno}
    return {"error": type(e).__name__, "message": str(e)}


def serve(device: ZonedDevice, stream: Stream, window=None) -> bool:
    """Answer one connection's requests on ``device`` until the client says ``bye`` or the stream ends.

    Args:
        device: the device every request runs on (it stays open; the caller closes it).
        stream: the connection.
        window: shared memory both ends map (a writable buffer), or None for data inline.

    Returns:
        True when the client asked the server to stop (``shutdown``), False when the connection ended.

    Errors of a request (a device refusal, an I/O error) go back to the client, never raised here;
    a malformed message ends the connection (False).
    """
    link = _Link(stream, window)
    staged = bytearray()               # the leading parts of the next write or append
    while True:
        try:
            req, data = link.recv()
        except (EOFError, OSError):
            return False
        op = req.get("op")
        if op == "bye":
            return False
        if op == "stage":
            if len(staged) + len(data) > device.geometry.zone_capacity:   # no write spans more than a zone
                staged = bytearray()
                reply, out = _refusal(RemoteDeviceError(
                    f"staged data beyond the zone capacity {device.geometry.zone_capacity}")), b""
            else:
                staged += data
                reply, out = {}, b""
        else:
            if staged and op in ("write", "append"):
                data, staged = bytes(staged + data), bytearray()
            try:
                reply, out = _execute(device, link, op, req, data)
            except (errors.RetainZError, OSError, ValueError, TypeError, KeyError) as e:
                reply, out = _refusal(e), b""
        if "id" in req:
            reply = {**reply, "id": req["id"]}
        try:
            link.send(reply, out)
        except OSError:
            return False
        if op == "shutdown":
            return True


def _execute(device: ZonedDevice, link: _Link, op, req: dict, data: bytes) -> tuple[dict, bytes]:
    if op == "hello":
        if req.get("protocol") != PROTOCOL:
            raise RemoteDeviceError(f"protocol {req.get('protocol')!r} is not this server's {PROTOCOL}")
        mine = len(link.window) if link.window is not None else 0
        token = bytes(link.window[:_TOKEN]).hex() if mine >= _TOKEN else ""
        return {"protocol": PROTOCOL, "info": device.info.to_dict(), "window": mine, "token": token}, b""
    if op == "report":
        return {"zones": [_zone_row(z) for z in device.report_zones(req["start"], req["count"])]}, b""
    if op == "zone":
        device.zone_op(ZoneOp(req["action"]), req["zone"])
        return {}, b""
    if op == "reset":
        device.reset_zones(list(req["zones"]))
        return {}, b""
    if op == "write":
        device.write(req["offset"], req["count"] if "count" in req else data)
        return {}, b""
    if op == "append":
        return {"offset": device.append(req["zone"], req["count"] if "count" in req else data)}, b""
    if op == "read":
        limit = len(link.window) if link.window is not None else INLINE_CHUNK
        if not isinstance(req["length"], int) or req["length"] > limit:
            raise RemoteDeviceError(f"a read of {req['length']!r} bytes (at most {limit} per request)")
        return {}, device.read(req["offset"], req["length"])
    if op == "flush":
        device.flush()
        return {}, b""
    if op == "shutdown":
        return {}, b""
    raise RemoteDeviceError(f"unknown request {op!r}")


# -- client --------------------------------------------------------------------------------------------

def _raise(reply: dict) -> None:
    name, message = reply["error"], reply.get("message", "")
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.ZonedDeviceError):
        raise cls(message, zone=reply.get("zone"), offset=reply.get("offset"), length=reply.get("length"),
                  errno=reply.get("errno"))
    if name == "OSError":
        raise OSError(reply.get("errno") or _errno.EIO, message)
    raise RemoteDeviceError(f"remote device: {name}: {message}")


class RemoteZonedDevice(ZonedDevice):
    """A zoned device served by :func:`serve` at the other end of ``stream``.

    Args:
        stream: a connected :class:`Stream`.
        window: the shared memory the server maps too (same size), or None.
        name: how the device is named in messages and ``info.path`` (e.g. the socket's path).
        window_name: how the window is named in messages (its file).
        notice: seconds after which a hello still unanswered says so on stderr (None: never).

    Raises:
        RemoteDeviceError: the server does not answer the hello or speaks another protocol.
        DeviceFormatError: ``window`` is not the server's shared memory (another size, or it does not
            see the token written into it), or the server has a window and the client none.
    """

    def __init__(self, stream: Stream, window=None, *, name: str = "remote", window_name: str = "",
                 notice: float | None = HELLO_NOTICE):
        self._link = _Link(stream, window)
        self._name = name
        self._closed = False
        self._next_id = int.from_bytes(os.urandom(6), "little")   # a fresh range per connection
        token = os.urandom(_TOKEN)
        if window is not None and len(window) >= _TOKEN:
            window[:_TOKEN] = token
        reply = self._call({"op": "hello", "protocol": PROTOCOL}, notice=notice)
        theirs, mine = reply.get("window", 0), len(window) if window is not None else 0
        where = window_name or "the window"
        if theirs != mine or (mine >= _TOKEN and reply.get("token") != token.hex()):
            if not mine:
                raise errors.DeviceFormatError(
                    f"remote device {name} shares a {theirs}-byte window: add window=FILE to the spec "
                    "(the spec `retainz vm serve` prints has it)")
            why = (f"its window is {theirs} bytes, this one {mine}" if theirs != mine else
                   "the server does not see what was written into it")
            raise errors.DeviceFormatError(f"{where} is not the shared memory of the remote device at {name} "
                                           f"({why}): use the spec the server printed")
        i = reply["info"]
        g = Geometry(nr_zones=i["nr_zones"], zone_size=i["zone_size"], zone_capacity=i["zone_capacity"],
                     block_size=i["block_size"], max_open=i["max_open"], max_active=i["max_active"])
        self._info = DeviceInfo(geometry=g, kind=f"remote({i['kind']})", path=i["path"] or name,
                                payload=i["payload"], model=i["model"])
        self._chunk = len(window) if window is not None else INLINE_CHUNK
        self._chunk -= self._chunk % g.block_size

    @classmethod
    def connect_unix(cls, path: str, window=None, *, timeout: float | None = 600.0,
                     window_name: str = "", notice: float | None = HELLO_NOTICE) -> RemoteZonedDevice:
        """Connect to a server on the Unix socket ``path`` (e.g. QEMU's end of a virtio-serial port).

        Raises:
            FileNotFoundError: no socket there.
            DeviceFormatError: ``path`` is not a socket, or as the constructor.
            RemoteDeviceError: nothing accepts connections there, or as the constructor.
        """
        if not path:
            raise errors.DeviceFormatError("a remote device needs socket=PATH")
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no remote zoned device socket there") from None
        if not stat.S_ISSOCK(mode):
            raise errors.DeviceFormatError(f"{path}: not a socket (a remote device is served on a Unix socket)")
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.connect(path)
        except FileNotFoundError:
            sock.close()
            raise FileNotFoundError(f"{path}: no remote zoned device socket there") from None
        except OSError as e:
            sock.close()
            raise RemoteDeviceError(f"{path}: cannot connect to a remote zoned device there "
                                    f"({e.strerror or e})", errno=e.errno) from None
        try:
            return cls(SocketStream(sock, timeout), window, name=path, window_name=window_name, notice=notice)
        except BaseException:
            sock.close()
            raise

    @property
    def info(self) -> DeviceInfo:
        return self._info

    def _call(self, header: dict, data: bytes | memoryview = b"", *, notice: float | None = None) -> dict:
        if self._closed:
            raise RemoteDeviceError(f"remote device {self._name} is closed")
        self._next_id += 1
        rid = self._next_id
        try:
            self._link.send({**header, "id": rid}, data)
            while True:
                reply, out = self._recv(notice)
                if reply.get("id") == rid:
                    break               # else a reply to a request of a client that is gone: drop it
        except TimeoutError:
            raise RemoteDeviceError(f"remote device {self._name} did not answer {header['op']!r} in time",
                                    errno=_errno.ETIMEDOUT) from None
        except EOFError:
            raise RemoteDeviceError(f"remote device {self._name} closed the connection during "
                                    f"{header['op']!r}") from None
        except OSError as e:
            if isinstance(e, errors.ZonedDeviceError):
                raise
            raise RemoteDeviceError(f"remote device {self._name}: {e.strerror or e}", errno=e.errno) from None
        if "error" in reply:
            _raise(reply)
        if out:
            reply["_data"] = out
        return reply

    def _recv(self, notice: float | None) -> tuple[dict, bytes]:
        """The next reply; with ``notice``, say on stderr once that it is taking longer than that."""
        sock = getattr(self._link.stream, "sock", None)
        if notice is None or sock is None:
            return self._link.recv()
        limit = sock.gettimeout()
        sock.settimeout(notice if limit is None else min(notice, limit))
        try:
            return self._link.recv()
        except TimeoutError:
            if limit is not None and limit <= notice:
                raise
            print(f"retainz: waiting for the remote device at {self._name} (another client may hold it, "
                  "or its guest is still booting)", file=sys.stderr, flush=True)
        finally:
            sock.settimeout(limit)
        return self._link.recv()

    # -- zones ---------------------------------------------------------------------------------------
    def report_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        rows = self._call({"op": "report", "start": start, "count": count})["zones"]
        return [Zone(index=r[0], start=r[1], size=r[2], capacity=r[3], wp=r[4], cond=ZoneCond(r[5]),
                     type=ZoneType(r[6])) for r in rows]

    def zone_op(self, op: ZoneOp, zone: int) -> None:
        self._call({"op": "zone", "action": op.value, "zone": zone})

    def reset_zones(self, zones) -> None:
        self._call({"op": "reset", "zones": list(zones)})

    # -- data ----------------------------------------------------------------------------------------
    def write(self, offset: int, data: WriteData) -> None:
        if isinstance(data, int):
            self._call({"op": "write", "offset": offset, "count": data})
            return
        self._call({"op": "write", "offset": offset}, self._stage(data))

    def append(self, zone: int, data: WriteData) -> int:
        if isinstance(data, int):
            return self._call({"op": "append", "zone": zone, "count": data})["offset"]
        return self._call({"op": "append", "zone": zone}, self._stage(data))["offset"]

    def _stage(self, data) -> memoryview:
        """Hand the server every part of ``data`` but the last (``stage``); return the last."""
        view = memoryview(data).cast("B")
        last = max(0, (view.nbytes - 1) // self._chunk * self._chunk)
        for at in range(0, last, self._chunk):
            self._call({"op": "stage"}, view[at:at + self._chunk])
        return view[last:]

    def read(self, offset: int, length: int) -> bytes:
        check_io_range(self.geometry, offset, length)
        parts = []
        for at in range(0, length, self._chunk):
            n = min(self._chunk, length - at)
            parts.append(self._call({"op": "read", "offset": offset + at, "length": n}).get("_data", b""))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def flush(self) -> None:
        self._call({"op": "flush"})

    def shutdown(self) -> None:
        """Ask the server to stop serving (it answers, then its :func:`serve` returns True)."""
        self._call({"op": "shutdown"})

    def close(self) -> None:
        """Say ``bye`` and close the stream.  Idempotent; the served device stays open."""
        if self._closed:
            return
        self._closed = True
        try:
            self._link.send({"op": "bye"})
        except OSError:
            pass
        close = getattr(self._link.stream, "close", None)
        if close is not None:
            close()
