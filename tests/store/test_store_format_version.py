"""Format versions: a store of a version or with flags this code does not know is refused before
anything is written (read-write and read-only, API and CLI); an older readable version is upgraded
by a journal rollover at a read-write open, and a read-only open leaves it as it is."""

from __future__ import annotations

import dataclasses
import re
import uuid

import crc32c
import pytest

from retainz.cli import main
from retainz.errors import CorruptJournalError, InvalidIdError, OldFormatError, UnsupportedFormatError
from retainz.store import Store
from retainz.store.format import FORMAT_VERSION, READABLE_VERSIONS, Superblock, check_id
from retainz.store.records import append_frames, empty_snapshot, frame, stamp, sync_record
from retainz.zoned import FileDevice, Geometry, MemoryDevice

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


def rewrite_superblock(dev: MemoryDevice, **change) -> bytes:
    """Replace the superblock of every meta zone in use with a re-encoded one (valid crc) carrying
    ``change``; returns the device's bytes before (to check nothing else is written later)."""
    bs = dev.geometry.block_size
    for z in range(3):
        zone = dev.zone(z)
        if zone.wp == zone.start:
            continue
        sb = Superblock.decode(dev.read(zone.start, bs), dev.geometry)
        dev._data[z][:bs] = dataclasses.replace(sb, **change).encode()
    return snapshot(dev)


def snapshot(dev: MemoryDevice) -> bytes:
    return b"".join(bytes(d or b"") for d in dev._data) + repr([(z.cond, z.wp) for z in dev.report_zones()]).encode()


def stored(dev: MemoryDevice) -> None:
    with Store.format(dev) as s:
        w = s.begin_generation("g1", 1)
        w.write_shard("a", [b"x" * 5000])
        w.commit()


@pytest.mark.parametrize("change", [{"version": FORMAT_VERSION + 1}, {"version": 99}, {"version": 0},
                                    {"flags": 2}, {"flags": 1 << 31}])
@pytest.mark.parametrize("readonly", [False, True])
def test_an_unknown_version_or_flag_is_refused_and_nothing_is_written(change, readonly):
    dev = MemoryDevice(GEOM)
    stored(dev)
    before = rewrite_superblock(dev, **change)
    with pytest.raises(UnsupportedFormatError) as e:
        Store.open(dev, readonly=readonly)
    what = f"version {change['version']}" if "version" in change else f"flags {change['flags']:#x}"
    assert what in str(e.value) and "nothing written" in str(e.value)
    assert snapshot(dev) == before


def test_format_refuses_to_overwrite_an_unknown_version_without_force():
    dev = MemoryDevice(GEOM)
    stored(dev)
    rewrite_superblock(dev, version=7)
    with pytest.raises(Exception, match="already holds a RetainZ store"):
        Store.format(dev)
    Store.format(dev, force=True).close()          # the explicit force


