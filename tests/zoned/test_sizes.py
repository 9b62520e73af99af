"""Sizes say what they mean (issue 27, item 9): one parser, units exactly as written, ambiguous or
unaligned input refused in one line naming the value, and the resulting geometry printed."""

from __future__ import annotations

import pytest

from retainz.cli import main
from retainz.errors import DeviceFormatError
from retainz.zoned import format_sizes, open_device, parse_size

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize("text,value", [
    ("4096", 4096), ("4096B", 4096), ("64K", 64 * KiB), ("64KiB", 64 * KiB), ("64M", 64 * MiB),
    ("64MiB", 64 * MiB), ("64 MiB", 64 * MiB), ("2G", 2 * GiB), ("2GiB", 2 * GiB), ("1T", 1 << 40),
    ("1TiB", 1 << 40), ("1P", 1 << 50), ("64kB", 64_000), ("64KB", 64_000), ("64MB", 64_000_000),
    ("1GB", 10 ** 9), ("1TB", 10 ** 12), (4096, 4096)])
def test_units_are_read_exactly_as_written(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text,needle", [
    ("64mb", "write 64MiB (67,108,864 B) or 64MB (64,000,000 B)"),
    ("64m", "write 64MiB (67,108,864 B) or 64MB (64,000,000 B)"),
    ("64Mb", "'Mb' is ambiguous"), ("64mib", "'mib' is ambiguous"), ("64MIB", "'MIB' is ambiguous"),
    ("4k", "write 4KiB (4,096 B) or 4kB (4,000 B)"), ("2gb", "'gb' is ambiguous"),
    ("1.5GiB", "whole number of units; write 1536MiB"), ("-4K", "cannot be negative"),
    (" 64M", "surrounding spaces"), ("", "empty"), ("12parsecs", "unknown unit 'parsecs'"),
    ("0x10", "expected an integer"), ("\u0666\u0664", "expected an integer"), (-1, "cannot be negative"),
    (True, "expected a number of bytes")])
def test_ambiguous_and_malformed_sizes_are_refused_naming_the_value(text, needle):
    with pytest.raises(ValueError) as ei:
        parse_size(text)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg
    assert repr(text) in msg or str(text) in msg


def test_a_size_not_a_multiple_of_the_block_size_is_refused():
    assert parse_size("1MiB", multiple_of=4096) == MiB
    with pytest.raises(ValueError, match=r"'1000kB': 1,000,000 bytes is not a multiple of the 4096-byte block"):
        parse_size("1000kB", multiple_of=4096)


def test_format_sizes_gives_both_unit_systems_and_bytes():
    assert format_sizes(64 * MiB) == "64 MiB = 67.11 MB = 67,108,864 B"
    assert format_sizes(64_000_000) == "61.04 MiB = 64 MB = 64,000,000 B"
    assert format_sizes(512) == "512 B"


def test_device_create_refuses_64mb_instead_of_making_61_mib_zones(tmp_path, capsys):
    path = tmp_path / "d.img"
    assert main(["device", "create", str(path), "--zones", "8", "--zone-size", "64mb"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'64mb'" in err and "64MiB (67,108,864 B) or 64MB (64,000,000 B)" in err
    assert not path.exists()


def test_device_create_and_mkfs_print_the_geometry(tmp_path, capsys):
    path = tmp_path / "d.img"
    assert main(["device", "create", str(path), "--zones", "8", "--zone-size", "64MB"]) == 0
    out = capsys.readouterr().out
    assert "    zones: 8 of 61.04 MiB = 64 MB = 64,000,000 B" in out
    assert "    zone capacity: 61.04 MiB = 64 MB = 64,000,000 B writable per zone" in out
    assert "    total: 488.28 MiB = 512 MB = 512,000,000 B" in out
    with open_device(str(path)) as dev:
        assert dev.geometry.zone_size == 64_000_000
    assert main(["mkfs", str(path)]) == 0
    out = capsys.readouterr().out
    assert "    zones: 8 of 61.04 MiB = 64 MB = 64,000,000 B" in out
    assert "    block size: 4096 B" in out


@pytest.mark.parametrize("flag,value,needle", [
    ("--zone-size", "1000kB", "--zone-size 976.56 KiB = 1 MB = 1,000,000 B is not a multiple of the block size (4096 B)"),
    ("--zone-capacity", "1000001", "--zone-capacity 976.56 KiB = 1.00 MB = 1,000,001 B is not a multiple"),
])
def test_device_create_refuses_unaligned_sizes_naming_the_flag_and_value(tmp_path, capsys, flag, value, needle):
    argv = ["device", "create", str(tmp_path / "d.img"), "--zones", "8", "--zone-size", "1MiB", flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


@pytest.mark.parametrize("spec,needle", [
    ("mem:zone_size=64mb", "zone_size='64mb' is not a size: unit 'mb' is ambiguous"),
    ("mem:zone_size=1000kB", "zone_size='1000kB' (1,000,000 B) is not a multiple of the block size (4096 B)"),
    ("mem:zone_size=1MB,block_size=512", "(1,000,000 B) is not a multiple of the block size (512 B)"),
])
def test_device_specs_use_the_same_parser(spec, needle):
    with pytest.raises(DeviceFormatError, match=None) as ei:
        open_device(spec)
    assert needle in str(ei.value)


def test_vm_zone_sizes_go_through_the_same_parser(capsys):
    assert main(["vm", "run", "--zone-size", "1mb", "--", "true"]) == 2
    assert "'1mb'" in capsys.readouterr().err
