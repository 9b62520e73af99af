"""The node-service wire format: framing, bounds, and the encodings both ends share.

Every message, either way, is one frame (the framing of :mod:`retainz.zoned.remote`, without its data
part: no data crosses this socket)::

    u32 little-endian  n, the header's length (1 .. MAX_REQUEST for a request, .. MAX_REPLY for a reply)
    n bytes            a UTF-8 JSON object

A request names its operation in ``"op"``; its reply is ``{"ok": true, ...}`` or ``{"ok": false,
"error": CLASS, "message": ONE LINE}``.  Requests and replies strictly alternate on a connection.
The field bounds every request is checked against are the constants below (docs/node.md lists the
messages).
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
from dataclasses import dataclass

from retainz import errors
from retainz.errors import ProtocolError
from retainz.hint import Hint, Lifetime
from retainz.store.types import GenerationInfo, GenState, ShardInfo

__all__ = [
    "PROTOCOL", "MAX_REQUEST", "MAX_REPLY", "MAX_CLAIM", "MAX_CRCS", "MAX_PAGE", "MAX_NAME", "MAX_TEXT",
    "send_frame", "recv_frame", "recv_exact", "field", "DATA_PATHS", "encode_hint", "decode_hint", "encode_gen", "decode_gen",
    "error_reply", "raise_reply", "socket_path",
]

PROTOCOL = 1
_LEN = struct.Struct("<I")
#: Largest request header (bytes).  A longer frame is refused and the connection closed.
MAX_REQUEST = 64 << 10
#: Largest reply header (bytes): listings and extent pages are paged to stay under it.
MAX_REPLY = 16 << 20
#: Largest claim of one request (data bytes): 64 extents of 1 MiB.
MAX_CLAIM = 64 << 20
#: Most crcs one ``written`` request reports.
MAX_CRCS = 4096
#: Most entries one page of ``list`` or ``locations`` returns.
MAX_PAGE = 4096
#: Longest generation id, shard name or job name (characters; the store allows 255 UTF-8 bytes).
MAX_NAME = 255
#: Longest free text (a retention rule, a hint's condition).
MAX_TEXT = 1024
#: The ways a client's bytes reach the device, best first (docs/node.md, "Data paths"): ``direct`` (the
#: client writes the device itself at claimed extents), ``shm`` (a shared memory buffer, a sealed memfd
#: passed over the socket with ``SCM_RIGHTS``: the service writes it), ``socket`` (the bytes follow the
#: frames on the socket).
DATA_PATHS = ("direct", "shm", "socket")
#: Most file descriptors one frame may carry (more are closed unread and the request refused).
MAX_FDS = 4
#: Largest handle, step or byte count a request may carry (a signed 64-bit integer).
MAX_INT = (1 << 63) - 1


def send_frame(sock: socket.socket, obj: dict, data=None, fds: tuple[int, ...] = ()) -> None:
    """Send one frame holding ``obj`` (strict JSON), then ``data``'s bytes when given (the data part of
    a ``put`` or ``read`` on the socket path), with ``fds`` attached to the frame's first bytes
    (``SCM_RIGHTS``: the ``shm`` request's memfd).

    Raises:
        OSError: the peer went away.
    """
    body = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
    frame = _LEN.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [frame], list(fds))
        frame = frame[sent:]
    if data is not None and len(frame) + len(data) <= 1 << 16:
        sock.sendall(frame + bytes(data))
        return
    if frame:
        sock.sendall(frame)
    if data is not None:
        sock.sendall(data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock`` (a frame's data part).

    Raises:
        ProtocolError: the stream ended first.  OSError: the connection failed.
    """
    got = _recv_exact(sock, n)
    if got is None or len(got) < n:
        raise ProtocolError(f"the connection ended inside a data part of {n} bytes")
    return got


def _recv_head(sock: socket.socket, fds: list[int]) -> bytes | None:
    """A frame's length prefix, collecting the file descriptors that arrive with it into ``fds``."""
    head = b""
    while len(head) < _LEN.size:
        msg, got, flags, _ = socket.recv_fds(sock, _LEN.size - len(head), MAX_FDS)
        fds.extend(got)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            raise ProtocolError(f"a frame carried more than {MAX_FDS} file descriptors")
        if not msg:
            return None if not head else b""
        head += msg
    return head


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            return None if got == 0 else b""
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int, fds: list[int] | None = None) -> dict | None:
    """Receive one frame; ``None`` when the peer closed the connection between frames.  With ``fds``
    (a list), the file descriptors sent with the frame (``SCM_RIGHTS``) are appended to it: the caller
    owns and closes them; without it, any sent are dropped by the kernel.

    Raises:
        ProtocolError: a length of 0 or above ``limit``, a header that is not a UTF-8 JSON object, or
            the stream ending inside a frame (the connection cannot be resynchronised: close it).
        OSError: the connection failed.
    """
    head = _recv_exact(sock, _LEN.size) if fds is None else _recv_head(sock, fds)
    if head is None:
        return None
    if len(head) < _LEN.size:
        raise ProtocolError("the connection ended inside a frame length")
    (n,) = _LEN.unpack(head)
    if not 0 < n <= limit:
        raise ProtocolError(f"frame of {n} bytes: a header is 1 .. {limit} bytes")
    body = _recv_exact(sock, n)
    if not body or len(body) < n:
        raise ProtocolError(f"the connection ended inside a frame of {n} bytes")
    try:
        obj = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"frame header is not JSON ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame header is a JSON {type(obj).__name__}, not an object")
    return obj


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


