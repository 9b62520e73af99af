"""The device CLI: create, info, zones report/ops, and the exit statuses for bad input."""

from __future__ import annotations

import json

import pytest

from retainz.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_create_info_report_and_ops(tmp_path, capsys):
    dev = str(tmp_path / "d.img")
    code, out, _ = run(capsys, "device", "create", dev, "--zones", "8", "--zone-size", "1MiB",
                       "--zone-capacity", "768KiB", "--max-open", "2", "--max-active", "3")
    assert code == 0 and "8 zones of 1 MiB" in out
    code, out, _ = run(capsys, "device", "info", dev, "--json")
    info = json.loads(out)
    assert (info["nr_zones"], info["zone_capacity"], info["max_active"]) == (8, 768 << 10, 3)
    assert run(capsys, "zones", "open", dev, "2")[0] == 0
    assert run(capsys, "zones", "finish", dev, "5")[0] == 0
    code, out, _ = run(capsys, "zones", "report", dev)
    lines = out.splitlines()
    assert len(lines) == 8
    assert lines[2] == ("Zone 00002: swr, ofst 00000002097152, len 00000001048576, cap 00000000786432, "
                        "wp 00000002097152, oe, non_seq 0, reset 0")
    assert ", fu," in lines[5] and "wp 00000006291456" in lines[5]
    code, out, _ = run(capsys, "zones", "report", dev, "-ro", "fu", "--csv")
    assert out.splitlines() == ["zone num, type, ofst, len, cap, wp, cond, non_seq, reset",
                                "00005, 2, 00000005242880, 00000001048576, 00000000786432, "
                                "00000006291456, 0xe, 0, 0"]
    code, out, _ = run(capsys, "zones", "report", dev, "--json", "--start", "5", "--count", "1")
    assert json.loads(out)[0]["cond"] == "full"
    code, _, err = run(capsys, "zones", "reset", dev, "5")     # Full: what it holds is unknown
    assert code == 2 and "zone 5 (full, 786,432 bytes written)" in err and "pass --force" in err
    assert run(capsys, "zones", "reset", dev, "5", "--force")[0] == 0
    code, out, _ = run(capsys, "zones", "report", dev, "-ro", "fu")
    assert out == ""


@pytest.mark.parametrize("zones, limit", [(4, 4), (13, 13), (14, 14), (40, 14)])
def test_create_limits_default_to_14_but_never_past_the_zone_count(tmp_path, capsys, zones, limit):
    dev = str(tmp_path / "d.img")
    code, out, _ = run(capsys, "device", "create", dev, "--zones", str(zones), "--zone-size", "64KiB")
    assert code == 0 and f"max open zones {limit}, max active {limit}" in out
    info = json.loads(run(capsys, "device", "info", dev, "--json")[1])
    assert (info["max_open"], info["max_active"]) == (limit, limit)
    code, out, _ = run(capsys, "device", "create", dev, "--zones", str(zones), "--zone-size", "64KiB",
                       "--max-open", "0", "--max-active", "3", "--force")
    info = json.loads(run(capsys, "device", "info", dev, "--json")[1])
    assert code == 0 and (info["max_open"], info["max_active"]) == (0, 3)


