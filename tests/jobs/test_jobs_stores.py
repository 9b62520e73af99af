"""One device-spec parser and one store opener for every command and face (retainz.jobs.stores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retainz.errors import DeviceFormatError
from retainz.jobs import stores
from retainz.node import socket_path
from retainz.tier import state_path_for
from retainz.zoned import Geometry, parse_device

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)


@pytest.mark.parametrize("text, kind, path", [
    ("dev.img", "file", "dev.img"),
    ("file:dev.img", "file", "dev.img"),
    ("file:/dev/shm/x.img", "file", "/dev/shm/x.img"),
    ("/dev/nvme0n1", "zbd", "/dev/nvme0n1"),
    ("zbd:/dev/nvme0n1", "zbd", "/dev/nvme0n1"),
    ("mem:zones=8", "mem", ""),
    ("mem", "mem", ""),
    ("remote:socket=/tmp/s.sock", "remote", ""),
])
def test_every_spec_form_parses_to_its_kind_and_path(text, kind, path):
    spec = parse_device(text)
    assert (spec.kind, spec.path, spec.text) == (kind, path, text)
    assert spec.persistent == (kind != "mem")


@pytest.mark.parametrize("text", ["file:", "zbd:"])
def test_a_prefix_without_a_path_is_refused(text):
    with pytest.raises(DeviceFormatError, match=f"no path after {text}"):
        parse_device(text)


def test_zbd_and_dev_name_one_block_device_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("RETAINZ_RUN_DIR", str(tmp_path))
    # the node service's socket, the tier's settings file: one answer for both spellings
    assert socket_path("zbd:/dev/nullb0") == socket_path("/dev/nullb0") == str(tmp_path / "nullb0.sock")
    assert state_path_for("zbd:/dev/nullb0") is None and state_path_for("/dev/nullb0") is None
    assert parse_device("zbd:/dev/nullb0").key == parse_device("/dev/nullb0").key
    assert stores.present("zbd:/dev/nullb0")


def test_file_prefix_names_the_same_device_file(tmp_path):
    dev = tmp_path / "d.img"
    assert socket_path(f"file:{dev}") == socket_path(str(dev)) == f"{dev}.sock"
    assert state_path_for(f"file:{dev}") == f"{dev}.tier.json"
    with stores.using(str(dev), geometry=GEOMETRY) as a, stores.using(f"file:{dev}") as b:
        assert a is b                     # one store per device in a process, whatever the spelling
        assert stores.open_count() == 1
    assert stores.open_count() == 0


def test_a_zbd_spec_is_never_taken_for_a_file_to_create(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = f"zbd:{tmp_path}/nullb9"
    with pytest.raises(FileNotFoundError, match="no such block device"):
        with stores.using(missing, geometry=GEOMETRY, wait=0):
            pass
    assert list(tmp_path.iterdir()) == []          # no device file "zbd:..." made on the way
    assert stores.open_count() == 0


def test_a_blank_mem_device_is_formatted_by_the_opener():
    store = stores.open_store("mem:zones=16,zone_size=1MiB")
    try:
        assert store.generations() == [] and store.device.geometry.nr_zones == 16
    finally:
        stores.close_store(store)


def test_serve_reads_a_zbd_spec_as_a_block_device(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), RETAINZ_RUN_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "retainz.cli", "serve", f"zbd:{tmp_path}/nullb9"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no such block device" in r.stderr and "device file" not in r.stderr
