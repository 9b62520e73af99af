"""Fault injection for crash-consistency tests, after LevelDB's ``FaultInjectionTestEnv``.

:class:`FaultyDevice` forwards every call to an emulated device and can:

* cut the power after the N-th write (a write or a zone append): writes after it are lost, and the
  N-th itself can be torn at block granularity (only its first ``torn_blocks`` blocks land).  Every
  operation after the cut raises :class:`PowerCutError` until :meth:`FaultyDevice.reboot`, which
  power-cycles the inner device into one of the states a drive with a volatile write cache can
  leave (see below);
* fail chosen operations with :class:`InjectedIOError` (by operation name, call number and zone);
* corrupt data returned by reads (flip a bit at a chosen device byte).

**What survives a cut.**  Whatever was written before a completed flush is durable, and so is a zone
operation once it completes.  A write cache persists the unflushed rest in any order *across* zones,
but each zone only up to a write pointer: every zone independently keeps a prefix of its unflushed
writes, torn at a block boundary.  :meth:`FaultyDevice.unflushed` lists those writes per zone and
:func:`power_cut_states` lists (or samples) the states they can leave: among them the ones where a
commit record in a meta zone persisted while the data it commits did not, and the reverse.
:meth:`FaultyDevice.reboot` applies one (``keep``) or, by default, keeps everything or nothing
(``keep_unflushed``).

Writes are numbered from 1 in the order issued; :attr:`FaultyDevice.writes` is the count so far, so a
test can run a workload once to count its write boundaries and then cut at every one of them.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from retainz.errors import InjectedIOError, PowerCutError
from retainz.zoned.device import WriteData, ZonedDevice, ZoneOp
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.model import DeviceInfo, Zone

__all__ = ["FaultyDevice", "IOFault", "power_cut_states"]

_OPS = ("write", "append", "read", "flush", "open", "close", "finish", "reset", "report")


@dataclass
class IOFault:
    """Fail calls of ``op`` (one of ``write append read flush open close finish reset report``).

    Attributes:
        op: the operation name.
        after: skip this many matching calls first.
        count: then fail this many (``-1``: every one after).
        zone: only calls that touch this zone (``None``: any).
    """

    op: str
    after: int = 0
    count: int = 1
    zone: int | None = None
    seen: int = 0

    def __post_init__(self):
        if self.op not in _OPS:
            raise ValueError(f"unknown operation {self.op!r}; valid: {', '.join(_OPS)}")

    def fires(self, zone: int | None) -> bool:
        if self.zone is not None and zone != self.zone:
            return False
        self.seen += 1
        n = self.seen - self.after
        return n > 0 and (self.count < 0 or n <= self.count)


class FaultyDevice(ZonedDevice):
    """Wrap an :class:`EmulatedZonedDevice` and inject faults.

    Args:
        inner: the device to wrap (memory or file).
        cut_after_writes: cut the power once this many writes have been issued (``None``: never).
        torn_blocks: if set, the cutting write lands only its first ``torn_blocks`` blocks (clamped to
            the write's length; 0 = none of it) and raises :class:`PowerCutError`; if ``None`` the
            cutting write lands whole and returns normally, and the next operation fails.
        keep_unflushed: how :meth:`reboot` power-cycles the inner device (see
            :meth:`EmulatedZonedDevice.power_loss`).  True (default) keeps every write the drive
            completed before the cut, which is what exposes torn records to recovery; False drops
            everything since the last flush.
    """

    def __init__(self, inner: EmulatedZonedDevice, *, cut_after_writes: int | None = None,
                 torn_blocks: int | None = None, keep_unflushed: bool = True):
        self.inner = inner
        self.cut_after_writes = cut_after_writes
        self.torn_blocks = torn_blocks
        self.keep_unflushed = keep_unflushed
        self.writes = 0
        self.dead = False
        self.faults: list[IOFault] = []
        self.corruptions: dict[int, int] = {}  # device byte -> xor mask
        g = inner.geometry
        self._info = DeviceInfo(geometry=g, kind=f"faulty({inner.info.kind})", path=inner.info.path,
                                payload=inner.info.payload)

    # -- configuration -----------------------------------------------------------------------------
    def fail(self, op: str, *, after: int = 0, count: int = 1, zone: int | None = None) -> IOFault:
        """Make calls of ``op`` raise :class:`InjectedIOError` (see :class:`IOFault`)."""
        fault = IOFault(op, after=after, count=count, zone=zone)
        self.faults.append(fault)
        return fault

    def corrupt(self, offset: int, mask: int = 0x01) -> None:
        """XOR byte ``offset`` of every read that covers it with ``mask`` (silent media corruption)."""
        if not 0 < mask < 256:
            raise ValueError("mask must be a non-zero byte")
        self.corruptions[offset] = mask

    def cut_now(self) -> None:
        """Cut the power now: every later operation raises :class:`PowerCutError` until
        :meth:`reboot` (trace replay's ``crash`` event)."""
        self.dead = True

    def unflushed(self) -> dict[int, int]:
        """Blocks written to each zone since it was last made durable (a flush or a zone operation):
        ``{zone: blocks}``, only zones that have some.  What a power cut now may lose, per zone."""
        bs = self.geometry.block_size
        return {z: (end - durable) // bs for z, (durable, end) in self.inner.unflushed().items()}

    def reboot(self, keep: dict[int, int] | None = None) -> EmulatedZonedDevice:
        """Power-cycle: the inner device becomes what survives the cut; faults stay armed but the
        power-cut trigger is disarmed.  Returns the inner device.

        Args:
            keep: ``{zone: blocks}`` of each zone's unflushed writes that persisted (a prefix; zones
                not named lose all of theirs): one state of :func:`power_cut_states`.  ``None``:
                :attr:`keep_unflushed` decides, all or nothing.
        """
        if keep is None:
            self.inner.power_loss(keep_unflushed=self.keep_unflushed)
        else:
            bs = self.geometry.block_size
            self.inner.power_loss(keep={z: n * bs for z, n in keep.items()})
        self.dead = False
        self.cut_after_writes = None
        return self.inner

    # -- helpers -----------------------------------------------------------------------------------
    def _check(self, op: str, zone: int | None) -> None:
        if self.dead:
            raise PowerCutError(f"power is cut: {op} not executed", zone=zone)
        for fault in self.faults:
            if fault.op == op and fault.fires(zone):
                raise InjectedIOError(f"injected I/O error on {op}" + (f" (zone {zone})" if zone is not None
                                                                       else ""), zone=zone)

    def _count_write(self, offset_zone: int, data: WriteData, do_write) -> object:
        self.writes += 1
        if self.cut_after_writes is None or self.writes < self.cut_after_writes:
            return do_write(data)
        self.dead = True
        if self.torn_blocks is None:
            return do_write(data)
        bs = self.geometry.block_size
        length = data if isinstance(data, int) else memoryview(data).nbytes
        keep = min(self.torn_blocks * bs, length)
        if keep:
            do_write(keep if isinstance(data, int) else memoryview(data)[:keep])
        raise PowerCutError(f"power cut during write #{self.writes}: {keep} of {length} bytes landed",
                            zone=offset_zone)

    # -- ZonedDevice -------------------------------------------------------------------------------
    @property
    def info(self) -> DeviceInfo:
        return self._info

    def report_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        self._check("report", None)
        return self.inner.report_zones(start, count)

    def zone_op(self, op: ZoneOp, zone: int) -> None:
        self._check(op.value, zone)
        self.inner.zone_op(op, zone)

    def write(self, offset: int, data: WriteData) -> None:
        zone = offset // self.geometry.zone_size
        self._check("write", zone)
        self._count_write(zone, data, lambda d: self.inner.write(offset, d))

    def append(self, zone: int, data: WriteData) -> int:
        self._check("append", zone)
        return self._count_write(zone, data, lambda d: self.inner.append(zone, d))

    def read(self, offset: int, length: int) -> bytes:
        self._check("read", offset // self.geometry.zone_size)
        data = self.inner.read(offset, length)
        hits = [o for o in self.corruptions if offset <= o < offset + length]
        if hits:
            buf = bytearray(data)
            for o in hits:
                buf[o - offset] ^= self.corruptions[o]
            data = bytes(buf)
        return data

    def flush(self) -> None:
        self._check("flush", None)
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


def power_cut_states(unflushed: dict[int, int], *, enumerate_up_to: int = 6, samples: int = 2,
                     rng: random.Random | None = None) -> list[dict[int, int]]:
    """The device states a power cut can leave, as ``keep`` mappings for :meth:`FaultyDevice.reboot`.

    Each zone independently keeps a prefix of its unflushed blocks (0 to all of them); zones are
    independent of one another (a volatile write cache destages in any order across zones).

    Args:
        unflushed: ``{zone: blocks}`` (:meth:`FaultyDevice.unflushed`).
        enumerate_up_to: list every state when there are at most this many; otherwise a sample.
        samples: random states added to the sample (each zone keeps a uniform 0..all blocks).
        rng: the sample's random source (seed it: a campaign must be repeatable).

    Returns:
        Distinct states, the two extremes first: everything kept, nothing kept.  A sample also holds,
        for every zone, "only this zone kept its writes" and "only this zone lost them" (so a commit
        record can persist while its data is lost, and data while its record is lost), then
        ``samples`` random states.  No unflushed writes: one state, ``{}``.
    """
    zones = sorted(unflushed)
    if not zones:
        return [{}]
    allkept = {z: unflushed[z] for z in zones}
    total = 1
    for z in zones:
        total *= unflushed[z] + 1
    if total <= enumerate_up_to:
        return [{z: n for z, n in zip(zones, ns, strict=True) if n}
                for ns in itertools.product(*(range(unflushed[z], -1, -1) for z in zones))]
    cands = [allkept, {}]
    if len(zones) > 1:
        for z in zones:
            cands.append({z: unflushed[z]})
            cands.append({y: n for y, n in allkept.items() if y != z})
    rng = rng or random.Random(0)
    for _ in range(samples):
        cands.append({z: rng.randint(0, unflushed[z]) for z in zones})
    out: list[dict[int, int]] = []
    seen: set[tuple] = set()
    for c in cands:
        key = tuple(c.get(z, 0) for z in zones)
        if key not in seen:
            seen.add(key)
            out.append({z: n for z, n in c.items() if n})
    return out
