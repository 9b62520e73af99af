"""Bad input across commands: one line on stderr naming the problem, exit 2 for bad input and 1 for
an operation failure, no traceback, nothing left behind (the new-user trial's findings)."""

from __future__ import annotations

import errno
import os

import pytest

from retainz.cli import main
from retainz.trace.generate import write_generated
from retainz.zoned import FileDevice, Geometry
from retainz.zoned.model import MAX_DEVICE_BYTES, MAX_ZONE_LIMIT, MAX_ZONES

BINARY = bytes(range(256)) * 4   # not UTF-8: 0x80 is a continuation byte


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "[Errno" not in err, err
    return err


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "tt.jsonl"
    write_generated(str(path), "smollm2-135m-dcp", "hf:save_steps=100", 1000)
    return path


@pytest.mark.parametrize("argv, needle", [
    (["device", "info", "mem:zones=99999999999,zone_size=1GiB"], f"exceeds the limit of {MAX_ZONES:,} zones"),
    (["device", "info", f"mem:zones={MAX_ZONES + 1}"], f"zone count {MAX_ZONES + 1:,} exceeds"),
    (["device", "info", "mem:zones=abc"], "zones='abc' is not an integer"),
    (["device", "info", "mem:max_open=1.5"], "max_open='1.5' is not an integer"),
    (["device", "info", "mem:zone_size=big"], "zone_size='big' is not a size"),
    (["device", "create", "{tmp}/c.img", "--zones", "100000000", "--zone-size", "1TiB"],
     "zone count 100,000,000 exceeds"),
    # sizes beyond the on-disk fields (the device label, the superblock, NVMe's MOR/MAR): one line, not a
    # struct.error traceback, on every command that takes a geometry
    (["device", "create", "{tmp}/c.img", "--zones", "4", "--zone-size", str(1 << 70)],
     f"4 zones of {1 << 70} bytes exceed the largest device, {(1 << 63) - 1} bytes"),
    (["device", "create", "{tmp}/c.img", "--zones", "2", "--zone-size", str(1 << 62)], "exceed the largest device"),
    (["device", "create", "{tmp}/c.img", "--zones", "4", "--zone-size", "4MiB", "--max-open", str(1 << 32),
      "--max-active", str(1 << 32)], "max open/active zones cannot exceed 4294967295"),
    (["device", "info", f"mem:zones=4,zone_size={1 << 70}"], "exceed the largest device"),
    (["replay", "{trace}", "--zones", "10", "--zone-size", str(1 << 70)], "exceed the largest device"),
    (["crashtest", f"mem:zones=12,zone_size={1 << 70}", "--workload", "basic"], "exceed the largest device"),
    (["replay", "{trace}", "--pressure", "0.9", "--zone-size", "0"], "zone size must be a positive"),
    (["replay", "{trace}", "--zones", "100000000"], "--zones 100,000,000 is over the limit of 1,048,576 data zones"),
    (["device", "create", "{tmp}", "--zones", "4", "--zone-size", "4MiB"], "{tmp}: a directory, not a device file"),
    (["device", "create", "{tmp}", "--zones", "4", "--zone-size", "4MiB", "--force"], "a directory, not a device file"),
    (["device", "create", "{tmp}/new.img/", "--zones", "4", "--zone-size", "4MiB"],
     "{tmp}/new.img/: a path ending in '/' names a directory, not a device file (drop the '/')"),
    (["device", "create", "mem:zones=4", "--zones", "4", "--zone-size", "4MiB"],
     "mem:zones=4 names a mem device, not a device file: `retainz device create` makes device files only"),
    (["device", "create", "zbd:/dev/nullb0", "--zones", "4", "--zone-size", "4MiB"], "names a zbd device"),
    (["replay", "{trace}", "--pressure", "0.9", "--zone-capacity", "0"], "zone capacity must be a positive"),
    # every refusal names the flag in the CLI's words, never a configuration field (write_bandwidth)
    (["replay", "{trace}", "--pressure", "0.9", "--write-bandwidth", "0"],
     "argument --write-bandwidth: '0' is zero: give a positive size"),
    (["replay", "{trace}", "--pressure", "0.9", "--write-bandwidth", "1MiB", "--write-unit", "0"],
     "argument --write-unit: '0' is zero"),
    (["replay", "{trace}", "--pressure", "0.9", "--promote-bandwidth", "0"], "argument --promote-bandwidth: '0' is zero"),
    (["replay", "{trace}", "--pressure", "0.9", "--write-unit", "1MiB"], "--write-unit needs --write-bandwidth"),
    (["replay", "{trace}", "--pressure", "0.9", "--write-bandwidth", "1MiB", "--write-unit", "5000"],
     "--write-unit 4.88 KiB = 5 kB = 5,000 B is not a multiple of the block size (4096 B); round it to 4,096 or 8,192 B"),
    (["device", "create", "{tmp}/c.img", "--zones", "-5", "--zone-size", "4MiB"], "argument --zones: -5 is under 1"),
    (["device", "create", "{tmp}/c.img", "--zones", "4", "--zone-size", "4MiB", "--max-active", "-1"],
     "argument --max-active: -1 is negative"),
    (["device", "create", "{tmp}/c.img", "--zones", "4", "--zone-size", "4MiB", "--max-open", "-1"],
     "argument --max-open: -1 is negative"),
    # a size under one block: the advice is the one block, never 0
    (["device", "create", "{tmp}/c.img", "--zones", "4", "--zone-size", "100"], "round it to 4,096 B"),
])
def test_out_of_range_numbers_are_refused_up_front(tmp_path, trace, capsys, argv, needle):
    argv = [a.format(tmp=tmp_path, trace=trace) for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert needle.format(tmp=tmp_path) in one_line(err)
    assert not (tmp_path / "c.img").exists()


def test_the_zone_limit_is_the_geometry_limit_and_the_limit_itself_is_accepted():
    assert Geometry(nr_zones=MAX_ZONES, zone_size=4096, zone_capacity=4096).nr_zones == MAX_ZONES
    with pytest.raises(ValueError, match="exceeds the limit"):
        Geometry(nr_zones=MAX_ZONES + 1, zone_size=4096, zone_capacity=4096)
    # the largest device and zone limits are accepted, one more is not
    biggest = (MAX_DEVICE_BYTES // 4) // 4096 * 4096
    assert Geometry(nr_zones=4, zone_size=biggest, zone_capacity=4096).size == 4 * biggest <= MAX_DEVICE_BYTES
    with pytest.raises(ValueError, match="exceed the largest device"):
        Geometry(nr_zones=4, zone_size=biggest + 4096, zone_capacity=4096)
    assert Geometry(nr_zones=4, zone_size=4096, zone_capacity=4096, max_open=MAX_ZONE_LIMIT,
                    max_active=MAX_ZONE_LIMIT).max_active == (1 << 32) - 1
    for field in ("max_open", "max_active"):
        with pytest.raises(ValueError, match="cannot exceed 4294967295"):
            Geometry(nr_zones=4, zone_size=4096, zone_capacity=4096, **{field: 1 << 32})


@pytest.mark.parametrize("exc", [MemoryError(), OverflowError("Python int too large to convert to C long")])
def test_memory_and_overflow_errors_become_one_line_status_1(tmp_path, capsys, monkeypatch, exc):
    def boom(*a, **k):
        raise exc
    monkeypatch.setattr("retainz.cli.trace.write_generated", boom)
    code, _, err = run(capsys, "trace", "generate", "--layout", "smollm2-135m-dcp", "--retention",
                       "hf:save_steps=1", "--steps", "99999999999", "-o", tmp_path / "g.jsonl")
    assert code == 1
    assert "too large" in one_line(err)


@pytest.mark.parametrize("failure", [OSError(errno.EFBIG, "File too large"),
                                     OverflowError("signed integer is greater than maximum")])
def test_a_failed_create_names_the_file_and_removes_only_what_it_made(tmp_path, capsys, monkeypatch,
                                                                     failure):
    def fail(fd, length):
        raise failure
    monkeypatch.setattr(os, "ftruncate", fail)
    path = tmp_path / "c.img"
    code, _, err = run(capsys, "device", "create", path, "--zones", "100000", "--zone-size", "1GiB")
    assert code == 1
    assert f"cannot create device file {path} of " in one_line(err)
    assert not path.exists()                   # the retry is not refused with "exists; pass --force"
    old = tmp_path / "old.img"
    old.write_bytes(b"x" * 10)
    code, _, err = run(capsys, "device", "create", old, "--zones", "4", "--zone-size", "1MiB", "--force")
    assert code == 1 and str(old) in one_line(err)
    assert old.exists()                        # a file that existed before is never removed
    monkeypatch.undo()
    code, out, _ = run(capsys, "device", "create", path, "--zones", "4", "--zone-size", "1MiB")
    assert code == 0 and FileDevice(path).geometry.nr_zones == 4


def test_put_of_something_that_is_not_a_regular_file(tmp_path, capsys):
    dev = tmp_path / "dev.img"
    run(capsys, "device", "create", dev, "--zones", "8", "--zone-size", "1MiB")
    run(capsys, "mkfs", dev)
    code, _, err = run(capsys, "put", dev, "x", tmp_path, "--step", 1)
    assert code == 2
    assert f"{tmp_path}: not a regular file but a directory" in one_line(err)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "put", dev, "x", fifo, "--step", 1)
    assert code == 2 and f"{fifo}: not a regular file but a FIFO" in one_line(err)
    code, _, err = run(capsys, "put", dev, "x", "/dev/null", "--step", 1)
    assert code == 2 and "/dev/null: not a regular file but a character device" in one_line(err)
    code, _, err = run(capsys, "put", dev, "x", tmp_path / "missing", "--step", 1)
    assert code == 2 and "missing: no such file" in one_line(err)


def test_run_of_a_binary_file_names_it(tmp_path, capsys):
    manifest = tmp_path / "m.json"
    manifest.write_bytes(BINARY)
    code, _, err = run(capsys, "run", manifest)
    assert code == 2
    assert f"{manifest}: not a JSON manifest: byte 0x80 is not UTF-8" in one_line(err)


def test_verify_and_analyze_of_a_binary_record_name_it(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r.json").write_bytes(BINARY)
    code, out, err = run(capsys, "verify", runs)
    assert code == 1
    assert "r.json: not a JSON run record: byte 0x80 is not UTF-8" in out + err
    assert "codec" not in out + err
    code, _, err = run(capsys, "analyze", runs, "--out", tmp_path / "an")
    assert code == 2
    assert f"{runs / 'r.json'}: not a JSON run record: byte 0x80" in one_line(err)


def test_analyze_refuses_to_write_into_the_records_folder(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.chdir(runs)
    for out in (runs, ".", f"../{runs.name}"):
        code, _, err = run(capsys, "analyze", runs, "--out", out)
        assert code == 2
        assert f"--out {out}: is the records folder itself" in one_line(err)
    assert os.listdir(runs) == []
    other = tmp_path / "other"                      # another records folder
    other.mkdir()
    (other / "pressure-retainz-0123456789ab.json").write_text("{}")
    code, _, err = run(capsys, "analyze", runs, "--out", other)
    assert code == 2 and f"--out {other}: holds 1 other JSON files" in one_line(err)
    code, _, err = run(capsys, "analyze", runs, "--out", other / "pressure-retainz-0123456789ab.json")
    assert code == 2 and "not a directory" in one_line(err)
    assert sorted(os.listdir(other)) == ["pressure-retainz-0123456789ab.json"]
    code, _, err = run(capsys, "analyze", runs, "--out", tmp_path / "a", "--check", "--expected", tmp_path / "no.json")
    assert code == 2 and f"{tmp_path / 'no.json'}: no such expected-claims file" in one_line(err)
    for text in ("not json", "{}", "[1]", '{"claims": [1]}', '{"claims": [{"id": "x"}]}'):
        (tmp_path / "bad.json").write_text(text)
        code, _, err = run(capsys, "analyze", runs, "--out", tmp_path / "a", "--check", "--expected",
                           tmp_path / "bad.json")
        assert code == 2 and f"{tmp_path / 'bad.json'}: not an expected-claims file" in one_line(err), text
    code, _, err = run(capsys, "analyze", runs, "--out", tmp_path / "a", "--write-expected", "--expected",
                       runs / "exp.json")
    assert code == 2 and f"--expected {runs / 'exp.json'}: is in the records folder" in one_line(err)
    assert not (tmp_path / "a").exists() and os.listdir(runs) == []    # refused before anything is written


@pytest.mark.parametrize("text", ["{}", "[1, 2]", '{"status": "ok"}', '"x"', "null"])
def test_analyze_refuses_json_that_is_not_a_run_record(tmp_path, capsys, text):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r.json").write_text(text)
    code, _, err = run(capsys, "analyze", runs, "--out", tmp_path / "an")
    assert code == 2
    assert f"{runs / 'r.json'}: not a run record" in one_line(err)


def test_trace_generate_refuses_a_run_of_more_than_ten_million_saves_up_front(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    code, _, err = run(capsys, "trace", "generate", "--layout", "smollm2-135m-dcp", "--retention",
                       "torchtitan:interval=1", "--steps", "100000000000", "-o", out)
    assert code == 2 and "would plan 100,000,000,000 saves; at most 10,000,000" in one_line(err)
    assert not out.exists()


@pytest.fixture
def small_device(tmp_path):
    path = tmp_path / "d.img"
    FileDevice.create(path, Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)).close()
    return path


@pytest.mark.parametrize("argv, needle", [
    (["zones", "report", "{dev}", "--count", "-1"], "argument --count: -1 is negative"),
    (["zones", "report", "{dev}", "--start", "x"], "argument --start: 'x' is not an integer"),
    (["zones", "report", "{dev}", "--start", "16"], "zone 16 does not exist: the device has zones 0..15"),
    (["zones", "report", "{dev}", "--start", "10", "--count", "7"], "zones 10..16 run past the last zone 15"),
    (["zones", "reset", "{dev}", "16"], "zone 16 does not exist: the device has zones 0..15"),
    (["zones", "finish", "{dev}", "-2"], "argument zone: -2 is negative"),
    (["mkfs", "file:"], "bad device spec 'file:': no path after file:"),
    (["mkfs", "mem:zones=16,zone_size=1MiB"], "mem:zones=16,zone_size=1MiB: an in-memory device lives only for "
                                             "one command, so no store can be kept on it"),
    (["ls", "mem:zones=16"], "an in-memory device lives only for one command"),
    (["mkfs", "fdp:zones=16,max_active=4,max_open=4"], "fdp:zones=16,max_active=4,max_open=4: an in-memory device "
                                                      "lives only for one command"),
    (["device", "info", "fdp:zones=16,spare=2"], "spare factor must be in (0, 1), got 2.0"),
    (["run", "experiments/quick.json", "-o", "{dev}"], "not a directory (--output names the records folder)"),
    (["ls", "file:"], "bad device spec 'file:': no path after file:"),
])
def test_zone_numbers_outside_the_device_are_bad_input(small_device, capsys, argv, needle):
    """A zone index or count the user typed wrong is exit 2 (bad input), like every other bad argument,
    not 1 (a device failure)."""
    code, out, err = run(capsys, *[a.format(dev=small_device) for a in argv])
    assert (code, out) == (2, "")
    assert needle in one_line(err)


def test_operating_system_errors_on_a_path_read_like_coreutils(tmp_path, small_device, capsys):
    """``PATH: reason``, never Python's ``[Errno 21] Is a directory: 'PATH'``."""
    code, _, err = run(capsys, "ls", tmp_path)
    assert code == 2 and one_line(err).startswith(f"retainz: error: {tmp_path}: a directory, not a device file")
    assert run(capsys, "mkfs", small_device)[0] == 0
    (tmp_path / "f.txt").write_text("x")
    assert run(capsys, "put", small_device, "g1", tmp_path / "f.txt", "--step", "1")[0] == 0
    code, _, err = run(capsys, "get", small_device, "g1", "-o", tmp_path / "f.txt")
    assert code == 2
    assert f"{tmp_path}/f.txt: not a directory (-o names the output directory" in one_line(err)
    assert (tmp_path / "f.txt").read_text() == "x"                 # nothing was written over it


def test_a_binary_line_deep_in_a_trace_is_blamed_on_its_own_line(tmp_path, capsys):
    """The bad byte is on line 120, after the first 8 KiB a text-mode reader decodes at once."""
    trace = tmp_path / "long.jsonl"
    write_generated(str(trace), "smollm2-135m-dcp", "hf:save_steps=100", 20000)
    lines = trace.read_bytes().splitlines(keepends=True)
    assert len(lines) > 120 and len(b"".join(lines[:119])) > 8192 > len(lines[0])
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(lines[:119]) + b"\xff\xfe\n" + b"".join(lines[119:]))
    code, _, err = run(capsys, "trace", "validate", bad)
    assert code == 2 and "bad.jsonl:120: not a trace: byte 0xff is not UTF-8 text" in one_line(err)


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without(trace, tmp_path, capsys):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + trace.read_bytes())
    code, out, err = run(capsys, "trace", "validate", bom)
    assert (code, err) == (0, "") and "valid trace v1" in out


@pytest.mark.parametrize("argv, needle", [
    (["vm", "serve", "--timeout", "0"], "argument --timeout: 0 must be a positive, finite number of seconds"),
    (["vm", "serve", "--timeout", "-1"], "argument --timeout: -1 must be a positive"),
    (["vm", "serve", "--memory", "1"], "argument --memory: 1 MiB is too little for the guest (at least 128)"),
    (["vm", "serve", "--zone-size", "3MiB"], "must be a power of two"),
    (["payload", "guest", "--out", "{tmp}/p", "--retention", "bogus:x=1"], "unknown retention rule 'bogus'"),
    (["payload", "guest", "--out", "{tmp}/p", "--layers", "0"], "argument --layers: 0 must be at least 1"),
    (["payload", "guest", "--out", "{tmp}/p", "--layers", "31"], "31 layers: SmolLM2-135M has 30"),
    (["payload", "guest", "--out", "{tmp}/p", "--steps", "-1"], "argument --steps: -1 must be at least 1"),
    (["payload", "guest", "--out", "{tmp}/p", "--timeout", "inf"], "argument --timeout: inf must be a positive"),
    (["payload", "capture", "--device", "{tmp}/d.img", "--out", "{tmp}/p", "--retention", "hf:nope=1"],
     "nope"),
])
def test_guest_commands_refuse_bad_arguments_before_booting_anything(tmp_path, capsys, argv, needle):
    code, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert (code, out) == (2, "")
    assert needle in one_line(err)
    assert not (tmp_path / "p").exists() and not (tmp_path / "d.img").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--grant", "jobs/a"], "--grant 'jobs/a': expected JOB=SERIES"),
    (["--group", "no-such-group-xyz"], "--group 'no-such-group-xyz': no such group"),
])
def test_mount_refuses_bad_access_flags_before_anything_starts(tmp_path, capsys, extra, needle):
    """The mount serves its device's socket with retainz serve's access flags: a bad one is bad input."""
    (tmp_path / "mnt").mkdir()
    code, out, err = run(capsys, "mount", tmp_path / "d.img", tmp_path / "mnt", *extra)
    assert (code, out) == (2, "") and needle in one_line(err)
    assert not (tmp_path / "d.img").exists()


