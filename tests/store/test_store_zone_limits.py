"""The allocator keeps within the device's open and active zone limits when several writers are in
flight at once (issue 40): at most ``min(max_open, max_active)`` zones are active at any moment, so
every active zone can be open and no write ever needs the device to close a zone first.  A Linux
null_blk device refuses a write to a Closed zone with ETOOMANYREFS when both limits are reached
(``null_check_open`` closes an implicitly open zone only if ``null_check_active`` passes), and the
clients of a node service write straight to the device with no close-and-retry: the guest lane's
null_blk (tests/vm/test_zns_guest.py: max_open 3, max_active 4) failed so under the retainz policy."""

from __future__ import annotations

import pytest

from retainz.hint import Hint
from retainz.placement import POLICIES
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice
from tests.pattern import block, seed_of

KiB = 1024
#: One device write of the store per chunk (its 1 MiB write buffer, store/writer.py).
CHUNK = 1 << 20
LIMITS = [(2, 2), (2, 3), (3, 4), (4, 6), (14, 14)]


class LinuxLimits(MemoryDevice):
    """A device that, like a Linux zoned block device written by node clients from other processes,
    gives the store only as many active zones as can be open at once
    (:meth:`retainz.zoned.linux.LinuxZonedDevice.active_zone_budget`, the same rule); the in-memory
    model itself closes an implicitly open zone as ZNS allows and keeps ``max_active``."""

    def active_zone_budget(self) -> int:
        from retainz.zoned.linux import LinuxZonedDevice

        return LinuxZonedDevice.active_zone_budget(self)


def test_the_model_keeps_its_active_limit_and_a_linux_device_the_lower_of_its_limits():
    g = Geometry(nr_zones=48, zone_size=512 * KiB, zone_capacity=384 * KiB, block_size=4096, max_open=3,
                 max_active=4)
    with Store.format(MemoryDevice(g), policy="retainz") as s:
        assert s.zones.max_active == s.table.max_active == 3
    with Store.format(LinuxLimits(g), policy="retainz") as s:
        assert s.zones.max_active == s.table.max_active == 2


@pytest.mark.parametrize("max_open,max_active", LIMITS)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_concurrent_writers_never_hold_more_active_zones_than_can_be_open(policy, max_open, max_active):
    g = Geometry(nr_zones=48, zone_size=512 * KiB, zone_capacity=384 * KiB, block_size=4096,
                 max_open=max_open, max_active=max_active)
    dev = LinuxLimits(g)
    writers = 3                                       # three jobs' saves in flight at once
    if policy.startswith("zenfs") and min(max_open, max_active) <= 2:
        with pytest.raises(ValueError, match="too small for the policy"):   # ZenFS keeps 2 for itself
            Store.format(dev, policy=policy)
        return
    with Store.format(dev, policy=policy) as s:
        committed = []
        for rnd in range(3):
            gens = [(f"j{j}%2Fg{rnd}", rnd * 10 + j) for j in range(writers)]
            ws = [s.begin_generation(gid, step, hint=Hint(reclaim_step=step + 30 * (j + 1)))
                  for j, (gid, step) in enumerate(gens)]
            streams = [w.open_shard("a") for w in ws]
            data = {gid: block(seed_of(gid, "a"), 0, (2 << 20) + 9_000 * j) for j, (gid, _) in enumerate(gens)}
            pos = 0
            while any(pos < len(d) for d in data.values()):
                for (gid, _), st in zip(gens, streams, strict=True):   # interleaved: every writer in flight
                    chunk = data[gid][pos:pos + CHUNK]
                    if chunk:
                        st.write(chunk)
                        n_open, n_active = dev.open_counts()
                        assert n_active <= min(max_open, max_active), (n_open, n_active)
                pos += CHUNK
            for st, w in zip(streams, ws, strict=True):
                st.close()
                w.commit()
            committed += [(gid, data[gid]) for gid, _ in gens]
            for gid, _ in gens[:2] if rnd < 2 else []:         # make room: drop the older two
                s.delete(gid)
                committed = [c for c in committed if c[0] != gid]
        for gid, d in committed:
            assert b"".join(s.read_shard(gid, "a")) == d, gid
        assert s.fsck().ok
