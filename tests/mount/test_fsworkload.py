"""The file-system comparison's pieces on the host (no guest): the workload driver's file replay on a
regular folder (files, fsync, deletes, read-back, a capacity stop), its trace arithmetic, system specs,
the manifest's ``system`` field, namespace sizing and the record checks.  The guest runs themselves are
in tests/vm/test_zns_guest.py."""

from __future__ import annotations

import errno
import glob
import json
import os

import pytest

from retainz.experiments import fsworkload as fw
from retainz.experiments.filesystems import guest_config, namespace_zones
from retainz.experiments.manifest import ManifestError, expand, load_manifest
from retainz.trace.format import CommitEvent, DeleteEvent, SaveEvent
from retainz.trace.generate import write_generated
from retainz.trace.io import TraceReader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def trace(tmp_path):
    """10 saves of a 2-file layout (TorchTitan keep 3): small enough to write as real files."""
    from retainz.experiments.runner import scaled_layout

    p = str(tmp_path / "t.jsonl")
    write_generated(p, scaled_layout("smollm2-135m-dcp", "1/4096"), "torchtitan:interval=500,keep_latest_k=3", 5000)
    with TraceReader(p) as r:
        events = list(r)
    return p, events


def test_parse_system_specs_and_refusals():
    assert fw.parse_system("btrfs") == fw.SystemSpec("btrfs", {})
    s = fw.parse_system("btrfs:bg_reclaim_threshold=51")
    assert s.options == {"bg_reclaim_threshold": 51} and s.spec() == "btrfs:bg_reclaim_threshold=51"
    assert fw.parse_system("f2fs").spec() == "f2fs"
    with pytest.raises(ValueError, match="unknown system 'ext4'"):
        fw.parse_system("ext4")
    with pytest.raises(ValueError, match="unknown option 'bg_reclaim_threshold=5'"):
        fw.parse_system("f2fs:bg_reclaim_threshold=5")
    with pytest.raises(ValueError, match="percentage 0-100, got 150"):
        fw.parse_system("btrfs:bg_reclaim_threshold=150")
    with pytest.raises(ValueError, match="must be an integer"):
        fw.parse_system("btrfs:bg_reclaim_threshold=high")


def test_file_replay_writes_fsyncs_deletes_and_reads_back(tmp_path, trace, monkeypatch):
    _, events = trace
    root = tmp_path / "mnt"
    root.mkdir()
    fsynced = []
    real_fsync = os.fsync
    monkeypatch.setattr(fw.os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd))[1])
    fr = fw.FileReplay(str(root))
    fr.run(events)
    saves = [e for e in events if isinstance(e, SaveEvent)]
    deletes = [e for e in events if isinstance(e, DeleteEvent)]
    assert fr.stop_step is None and fr.saves_committed == len(saves) == 10
    assert fr.generations_deleted == len(deletes) == 6
    assert fr.checkpoint_bytes == sum(e.nbytes for e in saves)
    # every commit fsyncs each shard file, the generation's folder and the root
    assert len(fsynced) == sum(len(e.shards) + 2 for e in saves)
    left = sorted(os.listdir(root))
    survivors = fw.survivors_before(events, None)
    assert left == sorted(f"{g:08d}-{e.name}" for g, e in survivors.items()) and len(left) == 4
    for g, e in survivors.items():
        for s in e.shards:
            assert os.path.getsize(root / f"{g:08d}-{e.name}" / s.name) == s.nbytes
    gens, nbytes, problems = fr.verify(events)
    assert (gens, problems) == (4, []) and nbytes == sum(e.nbytes for e in survivors.values())
    # the read-back has teeth: one flipped byte is found
    g, e = sorted(survivors.items())[0]
    path = root / f"{g:08d}-{e.name}" / e.shards[0].name
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    _, _, problems = fr.verify(events)
    assert len(problems) == 1 and "differs at byte" in problems[0] and e.shards[0].name in problems[0]


