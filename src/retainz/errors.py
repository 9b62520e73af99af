"""RetainZ's exceptions.

Device errors are named after the NVMe Zoned Namespace status codes (NVMe ZNS Command Set
specification 1.1, section 3.4, "Zoned Namespace Command Set Specific Status Values") and derive
from :class:`OSError` so that ``except OSError`` keeps working for callers that do not import
RetainZ.  Every device error carries the zone index and the byte numbers that made it fail, and,
where the kernel reported one, the ``errno``.

Errors that are not about the device (bad arguments, a foreign file, a corrupt header) derive
from the closest builtin (``ValueError``, ``FileNotFoundError``...), as fsspec does.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
    "RetainZError",
    "ZonedDeviceError",
    "ZoneBoundaryError",
    "ZoneFullError",
    "ZoneReadOnlyError",
    "ZoneOfflineError",
    "ZoneInvalidWriteError",
    "TooManyActiveZonesError",
    "TooManyOpenZonesError",
    "InvalidZoneTransitionError",
    "MisalignedIOError",
    "OutOfRangeError",
    "ZoneOpNotSupportedError",
    "NoPayloadError",
    "ReclaimGroupFullError",
    "PowerCutError",
    "InjectedIOError",
    "DeviceFormatError",
    "NotADeviceError",
    "CorruptDeviceError",
    "DeviceBusyError",
    # store
    "StoreError",
    "NoSpaceError",
    "STOP_CAUSES",
    "GenerationExistsError",
    "GenerationNotFoundError",
    "ShardNotFoundError",
    "ChecksumError",
    "CorruptJournalError",
    "StoreLockedError",
    "ForeignDeviceError",
    "InvalidIdError",
    "ShardExistsError",
    "ShardSizeError",
    "SummaryMismatchError",
    "UnsupportedFormatError",
    "OldFormatError",
    "ReadOnlyStoreError",
    # node service
    "ServiceGoneError",
    "ProtocolError",
    "AccessDeniedError",
    # tiers (retainz.tier)
    "PromotionBacklogError",
    "DestinationError",
    "DurableCopyError",
]


class RetainZError(Exception):
    """Base class of every error RetainZ raises on purpose."""


class ZonedDeviceError(RetainZError, OSError):
    """A zoned device refused an operation.

    Attributes:
        zone: index of the zone concerned, or ``None`` when the error is not about one zone.
        offset: byte offset of the request on the device, when there was one.
        length: byte length of the request, when there was one.
        errno: the errno the operation maps to (the kernel's, on a real device).
        status: the NVMe ZNS status code the error is named after, or ``None``.
    """

    status: int | None = None
    default_errno: int = _errno.EIO

    def __init__(self, message: str, *, zone: int | None = None, offset: int | None = None,
                 length: int | None = None, errno: int | None = None):
        code = self.default_errno if errno is None else errno
        OSError.__init__(self, code, message)
        self.zone = zone
        self.offset = offset
        self.length = length

    def __str__(self) -> str:  # OSError's default prefixes "[Errno 5]"; keep the message readable
        return str(self.strerror)

    def __reduce__(self):
        return (_rebuild_device_error,
                (type(self), self.strerror, self.zone, self.offset, self.length, self.errno))


def _rebuild_device_error(cls, message, zone, offset, length, errno):
    return cls(message, zone=zone, offset=offset, length=length, errno=errno)


class ZoneBoundaryError(ZonedDeviceError):
    """A write would cross the zone's writable capacity (ZNS status 0xB8, Zone Boundary Error)."""

    status = 0xB8


class ZoneFullError(ZonedDeviceError):
    """A write or append to a zone in the Full state (ZNS status 0xB9, Zone Is Full)."""

    status = 0xB9


class ZoneReadOnlyError(ZonedDeviceError):
    """A write or zone operation on a Read Only zone (ZNS status 0xBA, Zone Is Read Only)."""

    status = 0xBA


class ZoneOfflineError(ZonedDeviceError):
    """Any access to an Offline zone (ZNS status 0xBB, Zone Is Offline)."""

    status = 0xBB


class ZoneInvalidWriteError(ZonedDeviceError):
    """A write that does not start at the zone's write pointer (ZNS status 0xBC, Zone Invalid Write)."""

    status = 0xBC


class TooManyActiveZonesError(ZonedDeviceError):
    """Opening a zone would exceed the device's max active zones (ZNS status 0xBD).

    Linux reports it as ``EOVERFLOW``.
    """

    status = 0xBD
    default_errno = _errno.EOVERFLOW


class TooManyOpenZonesError(ZonedDeviceError):
    """Opening a zone would exceed max open zones and no implicitly open zone can be closed
    to make room (ZNS status 0xBE).  Linux reports it as ``ETOOMANYREFS``."""

    status = 0xBE
    default_errno = _errno.ETOOMANYREFS


class InvalidZoneTransitionError(ZonedDeviceError):
    """A zone management operation not allowed from the zone's current state
    (ZNS status 0xBF, Invalid Zone State Transition), e.g. opening a Full zone."""

    status = 0xBF


class MisalignedIOError(ZonedDeviceError):
    """An offset or length that is not a multiple of the block size, or a zero length (EINVAL)."""

    default_errno = _errno.EINVAL


class OutOfRangeError(ZonedDeviceError):
    """An offset, length or zone index outside the device (LBA Out of Range, EINVAL)."""

    default_errno = _errno.EINVAL


class ZoneOpNotSupportedError(ZonedDeviceError):
    """The device does not support the operation (libzbd maps ENOTTY/ENOIOCTLCMD to ENOTSUP)."""

    default_errno = _errno.ENOTSUP


class NoPayloadError(ZonedDeviceError):
    """A read of bytes a payload-less device counted but did not keep."""

    default_errno = _errno.ENODATA


class ReclaimGroupFullError(RetainZError, OSError):
    """The FDP FTL model's garbage collection found no reclaim unit with an invalid page in a reclaim
    group: the valid data written to the group fills it (``retainz.fdp.ftl``).  ``rg`` names the group."""

    def __init__(self, rg: int, message: str):
        super().__init__(_errno.ENOSPC, message)
        self.rg = rg

    def __str__(self) -> str:
        return self.strerror


class PowerCutError(ZonedDeviceError):
    """An injected power cut: the device is dead until :meth:`FaultyDevice.reboot`."""

    default_errno = _errno.EIO


class InjectedIOError(ZonedDeviceError):
    """An I/O error injected by :class:`~retainz.zoned.faulty.FaultyDevice`."""


class DeviceFormatError(RetainZError, ValueError):
    """A device geometry or a device specification that makes no sense (e.g. capacity > size)."""


class NotADeviceError(RetainZError, ValueError):
    """A path that does not hold a RetainZ device (wrong magic); nothing was changed."""


class CorruptDeviceError(RetainZError, ValueError):
    """A RetainZ device file that is damaged: its label or both zone-state copies fail their
    checksums, an impossible zone state, a truncated file."""

    exit_status = 1  # the CLI: damage is an operation failure (as CorruptJournalError), not bad input


class DeviceBusyError(RetainZError, OSError):
    """Another process holds the device's exclusive lock."""

    def __init__(self, message: str):
        OSError.__init__(self, _errno.EBUSY, message)

    def __str__(self) -> str:
        return str(self.strerror)


# -- store errors (retainz.store) --------------------------------------------------------------------
# Named after LevelDB's Status codes where one fits (NotFound, Corruption, InvalidArgument, IOError);
# each also derives from the closest builtin so callers need not import RetainZ to catch it.


class StoreError(RetainZError):
    """Base class of the store's own errors (not device errors)."""


class NoSpaceError(StoreError, OSError):
    """A generation was refused at admission, or an allocation or metadata append found no space.

    Attributes:
        needed: bytes the operation needed (0 when unknown).
        available: bytes that were available to it.
        cause: why there was no space, for a capacity stop (:data:`STOP_CAUSES`): ``"admission"``
            (the store's admission refused a generation: data reserve or journal room),
            ``"allocation"`` (the placement policy answered no space and no collection freed
            anything, e.g. ZenFS's "Zone allocation failure"), ``"gc"`` (collection freed space
            but not enough for the policy to place the bytes), ``"journal"`` (no room for the
            journal's records: metadata, not data); ``""`` from a lower layer that does not say.
        state: the zone state at the refusal (``{"empty_zones", "open_free_bytes", "dead_bytes",
            "live_bytes"}``; ``open_free_bytes`` is writable capacity stranded in partly filled
            zones), or ``None``.
    """

    def __init__(self, message: str, *, needed: int = 0, available: int = 0, cause: str = "",
                 state: dict | None = None):
        OSError.__init__(self, _errno.ENOSPC, message)
        self.needed = needed
        self.available = available
        self.cause = cause
        self.state = state

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self):
        return (_rebuild_nospace, (self.strerror, self.needed, self.available, self.cause, self.state))


