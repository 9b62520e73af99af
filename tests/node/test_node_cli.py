"""The store commands on a device another process holds (issue 29, 27.5(d)): through a node service's
socket when `retainz serve` or a mount holds it; one line naming the mount point and pid for what needs
the device itself."""

from __future__ import annotations

import json
import os

from tests.mountcheck import make_device, mounted, require_fuse, retainz
from tests.node.test_node import start_service, stop_service


def test_store_commands_on_a_served_device_go_through_the_service(tmp_path):
    device = make_device(tmp_path, zones=32, zone_size="1MiB")
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3_000_000))
    (src / "b.txt").write_bytes(b"b" * 10)
    svc = start_service(device, tmp_path / "service.log")
    try:
        r = retainz("put", device, "g1", str(src / "a.bin"), str(src / "b.txt"), "--step", "5")
        assert "g1: 2 shards" in r.stdout
        listing = json.loads(retainz("ls", device, "--json").stdout)
        assert [(g["id"], g["step"], g["size"]) for g in listing] == [("g1", 5, 3_000_010)]
        assert {s["name"]: s["extents"] for s in listing[0]["shards"]} == {"a.bin": 3, "b.txt": 1}
        assert "3 extents" in retainz("ls", device, "-l").stdout
        out = tmp_path / "out"
        retainz("get", device, "g1", "-o", str(out))
        assert (out / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
        assert "clean" in retainz("fsck", device).stdout
        assert "Used: " in retainz("df", device).stdout
        assert retainz("gc", device).returncode == 0
        # a job sees only its own series through the service
        os.environ["RETAINZ_JOB"] = "jobs/x"
        try:
            assert json.loads(retainz("ls", device, "--json").stdout) == []
            r = retainz("rm", device, "g1", check=False)
            assert r.returncode == 1 and r.stderr.count("\n") == 1 and "may not read generation 'g1'" in r.stderr
        finally:
            os.environ.pop("RETAINZ_JOB")
        assert "g1: deleted" in retainz("rm", device, "g1").stdout
        assert retainz("ls", device).stdout == ""
        # what needs the device itself says who holds it, in one line
        for args in (["mkfs", device, "--force"], ["fsck", device, "--repair"]):
            r = retainz(*args, check=False)
            line = r.stderr.strip()
            assert r.returncode == 1 and "\n" not in line, (args, r.stderr)
            assert f"retainz serve, pid {svc.pid}" in line and "stop the service first" in line, line
    finally:
        stop_service(svc)
    assert retainz("ls", device).stdout == ""            # and directly again once the service is gone


def test_store_commands_on_a_mounted_device_go_through_its_socket_and_the_rest_say_where_it_is_mounted(tmp_path):
    """A mount serves the device's socket (tests/mount/test_mount_service.py has the rest): the store commands
    work on a mounted device; those that need the device itself name the mount point and the pid."""
    require_fuse()
    from retainz.mount.runner import lock_holders

    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    with mounted(device, tmp_path / "mnt") as mnt:
        pids = lock_holders(device)
        assert len(pids) == 1
        small = tmp_path / "small.bin"
        small.write_bytes(b"s" * 5000)
        for args in (["put", device, "g", str(small), "--step", "1"], ["ls", device], ["df", device], ["rm", device, "g"]):
            r = retainz(*args, check=False)
            assert r.returncode == 0, (args, r.stderr)
        for args in (["mkfs", device, "--force"], ["fsck", device, "--repair"]):
            r = retainz(*args, check=False)
            line = r.stderr.strip()
            assert r.returncode == 1 and "\n" not in line, (args, r.stderr)
            assert f"it is mounted at {mnt} (retainz mount, pid {pids[0]})" in line and "retainz umount" in line, line