def test_file_replay_stops_at_the_first_enospc_and_keeps_the_committed(tmp_path, trace, monkeypatch):
    _, events = trace
    saves = [e for e in events if isinstance(e, SaveEvent)]
    budget = [sum(e.nbytes for e in saves[:5]) + 100]   # the sixth save runs out of space
    real_write = os.write

    def write(fd, data):
        if budget[0] < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        budget[0] -= len(data)
        return real_write(fd, data)

    monkeypatch.setattr(fw.os, "write", write)
    root = tmp_path / "mnt"
    root.mkdir()
    fr = fw.FileReplay(str(root))
    fr.run(events)
    assert fr.stop_step == saves[5].step == 3000 and fr.stop_errno == "ENOSPC"
    assert "SaveEvent of generation 5 at step 3000" in fr.stop_error
    assert events[fr.stop_index] is saves[5] or events[fr.stop_index] == saves[5]
    assert fr.saves_committed == 5
    # fill at the failure: generations 2, 3, 4 live (0 and 1 deleted after 3 and 4 committed) + the 6th whole
    assert fw.fill_at(events, fr.stop_index) == sum(e.nbytes for e in saves[2:6])
    monkeypatch.setattr(fw.os, "write", real_write)
    gens, _, problems = fr.verify(events)
    assert gens == 3 and problems == []    # the half-written sixth save is not a survivor, and not an error


@pytest.mark.parametrize("failing", ["save", "commit", "delete"])
def test_the_generation_whose_operation_failed_is_in_doubt_not_a_read_back_problem(tmp_path, trace, monkeypatch,
                                                                                    failing):
    """btrfs zoned aborting a transaction fails whichever operation is in flight (a write with EROFS, a
    commit's fsync with EIO, a delete halfway): that generation may be whole, partial or gone."""
    _, events = trace
    kinds = {"save": SaveEvent, "commit": CommitEvent, "delete": DeleteEvent}
    target = [e for e in events if isinstance(e, kinds[failing])][3]
    real = {"write": os.write, "fsync": os.fsync, "unlink": os.unlink}
    armed = {"on": False}

    def failing_call(name, err):
        def call(*a, **kw):
            if armed["on"]:
                if name == "unlink":              # the delete removes one file, then fails
                    armed["on"] = False
                    real[name](*a, **kw)
                raise OSError(err, os.strerror(err))
            return real[name](*a, **kw)
        return call

    monkeypatch.setattr(fw.os, "write", failing_call("write", errno.EROFS))
    monkeypatch.setattr(fw.os, "fsync", failing_call("fsync", errno.EIO))
    monkeypatch.setattr(fw.os, "unlink", failing_call("unlink", errno.EIO))
    root = tmp_path / "mnt"
    root.mkdir()
    fr = fw.FileReplay(str(root))
    stop = events.index(target)
    fr.run(events[:stop])
    armed["on"] = True
    fr.run(events[stop:stop + 1])
    armed["on"] = False
    fr.stop_index += stop
    assert fr.stop_step == target.step and fr.stop_errno == {"save": "EROFS", "commit": "EIO", "delete": "EIO"}[failing]
    assert fr.in_doubt is not None and fr.in_doubt.startswith(f"{target.gen:08d}-")
    assert fr.in_doubt in os.listdir(root)       # left behind, whole or in part
    gens, _, problems = fr.verify(events)
    assert problems == []
    want = {g for g in fw.survivors_before(events, fr.stop_index) if g != target.gen}
    assert gens == len(want) >= 2
    # the read-back still has teeth around it: a stray folder is a problem
    (root / "stray").mkdir()
    assert fr.verify(events)[2] == [f"{root}/stray: not a surviving generation"]


def test_kernel_errors_keep_the_lines_naming_the_file_system():
    log = ("nvme nvme0: I/O 12 QID 1 timeout\n"
           "BTRFS: error (device nvme0n1: state A) in btrfs_create_pending_block_groups:2562: errno=-28 No space left\n"
           "BTRFS info (device nvme0n1: state EA): forced readonly\n"
           "F2FS-fs (vda): inconsistent node block\n")
    assert fw.kernel_errors(log, "btrfs") == [
        "BTRFS: error (device nvme0n1: state A) in btrfs_create_pending_block_groups:2562: errno=-28 No space left",
        "BTRFS info (device nvme0n1: state EA): forced readonly"]
    assert fw.kernel_errors(log, "f2fs") == ["F2FS-fs (vda): inconsistent node block"]
    assert fw.kernel_errors(log, "btrfs", limit=1) == fw.kernel_errors(log, "btrfs")[:1]
    assert fw.kernel_errors("", "btrfs") == []


def test_survivors_and_fill_follow_the_trace(trace):
    _, events = trace
    saves = [e for e in events if isinstance(e, SaveEvent)]
    first = next(i for i, e in enumerate(events) if e is saves[4] or e == saves[4])
    assert sorted(fw.survivors_before(events, first)) == [1, 2, 3]
    assert fw.fill_at(events, first) == sum(e.nbytes for e in saves[1:5])