#: The causes a capacity stop can have (``NoSpaceError.cause``).
STOP_CAUSES = ("admission", "allocation", "gc", "journal")


def _rebuild_nospace(message, needed, available, cause="", state=None):
    return NoSpaceError(message, needed=needed, available=available, cause=cause, state=state)


class GenerationExistsError(StoreError, FileExistsError):
    """``begin_generation`` with an id that is committed or being written."""


class GenerationNotFoundError(StoreError, KeyError, FileNotFoundError):
    """No committed generation with that id (also a ``KeyError`` and a ``FileNotFoundError``)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class ShardNotFoundError(StoreError, KeyError, FileNotFoundError):
    """The generation exists but has no shard of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ChecksumError(StoreError, ValueError):
    """Data read back does not match its crc32c.

    Attributes:
        generation, shard: what was being read (``None`` when not known, e.g. during GC of a zone).
        zone: the zone index; offset: byte offset of the extent inside the zone; length: its bytes.
        expected, actual: the two crc32c values.
    """

    exit_status = 1  # the CLI: an operation failure, not bad input

    def __init__(self, message: str, *, generation: str | None = None, shard: str | None = None,
                 zone: int | None = None, offset: int | None = None, length: int | None = None,
                 expected: int | None = None, actual: int | None = None):
        super().__init__(message)
        self.generation, self.shard = generation, shard
        self.zone, self.offset, self.length = zone, offset, length
        self.expected, self.actual = expected, actual