def test_mount_refuses_a_foreign_file_in_its_own_process(tmp_path, capsys):
    """A file that is not a RetainZ device is refused by ``retainz mount`` itself, exit 2 like ``ls`` and
    ``fsck`` (it used to start a server that failed, exit 1 with the server's nested line, and left a
    ``.mount.log`` behind); the file is untouched."""
    pytest.importorskip("mfusepy")
    (tmp_path / "mnt").mkdir()
    junk = tmp_path / "junk.txt"
    junk.write_bytes(b"not a device\n")
    code, out, err = run(capsys, "mount", junk, tmp_path / "mnt")
    assert (code, out) == (2, "")
    assert "is not a RetainZ device file" in one_line(err) and "mount server" not in err
    assert junk.read_bytes() == b"not a device\n"
    assert not (tmp_path / "junk.txt.mount.log").exists()


@pytest.mark.parametrize("argv, prog", [
    (["ls", "dev.img", "--bogus"], "retainz ls"),
    (["device", "create", "x.img", "--zones", "4", "--zone-size", "1MiB", "--nope", "1"], "retainz device create"),
    (["tier", "promote", "dev.img", "file:///x", "--node", "a"], "retainz tier promote"),
    (["run", "experiments/quick.json", "extra-positional", "--and-a-flag"], "retainz run"),
])
def test_an_unknown_argument_is_refused_naming_the_command_that_refused_it(tmp_path, capsys, monkeypatch, argv, prog):
    """argparse reports unrecognized arguments from the top parser (``retainz: unrecognized
    arguments``); the line names the (sub)command they were given to, and nothing runs."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert one_line(err).startswith(f"{prog}: unrecognized arguments: "), err
    assert argv[-1] in err and not os.listdir(tmp_path)


@pytest.mark.parametrize("argv", [["ls"], ["df"], ["fsck"], ["get", "g", "s"], ["put", "g", "FILE", "--step", "1"],
                                  ["rm", "g"], ["gc"]])
def test_every_store_command_on_an_unformatted_device_says_to_run_mkfs(tmp_path, capsys, argv):
    device = tmp_path / "dev.img"
    assert run(capsys, "device", "create", device, "--zones", "16", "--zone-size", "1MiB")[0] == 0
    (tmp_path / "f.bin").write_bytes(b"x")
    before = device.read_bytes()
    argv = [str(tmp_path / "f.bin") if a == "FILE" else a for a in argv]
    code, _, err = run(capsys, argv[0], device, *argv[1:])
    assert code == 2
    assert one_line(err).strip() == (f"retainz: error: {device} holds no RetainZ store (no superblock in its "
                                     f"first zones); format it with `retainz mkfs {device}`")
    assert device.read_bytes() == before


def test_put_of_two_files_with_one_name_names_them(tmp_path, capsys):
    device = tmp_path / "dev.img"
    assert run(capsys, "device", "create", device, "--zones", "16", "--zone-size", "1MiB")[0] == 0
    assert run(capsys, "mkfs", device)[0] == 0
    (tmp_path / "d").mkdir()
    a, b = tmp_path / "a.bin", tmp_path / "d" / "a.bin"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    code, _, err = run(capsys, "put", device, "g", a, b, "--step", "1")
    assert code == 2
    assert one_line(err).strip() == (f"retainz: error: 2 files have the same name 'a.bin' ({a}, {b}); a shard is "
                                     "named by its file name, unique in a generation (a checkpoint tree keeps its "
                                     "paths through `retainz mount`)")
    code, _, err = run(capsys, "put", device, "g", a, a, "--step", "1")
    assert code == 2 and one_line(err).strip() == f"retainz: error: {a} is given 2 times"
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "a.bin").symlink_to(a)
    code, _, err = run(capsys, "put", device, "g", a, b, tmp_path / "l" / "a.bin", "--step", "1")
    assert code == 2 and one_line(err).strip() == (f"retainz: error: {a} is given 2 times (as {a}, "
                                                   f"{tmp_path / 'l' / 'a.bin'})")
    assert run(capsys, "ls", device)[1] == ""


@pytest.mark.parametrize("argv, line", [
    (["mkfs", "{dev}", "--meta-zones", "1"], "retainz mkfs: argument --meta-zones: 1 must be at least 2"),
    (["mkfs", "{dev}", "--meta-zones", "65"], "retainz mkfs: argument --meta-zones: 65 is above 64"),
    (["mkfs", "{dev}", "--gc-reserve", "-1"], "retainz mkfs: argument --gc-reserve: -1 is negative"),
    (["mkfs", "{dev}", "--gc-reserve", "99999999999999999999999"],
     "retainz mkfs: argument --gc-reserve: 99999999999999999999999 is more zones than a device has (1,048,576)"),
    (["put", "{dev}", "g", "{file}", "--step", "-3"], "retainz put: argument --step: -3 is negative"),
    (["put", "{dev}", "g", "{file}", "--step", "99999999999999999999999"],
     "retainz put: argument --step: 99999999999999999999999 is beyond the largest step, 9,223,372,036,854,775,807 "
     "(a signed 64-bit integer)"),
    (["put", "{dev}", "g", "{file}", "--step", "1", "--reclaim-step", "99999999999999999999999"],
     "retainz put: argument --reclaim-step: 99999999999999999999999 is beyond the largest step, "
     "9,223,372,036,854,775,807 (a signed 64-bit integer)"),
    (["rm", "{dev}", "g", "--step", "-1"], "retainz rm: argument --step: -1 is negative"),
    (["device", "create", "{tmp}/n.img", "--zones", "4", "--zone-size", "-64MiB"],
     "retainz device create: argument --zone-size: bad size '-64MiB': a size cannot be negative"),
    (["device", "create", "{tmp}/n.img", "--zones", "4", "--zone-size", "1MiB", "--zone-capacity", "-1MiB"],
     "retainz device create: argument --zone-capacity: bad size '-1MiB': a size cannot be negative"),
    (["run", "{tmp}/none.json", "-j", "0"], "retainz run: argument --jobs/-j: 0 must be at least 1"),
    (["run", "{tmp}/none.json", "--connect-timeout", "-1"],
     "retainz run: argument --connect-timeout: -1 must be a positive, finite number of seconds"),
    (["replay", "{tmp}/none.json", "--pressure", "2"], "retainz replay: argument --pressure: 2 must be above 0 and at most 1"),
    (["replay", "{tmp}/none.json", "--zones", "1"],
     "retainz replay: argument --zones: 1 is under 2 (a store needs 2 data zones besides the GC reserve)"),
    (["replay", "{tmp}/none.json", "--zones", "4", "--meta-zones", "-1"],
     "retainz replay: argument --meta-zones: -1 is negative"),
])
def test_every_bounded_flag_is_checked_in_the_cli_words(tmp_path, capsys, argv, line):
    """Issue 44.5: a flag's bound is checked when the flag is read and refused naming the flag (not the
    API's ``meta_zones``/``gc_reserve_zones``/``step``), a negative value is a value (``-64MiB`` was
    "expected one argument"), and a step beyond int64 never reaches the store (``--reclaim-step`` was
    stored, and ``ls --json`` then printed an integer no int64 reader takes)."""
    dev = tmp_path / "d.img"
    FileDevice.create(dev, Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)).close()
    f = tmp_path / "f.bin"
    f.write_bytes(b"x")
    code, out, err = run(capsys, *[a.format(dev=dev, file=f, tmp=tmp_path) for a in argv])
    assert (code, out, err) == (2, "", line + "\n")


def test_remedies_name_the_flag_not_the_api(tmp_path, capsys):
    """A device that holds a store (``mkfs``) or a file that exists (``device create``) is refused
    with the command and flag that would go ahead, never ``pass force=True (--force)``."""
    dev = tmp_path / "d.img"
    assert run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")[0] == 0
    code, _, err = run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")
    assert (code, err) == (2, f"retainz: error: {dev} exists and is not empty; `retainz device create --force` "
                              "overwrites it\n")
    assert run(capsys, "mkfs", dev)[0] == 0
    code, _, err = run(capsys, "mkfs", dev)
    assert (code, err) == (2, f"retainz: error: {dev} already holds a RetainZ store (superblock in zone 0); "
                              f"`retainz mkfs --force {dev}` erases it\n")


def test_the_store_refuses_a_reclaim_step_beyond_int64():
    """The API's bound behind ``--reclaim-step``'s: an int reclaim step past ``MAX_STEP`` is refused
    (``ls --json`` would print it, and int64 readers cannot take it); ``inf`` (permanent) is not an int."""
    from retainz.hint import Hint
    from retainz.store import Store
    from retainz.store.store import MAX_STEP
    from retainz.zoned import MemoryDevice

    with Store.format(MemoryDevice(Geometry(nr_zones=8, zone_size=1 << 20, zone_capacity=1 << 20))) as s:
        with pytest.raises(ValueError, match=rf"^hint reclaim_step {MAX_STEP + 1} is beyond the largest step, {MAX_STEP}$"):
            s.begin_generation("g", 1, hint=Hint(reclaim_step=MAX_STEP + 1))
        s.begin_generation("g", 1, hint=Hint(reclaim_step=MAX_STEP)).abort()
        s.begin_generation("h", 1, hint=Hint(reclaim_step=float("inf"))).abort()


def test_a_directory_named_as_the_device_gets_one_wording_on_every_command(tmp_path, capsys):
    """ls, fsck, mkfs, device create and mount (docs/cli.md): the same line, with the way to make a device."""
    line = f"{tmp_path}: a directory, not a device file (make one with `retainz device create FILE`"
    for argv in (["ls", tmp_path], ["fsck", tmp_path], ["mkfs", tmp_path], ["df", tmp_path],
                 ["device", "create", tmp_path, "--zones", "4", "--zone-size", "4MiB"],
                 ["mount", tmp_path, tmp_path / "mnt"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and line in one_line(err), (argv, err)


def test_a_put_refused_for_space_gives_sizes_a_person_reads_and_the_way_out(tmp_path, capsys):
    dev = tmp_path / "d.img"
    assert run(capsys, "device", "create", dev, "--zones", "12", "--zone-size", "4MiB")[0] == 0
    assert run(capsys, "mkfs", dev)[0] == 0
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(30 << 20))
    code, _, err = run(capsys, "put", dev, "g1", big, "--step", "1")
    assert code == 1
    line = one_line(err)
    assert "generation 'g1' needs 30 MiB, and 28 MiB can be reserved on this device" in line, line
    assert "`retainz rm DEVICE ID`" in line and "bytes;" not in line
    assert run(capsys, "ls", dev, "--json")[1].strip() == "[]"      # nothing half-written is listed


def test_fsck_upgrade_of_a_current_store_says_there_was_nothing_to_upgrade(tmp_path, capsys):
    from retainz.store.format import FORMAT_VERSION

    dev = tmp_path / "d.img"
    run(capsys, "device", "create", dev, "--zones", "12", "--zone-size", "4MiB")
    run(capsys, "mkfs", dev)
    code, out, _ = run(capsys, "fsck", dev, "--upgrade")
    assert code == 0
    assert f"nothing to upgrade: the store is already format version {FORMAT_VERSION}" in out
    assert "upgraded" not in out


def test_replay_on_an_fdp_device_shows_the_device_waf_in_text(trace, capsys):
    import json

    code, out, _ = run(capsys, "replay", trace, "--pressure", "0.9", "--device", "fdp")
    assert code == 0
    rows = dict(line.split(None, 1) for line in out.splitlines())
    code, js, _ = run(capsys, "replay", trace, "--pressure", "0.9", "--device", "fdp", "--json")
    fdp = json.loads(js)["fdp"]
    assert float(rows["fdp_device_waf"]) == pytest.approx(fdp["device_waf"], abs=1e-4)
    assert int(rows["fdp_media_bytes_written"]) == fdp["media_bytes_written"] > 0


def test_put_of_an_existing_generation_names_the_flag_not_the_api(tmp_path, capsys):
    """A second ``put`` of a committed id is refused in the CLI's words: the command and flag that
    replace it (``put --replace``), never the API's ``replace=True``; the committed one stays intact."""
    dev, f = tmp_path / "d.img", tmp_path / "s.bin"
    f.write_bytes(b"a" * 8192)
    assert run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")[0] == 0
    assert run(capsys, "mkfs", dev)[0] == 0
    assert run(capsys, "put", dev, "g1", f, "--step", 1)[0] == 0
    f.write_bytes(b"b" * 4096)
    code, out, err = run(capsys, "put", dev, "g1", f, "--step", 2)
    assert (code, out, one_line(err)) == (
        2, "", f"retainz: error: generation 'g1' already exists on {dev}; `retainz put --replace {dev} g1 FILE...` "
               "replaces it at the new one's commit\n")
    code, out, _ = run(capsys, "ls", dev, "--json")
    assert code == 0 and '"step": 1' in out and '"size": 8192' in out
    assert run(capsys, "put", dev, "g1", f, "--step", 2, "--replace")[0] == 0
    code, out, _ = run(capsys, "ls", dev, "--json")
    assert code == 0 and '"step": 2' in out and '"size": 4096' in out


