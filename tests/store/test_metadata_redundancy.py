"""One flipped byte does not lose a store (issue 27 item 4; docs/format.md, "Redundancy").

A store on a FileDevice with committed generations is damaged one byte at a time in every byte of
its fixed-size metadata structures (the device label and its copy, the four zone-state slot copies,
each meta zone's superblock copies and spares, the journal's snapshot head record and its copy) and
in a sample of the rest of the journal (``RETAINZ_FLIP_SAMPLE`` bytes, default 64).  For each, the
store must open read-only with every committed generation intact (or, for the journal sample,
``fsck --repair`` must salvage every generation but the one whose record was hit); the byte is then
restored.
"""

from __future__ import annotations

import os
import random
import shutil
import struct

import pytest

from retainz.cli import main
from retainz.store import Store
from retainz.store.format import _SB
from retainz.zoned import FileDevice
from retainz.zoned.file import _LABEL, _LABEL_COPY, _LABEL_SIZE, _SLOT_HEAD
from retainz.zoned.model import Geometry

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)
SAMPLE = int(os.environ.get("RETAINZ_FLIP_SAMPLE", "64"))


def _content(i: int) -> dict[str, bytes]:
    return {f"s{j}": bytes([i * 7 + j]) * (3000 + 1000 * j) for j in range(2)}


def _make(path) -> dict:
    dev = FileDevice.create(path, GEOM)
    with Store.format(dev) as s:
        for i in range(4):
            w = s.begin_generation(f"g{i}", step=i)
            for name, data in _content(i).items():
                w.write_shard(name, [data])
            w.commit()
        s.delete("g1")
    dev.close()
    dev = FileDevice(path, readonly=True)
    with Store.open(dev, readonly=True) as s:   # where the clean close left the journal
        meta = {"chain": list(s.journal.chain), "end": s.journal.end, "meta": s.meta_zones,
                "spares": sorted(s.journal.spares)}
    meta.update(seq=dev._seq, slot=dev._slot_size, data=_LABEL_SIZE + 4 * dev._slot_size)
    dev.close()
    return meta


EXPECTED = {f"g{i}": _content(i) for i in (0, 2, 3)}


def _intact(path, *, readonly=True, repair=False) -> set[str]:
    """Generations that read back exactly; raises what the open raises."""
    dev = FileDevice(path, readonly=readonly)
    try:
        if repair:
            dev.repair_metadata()
        with Store.open(dev, readonly=readonly, repair=repair) as s:
            ok = set()
            for g in s.generations():
                want = EXPECTED.get(g.id)
                if want is not None and all(b"".join(s.read_shard(g.id, n)) == d for n, d in want.items()) \
                        and set(g.shards) == set(want):
                    ok.add(g.id)
            return ok if {g.id for g in s.generations()} == ok else set()
    finally:
        dev.close()


def _regions(m: dict) -> dict[str, list[int]]:
    """File offsets of every byte of each fixed-size structure, and a sample of the journal."""
    slot_used = _SLOT_HEAD.size + 9 * GEOM.nr_zones + 4 + 4 * 3 + 4
    chain0 = m["data"] + m["chain"][0] * GEOM.zone_size
    regions = {
        "label": list(range(_LABEL.size + 4)) + list(range(_LABEL_COPY, _LABEL_COPY + _LABEL.size + 4)),
        "state slots": [_LABEL_SIZE + k * m["slot"] + b for k in range(4) for b in range(slot_used)],
        "superblock": [m["data"] + z * GEOM.zone_size + b * GEOM.block_size + i
                       for z in range(m["meta"]) for b in ((0, 1) if z in m["chain"] else (0,))
                       for i in range(_SB.size + 4)],
    }
    with open(m["path"], "rb") as f:
        f.seek(chain0 + 2 * GEOM.block_size)
        crc, n = struct.unpack("<II", f.read(8))
    head_frame = -(-(8 + n) // GEOM.block_size) * GEOM.block_size
    # the snapshot head record and its copy: header and payload (the padding is not covered)
    regions["journal head record"] = [chain0 + 2 * GEOM.block_size + k * head_frame + i
                                      for k in (0, 1) for i in range(8 + n)]
    rest = range(chain0 + 2 * GEOM.block_size + 2 * head_frame, chain0 + m["end"])
    regions["journal (sample)"] = sorted(random.Random(27).sample(rest, min(SAMPLE, len(rest))))
    return regions


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("flip") / "dev.img")
    m = _make(path)
    m["path"] = path
    with open(path, "rb") as f:
        m["image"] = f.read()
    assert _intact(path) == set(EXPECTED)
    return m


def _flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


def _restore(path, image):
    with open(path, "r+b") as f:
        f.write(image)