@pytest.mark.parametrize("argv, needle, status", [
    (["zones", "report", "/nonexistent/d.img"], "no such device file", 2),
    (["zones", "reset", "{dev}", "99"], "zone 99 does not exist", 2),
    (["zones", "close", "{dev}", "0"], "only an open zone can be closed", 1),
    (["device", "create", "{dev}", "--zones", "4", "--zone-size", "1MiB"], "exists", 2),
    (["device", "create", "{tmp}/n.img", "--zones", "4", "--zone-size", "1 furlong"], "bad size", 2),
    (["device", "create", "{tmp}/n.img", "--zones", "4", "--zone-size", "1MiB", "--zone-capacity", "2MiB"],
     "capacity", 2),
    (["zones", "report", "{foreign}"], "not a RetainZ device", 2),
    (["zones", "explode", "{dev}", "0"], "invalid choice", 2),
    (["frobnicate"], "invalid choice", 2),
    (["device", "info", "/dev/nvme9n9"], "/dev/nvme9n9: no such block device", 2),
    (["zones", "report", "zbd:{tmp}/nullb9"], "nullb9: no such block device", 2),
])
def test_bad_input_exits_with_one_clear_line(tmp_path, capsys, argv, needle, status):
    dev = tmp_path / "d.img"
    main(["device", "create", str(dev), "--zones", "4", "--zone-size", "1MiB"])
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(b"hello" * 100)
    capsys.readouterr()
    argv = [a.format(dev=dev, tmp=tmp_path, foreign=foreign) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == status
    assert needle in err
    assert len(err.strip().splitlines()) == 1, err
    assert "[Errno" not in err
    assert foreign.read_bytes() == b"hello" * 100


def test_demo_runs(tmp_path, capsys):
    code, out, _ = run(capsys, "demo", "--out", str(tmp_path / "demo"))
    assert code == 0
    assert "12 MiB still written across 16 zones (zone 0 was reset" in out


def test_a_closed_pipe_is_quiet(tmp_path):
    """`retainz zones report DEV | head -1`: no "Broken pipe" error line."""
    import subprocess
    import sys

    dev = tmp_path / "d.img"
    main(["device", "create", str(dev), "--zones", "4000", "--zone-size", "64KiB"])
    cmd = f"{sys.executable} -m retainz.cli zones report {dev} | head -1"
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert res.stdout.startswith("Zone 00000:") and len(res.stdout.splitlines()) == 1
    assert "Broken pipe" not in res.stderr, res.stderr


@pytest.mark.parametrize("op", ["reset", "finish", "open", "close"])
def test_zone_ops_refuse_a_device_holding_a_store_without_force(tmp_path, capsys, op):
    dev = str(tmp_path / "d.img")
    main(["device", "create", dev, "--zones", "8", "--zone-size", "1MiB"])
    src = tmp_path / "x.bin"
    src.write_bytes(b"z" * 5000)
    assert main(["mkfs", dev]) == 0 and main(["put", dev, "g1", str(src), "--step", "1"]) == 0
    capsys.readouterr()
    before = run(capsys, "zones", "report", dev)[1]
    for zone in ("0", "5"):   # a meta zone and a data zone: both refused
        code, _, err = run(capsys, "zones", op, dev, zone)
        assert code == 2
        assert err.startswith(f"retainz: error: {dev} holds a RetainZ store") and "retainz rm" in err
        assert len(err.strip().splitlines()) == 1, err
    assert run(capsys, "zones", "report", dev)[1] == before          # nothing changed
    code, out, _ = run(capsys, "ls", dev)
    assert code == 0 and "g1" in out
    if op == "reset":                                                  # --force does what it says
        assert run(capsys, "zones", "reset", dev, "0", "--force")[0] == 0
        # the chain is gone; the spare superblocks (format version 3) still name the store
        assert "hold spare superblocks but no zone holds a journal chain" in run(capsys, "ls", dev)[2]


def test_zone_reset_refuses_data_it_does_not_recognise_without_force(tmp_path, capsys):
    """No store superblock (e.g. one flipped bit in its magic), data in the zone: a reset would
    discard bytes RetainZ cannot account for, so it needs --force; finishing or resetting an empty
    zone needs nothing."""
    from retainz.zoned import FileDevice

    dev = str(tmp_path / "d.img")
    main(["device", "create", dev, "--zones", "8", "--zone-size", "1MiB"])
    with FileDevice(dev) as d:
        d.write(4 << 20, b"\x07" * 8192)
        d.flush()
    capsys.readouterr()
    code, _, err = run(capsys, "zones", "reset", dev, "4")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.strip() == (f"retainz: error: {dev}: zone 4 (open-implicit, 8,192 bytes written) is on a device holding "
                           "no RetainZ store: a reset discards data RetainZ does not recognise; pass --force")
    with FileDevice(dev, readonly=True) as d:
        assert d.zone(4).written == 8192 and d.read(4 << 20, 8192) == b"\x07" * 8192
    assert run(capsys, "zones", "open", dev, "6")[0] == 0            # an empty zone: nothing to lose
    assert run(capsys, "zones", "reset", dev, "6")[0] == 0
    assert run(capsys, "zones", "reset", dev, "4", "--force")[0] == 0
    with FileDevice(dev, readonly=True) as d:
        assert d.zone(4).written == 0


@pytest.mark.parametrize("kind", ["store", "foreign", "directory-file"])
def test_demo_refuses_to_overwrite_what_is_not_its_own_device(tmp_path, capsys, kind):
    out = tmp_path / "demo"
    out.mkdir()
    target = out / "zns.img"
    if kind == "store":
        main(["device", "create", str(target), "--zones", "8", "--zone-size", "1MiB"])
        main(["mkfs", str(target)])
    else:
        target.write_bytes(b"precious" * 1000)
    before = target.read_bytes()
    capsys.readouterr()
    code, _, err = run(capsys, "demo", "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("holds a RetainZ store" if kind == "store" else "is not a RetainZ device file") in err
    assert "--force" in err and target.read_bytes() == before
    assert run(capsys, "demo", "--out", str(out), "--force")[0] == 0


def test_demo_reruns_over_its_own_device(tmp_path, capsys):
    out = str(tmp_path / "demo")
    assert run(capsys, "demo", "--out", out)[0] == 0
    code, stdout, _ = run(capsys, "demo", "--out", out)
    assert code == 0 and "12 MiB still written across 16 zones" in stdout


@pytest.mark.parametrize("damage", ["label", "both-states", "truncated", "journal"])
def test_every_kind_of_damage_exits_1_with_one_line(tmp_path, capsys, damage):
    """Damage is an operation failure (1) whichever layer finds it; bad input stays 2."""
    import os

    from retainz.zoned import FileDevice
    from retainz.zoned.file import _LABEL_SIZE

    dev = tmp_path / "d.img"
    main(["device", "create", str(dev), "--zones", "16", "--zone-size", "1MiB"])
    main(["mkfs", str(dev)])
    with FileDevice(dev, readonly=True) as d:
        slot, data_offset = d._slot_size, d._data_offset
    with open(dev, "r+b") as f:
        if damage == "truncated":        # into the written meta zones (a file cut short of unwritten space opens)
            f.truncate(data_offset + (1 << 20))
        # device format 3 keeps three label copies (one at the end) and two copies of each slot; store
        # format 5 two copies of every superblock and record (the zone batch of the empty snapshot at
        # blocks 4 and 5): damage each copy
        end = os.path.getsize(dev) - _LABEL_SIZE
        for off in {"label": [20, 2048 + 20, end + 20], "both-states": [_LABEL_SIZE + k * slot + 20 for k in range(4)],
                    "truncated": [], "journal": [data_offset + 4 * 4096 + 12, data_offset + 5 * 4096 + 12]}[damage]:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x10]))
    capsys.readouterr()
    code, _, err = run(capsys, "ls", str(dev))
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert {"label": "label", "both-states": "every zone-state copy", "truncated": "shorter than its geometry",
            "journal": "fails its checksum: corrupt journal"}[damage] in err


