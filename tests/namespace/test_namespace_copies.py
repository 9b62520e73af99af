"""A large write (a whole tensor handed to one ``write`` by ``retainz://``) streams into the store from
the caller's own buffer: the namespace keeps no copy of it (issue 44.7: a save's peak memory)."""

from __future__ import annotations

import random
import threading
import tracemalloc

from retainz.namespace import Namespace
from retainz.namespace.pump import Pump
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry

MiB = 1 << 20
GEOM = Geometry(nr_zones=16, zone_size=16 * MiB, zone_capacity=16 * MiB)


class _Sink:
    def __init__(self):
        self.got = []
        self.lock = threading.Lock()

    def write(self, data):
        with self.lock:
            self.got.append(data)


def test_the_pump_writes_a_large_chunk_from_the_callers_buffer_after_the_queued_ones():
    sink = _Sink()
    pump = Pump(sink)
    small = bytearray(b"s" * 1000)
    big = memoryview(bytearray(Pump.LIMIT))
    pump.put(small)
    pump.put(big)
    pump.drain()
    pump.stop()
    assert len(sink.got) == 2
    assert bytes(sink.got[0]) == b"s" * 1000 and sink.got[0] is not small      # a small one is copied
    assert sink.got[1] is big                                                   # a large one is not


def test_a_large_write_is_not_copied_and_reads_back(tmp_path):
    store = Store.format(FileDevice.create(str(tmp_path / "dev.img"), GEOM))
    ns = Namespace(store)
    rnd = random.Random(7)
    head = rnd.randbytes(4096)
    tensors = [memoryview(rnd.randbytes(24 * MiB)) for _ in range(2)]
    fh = ns.open_write("/model.bin", truncate=True)
    tracemalloc.start()
    try:
        at = ns.write(fh, head, 0)
        for t in tensors:                     # the first starts the stream, the second goes through it
            at += ns.write(fh, t, at)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    ns.close(fh)
    ns.release(fh)
    assert peak < 8 * MiB, f"the namespace held {peak / MiB:.0f} MiB while 2 x 24 MiB were written"
    rh = ns.open_read("/model.bin")
    assert ns.read(rh, 64 * MiB, 0) == head + b"".join(bytes(t) for t in tensors)
    ns.release(rh)
    store.close()