@pytest.mark.parametrize("region", ["label", "state slots", "superblock", "journal head record"])
def test_a_flipped_byte_in_any_fixed_metadata_structure_loses_nothing(pristine, region, capsys):
    path, image = pristine["path"], pristine["image"]
    offsets = _regions(pristine)[region]
    lost = []
    for off in offsets:
        _flip(path, off)
        try:
            got = _intact(path)
        except Exception as e:  # noqa: BLE001 - every failure is counted and named
            got = f"{type(e).__name__}: {e}"
        if got != set(EXPECTED):
            lost.append((off, got))
        _restore(path, image)
    with capsys.disabled():
        print(f"\n{region}: {len(offsets)} single-byte corruptions, {len(offsets) - len(lost)} stores opened "
              "with every committed generation intact")
    assert lost == [], lost[:3]
    assert len(offsets) == {"label": 2 * (_LABEL.size + 4), "state slots": 4 * 180,
                            "superblock": 4 * (_SB.size + 4)}.get(region, len(offsets)) and len(offsets) > 100


def test_a_flipped_byte_in_the_journal_is_salvaged_by_fsck_repair(pristine, tmp_path, capsys):
    """A record written once (a commit, a deletion) has no copy: a byte in it fails the mount
    clearly, and ``fsck --repair`` salvages every generation its damage does not hit."""
    image = pristine["image"]
    offsets = _regions(pristine)["journal (sample)"]
    opened = salvaged = 0
    for off in offsets:
        path = str(tmp_path / "d.img")
        with open(path, "wb") as f:
            f.write(image)
        _flip(path, off)
        try:
            ok = _intact(path) == set(EXPECTED)
        except Exception:  # noqa: BLE001 - a clear refusal; the repair below must salvage
            ok = False
        opened += ok
        if not ok:
            got = _intact(path, readonly=False, repair=True)
            assert len(got) >= len(EXPECTED) - 1, (off, got)
            assert _intact(path) == got              # the repaired store opens cleanly
            salvaged += len(got) == len(EXPECTED)
        os.unlink(path)
    with capsys.disabled():
        print(f"\njournal sample: {len(offsets)} single-byte corruptions, {opened} opened intact, "
              f"{salvaged} more fully salvaged by fsck --repair")


def test_fsck_names_the_copy_it_used_and_repair_rewrites_it(pristine, tmp_path, capsys):
    path = str(tmp_path / "d.img")
    shutil.copyfile(pristine["path"], path)
    _restore(path, pristine["image"])
    chain0 = pristine["data"] + pristine["chain"][0] * GEOM.zone_size
    _flip(path, chain0 + 20)                        # the chain's superblock copy 0
    _flip(path, 30)                                 # the device label
    capsys.readouterr()
    assert main(["fsck", path]) == 0
    out = capsys.readouterr().out
    assert f"note: meta zone {pristine['chain'][0]}: superblock copy 0 is damaged; copy 1 was used" in out
    assert "note: device label copy 0 is damaged; copy 1 was used" in out
    assert "a read-write open would: rewrite the damaged metadata copies (fsck --repair)" in out
    assert main(["fsck", "--repair", path]) == 0
    capsys.readouterr()
    assert main(["fsck", path]) == 0
    out = capsys.readouterr().out
    assert "damaged" not in out and "clean" in out
    assert _intact(path) == set(EXPECTED)


def test_a_zeroed_block_in_either_copy_of_the_snapshot_head_loses_nothing(pristine, capsys):
    """A block that reads back as zeros (a lost write, a remapped sector) in one copy of the
    snapshot head is skipped like a flipped byte: the other copy is used and fsck names it
    ("zeroed" when the block held the record's header, "damaged" when it held payload)."""
    path, image = pristine["path"], pristine["image"]
    bs = GEOM.block_size
    first = pristine["data"] + pristine["chain"][0] * GEOM.zone_size + 2 * bs
    n = struct.unpack_from("<II", image, first)[1]
    frame = -(-(8 + n) // bs) * bs
    blocks = [(k, b) for k in (0, 1) for b in range(frame // bs)]
    lost = []
    for k, b in blocks:
        off = first + k * frame + b * bs
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes(bs))
        try:
            got = _intact(path)
            capsys.readouterr()
            main(["fsck", path])
            out = capsys.readouterr().out
            note = f"a record copy at byte {2 * bs + k * frame} is"   # its position in the zone
            said = ("is zeroed" if b == 0 else "is damaged") in out and note in out
        except Exception as e:  # noqa: BLE001 - every failure is counted and named
            got, said = f"{type(e).__name__}: {e}", False
        if got != set(EXPECTED) or not said:
            lost.append((k, b, got, said))
        _restore(path, image)
    with capsys.disabled():
        print(f"\nsnapshot head: {len(blocks)} zeroed blocks, {len(blocks) - len(lost)} stores opened intact "
              "and named the copy used")
    assert len(blocks) >= 2 and lost == [], lost[:3]