def test_filesystems_manifest_expands_and_leaves_other_ids_alone():
    m, cases = load_manifest(os.path.join(ROOT, "experiments", "filesystems.json"))
    assert m["manifest"] == "filesystems" and len(cases) == 33
    systems = sorted({(c.inputs["system"], c.inputs["policy"] if c.inputs["system"] == "retainz" else "-")
                      for c in cases})
    assert systems == [("btrfs", "-"), ("btrfs:bg_reclaim_threshold=51", "-"), ("f2fs", "-"),
                       ("retainz", "greedy"), ("retainz", "retainz"), ("retainz", "zenfs")]
    assert all(c.inputs["device"] == "guest" for c in cases)
    # ZenFS-Alloc runs exactly where the namespace has at least its 32-zone minimum (ZENFS_MIN_ZONES):
    # the committed RetainZ records say how many zones each (rule, pressure) namespace got
    zones = {}
    for path in glob.glob(os.path.join(ROOT, "results", "runs", "filesystems-retainz-*.json")):
        r = json.load(open(path))
        zones[(r["inputs"]["rule"], r["inputs"]["pressure"])] = r["metrics"]["namespace_zones"]
    zenfs = {(c.inputs["rule"], c.inputs["pressure"]) for c in cases if c.inputs["policy"] == "zenfs"
             and c.inputs["system"] == "retainz"}
    assert len(zones) == 6 and zenfs == {k for k, n in zones.items() if n >= 32} and len(zenfs) == 3
    assert {c.id.split("-")[1] for c in cases} == {"retainz", "greedy", "zenfs", "btrfs", "f2fs"}
    # a case without a system has no "system" input, so the ids recorded before the field stay put
    _, quick = load_manifest(os.path.join(ROOT, "experiments", "quick.json"))
    assert all("system" not in c.inputs for c in quick)
    assert all("guest_memory_mib" not in c.inputs for c in cases + quick)     # the default: absent


@pytest.mark.parametrize("fields,message", [
    ({"system": "ext4"}, "key 'system': unknown system 'ext4'"),
    ({"system": "btrfs", "device": "memory"}, "runs on device 'guest', not 'memory'"),
    ({"system": "btrfs", "guest_memory_mib": 64}, r"key 'guest_memory_mib' must be in \[128, 65536\]"),
    ({"system": "btrfs", "guest_memory_mib": "2GiB"}, "guest_memory_mib"),
    ({"system": "btrfs", "guest_memory_mib": 131072}, r"must be in \[128, 65536\]"),
    ({"device": "memory", "guest_memory_mib": 2048}, "device 'memory' runs no guest"),
    ({"device": "file", "guest_memory_mib": 2048}, "device 'file' runs no guest"),
])
def test_manifest_refuses_bad_system_cases(fields, message):
    m = {"manifest": "t", "format": 1, "defaults": {
        "layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=3", "steps": 5000,
        "zone_size": "16MiB", "zone_capacity": "16MiB", "max_active": 14, "max_open": 14, "pressure": 0.5,
        "device": "guest", "policy": "retainz"},
        "blocks": [{"experiment": "filesystems", "rows": [fields]}]}
    with pytest.raises(ManifestError, match=message):
        expand(m)


def test_namespace_sizing_and_guest_devices():
    assert namespace_zones(412 << 20, 16 << 20, pressure=0.5, zones=None) == 52
    assert namespace_zones(0, 16 << 20, pressure=None, zones=20) == 20
    with pytest.raises(ValueError, match="needs at least 8"):
        namespace_zones(10 << 20, 16 << 20, pressure=0.9, zones=None)
    inputs = {"zone_size": 16 << 20, "zone_capacity": 16 << 20, "max_open": 14, "max_active": 14}
    f2fs = guest_config("f2fs", 52, inputs, timeout=60, cwd="/")
    assert f2fs.disk is not None and f2fs.disk.block_size == 4096 and f2fs.modules == ("f2fs",)
    assert f2fs.scheduler == "mq-deadline" and f2fs.nullblk is None and f2fs.zns.zones == 52
    btrfs = guest_config("btrfs:bg_reclaim_threshold=51", 52, inputs, timeout=60, cwd="/")
    assert btrfs.disk is None and btrfs.modules == ("btrfs",)
    rz = guest_config("retainz", 52, inputs, timeout=60, cwd="/")
    assert rz.disk is None and rz.modules == ()
    assert os.path.isdir(os.path.join(rz.env["PYTHONPATH"], "retainz"))
    assert rz.memory_mb == 512 and guest_config("btrfs", 52, {**inputs, "guest_memory_mib": 2048}, timeout=60,
                                                cwd="/").memory_mb == 2048


