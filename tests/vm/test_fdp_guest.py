"""The QEMU FDP guest lane: the store on a real Linux NVMe namespace with Flexible Data Placement.

A guest is booted under a QEMU >= 8.0 (``make vm-setup`` unpacks Debian's bookworm-backports QEMU into
``cache/vm/qemu/``, :func:`retainz.vm.setup.ensure_fdp_qemu`) with one FDP subsystem (``fdp.nruh=4`` reclaim
unit handles, one reclaim group, 64 MiB reclaim units) and a 64 MiB namespace, ``/dev/nvme0n1``.  Inside,
the ``guest_`` tests of this file run with ``RETAINZ_TEST_FDP`` naming the namespace: a store on
:class:`~retainz.zoned.linuxfdp.LinuxFdpDevice` (zones of 1 MiB, one placement handle per active zone)
writes generations with RetainZ's placement (overlapping saves of different reclaim times), reads every
byte back, deletes one (Deallocate), and at every step the drive's own accounts agree with the host's
ledger of what it sent through each placement identifier:

* Reclaim Unit Handle Status: for every placement identifier, the logical blocks its current reclaim unit
  has taken (RU size - RUAMW) are exactly the bytes sent through it since its last RUH Update (QEMU counts
  RUAMW per handle in ``nvme_do_write_fdp``; an RU larger than one zone means no RU fills on its own);
* FDP statistics log (22h): HBMW is every byte the store wrote, MBMW is HBMW plus the unwritten remainders
  of the RUs the RUH Updates closed (QEMU ``nvme_update_ruh``; QEMU models no garbage collection).

Run with ``pytest -m fdp_guest tests/vm/test_fdp_guest.py`` (``make test`` does).  Without a QEMU >= 8.0 (no
root, no registry) the lane skips with the reason, and fails under ``CI=true``.  The unmarked tests at the
end check the pieces on the host without booting anything.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out" / "fdp_guest"
JUNIT = OUT / "junit.xml"
#: Seconds before a hung guest is killed: a guard, not a budget (the guest took 81 s at load 5, 270 s at
#: load 19).
GUEST_TIMEOUT = float(os.environ.get("RETAINZ_GUEST_TIMEOUT", "600"))
MiB = 1 << 20
#: The guest's FDP namespace (retainz.vm.guest.FDPConfig): 64 zones of 1 MiB, 4 handles, 64 MiB RUs.
GUEST_FDP = dict(size=64 * MiB, ru_size=64 * MiB, handles=4)
ZONE = 1 * MiB
FDP_DEV = os.environ.get("RETAINZ_TEST_FDP", "")
in_guest = pytest.mark.skipif(not FDP_DEV, reason="runs inside the FDP guest (RETAINZ_TEST_FDP unset)")


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"the QEMU FDP guest lane cannot run on this CI machine: {reason}", pytrace=False)
    pytest.skip(f"QEMU FDP guest lane unavailable: {reason}")


@pytest.fixture(scope="module")
def fdp_guest_run():
    """Boot the FDP guest once; returns ``(GuestResult, {test name: (outcome, message)})``."""
    from retainz.vm.guest import FDPConfig, GuestConfig, run_in_guest
    from retainz.vm.setup import VMSetupError, ensure_all, ensure_fdp_qemu

    if FDP_DEV:
        pytest.skip("already inside the FDP guest")
    try:
        ensure_all(install=True)
        ensure_fdp_qemu(install=True)
    except VMSetupError as e:
        _unavailable(str(e))
    OUT.mkdir(parents=True, exist_ok=True)
    JUNIT.unlink(missing_ok=True)
    cfg = GuestConfig(zns=None, nullblk=None, fdp=FDPConfig(**GUEST_FDP), timeout=GUEST_TIMEOUT, cwd=str(ROOT),
                      env={"RETAINZ_TEST_FDP": "/dev/nvme0n1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--tb=short", "-k", "test_guest_", "-m", "not fdp_guest",
           "--durations=5",
           f"--junitxml={JUNIT}", str(Path(__file__).relative_to(ROOT))]
    t0 = time.monotonic()
    result = run_in_guest(cmd, OUT, cfg)
    print(f"\nfdp_guest: guest ran in {time.monotonic() - t0:.1f} s, exit status {result.status}; "
          f"console log {result.console_log}")
    cases = {}
    if JUNIT.exists():
        for tc in ET.parse(JUNIT).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = tc.find(tag)
                if el is not None:
                    outcome, message = tag, (el.get("message") or "") + "\n" + (el.text or "")
                    break
            cases[tc.get("name")] = (outcome, message.strip())
    return result, cases


GUEST_CASES = ("test_guest_store_places_generations_in_handles_the_drive_confirms",
               "test_guest_writes_carry_the_placement_identifier",
               "test_guest_nvme_cli_fdp_plugin_sees_the_placed_writes",
               "test_guest_store_recovers_after_a_killed_process")


@pytest.mark.fdp_guest
@pytest.mark.parametrize("name", GUEST_CASES)
def test_fdp_guest_case_passed(fdp_guest_run, name):
    result, cases = fdp_guest_run
    assert not result.timed_out, f"the guest hung and was killed; console:\n{result.console_tail()}"
    assert name in cases, f"{name} did not run in the guest (exit {result.status}); console:\n" \
                          f"{result.console_tail()}"
    outcome, message = cases[name]
    assert outcome == "passed", f"{name} {outcome} in the guest:\n{message[:3000]}"


# -- inside the guest -------------------------------------------------------------------------------------

def _drive_matches_ledger(dev, base_stats) -> dict[int, int]:
    """The drive's RUH Status and FDP statistics agree with the host's ledger; returns the bytes each
    placement identifier's current RU has taken."""
    ledger = dev.placements()
    status = {r.pid: r for r in dev.ruh_status()}
    bs = dev.geometry.block_size
    taken = {}
    for h, led in enumerate(ledger):
        pid = dev.placement_id(h)
        taken[pid] = (GUEST_FDP["ru_size"] // bs - status[pid].ruamw) * bs
        assert taken[pid] == led.since_update, (pid, taken[pid], led)
    st = dev.fdp_statistics()
    hbmw = st.host_bytes_written - base_stats.host_bytes_written
    mbmw = st.media_bytes_written - base_stats.media_bytes_written
    assert hbmw == sum(led.written for led in ledger) > 0
    assert mbmw == hbmw + sum(led.padding for led in ledger)
    return taken


@in_guest
def test_guest_writes_carry_the_placement_identifier():
    """One raw write per placement identifier: the drive's RUH Status moves for that identifier only, by
    the blocks written (DTYPE 2 in CDW12 23:20, DSPEC in CDW13 31:16 reach the handle)."""
    from retainz.zoned.linuxfdp import LinuxFdpDevice

    dev = LinuxFdpDevice(FDP_DEV, zone_capacity=ZONE, ru_size=GUEST_FDP["ru_size"])
    try:
        pids = [dev.placement_id(h) for h in range(dev.geometry.max_active)]
        assert pids == [0, 1, 2, 3]
        bs = dev.geometry.block_size
        last = dev.geometry.nr_zones - 1          # a zone the store test below does not reach first
        for n, pid in enumerate(pids, start=1):
            before = {r.pid: r.ruamw for r in dev.ruh_status()}
            dev._nvme.write((last * ZONE + 64 * 1024 * pid) // bs, bytes([pid + 1]) * (n * bs), placement_id=pid)
            after = {r.pid: r.ruamw for r in dev.ruh_status()}
            assert {p: before[p] - after[p] for p in pids} == {p: (n if p == pid else 0) for p in pids}
        dev._nvme.deallocate(last * ZONE // bs, ZONE // bs)
        dev._nvme.flush()
        for pid in pids:   # leave every handle at a fresh RU for the store test
            dev._nvme.ruh_update(pid)
        assert all(r.ruamw == GUEST_FDP["ru_size"] // bs for r in dev.ruh_status())
    finally:
        dev.close()


@in_guest
def test_guest_store_places_generations_in_handles_the_drive_confirms():
    """The store on the FDP namespace: overlapping saves of different reclaim times land in different
    zones and so different placement handles; every step's bytes are accounted for by the drive per
    handle; every generation reads back bit for bit; a delete deallocates; fsck is clean."""
    from retainz.hint import Hint
    from retainz.store import Store
    from retainz.zoned.linuxfdp import LinuxFdpDevice

    dev = LinuxFdpDevice(FDP_DEV, zone_capacity=ZONE, ru_size=GUEST_FDP["ru_size"], zones=48)
    base = dev.fdp_statistics()
    try:
        store = Store.format(dev)
        _drive_matches_ledger(dev, base)
        expect: dict[str, dict[str, bytes]] = {}
        for rnd in range(3):
            # two overlapping saves: a short-lived one (reclaimed soon) and a long-lived one
            writers = {}
            for gid, reclaim in ((f"short{rnd}", 10 * rnd + 12), (f"long{rnd}", 1000 + rnd)):
                shards = {f"rank{r}": random.Random(f"{gid}/{r}").randbytes(ZONE // 2 + 4096 * r + 77)
                          for r in range(2)}
                expect[gid] = shards
                writers[gid] = store.begin_generation(gid, 10 * rnd, hint=Hint(reclaim_step=reclaim),
                                                      declared_size=sum(map(len, shards.values())))
            for r in range(2):             # interleaved: both generations' zones are active at once
                for gid, w in writers.items():
                    w.write_shard(f"rank{r}", [expect[gid][f"rank{r}"]])
            for w in writers.values():
                w.commit()
            _drive_matches_ledger(dev, base)
            first = {gid: store.generation(gid).shards["rank0"].extents[0][0] for gid in writers}
            zones = {gid: {e[0] for sh in store.generation(gid).shards.values() for e in sh.extents}
                     for gid in writers}
            # RetainZ's placement: the two reclaim times start in zones of their own (they may share a zone
            # later, when more groups are in flight than handles: the active-zone balance decides), and the
            # two zones, active at once, went through different placement identifiers
            assert first[f"short{rnd}"] != first[f"long{rnd}"], zones
            pids = [dev.zone_placement(z) for z in first.values()]
            assert None not in pids and pids[0] != pids[1], (first, pids)
        for gid, shards in expect.items():
            for name, data in shards.items():
                assert b"".join(store.read_shard(gid, name)) == data
        store.delete("short0", step=100)
        del expect["short0"]
        _drive_matches_ledger(dev, base)
        rep = store.fsck()
        assert rep.ok, rep.problems
        assert rep.generations == len(expect)
        store.close()
    finally:
        dev.close()


_CRASH_CHILD = r"""
import os, random, signal, sys
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned.linuxfdp import LinuxFdpDevice

dev = LinuxFdpDevice(sys.argv[1], zone_capacity=int(sys.argv[2]), ru_size=int(sys.argv[3]), zones=48)
store = Store.format(dev, force=True)
w = store.begin_generation("kept", 1, hint=Hint(reclaim_step=500), declared_size=2 * int(sys.argv[4]))
for r in range(2):
    w.write_shard(f"rank{r}", [random.Random(f"kept/{r}").randbytes(int(sys.argv[4]))])
w.commit()
w = store.begin_generation("lost", 2, hint=Hint(reclaim_step=20), declared_size=int(sys.argv[4]))
w.write_shard("rank0", [random.Random("lost/0").randbytes(int(sys.argv[4]))])
dev.flush()      # the uncommitted generation's bytes are on the namespace, its commit is not
os.kill(os.getpid(), signal.SIGKILL)
"""


@in_guest
def test_guest_store_recovers_after_a_killed_process():
    """A process formats the store on the FDP namespace, commits one generation, writes another without
    committing it and is SIGKILLed.  A new process opens the namespace (the zone table from its zone-state
    slots) and the store (journal replay and recovery): the committed generation reads back bit for bit,
    the uncommitted one is gone, fsck is clean, and a new generation writes and reads back."""
    import subprocess

    from retainz.hint import Hint
    from retainz.store import Store
    from retainz.zoned import ZoneCond
    from retainz.zoned.linuxfdp import LinuxFdpDevice

    size = ZONE + ZONE // 3 + 4096 * 3 + 11
    r = subprocess.run([sys.executable, "-c", _CRASH_CHILD, FDP_DEV, str(ZONE), str(GUEST_FDP["ru_size"]),
                        str(size)], capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, (r.returncode, r.stderr[-3000:])
    dev = LinuxFdpDevice(FDP_DEV, zone_capacity=ZONE, ru_size=GUEST_FDP["ru_size"], zones=48)
    try:
        used = [z for z in dev.report_zones() if z.cond != ZoneCond.EMPTY]
        assert used, "the zone table was not restored from the namespace"
        store = Store.open(dev)
        assert [g.id for g in store.generations()] == ["kept"]
        for rank in range(2):
            assert b"".join(store.read_shard("kept", f"rank{rank}")) == random.Random(f"kept/{rank}").randbytes(size)
        rep = store.fsck()
        assert rep.ok and rep.generations == 1, rep.problems
        data = random.Random("after").randbytes(size)
        w = store.begin_generation("after", 3, hint=Hint(reclaim_step=600), declared_size=size)
        w.write_shard("rank0", [data])
        w.commit()
        assert b"".join(store.read_shard("after", "rank0")) == data
        store.close()
    finally:
        dev.close()
    # the store commands open the namespace through its device spec (read-only, for fsck)
    spec = f"nvme-fdp:dev={FDP_DEV},zone_capacity={ZONE},ru_size={GUEST_FDP['ru_size']},zones=48"
    fsck = subprocess.run([sys.executable, "-m", "retainz.cli", "fsck", spec], capture_output=True, text=True, timeout=300)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert fsck.stdout.startswith("fsck: 2 generations, 3 shards"), fsck.stdout   # kept (2 ranks), after (1)


def _nvme_cli(*args: str) -> dict:
    import json
    import shutil
    import subprocess

    nvme = shutil.which("nvme") or "/usr/sbin/nvme"
    r = subprocess.run([nvme, *args, "-o", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"nvme {' '.join(args)}: exit {r.returncode}: {r.stderr}{r.stdout}"
    return json.loads(r.stdout)


@in_guest
def test_guest_nvme_cli_fdp_plugin_sees_the_placed_writes():
    """nvme-cli's fdp plugin (installed by `make vm-setup`), an independent reader of the drive: after
    three blocks through placement identifier 2, ``nvme fdp status`` shows that identifier's RUAMW down by
    3 and no other moved, ``nvme fdp stats`` HBMW up by 3 blocks and equal to the ioctl's log 0x22, and
    ``nvme fdp usage`` lists the namespace's four handles as host-specified (RUHA 1)."""
    from retainz.zoned.linuxfdp import LinuxFdpDevice

    dev = LinuxFdpDevice(FDP_DEV, zone_capacity=ZONE, ru_size=GUEST_FDP["ru_size"])
    try:
        bs = dev.geometry.block_size
        before = {int(d["pid"]): int(d["ruamw"]) for d in _nvme_cli("fdp", "status", FDP_DEV)["ruhss"]}
        hbmw = int(_nvme_cli("fdp", "stats", FDP_DEV, "--endgrp-id=1")["hbmw"])
        assert before == {r.pid: r.ruamw for r in dev.ruh_status()}
        dev._nvme.write((dev.geometry.nr_zones - 2) * ZONE // bs, bytes(3 * bs), placement_id=2)
        after = {int(d["pid"]): int(d["ruamw"]) for d in _nvme_cli("fdp", "status", FDP_DEV)["ruhss"]}
        assert {p: before[p] - after[p] for p in before} == {0: 0, 1: 0, 2: 3, 3: 0}
        stats = _nvme_cli("fdp", "stats", FDP_DEV, "--endgrp-id=1")
        mine = dev.fdp_statistics()
        assert int(stats["hbmw"]) == hbmw + 3 * bs == mine.host_bytes_written
        assert (int(stats["mbmw"]), int(stats["mbe"])) == (mine.media_bytes_written, mine.media_bytes_erased)
        usage = _nvme_cli("fdp", "usage", FDP_DEV, "--endgrp-id=1")
        assert [int(u["ruha"]) for u in usage["ruhus"]] == [1, 1, 1, 1]
        dev._nvme.deallocate((dev.geometry.nr_zones - 2) * ZONE // bs, 3)
    finally:
        dev.close()


# -- on the host (no guest) ---------------------------------------------------------------------------------

def test_fdp_config_makes_an_fdp_subsystem_and_namespace(tmp_path):
    from retainz.vm.guest import FDPConfig

    args = FDPConfig(size=64 * MiB, ru_size=32 * MiB, handles=3).qemu_args(tmp_path / "fdp.raw")
    joined = " ".join(args)
    assert "nvme-subsys,id=fdpsubsys,nqn=retainz-fdp,fdp=on,fdp.runs=33554432,fdp.nrg=1,fdp.nruh=3" in joined
    assert "nvme,serial=fdp0,id=nvmefdp,subsys=fdpsubsys" in joined
    assert joined.endswith("fdp.ruhs=0;1;2")
    for bad in (dict(handles=0), dict(handles=128), dict(size=5000), dict(ru_size=100)):
        with pytest.raises(ValueError):
            FDPConfig(**bad).check()


def test_find_fdp_qemu_takes_only_qemu_8_or_newer(tmp_path, monkeypatch):
    from retainz.vm import setup

    for version, ok in (("7.2.22", False), ("8.0.0", True), ("10.0.2", True)):
        fake = tmp_path / f"qemu-{version}"
        fake.write_text(f"#!/bin/sh\necho 'QEMU emulator version {version} (Debian)'\n")
        fake.chmod(0o755)
        monkeypatch.setenv("RETAINZ_FDP_QEMU", str(fake))
        assert setup.find_fdp_qemu(tmp_path) == (str(fake) if ok else None)
        if not ok:
            with pytest.raises(setup.VMSetupError, match="not a QEMU >= 8.0"):
                setup.ensure_fdp_qemu(tmp_path, install=False)


def test_nvme_fdp_spec_names_a_real_fdp_namespace():
    """``nvme-fdp:dev=...`` is its own kind (before it, the text was taken for a device-file path): the
    block device is its key and path, it outlives the command, and its keys are checked."""
    from retainz.errors import DeviceFormatError
    from retainz.zoned import parse_device

    d = parse_device("nvme-fdp:dev=/dev/nvme0n1,zone_capacity=1MiB,ru_size=64MiB,zones=48")
    assert (d.kind, d.path, d.key, d.persistent) == ("nvme-fdp", "/dev/nvme0n1", "/dev/nvme0n1", True)
    for bad, why in (("nvme-fdp:dev=/dev/nvme0n1", "no zone_capacity, ru_size"),
                     ("nvme-fdp:dev=/dev/x,zone_capacity=1MiB,ru_size=1MiB,spare=0.1", "unknown key"),
                     ("nvme-fdp:dev=/dev/x,zone_capacity=1Mi_B,ru_size=1MiB", "is not a size"),
                     ("nvme-fdp:dev=/dev/x,zone_capacity=1MiB,ru_size=1MiB,handles=0", "not a positive count")):
        with pytest.raises(DeviceFormatError, match=why):
            parse_device(bad)
    with pytest.raises(FileNotFoundError, match="no such block device"):
        parse_device("nvme-fdp:dev=/dev/nvme-none,zone_capacity=1MiB,ru_size=1MiB").open()


def test_write_command_carries_dtype_and_dspec(monkeypatch):
    """The 80-byte nvme_passthru_cmd64 of a placed write: opcode 01h, SLBA in CDW10/11, NLB-1 and
    DTYPE 2 in CDW12 (bits 23:20), the placement identifier in CDW13 bits 31:16."""
    from retainz.zoned import nvmeioctl, syscalls

    sent = []

    def fake_ioctl(fd, request, arg=0, mutate=False):
        if request == nvmeioctl.NVME_IOCTL_ID:
            return 7
        sent.append((request, bytes(arg)))
        return 0

    monkeypatch.setattr(syscalls.fcntl, "ioctl", fake_ioctl)   # the ioctls are made in zoned/syscalls.py
    p = nvmeioctl.NvmePassthrough(99, 4096, 128 * 1024)
    p.write((1 << 32) + 5, bytes(3 * 4096), placement_id=3)
    p.write(8, bytes(4096), placement_id=None)
    p.ruh_update(2)
    req, raw = sent[0]
    f = struct.unpack("<BBHIIIQQIIIIIIIIIIQ", raw)
    assert req == 0xC0504E48 and f[0] == 0x01 and f[3] == 7 and f[9] == 3 * 4096
    assert (f[10], f[11]) == (5, 1)                       # SLBA low / high
    assert f[12] == (2 << 20) | 2 and f[13] == 3 << 16     # NLB-1 = 2, DTYPE 2; DSPEC 3
    f = struct.unpack("<BBHIIIQQIIIIIIIIIIQ", sent[1][1])
    assert (f[12], f[13]) == (0, 0)                        # no directive
    f = struct.unpack("<BBHIIIQQIIIIIIIIIIQ", sent[2][1])
    assert f[0] == 0x1D and f[10] == 1                     # I/O management send, RUH Update
    p.close()


def test_kernel_dir_from_the_environment_is_used(tmp_path, monkeypatch):
    """``$RETAINZ_VM_KERNEL_DIR`` names an unpacked kernel folder (``boot/vmlinuz-R``, indexed
    ``lib/modules/R``): the guest lanes boot it instead of downloading one (the FDP lane's runs used
    the ZNS lane's kernel this way)."""
    from retainz.vm import setup

    root = tmp_path / "linux-image-6.1.0-9-amd64"
    (root / "boot").mkdir(parents=True)
    (root / "boot" / "vmlinuz-6.1.0-9-amd64").write_bytes(b"kernel")
    monkeypatch.setenv("RETAINZ_VM_KERNEL_DIR", str(root))
    with pytest.raises(setup.VMSetupError, match="indexed modules"):
        setup.ensure_kernel(tmp_path / "cache", install=False)
    (root / "lib" / "modules" / "6.1.0-9-amd64").mkdir(parents=True)
    (root / "lib" / "modules" / "6.1.0-9-amd64" / "modules.dep").write_text("")
    k = setup.ensure_kernel(tmp_path / "cache", install=False)
    assert (k.root, k.release, k.vmlinuz) == (root, "6.1.0-9-amd64", root / "boot" / "vmlinuz-6.1.0-9-amd64")
