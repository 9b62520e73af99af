"""Repair never brings back what was deleted and never loses what a copy holds (issue 41 items 1-3).

A store on a FileDevice holds gen-1 .. gen-5 (committed, small enough to share data zones), then
``rm gen-1``; its metadata is damaged a few bytes at a time, as a new user would, and ``ls``,
``fsck``, ``fsck --repair`` and ``get`` are run through the CLI.
"""

from __future__ import annotations

import json
import struct

import pytest

from retainz.cli import main
from retainz.store import Store
from retainz.store.records import kind_of, unframe
from retainz.zoned import FileDevice
from retainz.zoned.file import _LABEL_SIZE
from retainz.zoned.model import Geometry

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=256 * KiB, zone_capacity=192 * KiB, block_size=4096, max_open=3,
                max_active=4)
BS = GEOM.block_size


def _data(i: int) -> bytes:
    return bytes([i]) * 3000


def make(path) -> str:
    """gen-1 .. gen-5 committed, gen-1 deleted (the CLI's own commands); returns the path."""
    FileDevice.create(path, GEOM).close()
    dev = FileDevice(path)
    with Store.format(dev) as s:
        for i in range(1, 6):
            w = s.begin_generation(f"gen-{i}", step=i)
            w.write_shard("model.pt", [_data(i)])
            w.commit()
    dev.close()
    assert main(["rm", str(path), "gen-1", "--step", "6"]) == 0
    return str(path)


def data_offset(path) -> int:
    dev = FileDevice(path, readonly=True)
    try:
        return dev._data_offset
    finally:
        dev.close()


def records(path) -> list[tuple[int, int, bytes]]:
    """``(file offset, frame bytes, payload)`` of every intact record frame in the meta zones."""
    base = data_offset(path)
    out = []
    with open(path, "rb") as f:
        for z in range(3):
            f.seek(base + z * GEOM.zone_size)
            buf = f.read(GEOM.zone_capacity)
            for pos in range(0, len(buf) - 8, BS):
                n, total, ok = unframe(buf, pos, len(buf), BS)
                if ok and total:
                    out.append((base + z * GEOM.zone_size + pos, total, bytes(buf[pos + 8:pos + 8 + n])))
    return out


def copies_of(path, kind: str, needle: bytes) -> list[int]:
    """File offsets of every copy of the ``kind`` record whose payload holds ``needle``."""
    return [off for off, _, p in records(path) if kind_of(p) == kind and needle in p]


def damage(path, off: int, n: int = 3) -> None:
    """Flip ``n`` bytes of a record's payload (past its header)."""
    with open(path, "r+b") as f:
        f.seek(off + 12)
        b = f.read(n)
        f.seek(off + 12)
        f.write(bytes(x ^ 0x5A for x in b))


def listed(path, capsys) -> list[str]:
    capsys.readouterr()
    assert main(["ls", path, "--json"]) == 0
    return sorted(g["id"] for g in json.loads(capsys.readouterr().out))