def test_a_guest_store_replay_boots_the_guest_with_the_case_memory(tmp_path, monkeypatch):
    """``guest_memory_mib`` sizes the guest of a store replay on device guest too, not only a file
    system's."""
    import retainz.vm.guest as guest
    from retainz.experiments.runner import _replay_in_guest

    seen = []

    class Failed:
        status = 1

        def console_tail(self):
            return "stopped by the test"

    monkeypatch.setattr(guest, "run_in_guest", lambda argv, out, cfg, install: seen.append(cfg) or Failed())
    rows = [{}, {"guest_memory_mib": 1024}]
    m = {"manifest": "t", "format": 1, "defaults": {
        "layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=3", "steps": 5000,
        "zone_size": "16MiB", "zone_capacity": "16MiB", "max_active": 14, "max_open": 14, "zones": 40,
        "device": "guest", "policy": "retainz"}, "blocks": [{"experiment": "g", "rows": rows}]}
    for case in expand(m):
        with pytest.raises(RuntimeError, match="stopped by the test"):
            _replay_in_guest(str(tmp_path / "trace"), case, str(tmp_path))
    assert [c.memory_mb for c in seen] == [512, 1024]


def test_qemu_command_attaches_the_metadata_disk_with_4k_sectors(tmp_path):
    from retainz.vm.guest import DiskConfig, GuestConfig, qemu_command
    from retainz.vm.setup import Kernel

    k = Kernel(root=tmp_path, release="6.1.0-x", vmlinuz=tmp_path / "vmlinuz")
    cfg = GuestConfig(disk=DiskConfig(64 << 20))
    cmd = qemu_command("qemu", k, tmp_path / "i.cpio", tmp_path, cfg, tmp_path / "zns.raw", tmp_path / "c.log",
                       tmp_path / "disk.raw")
    dev = next(a for a in cmd if a.startswith("virtio-blk-pci,"))
    assert "logical_block_size=4096" in dev and "physical_block_size=4096" in dev
    assert f"file={tmp_path / 'disk.raw'},id=disk0,format=raw,if=none,cache=writeback" in cmd
    with pytest.raises(ValueError, match="multiple of the block size"):
        DiskConfig(size=1000).check()


def test_verify_checks_filesystem_records():
    from retainz.experiments.manifest import case_id
    from retainz.experiments.record import finalize
    from retainz.experiments.verify import verify_record

    inputs = {"system": "btrfs", "policy": "retainz", "device": "guest", "steps": 5000}
    tags = {"experiment": "filesystems", "label": None}
    metrics = {"system": "btrfs", "device_bytes_written": 1100, "checkpoint_bytes": 1000, "device_waf": 1.1,
               "enospc_step": 2500, "enospc_fill": 0.5, "peak_fill": 0.5, "zone_resets": 0,
               "capacity_stop_step": 2500, "raw_capacity_bytes": 4000, "verify_ok": True, "bytes_verified": 10,
               "save_throughput": 1.0}
    rec = finalize({"id": case_id(tags, inputs), "manifest": "t", "tags": tags, "inputs": inputs,
                    "backend": "retainz", "provenance": {}, "status": "ok", "metrics": metrics,
                    "capacity_stop_step": 2500, "timing": {},
                    "trace": {"key": "k", "sha256": "0" * 64, "bytes": 1, "file": None}})
    name = rec["id"] + ".json"
    assert verify_record(name, rec) == []
    bad = finalize({**rec, "metrics": {**metrics, "device_waf": 1.5, "enospc_fill": None}})
    problems = verify_record(name, bad)
    assert any("device_waf 1.5 != device_bytes_written / checkpoint_bytes" in p for p in problems)
    assert any("enospc_step and enospc_fill must both be set" in p for p in problems)


def test_same_stream_compares_differently_chunked_streams():
    data = bytes(range(256)) * 40
    assert fw.same_stream(iter([data[:1000], data[1000:]]), iter([data[:3], data[3:5000], data[5000:]])) == \
        (True, len(data))
    bad = bytearray(data)
    bad[4321] ^= 1
    assert fw.same_stream(iter([bytes(bad)]), iter([data[:4096], data[4096:]])) == (False, 4096)
    assert fw.same_stream(iter([data]), iter([data[:-1]]))[0] is False      # longer than expected
    assert fw.same_stream(iter([data[:-1]]), iter([data]))[0] is False      # shorter than expected