class CorruptJournalError(StoreError, ValueError):
    """The metadata journal or superblock is damaged in a way a crash cannot explain (a checksum
    mismatch inside a complete record, a missing superblock, committed data missing on the device).
    Recovery refuses to guess; the message names the zone and byte."""

    exit_status = 1  # the CLI: an operation failure, not bad input


class UnsupportedFormatError(StoreError):
    """The device holds a RetainZ store of a format version (or with format flags) this code does
    not know: written by newer code, or damaged in a way its checksum cannot show.  Nothing is
    written; the message names the version found and the versions this code reads."""

    exit_status = 1  # the CLI: an operation failure, not bad input


class OldFormatError(UnsupportedFormatError):
    """A read-write open of a store of an older format version this code reads but does not write
    (docs/format.md, "Version policy"): it is read as is; ``retainz fsck --upgrade`` migrates it.
    Nothing is written."""


class StoreLockedError(StoreError, BlockingIOError):
    """The store is already open for writing (in this process, or another holds the device lock)."""

    def __init__(self, message: str):
        OSError.__init__(self, _errno.EBUSY, message)

    def __str__(self) -> str:
        return str(self.strerror)


class ForeignDeviceError(StoreError, ValueError):
    """``Store.format`` refused a device holding data it does not recognise (or an existing RetainZ
    store) without ``force``; ``Store.open`` on a device that holds no RetainZ store.

    Attributes:
        found: what the device holds, without the API's remedy (``force=True``), so a caller with
            its own words for the remedy (``retainz mkfs --force``) can give it instead."""

    def __init__(self, message: str, *, found: str | None = None):
        super().__init__(message)
        self.found = found if found is not None else message


class InvalidIdError(StoreError, ValueError):
    """A generation id or shard name that is empty, longer than 255 bytes (UTF-8), ``.``/``..`` or
    containing ``..``, a path separator, NUL or a control character."""


