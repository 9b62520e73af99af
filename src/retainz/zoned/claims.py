"""Claimed extents of a zoned block device that other processes write themselves, in write-pointer order.

A zoned block device takes a zone's writes only at its write pointer: a write elsewhere fails (NVMe ZNS
1.1, 2.1.1.3: Zone Invalid Write), and the kernel does not order writes that different processes issue
to one zone ("parallel writes to the same zone could result in unaligned write errors": the btrfs
patch that makes zone append mandatory for zoned btrfs, linux-btrfs, J. Thumshirn, 2021).  The node
service hands a client an extent (``ZonedDevice.claim``) and the client writes it with its own
descriptor; when several clients write at once, the device must still see each zone's writes in
write-pointer order.  Zone append (NVMe ZNS 2.3.1.1: the device picks the offset and returns it) would
remove the ordering, but "Linux doesn't have a user API to issue zone append operations to zoned
devices from user space" (QEMU's file-posix zone append emulation, S. Li, qemu-block, 2023): the
kernel's ``REQ_OP_ZONE_APPEND`` is issued only by in-kernel users (btrfs, zonefs), and user space
reaches NVMe Zone Append only through NVMe passthrough.  So this is ordering by turns:

* **A claim is a lease** ``[start, end)`` of one zone at its *claim pointer*: the device's write pointer
  plus the leases handed out and not yet written.  Leases of a zone are handed out in claim order, so
  they tile the zone from the write pointer on.
* **A lease's turn** comes when the device's write pointer reaches its start: every earlier lease of
  the zone is written.  The service answers a claim only once each of its zones has reached that
  turn (:meth:`ZoneClaims.wait_turn`), so at any moment one client writes a zone, at its write pointer.
* **A lease ends** when the write pointer passes its end (:meth:`ZoneClaims.settle`, after the client
  reports the extent written; the service checks the device, not the report).  A lease whose client died
  or gave up before writing all of it is **filled**: once its turn comes, the service writes zeros from
  the write pointer to the lease's end (:meth:`ZoneClaims.fill`), so the leases after it get their turn.
  Its bytes were never committed, so they are dead whatever they hold.  A fill the device refuses
  (an I/O error, a zone resource refused) **breaks** the zone's leases: every writer waiting for a
  turn there gets the error instead of waiting forever (their writes could never land in order), until
  the zone is reset.
* **The device's own writes** (GC copies, the journal) and zone operations other than reset wait until
  the zone has no lease outstanding (:meth:`ZoneClaims.wait_settled`); a reset drops the zone's leases
  (nothing live is left in it; a late write of a lease then fails at the reset write pointer).

Waiting polls the zone's write pointer (one ``BLKREPORTZONE`` per poll) and wakes early on
:meth:`ZoneClaims.settle`; nothing here depends on a client's own report, so a client whose threads
share one connection cannot deadlock on its own leases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from retainz.errors import ZoneInvalidWriteError

__all__ = ["ZoneClaims", "LEASE_WAIT"]

#: Seconds the device's own write or zone operation waits for a zone's outstanding leases before it
#: fails (a client holding a lease that neither writes nor dies).
LEASE_WAIT = 120.0
#: Seconds between two looks at a zone's write pointer while waiting.
_POLL = 0.002


class ZoneClaims:
    """The outstanding leases of one zoned block device (owned by its
    :class:`~retainz.zoned.linux.LinuxZonedDevice`).

    Args:
        zone_size: bytes per zone (device byte ``zone * zone_size + offset``).
        written: ``written(zone)`` -> bytes the device has written in the zone now (its write pointer,
            relative; a fresh zone report).
        fill: ``fill(zone, pos, length)``: write ``length`` zero bytes at byte ``pos`` of the zone,
            which is its write pointer.

    Offsets here are relative to the zone.  Thread safe.
    """

    def __init__(self, zone_size: int, written: Callable[[int], int], fill: Callable[[int, int, int], None]):
        self._zsize = zone_size
        self._written = written
        self._fill = fill
        self._cv = threading.Condition()
        self._ahead: dict[int, int] = {}            # zone -> claim pointer (only zones with leases)
        self._broken: dict[int, str] = {}           # zone -> why a fill failed (its waiters fail too)

    def pointer(self, zone: int) -> int | None:
        """The zone's claim pointer while it has leases outstanding, else ``None`` (the device's
        write pointer is the claim pointer)."""
        with self._cv:
            return self._ahead.get(zone)

    def lease(self, zone: int, pos: int, length: int, wp: int) -> None:
        """Hand out bytes ``pos .. pos + length`` of ``zone``; ``wp``: the device's write pointer there
        (used when the zone has no lease yet).

        Raises:
            ZoneInvalidWriteError: ``pos`` is not the zone's claim pointer.
        """
        with self._cv:
            at = self._ahead.get(zone, wp)
            if pos != at:
                raise ZoneInvalidWriteError(f"zone {zone}: claim at byte {pos} of the zone, but its claim pointer "
                                            f"is at byte {at}", zone=zone, offset=zone * self._zsize + pos,
                                            length=length)
            self._ahead[zone] = pos + length

    def outstanding(self, zone: int) -> bool:
        with self._cv:
            return zone in self._ahead

    def _done(self, zone: int, upto: int) -> bool:
        """True once the device's write pointer in ``zone`` is at least ``upto``; forgets the zone's
        leases when it reached its claim pointer.  Called under the condition."""
        wp = self._written(zone)
        ahead = self._ahead.get(zone)
        if ahead is None or wp >= ahead:
            self._ahead.pop(zone, None)
            self._cv.notify_all()
            return True
        return wp >= upto

    def _wait(self, zone: int, upto: int, timeout: float | None, what: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                if zone in self._broken:    # checked first: the lost lease's end is never reached
                    raise ZoneInvalidWriteError(f"zone {zone}: {what}: an earlier lease of the zone could not be "
                                                f"filled ({self._broken[zone]}), so this one can never be written "
                                                "in order", zone=zone)
                if self._done(zone, upto):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise ZoneInvalidWriteError(
                        f"zone {zone}: {what}: the write pointer is at byte {self._written(zone)}, clients' "
                        f"claimed bytes up to byte {self._ahead.get(zone)} are still unwritten after "
                        f"{timeout:.0f} s", zone=zone)
                self._cv.wait(_POLL)

    def wait_turn(self, extents, timeout: float | None = None) -> None:
        """Return once each zone of ``extents`` (``(zone, pos, length)`` in claim order) has its write
        pointer at the first of them there: every earlier lease of the zone is written.

        Raises:
            ZoneInvalidWriteError: ``timeout`` seconds passed first.
        """
        first: dict[int, int] = {}
        for z, pos, _n in extents:
            first.setdefault(z, pos)
        for z, pos in first.items():
            self._wait(z, pos, timeout, "waiting for its turn to write")

    def wait_settled(self, zone: int, timeout: float = LEASE_WAIT) -> None:
        """Return once ``zone`` has no lease outstanding (its write pointer reached its claim pointer).

        Raises:
            ZoneInvalidWriteError: ``timeout`` seconds passed first.
        """
        if zone in self._ahead:
            self._wait(zone, 1 << 62, timeout, "the device's own write or zone operation")

    def settle(self, extents) -> list[tuple[int, int, int]]:
        """The leases of ``extents`` (``(zone, pos, length)``) the device has not written to their end
        (its write pointer short of it); the others end here, and waiters wake."""
        short = []
        with self._cv:
            for z, pos, n in extents:
                if not self._done(z, pos + n):
                    short.append((z, pos, n))
            self._cv.notify_all()
        return short

    def fill(self, extents, timeout: float | None = None) -> int:
        """End leases whose writer will not write them (it died, disconnected or gave up): for each
        ``(zone, pos, length)``, once its turn comes, write zeros from the write pointer to its end.
        A lease of a zone reset meanwhile is dropped.  Returns the bytes filled.

        Raises:
            ZoneInvalidWriteError: ``timeout`` seconds passed before a lease's turn, or an earlier lease
                of the zone is broken.
            OSError: the device refused the fill (the zone's leases are broken: their waiters fail).
        """
        filled = 0
        for z, pos, n in extents:
            self._wait(z, pos, timeout, "filling a lease its writer left")
            with self._cv:
                if z not in self._ahead:
                    continue            # settled (written, or the zone was reset)
                wp = self._written(z)
                end = pos + n
                if wp < end:
                    try:
                        self._fill(z, wp, end - wp)
                    except OSError as e:
                        self._broken[z] = f"{type(e).__name__}: {e}"
                        self._cv.notify_all()
                        raise
                    filled += end - wp
                self._done(z, end)
        return filled

    def reset(self, zone: int) -> None:
        """The zone was reset: its leases are void (a late write of one fails at the reset pointer)."""
        with self._cv:
            self._ahead.pop(zone, None)
            self._broken.pop(zone, None)
            self._cv.notify_all()
