"""``retainz mkfs|ls|put|get|rm|gc|fsck|df|crashtest`` and examples/lifecycle.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retainz.cli import main
from retainz.testing.crashtest import campaign
from retainz.zoned import FileDevice, open_device

ROOT = Path(__file__).resolve().parents[2]


def strict_json(text: str):
    """``json.loads`` that refuses ``Infinity``, ``-Infinity`` and ``NaN`` (not JSON, RFC 8259)."""
    def refuse(name):
        raise AssertionError(f"{name} in --json output: not JSON")
    return json.loads(text, parse_constant=refuse)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dev(tmp_path, capsys):
    path = tmp_path / "dev.img"
    assert run(capsys, "device", "create", path, "--zones", 16, "--zone-size", "256KiB",
               "--zone-capacity", "192KiB", "--max-open", 4, "--max-active", 4)[0] == 0
    return path


def test_mkfs_put_ls_get_rm_gc_fsck_df(dev, tmp_path, capsys):
    code, out, _ = run(capsys, "mkfs", dev)
    assert code == 0 and "RetainZ store" in out
    code, _, err = run(capsys, "mkfs", dev)
    assert code == 2 and "already holds a RetainZ store" in err and err.count("\n") == 1
    assert run(capsys, "mkfs", dev, "--force")[0] == 0

    a = tmp_path / "model.bin"
    a.write_bytes(os.urandom(500_000))
    b = tmp_path / "meta.json"
    b.write_text('{"step": 100}')
    assert run(capsys, "put", dev, "step-100", a, b, "--step", 100, "--reclaim-step", 300)[0] == 0
    assert run(capsys, "put", dev, "step-200", a, "--step", 200, "--permanent")[0] == 0

    code, out, _ = run(capsys, "ls", dev, "--json")
    gens = strict_json(out)
    assert [g["id"] for g in gens] == ["step-100", "step-200"]
    assert gens[0]["shards"][0]["size"] == 500_000 and gens[0]["reclaim_step"] == 300
    assert gens[1]["reclaim_step"] == "inf"          # permanent: the trace format's "inf", never Infinity
    code, out, _ = run(capsys, "ls", dev, "-l")
    assert "step-100\tstep 100" in out and "model.bin\t500000 B" in out

    outdir = tmp_path / "out"
    assert run(capsys, "get", dev, "step-100", "-o", outdir)[0] == 0
    assert (outdir / "model.bin").read_bytes() == a.read_bytes()
    assert (outdir / "meta.json").read_text() == '{"step": 100}'
    code, out, _ = run(capsys, "get", dev, "step-100", "meta.json", "-o", "-")
    assert out == '{"step": 100}'

    code, out, _ = run(capsys, "df", dev)
    assert code == 0 and out.splitlines()[0].startswith("Free: ") and "Space amplification: 0%" in out
    assert run(capsys, "rm", dev, "step-100", "--step", 300)[0] == 0
    code, out, _ = run(capsys, "df", dev, "--json")
    d = strict_json(out)
    assert d["generations"] == 1 and d["used"] >= 500_000 and d["metrics"]["generations_deleted"] == 1
    code, out, _ = run(capsys, "gc", dev, "--force", "--json")
    assert code == 0 and "victims" in strict_json(out)
    code, out, _ = run(capsys, "fsck", dev, "--json")
    rep = strict_json(out)
    assert code == 0 and rep["ok"] and rep["bytes_verified"] == 500_000


def test_bad_input_exits_2_with_one_line(dev, tmp_path, capsys):
    run(capsys, "mkfs", dev)
    f = tmp_path / "x.bin"
    f.write_bytes(b"x")
    for argv, needle in [
        (("put", dev, "../evil", f, "--step", 1), "contains '..'"),
        (("put", dev, "a/b", f, "--step", 1), "path separator"),
        (("put", dev, " ", f, "--step", 1), "only whitespace"),
        (("put", dev, "g", tmp_path / "missing", "--step", 1), "no such file"),
        (("put", dev, "g", f, "--step", -1), "--step"),
        (("get", dev, "nope"), "no committed generation"),
        (("rm", dev, "nope"), "no committed generation"),
        (("ls", tmp_path / "nodev.img"), "no such device file"),
        (("crashtest", "mem:zones=12", "--workload", "nope"), "unknown workload"),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert needle in err and err.count("\n") == 1, (argv, err)
    assert json.loads(run(capsys, "ls", dev, "--json")[1]) == []     # nothing was committed


def test_open_store_in_another_process_is_refused(dev, capsys):
    run(capsys, "mkfs", dev)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from retainz.zoned import FileDevice; d = FileDevice(sys.argv[1]); "
        "print('ready', flush=True); time.sleep(30)"), str(dev)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        code, _, err = run(capsys, "ls", dev)
        assert code == 1 and "open in another process" in err
    finally:
        holder.kill()
        holder.wait()


def test_crashtest_reports_points_and_exits_0(capsys):
    code, out, _ = run(capsys, "crashtest", "mem:zones=12,zone_size=64K,zone_capacity=48K,max_open=3,"
                       "max_active=4", "--workload", "basic", "--json")
    rep = strict_json(out)[0]
    assert code == 0 and rep["failures"] == [] and rep["points"] > 2 * rep["write_boundaries"] > 30
    assert rep["states"]["all kept"] == rep["states"]["none kept"] == rep["write_boundaries"]
    assert rep["generations_recovered"] > 0 and rep["bytes_verified"] > 0
    assert {"commit-record", "shard-data"} <= set(rep["classes"])


def test_crashtest_exits_1_on_a_failure(capsys, monkeypatch):
    from retainz.testing import crashtest

    real = crashtest.campaign

    def broken(*a, **kw):
        rep = real(*a, **kw)
        rep.failures.append("cut at write 1: AssertionError: injected")
        return rep

    monkeypatch.setattr(crashtest, "campaign", broken)
    code, out, _ = run(capsys, "crashtest", "mem:zones=12,zone_size=64K,zone_capacity=48K", "--workload",
                       "basic", "--max-points", 2)
    points = real("basic", 0, geometry=open_device("mem:zones=12,zone_size=64K,zone_capacity=48K").geometry,
                  points=[1, 2]).points
    assert code == 1 and "FAIL cut at write 1" in out and f"{points} crash points tried" in out


def test_crashtest_on_a_device_file(tmp_path, capsys):
    path = tmp_path / "scratch.img"
    run(capsys, "device", "create", path, "--zones", 12, "--zone-size", "64KiB", "--zone-capacity", "48KiB",
        "--max-open", 3, "--max-active", 4)
    code, out, _ = run(capsys, "crashtest", path, "--workload", "basic", "--max-points", 3)
    with FileDevice(str(path)) as dev:
        geometry = dev.geometry
    points = campaign("basic", 0, geometry=geometry, points=[1, 2, 3]).points
    assert code == 0 and f"{points} crash points tried" in out and "0 failures" in out


def test_lifecycle_example_runs():
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "lifecycle.py")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "read back step-300: 2 shards" in res.stdout and res.stdout.rstrip().endswith("done")


def test_get_of_a_corrupt_shard_fails_as_an_operation_and_leaves_no_partial_file(dev, tmp_path, capsys):
    from retainz.store import Store
    from retainz.zoned import FileDevice

    run(capsys, "mkfs", dev)
    a = tmp_path / "model.bin"
    a.write_bytes(os.urandom(300_000))
    assert run(capsys, "put", dev, "g1", a, "--step", 1)[0] == 0
    with FileDevice(dev, readonly=True) as fdev, Store.open(fdev, readonly=True) as store:
        z, off, _, _ = store.generation("g1").shards["model.bin"].extents[0]
        data_offset = fdev._data_offset + z * fdev.geometry.zone_size + off
    with open(dev, "r+b") as f:  # flip one bit of the first extent on the media
        f.seek(data_offset + 100)
        b = f.read(1)
        f.seek(data_offset + 100)
        f.write(bytes([b[0] ^ 0x04]))
    out = tmp_path / "got"
    code, _, err = run(capsys, "get", dev, "g1", "--out", out)
    assert code == 1 and "crc32c" in err and err.count("\n") == 1, err
    assert not any(p.name.endswith(".part") for p in out.iterdir())


def test_every_json_output_is_strict_json(dev, tmp_path, capsys):
    """Every --json output of the store and device commands parses without Infinity/NaN, a permanent
    generation included (its reclaim step is the string "inf")."""
    run(capsys, "mkfs", dev)
    f = tmp_path / "p.bin"
    f.write_bytes(os.urandom(70_000))
    assert run(capsys, "put", dev, "perm", f, "--step", 5, "--permanent")[0] == 0
    for argv in (("ls", dev, "--json"), ("df", dev, "--json"), ("fsck", dev, "--json"),
                 ("gc", dev, "--json"), ("device", "info", dev, "--json"), ("zones", "report", dev, "--json"),
                 ("crashtest", "mem:zones=12,zone_size=64K,zone_capacity=48K", "--max-points", 3, "--json")):
        code, out, err = run(capsys, *argv)
        assert code == 0, (argv, err)
        strict_json(out)


def test_print_json_turns_non_finite_floats_into_json_values(capsys):
    from retainz.cli import print_json

    print_json({"a": float("inf"), "b": [float("-inf"), float("nan"), 1.5], "c": (2, None)})
    assert strict_json(capsys.readouterr().out) == {"a": "inf", "b": ["-inf", None, 1.5], "c": [2, None]}


def test_df_reports_mib_rounded_not_truncated(dev, tmp_path, capsys):
    run(capsys, "mkfs", dev)
    f = tmp_path / "m.bin"
    f.write_bytes(os.urandom(1_250_000))                  # 1.19 MiB: truncated to whole "MB" it read 1
    assert run(capsys, "put", dev, "g", f, "--step", 1)[0] == 0
    code, out, _ = run(capsys, "df", dev)
    d = strict_json(run(capsys, "df", dev, "--json")[1])
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["Used"] == f"{d['used'] / 2**20:,.2f} MiB" and 1.19 <= float(lines["Used"][:-4]) < 1.3
    assert lines["Free"] == f"{d['free'] / 2**20:,.2f} MiB"
    assert "1 generation;" in out


def test_counts_of_one_are_singular(dev, tmp_path, capsys):
    run(capsys, "mkfs", dev)
    f = tmp_path / "m.bin"
    f.write_bytes(b"x" * 1000)
    code, out, _ = run(capsys, "put", dev, "g", f, "--step", 1)
    assert out == "g: 1 shard, 1000 B committed at step 1\n"
    code, out, _ = run(capsys, "ls", dev, "-l")
    assert "\t1 shard\t" in out and "\t1 extent\n" in out and "shards" not in out
    code, out, _ = run(capsys, "fsck", dev)
    assert out.startswith("fsck: 1 generation, 1 shard, 1 extent, ")


def test_crashtest_leaves_its_file_scratch_device_empty_and_refuses_negative_points(tmp_path, capsys):
    from retainz.cli import main
    from retainz.zoned import FileDevice, Geometry

    path = tmp_path / "scratch.img"
    FileDevice.create(path, Geometry(nr_zones=12, zone_size=64 * 1024, zone_capacity=48 * 1024,
                                     max_open=3, max_active=4)).close()
    for _ in range(2):                      # the second run finds the device empty again
        assert main(["crashtest", str(path), "--workload", "basic", "--max-points", "2"]) == 0
    with FileDevice(path, readonly=True) as dev:
        assert all(z.cond.name == "EMPTY" for z in dev.report_zones())
    capsys.readouterr()
    assert main(["crashtest", str(path), "--workload", "basic", "--max-points", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-points must be >= 0" in err[0]


def test_put_replace_swaps_a_generation_at_its_commit(tmp_path, capsys):
    from retainz.cli import main
    from retainz.zoned import FileDevice, Geometry

    path = tmp_path / "dev.img"
    FileDevice.create(path, Geometry(nr_zones=12, zone_size=1 << 20, zone_capacity=1 << 20)).close()
    assert main(["mkfs", str(path)]) == 0
    a, b = tmp_path / "a" / "model.bin", tmp_path / "b" / "model.bin"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_bytes(b"old" * 1000)
    b.write_bytes(b"new" * 2000)
    assert main(["put", str(path), "last", str(a), "--step", "1"]) == 0
    capsys.readouterr()
    assert main(["put", str(path), "last", str(b), "--step", "2"]) == 2      # the id exists: bad input
    assert "retainz put --replace" in capsys.readouterr().err
    assert main(["put", str(path), "last", str(b), "--step", "2", "--replace"]) == 0
    out = tmp_path / "got"
    assert main(["get", str(path), "last", "-o", str(out)]) == 0
    assert (out / "model.bin").read_bytes() == b"new" * 2000


def test_fsck_notes_a_zone_state_copy_that_fails_its_checksum(tmp_path, capsys):
    """The store is intact through the older copy (clean, exit 0), and fsck says the newer one is
    bad rather than staying silent about lost redundancy."""
    from retainz.cli import main
    from retainz.zoned import FileDevice
    from retainz.zoned.file import _LABEL_SIZE

    dev = str(tmp_path / "d.img")
    src = tmp_path / "a.bin"
    src.write_bytes(bytes(range(256)) * 400)
    assert main(["device", "create", dev, "--zones", "16", "--zone-size", "1MiB"]) == 0
    assert main(["mkfs", dev]) == 0 and main(["put", dev, "g1", str(src), "--step", "1"]) == 0
    with FileDevice(dev, readonly=True) as d:
        seq, slot = d._seq, d._slot_size
    with open(dev, "r+b") as f:
        off = _LABEL_SIZE + (seq % 2) * 2 * slot + 20   # the newest slot's first copy (A or B)
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))
    capsys.readouterr()
    assert main(["fsck", dev]) == 0
    out = capsys.readouterr().out.splitlines()
    # device format 2: its twin holds the same, newest state (format 1 fell back to sequence seq - 1)
    assert out[1] == (f"  note: zone-state copy {'AB'[seq % 2]} is damaged; its twin {'AB'[seq % 2]}', sequence "
                      f"{seq}, was used (fsck --repair rewrites it)")
    assert out[-1] == "clean"
    assert main(["fsck", dev, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["notes"]) == 1


def test_ls_tells_permanent_from_not_retired_in_this_run(tmp_path, capsys):
    """A save no rule retires is `permanent`; one a rule would retire after the run's last save
    (the last k of keep-latest-k: reclaim step inf) is `not in this run`; the condition is shown."""
    import math

    from retainz.cli import main
    from retainz.hint import Hint
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry

    dev = tmp_path / "d.img"
    cond = "after_newer:k=2,of_class=interval,timing=after_commit"
    with FileDevice.create(dev, Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)) as d:
        s = Store.format(d)
        for gid, hint in (("a", Hint(reclaim_step=math.inf)), ("b", Hint(reclaim_step=math.inf, condition=cond)),
                          ("c", Hint(reclaim_step=9, condition=cond)), ("d", Hint())):
            w = s.begin_generation(gid, 5, hint=hint)
            w.write_shard("x", [b"1" * 100])
            w.commit()
        s.close()
    capsys.readouterr()
    assert main(["ls", str(dev)]) == 0
    cols = [line.split("\t")[-1] for line in capsys.readouterr().out.splitlines()]
    assert cols == ["reclaim permanent", f"reclaim not in this run ({cond})", f"reclaim 9 ({cond})", "reclaim -"]


def test_get_that_cannot_replace_the_target_leaves_no_partial_file(dev, tmp_path, capsys):
    """The rename onto an existing target refused (here: the target is a non-empty directory):
    one error line, the .part file removed, the target untouched."""
    run(capsys, "mkfs", dev)
    a = tmp_path / "model.bin"
    a.write_bytes(os.urandom(50_000))
    assert run(capsys, "put", dev, "g1", a, "--step", 1)[0] == 0
    out = tmp_path / "got"
    (out / "model.bin").mkdir(parents=True)
    (out / "model.bin" / "keep").write_text("mine")
    code, _, err = run(capsys, "get", dev, "g1", "--out", out)
    assert code == 2 and err.count("\n") == 1 and "model.bin" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["model.bin"]
    assert (out / "model.bin" / "keep").read_text() == "mine"


def test_fsck_json_reports_damage_that_stops_the_mount(tmp_path, capsys):
    """A flipped bit in both copies of a journal record stops the mount; `fsck --json` still prints
    a report."""
    from retainz.cli import main
    from retainz.zoned import FileDevice

    dev = str(tmp_path / "d.img")
    assert main(["device", "create", dev, "--zones", "16", "--zone-size", "1MiB"]) == 0
    assert main(["mkfs", dev]) == 0
    with FileDevice(dev, readonly=True) as d:
        off = d._data_offset + 4 * 4096 + 12       # the empty snapshot's zone batch, after 2 superblock
        #                                            copies and the snapshot head's 2 copies
    with open(dev, "r+b") as f:
        for at in (off, off + 4096):               # both its copies (format 5 writes it twice)
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x10]))
    capsys.readouterr()
    assert main(["fsck", dev, "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is False and rep["mounted"] is False
    hint = f"; run `retainz fsck --repair {dev}` to repair it"     # the way out (issue 41 item 2)
    assert len(rep["problems"]) == 1 and rep["problems"][0].startswith(
        "meta zone 0: record at byte 16384 (18 bytes) fails its checksum: corrupt journal" + hint)
    assert main(["fsck", dev]) == 1                 # the text form: the one error line
    err = capsys.readouterr().err.strip()
    assert "fails its checksum: corrupt journal" + hint in err and len(err.splitlines()) == 1


def test_mkfs_formats_with_retainz_unless_another_policy_is_named_and_df_shows_the_one_kept(dev, capsys):
    """Issue 40: every way in uses lifetime-aware placement by default; a store formatted with
    another policy keeps it (the superblock's), and df says which."""
    code, out, _ = run(capsys, "mkfs", dev)
    assert code == 0 and out.splitlines()[0].endswith("policy retainz")
    code, out, _ = run(capsys, "df", dev)
    assert code == 0 and "Policy: retainz" in out.splitlines()
    assert run(capsys, "mkfs", dev, "--force", "--policy", "greedy")[0] == 0
    code, out, _ = run(capsys, "df", dev, "--json")
    assert code == 0 and strict_json(out)["policy"] == "greedy"
    code, out, _ = run(capsys, "df", dev)
    assert "Policy: greedy" in out.splitlines()


def test_a_device_file_the_integrations_format_for_themselves_gets_retainz_and_keeps_a_named_one(tmp_path):
    """The DCP writer's and retainz://'s own device (``retainz.jobs.stores.using``, no torch needed)."""
    from retainz.jobs.stores import using
    from retainz.zoned import Geometry

    geo = Geometry(nr_zones=16, zone_size=256 << 10, zone_capacity=192 << 10)
    with using(str(tmp_path / "a.img"), geometry=geo) as store:
        assert store.policy == "retainz"
    with using(str(tmp_path / "b.img"), geometry=geo, policy="greedy") as store:
        assert store.policy == "greedy"
    with using(str(tmp_path / "b.img")) as store:          # reopened: the recorded policy
        assert store.policy == "greedy"


def test_plain_gc_says_what_it_left_and_what_to_run(dev, tmp_path, capsys):
    """Issue 44.3: after ``rm``, ``df`` showed reclaimable space and a plain ``gc`` collected nothing
    without a word.  It now names what it left (zones, bytes), why (the GC reserve, with its flag) and
    what to run (``gc --force``, with the live bytes it would copy); ``--force`` then takes exactly that."""
    assert run(capsys, "mkfs", dev)[0] == 0
    f = tmp_path / "a.bin"
    f.write_bytes(os.urandom(256 * 1024))                  # 256 KiB saves straddle 192 KiB zones
    for i in range(3):
        assert run(capsys, "put", dev, f"g{i}", f, "--step", i)[0] == 0
    assert run(capsys, "rm", dev, "g1")[0] == 0
    reclaimable = strict_json(run(capsys, "df", dev, "--json")[1])["reclaimable"]
    code, out, err = run(capsys, "gc", dev)
    assert code == 0 and err == ""
    summary, left = out.splitlines()
    assert summary == "GC: 0 zones collected [], 0 extents (0 B) moved, 0 zones reset"
    rep = strict_json(run(capsys, "gc", dev, "--json")[1])
    assert rep["held_back_reclaimable"] == reclaimable > 0 and rep["empty_zones"] >= 2
    zones = ", ".join(map(str, sorted(rep["held_back"])))   # text: zone order; --json: the order a forced pass takes
    assert left == (f"  left: {reclaimable // 1024} KiB reclaimable in full zone{'s' if ',' in zones else ''} "
                    f"{zones}: GC collects only while fewer than 2 data zones are empty (the GC reserve), and "
                    f"{rep['empty_zones']} are (mkfs --gc-reserve); `retainz gc --force` collects it now, copying "
                    f"{rep['held_back_live'] // 1024} KiB of live data")
    code, out, _ = run(capsys, "gc", dev, "--force", "--json")
    forced = strict_json(out)
    assert code == 0 and forced["victims"] == rep["held_back"] and forced["bytes_copied"] == rep["held_back_live"]
    assert strict_json(run(capsys, "df", dev, "--json")[1])["reclaimable"] == 0
    assert run(capsys, "gc", dev)[1] == "GC: 0 zones collected [], 0 extents (0 B) moved, 0 zones reset\n"
