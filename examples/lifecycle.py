"""The life of checkpoints in a RetainZ store, in one short script.

format -> write three generations with retention hints -> commit -> retire one -> GC -> a power cut
in the middle of a save -> recover -> read everything back.

Run it:  python examples/lifecycle.py
"""

from __future__ import annotations

import random

from retainz.hint import Hint
from retainz.placement.base import PERMANENT
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice, format_size
from retainz.zoned.faulty import FaultyDevice

KiB = 1024


def checkpoint(step: int, nbytes: int) -> bytes:
    """Stand-in for a model's state at a training step (deterministic bytes)."""
    return random.Random(step).randbytes(nbytes)


def chunks(data: bytes, size: int = 16 * KiB):
    """Checkpoints stream in: the store never needs a whole shard in memory."""
    for i in range(0, len(data), size):
        yield data[i:i + size]


def main() -> None:
    # A small zoned device: 16 zones of 64 KiB (48 KiB writable), at most 4 zones open at once.
    geometry = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, max_open=4, max_active=4)
    device = FaultyDevice(MemoryDevice(geometry))   # lets us pull the plug later

    # 1. Format: 3 meta zones hold the journal, the rest hold data.
    store = Store.format(device)
    print(f"formatted: {store.df().data_zones} data zones, policy {store.policy}")

    # 2. Three generations.  keep_latest_2: each one dies when the save two steps later commits;
    #    step 300 is also kept forever (every-300 rule).
    for step in (100, 200, 300):
        reclaim = PERMANENT if step == 300 else step + 200
        w = store.begin_generation(f"step-{step}", step, hint=Hint(reclaim_step=reclaim),
                                   declared_size=40 * KiB + 4 * KiB)
        w.write_shard("model.bin", chunks(checkpoint(step, 40 * KiB)))
        w.write_shard("optim.bin", chunks(checkpoint(step + 1, 4 * KiB)))
        w.commit()   # data flushed, then the commit record: from here on it survives any crash
        print(f"committed step-{step} (reclaim at {reclaim})")

    # 3. Retire step-100 (training reached step 300).  Zones left with only dead data are reset.
    store.delete("step-100", step=300)
    df = store.df()
    print(f"after retiring step-100: used {format_size(df.used)}, reclaimable {format_size(df.reclaimable)}")

    # 4. Copying GC: move the live data out of zones that also hold dead data, then reset them.
    report = store.gc(force=True)
    print(f"GC moved {report.extents_moved} extents ({format_size(report.bytes_copied)}) out of zones "
          f"{report.victims}; WAF {store.metrics.waf:.2f}")

    # 5. A save is in flight when the power goes out.
    w = store.begin_generation("step-400", 400, hint=Hint(reclaim_step=600))
    device.cut_after_writes = device.writes + 1
    try:
        w.write_shard("model.bin", chunks(checkpoint(400, 40 * KiB)))
        w.commit()
    except OSError as e:
        print(f"power cut: {e}")
    try:
        store.close()
    except OSError:
        pass   # the process would be gone; nothing more reaches the device

    # 6. Power back on: open replays the journal and reclaims what the crash left behind.
    device.reboot()
    store = Store.open(device)
    r = store.recovery
    print(f"recovered: {r.records} journal records replayed, {len(r.zones_reset)} zones reset, "
          f"{format_size(r.dead_bytes_found)} of uncommitted bytes counted dead")

    # 7. Exactly the committed generations are there, byte for byte (checksums verified on read).
    for gen in store.generations():
        for name in gen.shards:
            data = b"".join(store.read_shard(gen.id, name))
            expected = checkpoint(gen.step + (name == "optim.bin"), len(data))
            assert data == expected, (gen.id, name)
        print(f"read back {gen.id}: {len(gen.shards)} shards, {format_size(gen.size)}, checksums ok")
    assert [g.id for g in store.generations()] == ["step-200", "step-300"]
    assert store.fsck().ok
    store.close()
    print("done")


if __name__ == "__main__":
    main()