def test_a_truncated_device_file_is_not_sent_to_a_repair_that_refuses_it(tmp_path, capsys):
    """A device file cut short (an incomplete copy): every command, ``fsck --repair`` included, refuses
    it in one line, exit 1; the line must not send the user to ``fsck --repair``, which refuses the
    same file with the same line (the new-user trial's loop)."""
    dev, f = tmp_path / "d.img", tmp_path / "s.bin"
    f.write_bytes(b"a" * 8192)
    assert run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")[0] == 0
    assert run(capsys, "mkfs", dev)[0] == 0
    assert run(capsys, "put", dev, "g1", f, "--step", 1)[0] == 0
    full = dev.stat().st_size
    from retainz.zoned import FileDevice
    with FileDevice(dev, readonly=True) as d:      # cut into the last zone that holds data (g1's)
        z = max(z.index for z in d.report_zones() if z.wp > z.start)
        cut = d._data_offset + z * (1 << 20)
    os.truncate(dev, cut)
    for argv in (["ls", dev], ["fsck", dev], ["fsck", dev, "--repair"], ["put", dev, "g2", f, "--step", 2],
                 ["mkfs", "--force", dev]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (1, ""), (argv, err)
        assert one_line(err) == (f"retainz: error: {dev} is {cut} bytes, shorter than its geometry ({full} "
                                 f"bytes), and zone {z}'s written bytes reach past its end: the file was cut short (an "
                                 "incomplete copy?) and its missing bytes cannot be rebuilt, `retainz fsck --repair` "
                                 f"included; copy it again from its source, or `retainz device create --force {dev} "
                                 "--zones 16 --zone-size 1MiB --max-open 14 --max-active 14` makes an empty one in "
                                 "its place (`mkfs --force` cannot: it erases zones, and these are missing)\n"), argv
    assert dev.stat().st_size == cut               # nothing wrote to it
    # the way out it names makes the same device again (mkfs --force, the trial's first try, cannot)
    assert run(capsys, "device", "create", "--force", dev, "--zones", 16, "--zone-size", "1MiB",
               "--max-open", 14, "--max-active", 14)[0] == 0
    assert dev.stat().st_size == full and run(capsys, "mkfs", dev)[0] == 0


def test_crashtest_workload_help_names_every_workload_it_takes(capsys):
    """``crashtest --workload``'s help (and so docs/cli.md) lists every workload the command accepts:
    the trial was refused ``bogus`` with a list of nine names while the help gave six."""
    from retainz.testing.crashtest import WORKLOADS

    with pytest.raises(SystemExit):
        main(["crashtest", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    listed = text.rsplit("--workload WORKLOAD", 1)[1].split("(default", 1)[0]
    assert [w for w in (*WORKLOADS, "all") if w not in listed.replace(",", " ").split()] == []
    docs = (os.path.dirname(__file__) + "/../../docs/cli.md")
    assert listed.strip() in " ".join(open(docs).read().split())


def test_a_character_device_named_as_a_zoned_device_is_called_what_it_is(capsys):
    """``/dev/null`` given as DEV: one line calling it a character device (the trial read
    "/dev/null is not a block device, not a zoned block device"), exit 2."""
    for argv in (["device", "info", "/dev/null"], ["ls", "/dev/null"]):
        code, out, err = run(capsys, *argv)
        assert (code, out, one_line(err)) == (
            2, "", "retainz: error: /dev/null is a character device, not a zoned block device\n"), argv


def test_put_of_a_file_whose_size_changes_while_read_names_the_file(tmp_path, capsys):
    """A file that gives more (or fewer) bytes than its size when put began (a /proc file says 0, a
    file still being written grows): one line naming the file, not the store's "shard ...: more than
    the 0 bytes given as its size"; nothing is committed."""
    dev = tmp_path / "d.img"
    assert run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")[0] == 0
    assert run(capsys, "mkfs", dev)[0] == 0
    code, out, err = run(capsys, "put", dev, "g", "/proc/self/status", "--step", 1)
    assert (code, out, one_line(err)) == (
        2, "", "retainz: error: /proc/self/status: its size changed while put read it (0 bytes when put began); "
               "put stores files that do not change while it reads them\n")
    assert run(capsys, "ls", dev, "--json")[1].split() == ["[]"]


def test_device_create_over_a_store_says_what_force_would_destroy(tmp_path, capsys):
    """``device create`` over a device file holding a store names the committed generations
    ``--force`` would destroy (the refusal said only "exists and is not empty"); the store stays."""
    dev, f = tmp_path / "d.img", tmp_path / "s.bin"
    f.write_bytes(b"a" * 8192)
    assert run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")[0] == 0
    code, _, err = run(capsys, "device", "create", dev, "--zones", 16, "--zone-size", "1MiB")
    assert (code, one_line(err)) == (2, f"retainz: error: {dev} exists and is not empty; `retainz device create "
                                        "--force` overwrites it\n")
    assert run(capsys, "mkfs", dev)[0] == 0
    for gen in ("g1", "g2"):
        assert run(capsys, "put", dev, gen, f, "--step", 1)[0] == 0
    code, out, err = run(capsys, "device", "create", dev, "--zones", 32, "--zone-size", "1MiB")
    assert (code, out, one_line(err)) == (
        2, "", f"retainz: error: {dev} holds a RetainZ store with 2 committed generations; `retainz device create "
               "--force` overwrites it and every generation on it\n")
    assert run(capsys, "ls", dev)[1].count("\n") == 2


def test_demo_out_naming_a_file_says_it_is_not_a_directory(tmp_path, capsys):
    """``demo --out FILE``: one line saying --out names a folder (the trial read "FILE: File exists"),
    exit 2, and the file is left as it was."""
    f = tmp_path / "random.bin"
    f.write_bytes(b"x" * 100)
    code, out, err = run(capsys, "demo", "--out", f)
    assert (code, out, one_line(err)) == (
        2, "", f"retainz: error: {f}: not a directory (--out names the demo's output folder)\n")
    assert f.read_bytes() == b"x" * 100


@pytest.fixture
def store_with_step_5(tmp_path, capsys):
    """A device file holding a store with generation ``step-5`` (shard ``model.bin``)."""
    dev = tmp_path / "dev.img"
    src = tmp_path / "model.bin"
    src.write_bytes(BINARY * 16)
    assert run(capsys, "device", "create", dev, "--zones", "16", "--zone-size", "1MiB")[0] == 0
    assert run(capsys, "mkfs", dev)[0] == 0
    assert run(capsys, "put", dev, "step-5", src, "--step", 5)[0] == 0
    return dev, src


def test_steps_out_of_order_are_named_by_their_flags(tmp_path, capsys, store_with_step_5):
    """``put --reclaim-step`` before ``--step`` and ``rm --step`` before the generation's own step
    name the flags (they said "reclaim step"/"retirement step", the store's words)."""
    dev, src = store_with_step_5
    code, _, err = run(capsys, "put", dev, "step-9", src, "--step", 9, "--reclaim-step", 3)
    assert code == 2
    assert one_line(err) == ("retainz: error: --reclaim-step 3 is before --step 9 (a generation cannot be "
                             "retired before it is saved)\n")
    code, _, err = run(capsys, "rm", dev, "step-5", "--step", 2)
    assert code == 2
    assert one_line(err) == ("retainz: error: --step 2 is before step 5 of generation 'step-5' (a generation "
                             "cannot be retired before it is saved)\n")
    code, out, _ = run(capsys, "ls", dev)
    assert code == 0 and out.startswith("step-5\tstep 5\t") and "step-9" not in out   # nothing changed


def test_tier_restore_of_a_generation_the_device_holds_names_the_commands(tmp_path, capsys, store_with_step_5):
    """``tier restore`` onto a device that already holds the generation is one line in the CLI's words
    (it named the Python flag ``replace=True`` and ``put --replace``, which restore does not take);
    ``get`` of a generation neither on the device nor at the remembered destination says both (it
    named only the missing durable copy)."""
    dev, src = store_with_step_5
    url = "file://" + str(tmp_path / "durable")
    assert run(capsys, "tier", "promote", dev, "--to", url)[0] == 0
    code, _, err = run(capsys, "tier", "restore", dev, "step-5")
    assert code == 2
    assert one_line(err) == (f"retainz: error: generation 'step-5' is already on {dev}: `retainz tier restore` "
                             f"brings back a generation the device lacks (`retainz get {dev} step-5` reads it)\n")
    code, _, err = run(capsys, "get", dev, "step-6", "-o", tmp_path / "out")
    assert code == 2
    assert one_line(err) == (f"retainz: error: no committed generation 'step-6' on {dev}, and no durable copy "
                             f"of it at {url}\n")
    assert not (tmp_path / "out").exists()
    assert run(capsys, "get", dev, "step-5", "-o", tmp_path / "out")[0] == 0           # still intact
    assert (tmp_path / "out" / "model.bin").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("argv, line", [
    # the user gave no --zone-capacity: the line named "zone capacity 0" too (the default is the zone size)
    (["--zones", "4", "--zone-size", "0"], "retainz: error: --zone-size 0: a zone holds at least one block (4096 B)"),
    (["--zones", "4", "--zone-size", "0", "--block-size", "512"],
     "retainz: error: --zone-size 0: a zone holds at least one block (512 B)"),
    (["--zones", str(MAX_ZONES + 1), "--zone-size", "4MiB"],
     f"retainz: error: --zones {MAX_ZONES + 1:,}: zone count {MAX_ZONES + 1:,} exceeds the limit of {MAX_ZONES:,} zones"),
])
def test_device_create_names_the_flag_of_a_zero_zone_size_or_too_many_zones(tmp_path, capsys, argv, line):
    code, _, err = run(capsys, "device", "create", tmp_path / "c.img", *argv)
    assert code == 2
    assert one_line(err) == line + "\n"
    assert not (tmp_path / "c.img").exists()


@pytest.mark.parametrize("name", ["f" * 251 + ".bin", "ü" * 125 + ".bin"])    # 255 bytes in UTF-8, the longest name
def test_get_writes_a_shard_whose_name_is_as_long_as_a_file_name_can_be(tmp_path, capsys, name):
    """``get`` wrote ``NAME.part`` and renamed it; for a shard named with 251 to 255 bytes (``put``
    stores any file the file system can name) ``NAME.part`` is past NAME_MAX and every get failed
    with `File name too long`, exit 1."""
    dev = tmp_path / "dev.img"
    src = tmp_path / name
    src.write_bytes(BINARY * 8)
    assert run(capsys, "device", "create", dev, "--zones", "16", "--zone-size", "1MiB")[0] == 0
    assert run(capsys, "mkfs", dev)[0] == 0
    assert run(capsys, "put", dev, "step-1", src, "--step", 1)[0] == 0
    out = tmp_path / "out"
    code, _, err = run(capsys, "get", dev, "step-1", "-o", out)
    assert code == 0, err
    assert os.listdir(out) == [name]
    assert (out / name).read_bytes() == BINARY * 8
