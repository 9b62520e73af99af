"""A malformed ``mem:``/``fdp:`` spec is named as such on every command (one line, exit 2), before
anything else a command would say of the device (e.g. that an in-memory device cannot hold a store):
:func:`retainz.zoned.parse_device` checks the spec's values."""

from __future__ import annotations

import pytest

from retainz.cli import main
from retainz.errors import DeviceFormatError
from retainz.zoned import open_device, parse_device

BAD = [
    ("mem:zone_size=-1", "zone_size='-1' is not a size: a size cannot be negative"),
    ("mem:zones=x", "zones='x' is not an integer"),
    ("mem:zones=0", "zone count 0 must be at least 1"),
    ("mem:zone_capacity=2MiB", "zone capacity 2097152 must be at most the zone size 1048576"),
    ("mem:zonez=4", "unknown geometry key(s) zonez"),
    ("mem:payload=maybe", "payload must be true or false"),
    ("mem:block_size=1024", "block size 1024 is not 512 or 4096"),
    ("mem:block_size=1000", "block size 1000 is not 512 or 4096"),   # named before the zone size it does not divide
    ("fdp:block_size=1000", "block size 1000 is not 512 or 4096"),
    ("fdp:spare=x", "spare='x' is not a number"),
    ("fdp:spare=2", "spare factor must be in (0, 1), got 2.0"),
    ("fdp:ru_size=3", "RU size 3 B is not a whole number of 4096-byte pages"),
    ("fdp:ruh=XX", "handle type must be II or PI, got 'XX'"),
    ("fdp:max_active=0,max_open=0", "an FDP namespace needs max_active >= 1"),
    ("fdp:handles=2", "handles='2': give handles=1"),
]
COMMANDS = [["ls", "{d}"], ["fsck", "{d}"], ["df", "{d}"], ["gc", "{d}"], ["mkfs", "{d}"], ["rm", "{d}", "g"],
            ["fsck", "--upgrade", "{d}"], ["device", "info", "{d}"], ["zones", "report", "{d}"]]


@pytest.mark.parametrize("spec, why", BAD, ids=[s for s, _ in BAD])
def test_parse_device_names_a_bad_value_of_an_in_memory_spec(spec, why):
    with pytest.raises(DeviceFormatError) as e:
        parse_device(spec)
    assert str(e.value).startswith(f"bad device spec {spec!r}: ") and why in str(e.value), str(e.value)
    with pytest.raises(DeviceFormatError, match=f"^bad device spec {spec!r}: "):
        open_device(spec)                         # the open says the same


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:-1] if a[-1] == "{d}" else a))
@pytest.mark.parametrize("spec, why", BAD[:1] + BAD[4:6] + BAD[8:10], ids=lambda x: x[:20])
def test_every_command_names_the_malformed_spec_in_one_line(capsys, argv, spec, why):
    capsys.readouterr()
    code = main([a.format(d=spec) for a in argv])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"bad device spec {spec!r}: " in lines[0] and why in lines[0], err
    assert "in-memory device" not in err


def test_a_well_formed_in_memory_spec_still_says_it_cannot_hold_a_store(capsys):
    capsys.readouterr()
    assert main(["ls", "mem:zones=16,zone_size=1MiB"]) == 2
    assert "an in-memory device lives only for one command" in capsys.readouterr().err
    assert parse_device("fdp:zones=16,spare=0.1,ruh=pi").kind == "fdp"
    assert open_device("mem:zones=4,payload=false").geometry.nr_zones == 4