_MISSING = object()


def field(req: dict, name: str, kind: str, *, default=_MISSING, low: int = 0, high: int = MAX_INT):
    """Field ``name`` of a request, checked.

    Args:
        kind: ``"int"`` (an int, not a bool, ``low <= v <= high``), ``"name"`` (a str of 1 ..
            :data:`MAX_NAME` characters), ``"text"`` (a str of at most :data:`MAX_TEXT`), ``"bool"``,
            ``"ints"`` (a list of at most ``high`` ints in 0 .. 2**32 - 1: crcs), ``"dict"``.
        default: returned when the field is absent or ``null`` (absent without a default is an error).

    Raises:
        ProtocolError: absent without a default, or of the wrong kind or outside its bounds.
    """
    v = req.get(name)
    if v is None:
        if default is _MISSING:
            raise ProtocolError(f"request {req.get('op')!r}: field {name!r} is missing")
        return default
    ok = False
    if kind == "int":
        ok = type(v) is int and low <= v <= high
    elif kind == "name":
        ok = type(v) is str and 0 < len(v) <= MAX_NAME
    elif kind == "text":
        ok = type(v) is str and len(v) <= MAX_TEXT
    elif kind == "bool":
        ok = type(v) is bool
    elif kind == "ints":
        ok = type(v) is list and len(v) <= high and all(type(c) is int and 0 <= c < 1 << 32 for c in v)
    elif kind == "dict":
        ok = type(v) is dict
    if not ok:
        shown = repr(v)
        raise ProtocolError(f"request {req.get('op')!r}: field {name!r} = {shown[:60]} is not a valid "
                            f"{kind}" + (f" in {low} .. {high}" if kind == "int" else ""))
    return v


def _step_out(v: float | None):
    if v is None or not math.isinf(v):
        return v
    return "inf" if v > 0 else "-inf"


def _step_in(v, what: str) -> float | None:
    if v is None:
        return None
    if v in ("inf", "-inf"):
        return math.inf if v == "inf" else -math.inf
    if type(v) not in (int, float) or v != v:
        raise ProtocolError(f"hint {what} must be a number, 'inf' or null, not {str(v)[:40]!r}")
    return v


def encode_hint(h: Hint | None) -> dict | None:
    """A hint as JSON (``math.inf`` as ``"inf"``), ``None`` for none."""
    if h is None:
        return None
    return {"reclaim_step": _step_out(h.reclaim_step), "lifetime": int(h.lifetime), "condition": h.condition,
            "actual_reclaim_step": _step_out(h.actual_reclaim_step)}


def decode_hint(d) -> Hint | None:
    """The :class:`Hint` of :func:`encode_hint`'s form.

    Raises:
        ProtocolError: not that form (a wrong type, an unknown lifetime, a condition too long).
    """
    if d is None:
        return None
    if type(d) is not dict:
        raise ProtocolError("hint must be an object or null")
    life = d.get("lifetime", 0)
    if type(life) is not int or life not in Lifetime._value2member_map_:
        raise ProtocolError(f"hint lifetime must be 0 .. 5, not {str(life)[:20]!r}")
    cond = d.get("condition", "")
    if type(cond) is not str or len(cond) > MAX_TEXT:
        raise ProtocolError(f"hint condition must be a string of at most {MAX_TEXT} characters")
    return Hint(reclaim_step=_step_in(d.get("reclaim_step"), "reclaim_step"), lifetime=Lifetime(life),
                condition=cond, actual_reclaim_step=_step_in(d.get("actual_reclaim_step"), "actual_reclaim_step"))


