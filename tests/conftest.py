"""Shared fixtures: a zoned device of every kind, for the conformance suite and the store tests.

Set ``RETAINZ_TEST_ZBD=/dev/nvme0n1[,/dev/nullb0]`` (the QEMU guest lane does) to add real Linux zoned
block devices to the ``any_device`` parametrization; they are skipped otherwise.  Set
``RETAINZ_TEST_REMOTE`` to a ``remote:`` device spec (the guest lane does, for the guest's namespace
served to the host) to add that device.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from retainz.zoned import FileDevice, Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice

#: The conformance geometry: capacity < size, small limits, 4 KiB blocks.
SMALL = Geometry(nr_zones=8, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096,
                 max_open=3, max_active=4)

#: Byte offsets past 2^31 and 2^32 (a C ``int`` and a ``uint32``).
GiB = 1 << 30


def high(g: Geometry) -> Geometry:
    """``g`` with 3 GiB zones (capacity and limits unchanged): zone 1 starts at 3 GiB, between 2^31 and
    2^32 bytes, and every later zone past 2^32 bytes, so every device call crosses both widths a
    truncated offset would lose (a sparse file: the unwritten span costs no disk)."""
    return dataclasses.replace(g, zone_size=3 * GiB)


#: More zones than a 16-bit index holds, and zones from index 65,536 on start at 2^32 bytes and beyond.
WIDE = dataclasses.replace(SMALL, nr_zones=(1 << 16) + 64)

_REAL = [p for p in os.environ.get("RETAINZ_TEST_ZBD", "").split(",") if p]
_SERVED = os.environ.get("RETAINZ_TEST_REMOTE", "")
DEVICE_KINDS = ["memory", "file", "fdp", "faulty-memory", "faulty-file", "remote-memory", "remote-window-file",
                "memory-high", "file-high", "faulty-file-high", "remote-window-file-high"] + [
    f"linux:{p}" for p in _REAL] + ([f"served:{_SERVED}"] if _SERVED else [])


def make_device(kind: str, tmp_path, geometry: Geometry = SMALL):
    """A fresh device of ``kind``; a ``-high`` kind has ``geometry``'s zones at offsets past 2^32
    (:func:`high`)."""
    if kind.endswith("-high"):
        return make_device(kind.removesuffix("-high"), tmp_path, high(geometry))
    if kind == "memory":
        return MemoryDevice(geometry)
    if kind == "file":
        return FileDevice.create(tmp_path / "dev.img", geometry)
    if kind == "fdp":  # an FDP namespace on the FTL model, its zones a host-side view (docs/fdp.md)
        from retainz.zoned.fdp import FdpNamespaceDevice

        return FdpNamespaceDevice(geometry)
    if kind == "faulty-memory":
        return FaultyDevice(MemoryDevice(geometry))
    if kind == "faulty-file":
        return FaultyDevice(FileDevice.create(tmp_path / "dev.img", geometry))
    if kind.startswith("remote-"):
        # the device served in a thread at the other end of a socket pair; "window": the data goes
        # through a 3-block shared window (larger I/O is split), else inline
        inner = make_device(kind.split("-")[-1], tmp_path, geometry)
        return serve_in_thread(inner, window_blocks=3 if "-window-" in kind else 0)
    if kind.startswith(("linux:", "served:")):
        from retainz.zoned import open_device

        dev = open_device(kind.split(":", 1)[1])
        for z in range(dev.geometry.nr_zones):
            dev.reset_zone(z)
        return dev
    raise ValueError(kind)


def serve_in_thread(inner, window_blocks: int = 0):
    """A RemoteZonedDevice whose server runs :func:`retainz.zoned.remote.serve` on ``inner`` in a
    thread; closing the client ends the server and closes ``inner``."""
    import mmap
    import socket
    import threading

    from retainz.zoned.remote import RemoteZonedDevice, SocketStream, serve

    a, b = socket.socketpair()
    window = mmap.mmap(-1, window_blocks * inner.geometry.block_size) if window_blocks else None

    def run():
        try:
            serve(inner, SocketStream(b), window)
        finally:
            b.close()
            inner.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    dev = RemoteZonedDevice(SocketStream(a, timeout=60), window, name="socketpair")
    close = dev.close

    def close_and_join():
        close()
        t.join(timeout=10)

    dev.close = close_and_join
    return dev


def _kind_id(kind: str) -> str:
    """A test id per kind.  The served spec names temporary paths (pid included) and can pass 100
    characters, past which pytest ids the parameter ``any_device6`` and ``-k served`` finds nothing:
    it is ``served:remote:guest``."""
    return "served:remote:guest" if kind.startswith("served:") else kind


@pytest.fixture(params=DEVICE_KINDS, ids=_kind_id)
def any_device(request, tmp_path):
    """A fresh, all-empty device of each kind (a real one is reset zone by zone first)."""
    dev = make_device(request.param, tmp_path)
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto's standalone S3 server, one per test session (started at the first S3 test); its URL."""
    pytest.importorskip("s3fs", reason="needs the tier-test extra (s3fs)")
    pytest.importorskip("moto.server", reason="needs the tier-test extra (moto[server])")
    from tests.tierdest import moto_server

    with moto_server() as (endpoint, _):
        yield endpoint


@pytest.fixture(params=["dir", "s3"])
def destination(request, tmp_path, monkeypatch):
    """A fresh, empty durable destination of each kind (:class:`tests.tierdest.TierDestination`): a
    directory tree, and a fresh bucket on the session's moto server with the ``AWS_*`` environment
    pointing there (so the CLI, a subprocess or a bare ``s3://`` URL reach it, as docs/tiers.md says)."""
    from tests.tierdest import TierDestination, aws_env, forget_s3_clients

    if request.param == "dir":
        yield TierDestination("dir", tmp_path)
        return
    endpoint = request.getfixturevalue("moto_endpoint")
    for k, v in aws_env(endpoint).items():
        monkeypatch.setenv(k, v)
    forget_s3_clients()
    yield TierDestination("s3", tmp_path, endpoint)
    forget_s3_clients()


#: Power-cut campaigns run in this session: ``(label, [CampaignReport, ...])``, appended by the
#: crash tests through the ``crash_ledger`` fixture and printed at the end of the run.
_CRASH_CAMPAIGNS: list[tuple[str, list]] = []


@pytest.fixture(scope="session")
def crash_ledger():
    """Where a crash test records its campaigns' reports (printed in the terminal summary: each
    campaign's points and failures, and the lane's distinct power-cut points)."""
    return _CRASH_CAMPAIGNS


def pytest_terminal_summary(terminalreporter):
    if not _CRASH_CAMPAIGNS:
        return
    from retainz.testing.crashtest import distinct_points

    tr = terminalreporter
    tr.section("power-cut campaigns")
    for label, reports in _CRASH_CAMPAIGNS:
        tr.write_line(f"{label}: {distinct_points(reports)} points, "
                      f"{sum(len(r.failures) for r in reports)} failures")
    every = [r for _, reports in _CRASH_CAMPAIGNS for r in reports]
    tr.write_line(f"total: {distinct_points(every)} distinct power-cut points "
                  f"(workload, script, boundary, state) in {len(every)} campaigns, "
                  f"{sum(len(r.failures) for r in every)} failures")
