"""The repair paths at real size: a sparse 64 GiB device file (32 zones of 2 GiB), so every data
extent and the third meta zone lie past byte 2^32 and any 32-bit truncation of an offset (a zone
start, a file offset, a journal position) shows.  Generations are put, one removed, its deletion
record and the sync record after it damaged, and ``fsck --repair``, ``fsck --restore`` and
``fsck --upgrade`` are run through the CLI; what is listed and read back is checked.  The file is
sparse: a few MiB are allocated, so the test takes seconds."""

from __future__ import annotations

import dataclasses
import json
import os

from retainz.cli import main
from retainz.store import Store
from retainz.store.format import FORMAT_VERSION, Superblock
from retainz.store.records import kind_of, unframe
from retainz.zoned import FileDevice

GiB = 1 << 30
ZONE = 2 * GiB
ZONES = 32
META = 3


def _data(i: int) -> bytes:
    return os.urandom(1 << 20)[: (1 << 20) - 7 * i] + bytes([i]) * 5000    # not block aligned


def _records(path) -> list[tuple[int, bytes]]:
    """``(file offset, payload)`` of every intact record in the meta zones, read up to each zone's
    write pointer and at most 16 MiB (a meta zone is 2 GiB, a spare one finished: this journal is the
    first few blocks of its zone)."""
    dev = FileDevice(path, readonly=True)
    try:
        base, bs = dev._data_offset, dev.geometry.block_size
        spans = [(z, min(dev.zone(z).wp - dev.zone(z).start, 16 << 20)) for z in range(META)]
    finally:
        dev.close()
    out = []
    with open(path, "rb") as f:
        for z, used in spans:
            f.seek(base + z * ZONE)
            buf = f.read(used)
            for pos in range(0, max(0, len(buf) - 8), bs):
                n, total, ok = unframe(buf, pos, len(buf), bs)
                if ok and total:
                    out.append((base + z * ZONE + pos, bytes(buf[pos + 8:pos + 8 + n])))
    return out


def _damage(path, off: int) -> None:
    with open(path, "r+b") as f:
        f.seek(off + 12)
        b = f.read(3)
        f.seek(off + 12)
        f.write(bytes(x ^ 0x5A for x in b))


def _ls(path, capsys) -> list[str]:
    capsys.readouterr()
    assert main(["ls", path, "--json"]) == 0
    return sorted(g["id"] for g in json.loads(capsys.readouterr().out))


def _fsck(path, capsys, *extra) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["fsck", *extra, path, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _get(path, gen, out, capsys) -> bytes:
    capsys.readouterr()
    assert main(["get", path, gen, "-o", str(out)]) == 0, capsys.readouterr().err
    return (out / "model.pt").read_bytes()


def test_repair_restore_and_upgrade_on_a_64_gib_sparse_device(tmp_path, capsys):
    path = str(tmp_path / "big.img")
    assert main(["device", "create", path, "--zones", str(ZONES), "--zone-size", "2GiB"]) == 0
    # the one log (greedy) keeps gen-1's bytes in the zone the later generations fill, so its deleted
    # data is still on the device when its deletion record is lost (retainz gives its 4 MB, dying
    # first, a zone of its own and resets it at the deletion: nothing left to bring back)
    assert main(["mkfs", path, "--meta-zones", str(META), "--policy", "greedy"]) == 0
    assert os.path.getsize(path) > ZONES * ZONE                     # 64 GiB and the label copy at the end
    data = {}
    for i in range(1, 6):
        data[i] = _data(i)
        src = tmp_path / f"in{i}" / "model.pt"
        src.parent.mkdir()
        src.write_bytes(data[i])
        assert main(["put", path, f"gen-{i}", str(src), "--step", str(i), "--reclaim-step", str(10 * i)]) == 0
    assert main(["rm", path, "gen-1", "--step", "6"]) == 0
    assert os.stat(path).st_blocks * 512 < 256 << 20                 # sparse: what was written, no more

    dev = FileDevice(path, readonly=True)
    with Store.open(dev, readonly=True) as s:
        ends = [(z, off) for g in s.generations() for sh in g.shards.values() for (z, off, _, _) in sh.extents]
        assert s.journal.chain[0] < META
    dev.close()
    assert ends and all(z >= META and z * ZONE + off >= 1 << 32 for z, off in ends), ends
    assert min(z * ZONE for z, _ in ends) >= 6 * GiB                  # the first data zone starts at 6 GiB

    # the deletion record of gen-1 and the sync record after it lost: every generation they could
    # concern is unknown after the repair; nothing deleted comes back
    recs = _records(path)
    lost = [off for off, p in recs if (kind_of(p) == "d" and b'"gen-1"' in p) or
            (kind_of(p) == "x" and b'"now":6' in p)]
    assert len(lost) >= 2, [kind_of(p) for _, p in recs]
    for off in lost:
        _damage(path, off)
    rc, rep = _fsck(path, capsys, "--repair")
    assert rc == 0, rep
    assert [(u["id"], u["step"]) for u in rep["unknown"]] == [(f"gen-{i}", i) for i in range(1, 6)], rep
    assert _ls(path, capsys) == []
    dev = FileDevice(path, readonly=True)
    with Store.open(dev, readonly=True) as s:
        chain = list(s.journal.chain)
    dev.close()
    assert chain and all(z < META for z in chain)

    # restore brings back exactly the ones asked for, byte for byte from past 2^32
    for i in (3, 5):
        assert main(["fsck", "--restore", f"gen-{i}", path]) == 0
    assert _ls(path, capsys) == ["gen-3", "gen-5"]
    assert _get(path, "gen-3", tmp_path / "o3", capsys) == data[3]
    assert _get(path, "gen-5", tmp_path / "o5", capsys) == data[5]
    assert main(["rm", path, "gen-1"]) == 0                       # the deleted one stays deleted
    rc, rep = _fsck(path, capsys)
    assert sorted(u["id"] for u in rep["unknown"]) == ["gen-2", "gen-4"], rep
    assert rep["ok"] and rep["bytes_verified"] >= len(data[3]) + len(data[5]), rep

    # an older store format (every superblock copy rewritten as version 3) is migrated by --upgrade
    dev = FileDevice(path, readonly=True)
    base, bs = dev._data_offset, dev.geometry.block_size
    g = dev.geometry
    dev.close()
    with open(path, "r+b") as f:
        for z in range(META):
            for b in (0, 1):
                f.seek(base + z * ZONE + b * bs)
                sb = Superblock.decode(f.read(bs), g)
                if sb is not None:
                    f.seek(base + z * ZONE + b * bs)
                    f.write(dataclasses.replace(sb, version=3).encode())
    rc, rep = _fsck(path, capsys, "--upgrade")
    assert rc == 0, rep
    assert f"upgraded: the store from format version 3 to {FORMAT_VERSION} (its journal rolled over at the " \
           "new version)" in rep["notes"], rep
    rc, rep = _fsck(path, capsys, "--upgrade")
    assert rc == 0 and f"nothing to upgrade: the store is already format version {FORMAT_VERSION}" in rep["notes"]
    assert _ls(path, capsys) == ["gen-3", "gen-5"]
    assert _get(path, "gen-5", tmp_path / "o5b", capsys) == data[5]
    src = tmp_path / "in6.pt"
    src.write_bytes(data[2])
    assert main(["put", path, "gen-6", str(src), "--step", "7"]) == 0   # writes work after the upgrade
    assert _ls(path, capsys) == ["gen-3", "gen-5", "gen-6"]