def encode_gen(g: GenerationInfo) -> dict:
    """A generation as JSON: id, step, hint, state, commit_seq, unknown_reason, shards ``[[name, size, crc, extents]]``
    (the shard's extent count, not its extents: those are paged by ``locations``)."""
    return {"id": g.id, "step": g.step, "hint": encode_hint(g.hint), "state": g.state.value,
            "commit_seq": g.commit_seq, "unknown_reason": g.unknown_reason,
            "shards": [[s.name, s.size, s.crc, len(s.extents)] for s in g.shards.values()]}


@dataclass(slots=True)
class ServedShardInfo(ShardInfo):
    """A shard as a served store lists it: its extents stay in the service (``extents`` is empty),
    ``extent_count`` says how many it has."""

    extent_count: int = 0


def decode_gen(d: dict) -> GenerationInfo:
    """The :class:`GenerationInfo` of :func:`encode_gen` (shards without extents, with their count)."""
    gen = GenerationInfo(id=d["id"], step=d["step"], hint=decode_hint(d["hint"]) or Hint(),
                         state=GenState(d["state"]), commit_seq=d["commit_seq"],
                         unknown_reason=d.get("unknown_reason") or "")
    for name, size, crc, n in d["shards"]:
        gen.shards[name] = ServedShardInfo(name, size, crc, (), n)
    return gen


#: Error classes a reply may name that the client raises again as themselves (message kept).
_RAISABLE = {name: getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)}
_RAISABLE.update({"ValueError": ValueError, "KeyError": KeyError, "TypeError": ValueError,
                  "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError})


def error_reply(e: BaseException) -> dict:
    """The reply refusing a request with ``e``: its class name and one line of message; a
    :class:`~retainz.errors.NoSpaceError` also its ``needed``, ``available`` and ``cause``."""
    msg = str(e.strerror if isinstance(e, OSError) and e.strerror and not e.filename else e)
    out = {"ok": False, "error": type(e).__name__, "message": " ".join(msg.split())[:2000]}
    if isinstance(e, errors.NoSpaceError):
        out["space"] = {"needed": int(e.needed), "available": int(e.available), "cause": str(e.cause)}
    return out


def raise_reply(reply: dict) -> dict:
    """``reply`` if it is a success, else raise the error it names (a RetainZ error class, or a
    builtin; anything else as :class:`ProtocolError`).  A ``NoSpaceError`` comes back with its
    ``needed``, ``available`` and ``cause`` (not its zone ``state``); other errors with the message only."""
    if reply.get("ok") is True:
        return reply
    name, msg = str(reply.get("error")), str(reply.get("message", ""))
    cls = _RAISABLE.get(name)
    if cls is None:
        raise ProtocolError(f"the node service refused the request: {name}: {msg}")
    space = reply.get("space")
    try:
        if issubclass(cls, errors.NoSpaceError) and isinstance(space, dict):
            err = cls(msg, needed=_count(space.get("needed")), available=_count(space.get("available")),
                      cause=space["cause"] if space.get("cause") in errors.STOP_CAUSES else "")
        else:
            err = cls(msg)
    except TypeError:   # a class whose constructor takes more than a message
        raise ProtocolError(f"the node service refused the request: {name}: {msg}") from None
    raise err


def _count(v) -> int:
    return v if type(v) is int and v >= 0 else 0


def socket_path(device: str | os.PathLike) -> str:
    """Where the node service of ``device`` listens (the one rule both ends use, so nothing is
    configured): ``DEVICE.sock`` beside a device file (its real path); ``/run/retainz/NAME.sock``
    for a block device ``/dev/NAME`` or ``zbd:/dev/NAME`` (``$RETAINZ_RUN_DIR`` replaces ``/run/retainz``;
    :func:`retainz.zoned.parse_device` says which a spec names).  A path too
    long for a Unix socket (107 bytes) becomes ``$RETAINZ_RUN_DIR or /tmp/retainz-UID`` /
    ``<sha256 of the device path, 16 hex>.sock``."""
    import hashlib

    from retainz.zoned.spec import parse_device

    spec = parse_device(device)
    run = os.environ.get("RETAINZ_RUN_DIR")
    if spec.kind == "zbd":
        text = spec.path
        path = os.path.join(run or "/run/retainz", text.removeprefix("/dev/").replace("/", "_") + ".sock")
    else:
        text = spec.key
        path = text + ".sock"
    if len(os.fsencode(path)) > 107:
        digest = hashlib.sha256(os.fsencode(text)).hexdigest()[:16]
        path = os.path.join(run or f"/tmp/retainz-{os.getuid()}", digest + ".sock")
    return path