def fsck_json(path, capsys, *extra) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["fsck", *extra, path, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_a_damaged_deletion_record_never_brings_the_deleted_generation_back(tmp_path, capsys):
    """Issue 41 item 1: every copy of gen-1's deletion record damaged; repair must not list,
    read or commit gen-1 again."""
    path = make(tmp_path / "dev.img")
    offs = copies_of(path, "d", b'"gen-1"')
    assert offs
    for off in offs:
        damage(path, off)
    rc, _ = fsck_json(path, capsys, "--repair")
    assert "gen-1" not in listed(path, capsys)
    capsys.readouterr()
    assert main(["get", path, "gen-1", "-o", str(tmp_path / "out")]) != 0
    # and the other generations are still all there (the live-set digest of the next record
    # says which one the lost record deleted)
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    assert rc == 0


def test_a_lost_last_record_makes_what_it_could_concern_unknown_and_restorable(tmp_path, capsys):
    """Issue 41 item 1: the deletion record and the sync record after it both lost: nothing after
    them says what they did, so every generation they could concern is unknown: named by id and
    step, not listed nor read, restorable one by one with ``fsck --restore`` (never by the repair)."""
    path = make(tmp_path / "dev.img")
    for off in copies_of(path, "d", b'"gen-1"') + copies_of(path, "x", b'"now":6'):
        damage(path, off)
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0, rep
    assert [(u["id"], u["step"]) for u in rep["unknown"]] == [(f"gen-{i}", i) for i in range(1, 6)]
    assert all("could have deleted or changed it" in u["reason"] for u in rep["unknown"])
    assert listed(path, capsys) == []
    capsys.readouterr()
    assert main(["get", path, "gen-3", "-o", str(tmp_path / "o")]) == 2   # as any missing generation
    assert f"retainz fsck --restore gen-3 {path}" in capsys.readouterr().err
    rc, rep = fsck_json(path, capsys)           # still unknown after a remount: nothing resurrected
    assert rc == 1 and rep["ok"] and len(rep["unknown"]) == 5, rep   # 1: generations wait for a decision
    assert main(["fsck", path]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"5 unknown generations (not listed nor read until `retainz fsck --restore GEN {path}` "
                    f"or `retainz rm {path} GEN`)"), last
    assert main(["fsck", "--restore", "gen-3", path]) == 0
    assert listed(path, capsys) == ["gen-3"]
    out = tmp_path / "out"
    assert main(["get", path, "gen-3", "-o", str(out)]) == 0
    assert (out / "model.pt").read_bytes() == _data(3)
    assert main(["rm", path, "gen-1"]) == 0       # discarding an unknown one
    rc, rep = fsck_json(path, capsys)
    assert sorted(u["id"] for u in rep["unknown"]) == ["gen-2", "gen-4", "gen-5"], rep


def test_a_lost_commit_record_is_named_by_repair(tmp_path, capsys):
    """Issue 41 item 2: every copy of gen-3's commit record damaged: repair names what it lost,
    and ``fsck --json`` lists it."""
    path = make(tmp_path / "dev.img")
    for off in copies_of(path, "c", b'"gen-3"'):
        damage(path, off)
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0, rep
    # the others are settled by the next record's live set (one commit lost, no deletion)
    assert listed(path, capsys) == ["gen-2", "gen-4", "gen-5"]
    assert [d for d in rep["dropped"] if "commit sequence 3..3" in d["reason"]], rep
    assert rep["unknown"] == []


def test_every_error_a_repair_fixes_says_to_run_fsck_repair(tmp_path, capsys):
    """Issue 41 item 2: until repaired, every command names the way out in the CLI's words."""
    path = make(tmp_path / "dev.img")
    for off in copies_of(path, "c", b'"gen-3"'):
        damage(path, off)
    for argv in (["ls", path], ["fsck", path], ["get", path, "gen-2", "-o", str(tmp_path / "o")]):
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"retainz fsck --repair {path}" in err, (argv, err)


def test_both_superblock_copies_of_the_chain_zone_lost_are_recovered_from_a_spare(tmp_path, capsys):
    """Issue 41 item 3: the chain zone's two superblock blocks destroyed; the spares of the other
    meta zones hold the store's identity, so every generation is still reachable."""
    path = make(tmp_path / "dev.img")
    dev = FileDevice(path, readonly=True)
    with Store.open(dev, readonly=True) as s:
        chain = list(s.journal.chain)
    dev.close()
    base = data_offset(path)
    with open(path, "r+b") as f:
        f.seek(base + chain[0] * GEOM.zone_size)
        f.write(bytes(2 * BS))
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0, rep
    rc, rep = fsck_json(path, capsys)
    assert rc == 0 and not any("superblock" in n for n in rep["notes"]), rep


def test_the_device_label_block_lost_is_recovered_from_its_copy_at_the_end(tmp_path, capsys):
    """Issue 41 item 3: the whole first 4 KiB block (both label copies) destroyed."""
    path = make(tmp_path / "dev.img")
    with open(path, "r+b") as f:
        f.write(bytes(_LABEL_SIZE))
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0, rep
    with open(path, "rb") as f:
        assert f.read(8) == b"RETAINZD"


def test_every_zone_state_copy_lost_is_rebuilt_from_the_journal(tmp_path, capsys):
    """Issue 41 item 3: all four zone-state slot copies destroyed: ``fsck --repair`` rebuilds the
    zone state from the journal (and the device's write pointers where it has them)."""
    path = make(tmp_path / "dev.img")
    dev = FileDevice(path, readonly=True)
    slot = dev._slot_size
    dev.close()
    with open(path, "r+b") as f:
        f.seek(_LABEL_SIZE)
        f.write(b"\xff" * (4 * slot))
    capsys.readouterr()
    assert main(["ls", path]) == 1
    assert f"retainz fsck --repair {path}" in capsys.readouterr().err
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0, rep
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    out = tmp_path / "out"
    assert main(["get", path, "gen-5", "-o", str(out)]) == 0
    assert (out / "model.pt").read_bytes() == _data(5)
    # the repaired store takes new generations
    src = tmp_path / "new.bin"
    src.write_bytes(b"x" * 5000)
    assert main(["put", path, "gen-6", str(src), "--step", "7"]) == 0
    rc, rep = fsck_json(path, capsys)
    assert rc == 0, rep


@pytest.mark.parametrize("kind", ["c", "d"])
def test_a_zeroed_4k_block_of_one_record_loses_only_what_it_alone_held(tmp_path, capsys, kind):
    """A lost 4 KiB block (the unit a drive loses) of one record costs nothing: format 5 wrote the
    record twice, and the other copy is used (named); no repair is needed.  Both copies' blocks lost
    (two faults): the deletion stays a deletion (the next record's live set says which); a lost
    commit loses that generation only, named."""
    path = make(tmp_path / "dev.img")
    needle = b'"gen-1"' if kind == "d" else b'"gen-2"'
    offs = copies_of(path, kind, needle)
    assert len(offs) == 2 and offs[1] - offs[0] == BS            # copy 0, then copy 1 in the next block
    with open(path, "r+b") as f:
        f.seek(offs[0])
        f.write(bytes(BS))
    rc, rep = fsck_json(path, capsys)
    assert rc == 0 and rep["ok"] and rep["dropped"] == [] and rep["unknown"] == [], rep
    assert [n for n in rep["notes"] if "is zeroed; its other copy was used" in n], rep
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    with open(path, "r+b") as f:
        f.seek(offs[1])
        f.write(bytes(BS))
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0, rep
    if kind == "d":
        assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
        assert [(d["id"], d["step"]) for d in rep["dropped"]] == [("gen-1", 1)]
    else:
        assert listed(path, capsys) == ["gen-3", "gen-4", "gen-5"]
        assert [d["reason"] for d in rep["dropped"] if "commit sequence 2..2" in d["reason"]], rep
    assert rep["unknown"] == []
    assert struct.calcsize("<II") == 8


def test_an_older_store_is_read_as_is_and_migrated_only_by_fsck_upgrade(tmp_path, capsys):
    """Version policy: a format-3 store (written before this change) lists and reads; a writing
    command refuses it in one line naming `fsck --upgrade`; after it, writes work."""
    import dataclasses

    from retainz.store.format import Superblock

    path = make(tmp_path / "dev.img")
    base = data_offset(path)
    with open(path, "r+b") as f:       # rewrite every superblock copy as version 3
        for z in range(3):
            for b in (0, 1):
                f.seek(base + z * GEOM.zone_size + b * BS)
                raw = f.read(BS)
                sb = Superblock.decode(raw, GEOM)
                if sb is not None:
                    f.seek(base + z * GEOM.zone_size + b * BS)
                    f.write(dataclasses.replace(sb, version=3).encode())
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    src = tmp_path / "new.bin"
    src.write_bytes(b"y" * 4000)
    capsys.readouterr()
    assert main(["put", path, "gen-6", str(src), "--step", "7"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"`retainz fsck --upgrade {path}`" in err, err
    assert main(["fsck", "--upgrade", path]) == 0
    assert main(["put", path, "gen-6", str(src), "--step", "7"]) == 0
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5", "gen-6"]


def test_a_repair_of_a_clean_store_writes_nothing_and_says_it_is_clean(tmp_path, capsys):
    """``fsck --repair`` with nothing to repair (issue 44): the device file is byte for byte what it
    was (no journal rollover, no superblock or zone-state rewrite), the output says so, exit 0; a
    store damaged afterwards is still repaired."""
    path = make(tmp_path / "dev.img")
    before = (tmp_path / "dev.img").read_bytes()
    capsys.readouterr()
    assert main(["fsck", "--repair", path]) == 0
    out = capsys.readouterr().out
    assert "note: nothing to repair: the store is clean (nothing was written)" in out
    assert out.rstrip().endswith("clean")
    assert (tmp_path / "dev.img").read_bytes() == before
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0 and rep["ok"] and rep["notes"] == ["nothing to repair: the store is clean (nothing was written)"]
    assert (tmp_path / "dev.img").read_bytes() == before
    # damage still repairs: the label block's first copies zeroed are rewritten from the end copy
    with open(path, "r+b") as f:
        f.write(b"\0" * 64)
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0 and any(n.startswith("repaired: rewrote the device label") for n in rep["notes"]), rep
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]


def test_ls_of_a_store_holding_only_unknown_generations_says_so(tmp_path, capsys):
    """Issue 44: after a repair kept every generation as unknown, ``ls`` printed nothing, as for an
    empty store.  It names how many unknown generations there are and the commands that inspect and
    decide them; ``--json`` keeps stdout the (empty) list of listed generations and says it on stderr;
    once one is restored it is listed and the line counts the rest."""
    path = make(tmp_path / "dev.img")
    for off in copies_of(path, "d", b'"gen-1"') + copies_of(path, "x", b'"now":6'):
        damage(path, off)
    assert fsck_json(path, capsys, "--repair")[0] == 0
    line = (f"5 unknown generations (14.65 KiB) not listed: a repair could not decide whether they were deleted; "
            f"`retainz fsck {path}` names them, `retainz fsck --restore GEN {path}` lists one again, "
            f"`retainz rm {path} GEN` discards it")
    capsys.readouterr()
    assert main(["ls", path]) == 0
    assert capsys.readouterr().out.splitlines() == [line]
    assert main(["ls", path, "--json"]) == 0
    io = capsys.readouterr()
    assert json.loads(io.out) == [] and io.err.splitlines() == [line]
    assert main(["fsck", "--restore", "gen-3", path]) == 0
    capsys.readouterr()
    assert main(["ls", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gen-3\tstep 3\t") and out[1].startswith("4 unknown generations (11.72 KiB) not listed")
    assert len(out) == 2


def test_a_lost_replacing_commit_is_named_with_the_step_it_retired_not_a_python_none(tmp_path, capsys):
    """Both copies of a `put --replace` commit damaged: the repair keeps the old version retired and
    names the new one as lost; its step was only in the lost record, and the line said
    ``(step None)`` (issue 41 trial): it says the step is unknown and which step stays retired."""
    path = make(tmp_path / "dev.img")
    src = tmp_path / "new.bin"
    src.write_bytes(b"n" * 3000)
    assert main(["put", path, "gen-3", str(src), "--step", "7", "--replace"]) == 0
    for off in copies_of(path, "c", b'"gen-3",7'):
        damage(path, off)
    capsys.readouterr()
    assert main(["fsck", "--repair", path]) == 0
    lost = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  lost:")]
    assert len(lost) == 1 and "None" not in lost[0], lost
    assert lost[0].startswith("  lost: generation 'gen-3' (step unknown: only the lost record held it): "), lost
    assert "the version of step 3 stays retired" in lost[0]
    assert listed(path, capsys) == ["gen-2", "gen-4", "gen-5"]
    rc, rep = fsck_json(path, capsys)
    assert rc == 0 and rep["dropped"] == []


def test_every_device_label_copy_lost_is_rebuilt_from_the_store_superblock(tmp_path, capsys):
    """Two faults: the file's first block (label copies 0 and 1) and its last (the copy at the end)
    both lost.  Every command said the file 'is not a RetainZ device file ... Create one with `retainz
    device create`' (exit 2), ``fsck --repair`` included, though the store's superblock records the
    geometry (issue 41 trial).  Now they name ``fsck --repair`` (exit 1), which rebuilds the label and
    keeps every generation."""
    path = make(tmp_path / "dev.img")
    size = (tmp_path / "dev.img").stat().st_size
    with open(path, "r+b") as f:
        f.write(bytes(_LABEL_SIZE))
        f.seek(size - _LABEL_SIZE)
        f.write(bytes(_LABEL_SIZE))
    capsys.readouterr()
    assert main(["ls", path]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"retainz: error: {path}: every copy of the device label is lost (its first and last blocks), but "
                   "it holds a RetainZ store whose superblock gives the geometry; run `retainz fsck --repair "
                   f"{path}` to rebuild the label"]
    rc, rep = fsck_json(path, capsys, "--repair")
    assert rc == 0 and rep["ok"] and rep["dropped"] == []
    assert rep["notes"][0].startswith("repaired: rebuilt the device label (every copy was lost) from the store's "
                                      "superblock: 16 zones of 262,144 bytes"), rep["notes"]
    assert listed(path, capsys) == ["gen-2", "gen-3", "gen-4", "gen-5"]
    with FileDevice(path, readonly=True) as dev:
        assert dev.notes == () and dev.geometry.zone_capacity == GEOM.zone_capacity
    assert main(["get", path, "gen-3", "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.pt").read_bytes() == _data(3)