class ShardExistsError(StoreError, ValueError):
    """A shard name the generation being written already has (closed or open): refused at
    ``open_shard`` before any byte is placed.  A namespace carrying a checkpoint's unchanged files
    into its next version skips the ones other ranks of a joined generation already wrote."""


class ShardSizeError(StoreError, ValueError):
    """More bytes than declared: a shard longer than its ``size=``, or a generation past its
    ``declared_size``.  Nothing is committed by the failing call."""


class ReadOnlyStoreError(StoreError, PermissionError):
    """A write operation (begin_generation, delete, gc) on a store opened with ``readonly=True``."""


class SummaryMismatchError(StoreError, AssertionError):
    """``verify_summaries`` mode found cached zone summaries that differ from a recomputation."""


# -- node service errors (retainz.node) -------------------------------------------------------------


class ServiceGoneError(RetainZError, ConnectionError):
    """The node service that owns the device went away (killed, stopped, restarted) while a client
    talked to it.  What the client had not committed is gone (the service's restart reclaims it);
    every acknowledged commit is durable.  Retry after ``retainz serve DEVICE`` runs again."""

    exit_status = 1  # the CLI: an operation failure, not bad input

    def __init__(self, message: str):
        ConnectionError.__init__(self, _errno.ECONNRESET, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self):       # DCP gathers a rank's exception to the others (pickled)
        return (type(self), (self.strerror,))


class ProtocolError(RetainZError, ValueError):
    """A node-service message that breaks the protocol: a frame longer than its bound, a header that
    is not a JSON object, an unknown request, a field of the wrong type or outside its bounds, a
    handle the connection does not hold.  The service answers it with an error reply."""


# -- tier errors (retainz.tier) ----------------------------------------------------------------------


class PromotionBacklogError(NoSpaceError):
    """Admission refused a new generation because the local device is short of space while
    generations that must be promoted wait for their durable copy (the destination is slow or
    down), so retention may not retire them (docs/tiers.md, "Keep until durable").  Nothing was
    deleted; the save can be retried once the backlog drains.

    Attributes (besides :class:`NoSpaceError`'s, ``cause`` ``"admission"``):
        backlog: generations waiting for promotion; backlog_bytes: their bytes.
    """

    def __init__(self, message: str, *, needed: int = 0, available: int = 0, backlog: int = 0,
                 backlog_bytes: int = 0, state: dict | None = None):
        super().__init__(message, needed=needed, available=available, cause="admission", state=state)
        self.backlog = backlog
        self.backlog_bytes = backlog_bytes

    def __reduce__(self):
        return (_rebuild_backlog, (self.strerror, self.needed, self.available, self.backlog,
                                   self.backlog_bytes, self.state))


def _rebuild_backlog(message, needed, available, backlog, backlog_bytes, state):
    return PromotionBacklogError(message, needed=needed, available=available, backlog=backlog,
                                 backlog_bytes=backlog_bytes, state=state)


class DestinationError(RetainZError, OSError):
    """A promotion destination (an fsspec URL) refused or failed an operation: unreachable, an
    error mid-upload, full.  The message names the URL and the object; ``errno`` is the underlying
    error's when it had one.  Nothing is counted durable by a failed copy; it is retried."""

    exit_status = 1

    def __init__(self, message: str, *, errno: int | None = None):
        OSError.__init__(self, _errno.EIO if errno is None else errno, message)

    def __str__(self) -> str:
        return str(self.strerror)


class DurableCopyError(ChecksumError):
    """A copy at the promotion destination does not match what was promoted: an object's size or
    crc32c read back differs from the shard's, or its manifest is damaged or describes other bytes.
    Such a copy is never counted durable (docs/tiers.md)."""


class AccessDeniedError(RetainZError, PermissionError):
    """A node-service client asked for a generation outside what its job may see (its series folder
    and the operator's grants, ``retainz serve --grant/--allow-all``), or for the whole-device view
    (job ``*``) it was not granted.  Nothing was done; the message names the job and the generation.
    Its errno is ``EACCES`` (a face reports it as a permission error, not EIO)."""

    exit_status = 1  # the CLI: an operation refused, not malformed input

    def __init__(self, message: str = ""):
        OSError.__init__(self, _errno.EACCES, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self):
        return (type(self), (self.strerror,))