@pytest.mark.parametrize("geometry", [("8", "1MiB"), ("16", "4MiB")])       # another geometry, and the demo's own
def test_demo_refuses_a_device_file_holding_data_it_did_not_write(tmp_path, capsys, geometry):
    """OUT/zns.img a RetainZ device file whose zones hold someone's data (no store): the demo refused
    only a store and a file that is not a device, and rewrote this one without --force (a
    fresh-user trial). Its own device (its geometry, its pattern) it still rewrites."""
    from retainz.zoned import FileDevice

    out = tmp_path / "demo"
    out.mkdir()
    target = out / "zns.img"
    zones, size = geometry
    args = ["--zone-capacity", "3MiB", "--max-open", "4", "--max-active", "6"] if size == "4MiB" else []
    assert run(capsys, "device", "create", str(target), "--zones", zones, "--zone-size", size, *args)[0] == 0
    with FileDevice(target) as d:
        d.write(0, b"precious" * 512)
        d.write(2 * d.geometry.zone_size, b"precious" * 512)
        d.flush()
    before = target.read_bytes()
    capsys.readouterr()
    code, _, err = run(capsys, "demo", "--out", str(out))
    assert code == 2
    assert err == (f"retainz: error: {target} holds data RetainZ does not recognise (2 non-empty zones, first 0); "
                   "pass --force to overwrite it, or use another --out\n")
    assert target.read_bytes() == before
    assert run(capsys, "demo", "--out", str(out), "--force")[0] == 0
    assert run(capsys, "demo", "--out", str(out))[0] == 0                 # its own device: rewritten


def test_device_create_reads_its_path_as_every_command_reads_a_device_spec(tmp_path, capsys):
    """``device create file:PATH`` makes PATH, which ``mkfs file:PATH`` and ``mkfs PATH`` then open;
    before, it made a file literally named ``file:PATH`` that no command could name (a fresh-user trial)."""
    img = tmp_path / "fx.img"
    code, out, err = run(capsys, "device", "create", f"file:{img}", "--zones", "8", "--zone-size", "1MiB")
    assert code == 0, err
    assert img.exists() and not (tmp_path / f"file:{img}").exists()
    assert run(capsys, "mkfs", f"file:{img}")[0] == 0
    assert run(capsys, "ls", str(img))[0] == 0