@pytest.mark.parametrize("command", [["ls"], ["fsck"], ["df"], ["put", "g2", "FILE", "--step", "2"]])
def test_the_cli_says_which_version_it_found_exit_1(tmp_path, capsys, command):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    stored(dev)
    dev.close()
    raw = bytearray(path.read_bytes())
    dev = FileDevice(path, readonly=True)
    sb = Superblock.decode(dev.read(0, 4096), dev.geometry)
    dev.close()
    start = raw.index(sb.encode()[:64])
    raw[start:start + 4096] = dataclasses.replace(sb, version=7).encode()
    path.write_bytes(raw)
    (tmp_path / "FILE").write_bytes(b"y" * 100)
    argv = [a if a != "FILE" else str(tmp_path / "FILE") for a in command]
    assert main([argv[0], str(path), *argv[1:]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format version 7" in err[0] and "reads versions 1, 2, 3" in err[0]
    assert path.read_bytes() == raw


def test_a_version_1_store_is_read_as_is_and_migrated_only_by_an_explicit_upgrade():
    """Version policy (issue 41 item 3): an older version is read as is and says so; a read-write
    open refuses it naming ``fsck --upgrade`` (nothing written); only ``upgrade`` migrates it."""
    assert 1 in READABLE_VERSIONS and FORMAT_VERSION == 6
    g = GEOM
    dev = MemoryDevice(g)
    sb = Superblock(uuid=__import__("uuid").uuid4(), sequence=1, part=0, geometry=g, meta_zones=3,
                    gc_reserve_zones=2, policy="greedy", version=1)
    dev.write(0, sb.encode() + b"".join(frame(p, g.block_size) for p in empty_snapshot()))
    dev.flush()
    before = snapshot(dev)
    with Store.open(dev, readonly=True) as s:
        assert s.format_version == 1 and s.generations() == []
        assert any("format version 1 is read as is; `retainz fsck --upgrade` migrates it to version 6" in r
                   for r in s.recovery.repairs)
    with pytest.raises(OldFormatError, match=r"format version 1 .*`retainz fsck --upgrade memory`"):
        Store.open(dev)
    assert snapshot(dev) == before
    with Store.open(dev, upgrade=True) as s:
        assert s.format_version == 6 and s.recovery.rolled and s.recovery.upgraded_from == 1
        assert "upgraded: the store from format version 1 to 6 (its journal rolled over at the new version)" \
            in s.fsck().notes                                   # what `fsck --upgrade` prints
        w = s.begin_generation("g", 1)
        w.write_shard("a", [b"z" * 100])
        w.commit()
    with Store.open(dev, readonly=True) as s:
        assert s.format_version == 6 and [g.id for g in s.generations()] == ["g"]


def test_a_version_4_store_is_read_as_is_and_its_chain_is_the_previous_chain_after_the_upgrade():
    """Format 4 (every appended record written once) is read as is; `fsck --upgrade` rolls over to
    format 6 (format 5's records written twice, and zone closes), whose appended records are written twice, and keeps the format 4 chain as the new
    snapshot's copy (the previous chain) until the next rollover."""
    g, bs = GEOM, GEOM.block_size
    dev = MemoryDevice(g)
    sb = Superblock(uuid=uuid.uuid4(), sequence=1, part=0, geometry=g, meta_zones=3, gc_reserve_zones=2,
                    policy="greedy", version=4)
    records = [*empty_snapshot(), stamp(sync_record(1, {}, [], 0), 1, (0, 0, 0))]
    dev.write(0, sb.encode() * 2 + b"".join(frame(p, bs) for p in records))
    dev.flush()
    before = snapshot(dev)
    with Store.open(dev, readonly=True) as s:
        assert s.format_version == 4 and s.generations() == []
        assert s.recovery.repairs == ["nothing: format version 4 is read as is; `retainz fsck --upgrade` migrates "
                                      "it to version 6"]
    with pytest.raises(OldFormatError, match=r"format version 4 .*`retainz fsck --upgrade memory`"):
        Store.open(dev)
    assert snapshot(dev) == before
    with Store.open(dev, upgrade=True) as s:
        assert (s.format_version, s.recovery.upgraded_from, s.journal.chain, s.journal.previous) == (6, 4, [1], [0])
        w = s.begin_generation("g", 2)
        w.write_shard("a", [b"z" * 100])
        w.commit()
    assert bytes(dev._data[0]) == before[:len(dev._data[0])]        # the format 4 chain, untouched
    new = bytes(dev._data[1])
    assert new.count(b'c {"cp":0,"q":2,') == 1 and new.count(b'c {"cp":1,"q":2,') == 1
    with Store.open(dev, readonly=True) as s:
        assert s.format_version == 6 and [x.id for x in s.generations()] == ["g"] and s.journal.previous == [0]


@pytest.mark.parametrize("version", [5, 6])
def test_a_format_5_zone_finished_on_zeros_reads_as_whole_and_format_6_calls_it_a_lost_tail(version):
    """A Full chain zone whose records stop before its capacity with zeros after them and no close
    record: how a format 5 rollover left every zone it finished (the padding is the end), and in
    format 6 a lost tail (a format 6 zone ends in a close record or in records up to its capacity).
    The same bytes under either version: version 5 is read as is (and after the upgrade its chain is
    the previous chain, still read by its own rule); version 6 is refused, naming the lost tail."""
    g, bs = GEOM, GEOM.block_size
    dev = MemoryDevice(g)
    sb = Superblock(uuid=uuid.uuid4(), sequence=1, part=0, geometry=g, meta_zones=3, gc_reserve_zones=2,
                    policy="greedy", version=version)
    records = [*empty_snapshot(), stamp(sync_record(1, {}, [], 0), 1, (0, 0, 0))]
    dev.write(0, sb.encode() * 2 + b"".join(f for p in records for f in append_frames(p, bs)))
    dev.finish_zone(0)
    dev.flush()
    if version == 6:
        with pytest.raises(CorruptJournalError, match="no close record after them: its last records are lost"):
            Store.open(dev, readonly=True)
        return
    with Store.open(dev, readonly=True) as s:
        assert s.format_version == 5 and s.generations() == [] and s.recovery.lost == []
    with Store.open(dev, upgrade=True) as s:
        assert (s.format_version, s.journal.chain, s.journal.previous) == (6, [1], [0])
        assert s.journal.previous_damage() == []
        w = s.begin_generation("g", 2)
        w.write_shard("a", [b"z" * 100])
        w.commit()
    with Store.open(dev, readonly=True) as s:
        assert [x.id for x in s.generations()] == ["g"] and s.fsck().ok


@pytest.mark.parametrize("torn", [False, True])
def test_a_read_only_open_says_an_older_version_is_read_as_is_and_why_it_would_roll(torn):
    """A version-1 journal: a read-only open says it reads it as is (and how to migrate); with a
    torn tail record as well it names the torn tail; the upgrade drops it and migrates in one roll."""
    g = GEOM
    dev = MemoryDevice(g)
    sb = Superblock(uuid=__import__("uuid").uuid4(), sequence=1, part=0, geometry=g, meta_zones=3,
                    gc_reserve_zones=2, policy="greedy", version=1)
    tail = frame(b"x " + b'{"now":1,"metrics":{},"pad":"' + b"p" * 6000 + b'"}', g.block_size)[:g.block_size]
    dev.write(0, sb.encode() + b"".join(frame(p, g.block_size) for p in empty_snapshot()) + (tail if torn else b""))
    dev.flush()
    with Store.open(dev, readonly=True) as s:
        assert s.format_version == 1 and s.recovery.torn_bytes == (g.block_size if torn else 0)
        said = ["nothing: format version 1 is read as is; `retainz fsck --upgrade` migrates it to version 6"]
        if torn:
            said.append(f"roll the journal over to a fresh chain (drop a torn tail of {g.block_size} bytes)")
        assert s.recovery.repairs == said
    with Store.open(dev, upgrade=True) as s:
        assert s.format_version == 6 and s.recovery.rolled and s.recovery.repairs == []


@pytest.mark.parametrize("change, why", [
    ({"version": 7}, "RetainZ store format version 7; this code reads versions 1, 2, 3, 4, 5, 6 (newer software wrote it?)"),
    ({"flags": 6}, "RetainZ store with unknown format flags 0x6 (format version 6)")])
def test_the_refusal_of_an_unknown_version_or_flag_names_the_zone_and_what_it_found(change, why):
    dev = MemoryDevice(GEOM)
    stored(dev)
    rewrite_superblock(dev, **change)
    for readonly in (False, True):
        with pytest.raises(UnsupportedFormatError, match=rf"^memory meta zone 0: {re.escape(why)}: nothing written$"):
            Store.open(dev, readonly=readonly)


def test_a_superblock_policy_spec_must_fit_64_bytes_of_utf8():
    sb = Superblock(uuid=uuid.UUID(int=1), sequence=1, part=0, geometry=GEOM, meta_zones=3, gc_reserve_zones=2,
                    policy="p" * 64)
    assert Superblock.decode(sb.encode(), GEOM) == sb
    with pytest.raises(ValueError, match=rf"^policy spec '{'q' * 65}' is longer than 64 bytes$"):
        dataclasses.replace(sb, policy="q" * 65).encode()
    raw = bytearray(sb.encode())
    start = bytes(raw).index(b"p" * 64)
    raw[start] = 0xFF                                    # not UTF-8, checksum made valid again
    size = start + 64
    raw[size:size + 4] = crc32c.crc32c(bytes(raw[:size])).to_bytes(4, "little")
    with pytest.raises(CorruptJournalError, match=r"^a superblock's policy name is not UTF-8 text: corrupt store$"):
        Superblock.decode(bytes(raw), GEOM)


@pytest.mark.parametrize("value, why", [
    ("", "shard name is empty or only whitespace ('')"), (" ", "shard name is empty or only whitespace (' ')"),
    ("a/b", "shard name 'a/b' contains a path separator"), ("a\\b", "shard name 'a\\\\b' contains a path separator"),
    ("..", "shard name '..' is '.' or contains '..'"), ("x..y", "shard name 'x..y' is '.' or contains '..'"),
    (".", "shard name '.' is '.' or contains '..'"),
    ("a\x00b", "shard name 'a\\x00b' contains NUL or a control character"),
    ("a\x7fb", "shard name 'a\\x7fb' contains NUL or a control character"),
    ("x" * 256, "shard name is longer than 255 bytes"), (5, "shard name must be a str, not int")])
def test_a_name_that_cannot_be_a_file_name_is_refused_saying_why(value, why):
    """Generation ids and shard names become file names (``retainz get``): the store's format
    refuses the rest, one reason each."""
    with pytest.raises(InvalidIdError, match=f"^{re.escape(why)}$"):
        check_id(value, "shard name")
    assert check_id("x" * 255, "shard name") == "x" * 255 and check_id("é" * 127) == "é" * 127
    with pytest.raises(InvalidIdError, match=r"^generation id 'a/b' contains a path separator$"):
        check_id("a/b")                                # what it names by default


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fsck_upgrade_of_a_current_store_writes_nothing(tmp_path, capsys):
    """A store and device file already current: `fsck --upgrade` checks read-only, says there is
    nothing to upgrade, and the device file's bytes are the same (no close record journaled)."""
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    stored(dev)
    dev.close()
    before = _sha(path)
    capsys.readouterr()
    assert main(["fsck", "--upgrade", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"note: nothing to upgrade: the store is already format version {FORMAT_VERSION}" in out, out
    assert "upgraded" not in out and "clean" in out
    assert _sha(path) == before
    assert main(["ls", str(path), "--json"]) == 0
    assert '"g1"' in capsys.readouterr().out


def test_fsck_upgrade_of_a_version_1_store_in_a_device_file_still_migrates_it(tmp_path, capsys):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    sb = Superblock(uuid=uuid.uuid4(), sequence=1, part=0, geometry=GEOM, meta_zones=3, gc_reserve_zones=2,
                    policy="greedy", version=1)
    dev.write(0, sb.encode() + b"".join(frame(p, GEOM.block_size) for p in empty_snapshot()))
    dev.flush()
    dev.close()
    before = _sha(path)
    capsys.readouterr()
    assert main(["fsck", "--upgrade", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: upgraded: the store from format version 1 to 6 (its journal rolled over at the new version)" \
        in out, out
    assert "nothing to upgrade" not in out and _sha(path) != before
    with Store.open(FileDevice(path, readonly=True), readonly=True) as s:
        assert s.format_version == FORMAT_VERSION


def _as_device_file_version_2(path) -> None:
    """Rewrite a version-3 device file as version 2 wrote it: both label copies say 2, no label copy
    at the end of the device."""
    from retainz.zoned.file import _LABEL, _LABEL_COPY, _LABEL_SIZE

    raw = bytearray(path.read_bytes())
    n = _LABEL.size
    label = bytes(raw[:8]) + (2).to_bytes(4, "little") + bytes(raw[12:n])
    label += crc32c.crc32c(label).to_bytes(4, "little")
    raw[:n + 4] = label
    raw[_LABEL_COPY:_LABEL_COPY + n + 4] = label
    path.write_bytes(bytes(raw[:-_LABEL_SIZE]))


def test_fsck_upgrade_migrates_a_version_2_device_file_of_a_current_store(tmp_path, capsys):
    """The store is current, the device file is not (``FileDevice.upgradable``): the read-write
    upgrade runs and gives the file its label copy at the end."""
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    stored(dev)
    dev.close()
    _as_device_file_version_2(path)
    dev = FileDevice(path, readonly=True)
    assert dev.upgradable
    dev.close()
    capsys.readouterr()
    assert main(["fsck", "--upgrade", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: upgraded: device file format 2 migrated to 3 (a label copy at the end of the device)" in out, out
    assert "nothing to upgrade" not in out
    dev = FileDevice(path, readonly=True)
    assert not dev.upgradable and dev.notes == ()
    dev.close()
    before = _sha(path)
    assert main(["fsck", "--upgrade", str(path)]) == 0      # now nothing is left to do
    assert "nothing to upgrade" in capsys.readouterr().out and _sha(path) == before
