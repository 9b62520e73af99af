"""Random operation sequences against an independent reference model of the ZNS zone state machine.

The model below is written from the NVMe ZNS 1.1 zone state machine (section 2.1.1) without looking
at the emulator: each zone is (condition, written bytes); open/active resources are counted from the
conditions; implicit opens close the oldest implicitly open zone at the open limit.  After every step
the device's report, the error raised (type) and the data read must agree with the model.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from retainz import errors
from retainz.zoned import FileDevice, Geometry, MemoryDevice, ZoneCond

G = Geometry(nr_zones=6, zone_size=8 * 4096, zone_capacity=6 * 4096, block_size=4096, max_open=2, max_active=3)
BS = G.block_size


class ZoneModel:
    """Reference model: per zone (cond, written, data); implicit-open order for eviction."""

    def __init__(self, g: Geometry):
        self.g = g
        self.cond = ["em"] * g.nr_zones
        self.written = [0] * g.nr_zones
        self.data = [b""] * g.nr_zones
        self.imp_order: list[int] = []  # implicitly open zones, oldest first

    def n_open(self):
        return sum(c in ("oi", "oe") for c in self.cond)

    def n_active(self):
        return sum(c in ("oi", "oe", "cl") for c in self.cond)

    def _set(self, z, c):
        if self.cond[z] == "oi":
            self.imp_order.remove(z)
        if c == "oi":
            self.imp_order.append(z)
        self.cond[z] = c

    def _open(self, z, target):
        """Acquire resources for zone z; returns an error class or None."""
        if self.cond[z] == "em" and self.g.max_active and self.n_active() >= self.g.max_active:
            return errors.TooManyActiveZonesError
        if self.g.max_open and self.n_open() >= self.g.max_open:
            if not self.imp_order:
                return errors.TooManyOpenZonesError
            self._set(self.imp_order[0], "cl")
        self._set(z, target)
        return None

    def write(self, z, pos, data, append=False):
        if not append and z * self.g.zone_size + pos + len(data) > self.g.size:
            return errors.OutOfRangeError  # LBA Out of Range is checked before zone rules
        c = self.cond[z]
        if c == "fu":
            return errors.ZoneFullError
        if pos != self.written[z]:
            return errors.ZoneInvalidWriteError
        if pos + len(data) > self.g.zone_capacity:
            return errors.ZoneBoundaryError
        if c in ("em", "cl"):
            err = self._open(z, "oi")
            if err:
                return err
        self.written[z] += len(data)
        self.data[z] += data
        if self.written[z] == self.g.zone_capacity:
            self._set(z, "fu")
        return None

    def op(self, name, z):
        c = self.cond[z]
        if name == "open":
            if c == "fu":
                return errors.InvalidZoneTransitionError
            if c == "oi":
                self._set(z, "oe")
            elif c in ("em", "cl"):
                return self._open(z, "oe")
        elif name == "close":
            if c in ("em", "fu"):
                return errors.InvalidZoneTransitionError
            if c in ("oi", "oe"):
                self._set(z, "cl" if self.written[z] else "em")
        elif name == "finish":
            if c == "em" and self.g.max_active and self.n_active() >= self.g.max_active:
                return errors.TooManyActiveZonesError
            self._set(z, "fu")
        elif name == "reset":
            self._set(z, "em")
            self.written[z] = 0
            self.data[z] = b""
        return None

    def power_cycle(self):
        for z, c in enumerate(self.cond):
            if c in ("oi", "oe"):
                self._set(z, "cl" if self.written[z] else "em")

    def wp(self, z):
        start = z * self.g.zone_size
        return start + self.g.zone_size if self.cond[z] == "fu" else start + self.written[z]


def payload(seed: int, nblocks: int) -> bytes:
    return bytes([(seed + i) % 256 for i in range(nblocks)]) * BS


class DeviceMachine(RuleBasedStateMachine):
    make = staticmethod(lambda: MemoryDevice(G))

    def __init__(self):
        super().__init__()
        self.dev = self.make()
        self.model = ZoneModel(G)
        self.seed = 0

    def _expect(self, err, fn):
        if err is None:
            fn()
        else:
            try:
                fn()
            except errors.ZonedDeviceError as e:
                assert type(e) is err, f"device raised {type(e).__name__}, model expects {err.__name__}"
            else:
                raise AssertionError(f"device accepted an operation the model refuses ({err.__name__})")

    @rule(z=st.integers(0, G.nr_zones - 1), nblocks=st.integers(1, 4), skew=st.sampled_from([0, 0, 0, -1, 1]))
    def write(self, z, nblocks, skew):
        self.seed += 1
        data = payload(self.seed, nblocks)
        pos = self.model.written[z] + skew * BS
        if pos < 0:
            pos = BS
        err = self.model.write(z, pos, data)
        self._expect(err, lambda: self.dev.write(z * G.zone_size + pos, data))

    @rule(z=st.integers(0, G.nr_zones - 1), nblocks=st.integers(1, 3))
    def append(self, z, nblocks):
        self.seed += 1
        data = payload(self.seed, nblocks)
        before = self.model.written[z]
        err = self.model.write(z, before, data, append=True)
        if err is None:
            assert self.dev.append(z, data) == z * G.zone_size + before
        else:
            self._expect(err, lambda: self.dev.append(z, data))

    @rule(z=st.integers(0, G.nr_zones - 1), name=st.sampled_from(["open", "close", "finish", "reset"]))
    def zone_op(self, z, name):
        err = self.model.op(name, z)
        self._expect(err, lambda: getattr(self.dev, f"{name}_zone")(z))

    @rule()
    def flush(self):
        self.dev.flush()

    @precondition(lambda self: hasattr(self.dev, "power_loss"))
    @rule()
    def power_cycle_keeping_completed_writes(self):
        self.dev.power_loss(keep_unflushed=True)
        self.model.power_cycle()

    @rule(z=st.integers(0, G.nr_zones - 1))
    def read_zone(self, z):
        got = self.dev.read(z * G.zone_size, G.zone_size)
        want = self.model.data[z]
        assert got == want + bytes(G.zone_size - len(want))

    @invariant()
    def reports_agree(self):
        for z in self.dev.report_zones():
            assert z.cond == ZoneCond.from_short(self.model.cond[z.index]), f"zone {z.index}"
            assert z.wp == self.model.wp(z.index), f"zone {z.index} wp"


DeviceMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestMemoryDeviceAgainstModel = DeviceMachine.TestCase


class FileDeviceMachine(DeviceMachine):
    """Same model against the file device, which also gets closed and reopened (clean restart)."""

    def __init__(self):
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.path = f"{self._dir.name}/dev.img"
        self.make = lambda: FileDevice.create(self.path, G)
        super().__init__()

    @rule()
    def reopen(self):
        self.dev.close()
        self.dev = FileDevice(self.path)

    def teardown(self):
        self.dev.close()
        self._dir.cleanup()


FileDeviceMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestFileDeviceAgainstModel = FileDeviceMachine.TestCase
