"""Tiers (docs/tiers.md): promotion to a real directory tree, verified copies and manifests, the
bandwidth cap, keep-until-durable retirement, restore and fallback, and the fault list: a destination
that is unreachable, stalled, failing mid-upload or full, a corrupted or torn remote object, and a
promoting process SIGKILLed mid-copy.  Every test ends by checking that nothing committed was lost
and that nothing reported durable is not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

pytest.importorskip("fsspec", reason="needs fsspec (the tier extra)")

from retainz.cli import main  # noqa: E402
from retainz.errors import DestinationError, DurableCopyError, GenerationNotFoundError  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.tier import (  # noqa: E402
    Destination,
    Manifest,
    Promoter,
    RateLimit,
    parse_policy,
    read_durable_shard,
    restore_generation,
)
from retainz.tier.copy import shard_key  # noqa: E402
from retainz.zoned import FileDevice, Geometry  # noqa: E402

GEO = Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20, block_size=4096, max_open=6, max_active=6)
SRC = str(Path(__file__).resolve().parents[2] / "src")


def payload(seed: int, n: int) -> bytes:
    """``n`` reproducible, incompressible-looking bytes."""
    out = bytearray()
    x = seed
    while len(out) < n:
        x = zlib.crc32(x.to_bytes(8, "little"), seed) + (x << 1) & (1 << 62) - 1
        out += x.to_bytes(8, "little")
    return bytes(out[:n])


def save(store, gid: str, step: int, n: int = 300_000) -> dict[str, bytes]:
    shards = {"model.bin": payload(step, n), ".metadata": payload(step + 1, 100)}
    w = store.begin_generation(gid, step)
    for name, data in shards.items():
        w.write_shard(name, [data])
    w.commit()
    return shards


def local_bytes(store, gid: str) -> dict[str, bytes]:
    return {name: b"".join(store.read_shard(gid, name)) for name in store.generation(gid).shards}


def durable_bytes(url: str, gid: str, fs=None) -> dict[str, bytes]:
    dest = Destination(url, fs=fs)
    m = dest.manifest(gid)
    return {c.name: b"".join(read_durable_shard(dest, m, c.name)) for c in m.shards}


def reported_durable_is_durable(p: Promoter, url: str) -> list[str]:
    """Every generation the promoter reports durable has a verified, byte-equal copy at ``url``
    (checked independently of the promoter: a fresh Destination on the real tree)."""
    ids = [r.id for r in p.status() if r.state == "durable"]
    for gid in ids:
        assert durable_bytes(url, gid) == local_bytes(p.store, gid), gid
    return ids


@pytest.fixture
def store(tmp_path):
    dev = FileDevice.create(tmp_path / "dev.img", GEO)
    s = Store.format(dev)
    yield s
    s.close()
    dev.close()


@pytest.fixture
def url(destination):
    """The destination's URL: every test taking it runs on a directory and on S3 (tests/conftest.py)."""
    return destination.url


# -- policy, bandwidth, manifest --------------------------------------------------------------------
@pytest.mark.parametrize("spec, steps, chosen", [
    ("all", [0, 10, 20, 30], [0, 10, 20, 30]),
    ("every:n=20", [0, 10, 20, 30, 40], [0, 20, 40]),
    ("requested", [0, 10, 20], []),
    ("none", [0, 10], []),
])
def test_policy_selects_by_step(spec, steps, chosen):
    pol = parse_policy(spec)
    assert [s for s in steps if pol.selects(f"step-{s}", s)] == chosen
    assert pol.with_request("step-10").selects("step-10", 10)


@pytest.mark.parametrize("spec", ["bogus", "every", "every:n=0", "every:n=x", "every:m=3", "all:n=1"])
def test_malformed_policy_is_one_line(spec):
    with pytest.raises(ValueError) as ei:
        parse_policy(spec)
    assert "\n" not in str(ei.value) and "promotion policy" in str(ei.value)


def test_rate_limit_paces_bytes_at_the_cap():
    t = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        t[0] += s

    lim = RateLimit(2 << 20, clock=lambda: t[0], sleep=sleep)
    for _ in range(10):
        lim.take(1 << 20)
    # a burst of one second's worth (2 MiB) passes, then each MiB waits half a second
    assert slept == [0.5] * 8 and lim.waited == 4.0
    assert t[0] == 4.0      # 10 MiB over 4 s after the 2 MiB burst: 2 MiB/s
    with pytest.raises(ValueError):
        RateLimit(0)


def test_manifest_round_trip_and_damage_detected(store):
    save(store, "step-1", 1)
    gen = store.generation("step-1")
    m = Manifest.of(store.uuid, gen, {n: shard_key(n) for n in gen.shards})
    blob = m.encode()
    assert Manifest.decode(blob, "x") == m and m.matches(gen)
    for bad in (blob[:-5], blob.replace(b'"step": 1', b'"step": 2'), b"[]", b"\xff"):
        with pytest.raises(DurableCopyError):
            Manifest.decode(bad, "x")


# -- promotion ----------------------------------------------------------------------------------------
def test_promotion_copies_verifies_and_writes_the_manifest_last(store, url, destination):
    saved = {f"step-{s}": save(store, f"step-{s}", s) for s in (0, 10, 20)}
    with Promoter(store, url, policy="every:n=20").start() as p:
        assert p.wait(60)
        rows = {r.id: r.state for r in p.status()}
        assert rows == {"step-0": "durable", "step-10": "local", "step-20": "durable"}
        assert reported_durable_is_durable(p, url) == ["step-0", "step-20"]
        assert p.backlog() == (0, 0)
    assert destination.listdir() == ["step-0", "step-20"]
    assert destination.listdir("step-0") == ["MANIFEST.json", "data"]
    assert destination.listdir("step-0/data") == [".metadata", "model.bin"]
    assert destination.cat("step-0/data/model.bin") == saved["step-0"]["model.bin"]


def test_training_does_not_wait_for_a_stalled_destination(store, url, destination):
    fs = destination.faulty()
    fs.gate = threading.Event()
    p = Promoter(store, url, fs=fs).start()
    try:
        save(store, "step-1", 1)
        p.committed("step-1")
        assert fs.waiting.wait(30)                      # the copy is under way, blocked at the destination
        save(store, "step-2", 2)                        # the next save commits meanwhile
        p.committed("step-2")
        states = {r.id: r.state for r in p.status()}
        assert states == {"step-1": "copying", "step-2": "pending"}
        assert not p.is_durable("step-1") and p.backlog() == (2, 600_200)
        fs.gate.set()
        assert p.wait(60)
        assert {r.id: r.state for r in p.status()} == {"step-1": "durable", "step-2": "durable"}
    finally:
        fs.gate.set()
        p.close()


@pytest.mark.parametrize("fault", ["unreachable", "mid-upload", "full", "silent-corruption"])
def test_a_failing_destination_reports_nothing_durable_then_recovers(store, url, destination, fault):
    saved = save(store, "step-1", 1)
    fs = destination.faulty()
    if fault == "unreachable":
        fs.down = True
    elif fault == "mid-upload":
        fs.fail_after = 100_000
    elif fault == "full":
        fs.full = True
    else:
        fs.flip_writes = True
    p = Promoter(store, url, fs=fs, retry_seconds=0.05)
    assert not p.run_pending()
    [row] = p.status()
    assert row.state == "failed" and not p.is_durable("step-1")
    assert {"unreachable": "Connection refused", "mid-upload": "mid-upload",
            "full": "destination full", "silent-corruption": "read back"}[fault] in row.error
    fs.down = fs.full = fs.flip_writes = False
    if fault != "unreachable":   # an independent look at the tree: no manifest
        assert Destination(url).manifest("step-1") is None
    fs.fail_after = None
    assert p.run_pending()
    assert p.status()[0].state == "durable"
    assert durable_bytes(url, "step-1") == saved == local_bytes(store, "step-1")


def test_a_corrupted_remote_object_is_detected_not_durable_and_copied_again(store, url, destination):
    saved = save(store, "step-1", 1)
    p = Promoter(store, url)
    assert p.run_pending()
    data = bytearray(destination.cat("step-1/data/model.bin"))
    data[1234] ^= 0x40                                  # same size: only a read-back sees it
    destination.pipe("step-1/data/model.bin", bytes(data))
    with pytest.raises(DurableCopyError):               # a restore never hands out the bad bytes
        durable_bytes(url, "step-1")
    bad = p.verify(deep=True)
    assert len(bad) == 1 and "model.bin" in bad[0]
    assert p.status()[0].state == "pending" and not p.is_durable("step-1")
    assert Destination(url).manifest("step-1") is None  # nobody else reports it durable either
    assert p.run_pending()
    assert durable_bytes(url, "step-1") == saved


def test_a_truncated_object_or_torn_manifest_is_not_durable(store, url, destination):
    save(store, "step-1", 1)
    p = Promoter(store, url)
    assert p.run_pending()
    destination.pipe("step-1/data/model.bin", b"short")
    assert not Promoter(store, url).is_durable("step-1")
    assert p.run_pending()                               # copied again, the manifest rewritten
    m = "step-1/MANIFEST.json"
    destination.pipe(m, destination.cat(m)[:-40])       # a torn manifest
    fresh = Promoter(store, url)
    fresh.refresh()
    assert fresh.status()[0].state == "pending"
    assert fresh.run_pending() and fresh.is_durable("step-1")


_KILLED = r"""
import sys, time
from retainz.store import Store
from retainz.tier import Promoter
from retainz.zoned import FileDevice
dev = FileDevice(sys.argv[1], readonly=True)
store = Store.open(dev, readonly=True)
seen = [0]
def progress(n):
    seen[0] += n
    if seen[0] > 1_500_000:        # inside step-1's object: stop here until the parent's SIGKILL lands
        print("copying", flush=True)
        time.sleep(600)
p = Promoter(store, sys.argv[2], bandwidth=4 << 20, on_progress=progress)
p.run_pending()
print("finished", flush=True)
"""


def test_sigkill_mid_promotion_leaves_nothing_durable_and_a_restart_finishes(tmp_path, url):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEO)
    store = Store.format(dev)
    saved = {g: save(store, g, s, 2_500_000) for g, s in (("step-1", 1), ("step-2", 2))}
    store.close()
    dev.close()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(path), url], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    try:
        assert proc.stdout.readline().strip() == "copying"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    dev = FileDevice(path)
    with Store.open(dev) as store:
        assert {g: local_bytes(store, g) for g in saved} == saved     # nothing committed is lost
        p = Promoter(store, url)
        p.refresh()
        states = {r.id: r.state for r in p.status()}
        assert states["step-2"] == "pending"                         # never reached
        assert states["step-1"] == "pending"                         # killed mid-copy: no manifest
        assert Destination(url).manifest("step-1") is None
        assert p.run_pending()
        assert reported_durable_is_durable(p, url) == ["step-1", "step-2"]
    dev.close()


# -- keep until durable ---------------------------------------------------------------------------------
def test_retirement_waits_for_the_verified_copy(store, url, destination):
    fs = destination.faulty()
    fs.down = True
    p = Promoter(store, url, fs=fs, retry_seconds=0.05).start()
    try:
        saved = {f"step-{s}": save(store, f"step-{s}", s) for s in (1, 2, 3)}
        for g in saved:
            p.committed(g)
        assert p.retire(store, "step-1", 3) is False      # not durable: deferred, not deleted
        assert p.deferred == ["step-1"]
        assert [g.id for g in store.generations()] == ["step-1", "step-2", "step-3"]
        assert local_bytes(store, "step-1") == saved["step-1"]
        fs.down = False
        assert p.wait(60)
        # durable now: the deferred retirement was carried out, and only then
        assert p.deferred == [] and [g.id for g in store.generations()] == ["step-2", "step-3"]
        assert durable_bytes(url, "step-1") == saved["step-1"]
        assert p.retire(store, "step-2", 3) is True        # durable: deleted at once
    finally:
        p.close()


def test_an_unselected_generation_retires_at_once(store, url):
    save(store, "step-1", 1)
    p = Promoter(store, url, policy="every:n=100")
    assert p.retire(store, "step-1", 2) is True
    with pytest.raises(GenerationNotFoundError):
        store.generation("step-1")


# -- restore --------------------------------------------------------------------------------------------
def test_restore_onto_a_fresh_device(store, url, tmp_path):
    saved = save(store, "step-7", 7)
    assert Promoter(store, url).run_pending()
    dev = FileDevice.create(tmp_path / "fresh.img", GEO)
    with Store.format(dev) as fresh:
        gen = restore_generation(fresh, Destination(url), "step-7")
        assert gen.step == 7 and local_bytes(fresh, "step-7") == saved
        with pytest.raises(GenerationNotFoundError):
            restore_generation(fresh, Destination(url), "step-8")
    dev.close()


# -- the command line -------------------------------------------------------------------------------------
def cli_device(tmp_path, seed: int, n: int, steps: list[int]):
    """``retainz device create`` + ``mkfs`` of ``tmp_path/dev.img`` and a ``put`` of ``model.bin``
    (``payload(seed, n)``) as ``step-S`` for each step; returns (device path, source file)."""
    dev = str(tmp_path / "dev.img")
    src = tmp_path / "model.bin"
    src.write_bytes(payload(seed, n))
    assert main(["device", "create", dev, "--zones", "16", "--zone-size", "1MiB", "--max-open", "6",
                 "--max-active", "6"]) == 0
    assert main(["mkfs", dev]) == 0
    for step in steps:
        assert main(["put", dev, f"step-{step}", str(src), "--step", str(step)]) == 0
    return dev, src


def test_cli_promote_status_get_fallback_restore(tmp_path, url, capsys):
    dev, src = cli_device(tmp_path, 3, 400_000, [10, 20])
    capsys.readouterr()
    assert main(["tier", "status", dev]) == 2                       # no destination yet: one line
    assert "no destination" in capsys.readouterr().err
    assert main(["tier", "promote", dev, "--to", url, "--policy", "every:n=20"]) == 0
    capsys.readouterr()
    assert main(["tier", "status", dev, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["backlog"] == {"generations": 0, "bytes": 0}
    assert [(g["id"], g["state"]) for g in st["generations"]] == [("step-10", "local"), ("step-20", "durable")]
    assert main(["tier", "status", dev]) == 0
    out = capsys.readouterr().out
    assert "step-10\tstep 10\t390.62 KiB\tlocal" in out and "step-20\tstep 20\t390.62 KiB\tdurable" in out
    assert "backlog: 0 generations, 0 B" in out
    # the local copy gone: get reads the durable copy and says so
    assert main(["rm", dev, "step-20"]) == 0
    assert main(["get", dev, "step-20", "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "durable copy at " + url in err
    assert (tmp_path / "out" / "model.bin").read_bytes() == src.read_bytes()
    # and restore pulls it back onto a fresh device
    fresh = str(tmp_path / "fresh.img")
    assert main(["device", "create", fresh, "--zones", "16", "--zone-size", "1MiB", "--max-open", "6",
                 "--max-active", "6"]) == 0
    assert main(["mkfs", fresh]) == 0
    assert main(["tier", "restore", fresh, "step-20", "--from", url]) == 0
    assert main(["get", fresh, "step-20", "-o", str(tmp_path / "out2"), "--from", url]) == 0
    assert "crc32c verified (local copy)" in capsys.readouterr().err
    assert (tmp_path / "out2" / "model.bin").read_bytes() == src.read_bytes()


UNREACHABLE = "ftp://127.0.0.1:1/ckpt"     # fsspec's FTP file system connects when made: refused at once


def test_cli_an_unreachable_destination_is_one_line_and_never_stands_between_get_and_a_local_copy(
        tmp_path, url, capsys):
    """A promote to a destination it cannot reach fails in one line naming the URL (exit 1) and
    remembers nothing (it saved the URL, and every later ``get`` failed on a healthy local copy:
    a fresh-user trial); a remembered destination that has become unreachable is not touched by a
    ``get`` whose local copy is whole, and is named when the fallback is needed."""
    dev, src = cli_device(tmp_path, 4, 300_000, [5])
    capsys.readouterr()
    assert main(["tier", "promote", dev, "--to", UNREACHABLE]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{UNREACHABLE}: cannot reach the destination" in err, err
    assert not os.path.exists(dev + ".tier.json")
    assert main(["tier", "promote", dev, "--to", url]) == 0
    remembered = open(dev + ".tier.json").read()
    assert main(["tier", "promote", dev, "--to", UNREACHABLE]) == 1
    assert open(dev + ".tier.json").read() == remembered             # the old settings stand
    settings = json.loads(remembered)
    settings["url"] = UNREACHABLE                                       # the destination goes away later
    with open(dev + ".tier.json", "w") as f:
        json.dump(settings, f)
    capsys.readouterr()
    assert main(["get", dev, "step-5", "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.bin").read_bytes() == src.read_bytes()
    assert main(["get", dev, "step-5", "nosuch", "-o", str(tmp_path / "out2")]) == 2
    assert "has no shard 'nosuch'" in capsys.readouterr().err
    assert main(["rm", dev, "step-5"]) == 0
    capsys.readouterr()
    assert main(["get", dev, "step-5", "-o", str(tmp_path / "out3")]) == 1      # now it is needed
    err = capsys.readouterr().err
    assert err.count("\n") <= 2 and f"{UNREACHABLE}: cannot reach the destination" in err, err


def test_cli_get_falls_back_when_the_local_copy_fails_its_checksum(tmp_path, url, capsys):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEO)
    with Store.format(dev) as store:
        saved = save(store, "step-1", 1)
        assert Promoter(store, url).run_pending()
        z, off, _, _ = store.generation("step-1").shards["model.bin"].extents[0]
        region = dev.direct_region()[1]
    dev.close()
    with open(path, "r+b") as f:         # flip a byte of the shard's data on the device file
        f.seek(region + z * GEO.zone_size + off + 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    assert main(["get", str(path), "step-1", "model.bin", "-o", str(tmp_path / "out"), "--from", url]) == 0
    err = capsys.readouterr().err
    assert "fails its checksum" in err and f"durable copy at {url}" in err
    assert (tmp_path / "out" / "model.bin").read_bytes() == saved["model.bin"]
    assert main(["get", str(path), "step-1", "model.bin", "-o", str(tmp_path / "o2")]) == 1   # no fallback named


def test_destination_errors_are_one_type(destination):
    fs = destination.faulty()
    fs.down = True
    d = Destination(destination.url, fs=fs)
    with pytest.raises(DestinationError) as ei:
        d.manifest("g")
    assert "Connection refused" in str(ei.value) and "\n" not in str(ei.value)


def test_retention_callbacks_keep_until_durable(store, url, destination):
    from retainz.integrations.retention_callbacks import KeepLatestK

    fs = destination.faulty()
    fs.down = True
    cb = KeepLatestK(2, interval=10)
    p = Promoter(store, url, fs=fs, retry_seconds=0.05).start()
    cb.promoter = p
    try:
        for step in (10, 20, 30, 40):
            save(store, cb.generation_id(step), step)
            p.committed(cb.generation_id(step))
            cb.after_commit(store, step)
        assert [g.id for g in store.generations()] == ["step-10", "step-20", "step-30", "step-40"]
        assert p.deferred == ["step-10", "step-20"]
        fs.down = False
        assert p.wait(60)
        assert [g.id for g in store.generations()] == ["step-30", "step-40"]
        assert Destination(url).generations() == ["step-10", "step-20", "step-30", "step-40"]
    finally:
        p.close()


def test_a_replaced_generation_is_promoted_again_and_the_old_manifest_never_vouches(store, url, destination):
    save(store, "last", 1)
    p = Promoter(store, url)
    assert p.run_pending()
    w = store.begin_generation("last", 2, replace=True)
    w.write_shard("model.bin", [payload(99, 300_000)])
    w.commit()
    assert not p.is_durable("last") and p.status()[0].state == "pending"
    fs = destination.faulty()
    fs.fail_after = 100_000                             # the new copy fails halfway through its object
    assert not Promoter(store, url, fs=fs).run_pending()
    assert Destination(url).manifest("last") is None    # the old manifest no longer vouches for that object
    assert p.run_pending()
    assert durable_bytes(url, "last") == local_bytes(store, "last") == {"model.bin": payload(99, 300_000)}


@pytest.mark.parametrize("argv, line", [
    (["tier", "promote", "DEV", "--to", "URL", "--policy", "every:n=0"], "at least 1 step"),
    (["tier", "promote", "DEV", "--to", "URL", "--bandwidth", "0"], "--bandwidth must be a positive"),
    (["tier", "promote", "DEV", "--to", "URL", "--gen", "nosuch"], "no committed generation 'nosuch'"),
    (["tier", "restore", "DEV", "step-1", "--from", "URL"], "no durable copy of generation 'step-1'"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, url, capsys, argv, line):
    dev = str(tmp_path / "dev.img")
    assert main(["device", "create", dev, "--zones", "16", "--zone-size", "1MiB", "--max-open", "6",
                 "--max-active", "6"]) == 0
    assert main(["mkfs", dev]) == 0
    capsys.readouterr()
    assert main([dev if a == "DEV" else url if a == "URL" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert line in err and err.count("\n") == 1
    assert not os.path.exists(dev + ".tier.json")          # nothing remembered from a refused command


def test_a_resumed_promotion_sends_only_what_is_not_verified(store, url, destination):
    w = store.begin_generation("step-1", 1)
    shards = {"a.bin": payload(1, 400_000), "b.bin": payload(2, 300_000)}
    for name, data in shards.items():
        w.write_shard(name, [data])
    w.commit()
    fs = destination.faulty()
    fs.fail_after, fs.fail_only = 100_000, "b.bin"      # a.bin lands whole, b.bin fails halfway
    assert not Promoter(store, url, fs=fs).run_pending()
    assert Destination(url).manifest("step-1") is None
    again = destination.faulty()
    assert Promoter(store, url, fs=again).run_pending()
    manifest = len(Destination(url).manifest("step-1").encode())
    assert again.written == 300_000 + manifest         # a.bin was read back and kept, not sent again
    assert durable_bytes(url, "step-1") == shards


def test_an_upload_given_up_is_not_committed_and_leaves_nothing_to_flush(destination):
    """The local side fails mid-upload (a checksum, a deletion, a stop): the destination's write gives
    the object up; on S3 the object is never committed, and the abandoned upload is not flushed again
    when it is collected (s3fs's discard leaves the file open with no buffer: fsspec's ``__del__``
    closed it again and printed an AttributeError for every given-up upload)."""
    import gc

    d = Destination(destination.url, storage_options=destination.storage_options)
    path = d.shard_path("step-1", shard_key("model.bin"))

    def chunks():
        yield payload(1, 100_000)
        raise InterruptedError("the promoter was stopped")

    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(InterruptedError):
            d.write(path, chunks())
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [str(u.exc_value) for u in unraisable] == []
    if destination.kind == "s3":
        assert d.size(path) is None                      # the multipart upload was aborted: no object
    assert d.manifest("step-1") is None


def test_cli_a_relative_destination_is_remembered_as_an_absolute_path(tmp_path, capsys, monkeypatch):
    """``tier promote --to DIR`` with a relative DIR remembers where DIR is, not the words: run from
    another working directory, ``tier status`` and ``get``'s fallback still find the durable copies
    (the relative path was remembered as written, and from elsewhere every generation showed
    `pending` and a later promote copied into a new folder there: a fresh-user trial)."""
    dev, src = cli_device(tmp_path, 6, 200_000, [1])
    (tmp_path / "job").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "job")
    assert main(["tier", "promote", dev, "--to", "durable"]) == 0
    assert json.loads(open(dev + ".tier.json").read())["url"] == str(tmp_path / "job" / "durable")
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["tier", "status", dev]) == 0
    assert "step-1\tstep 1\t195.31 KiB\tdurable" in capsys.readouterr().out
    assert main(["rm", dev, "step-1"]) == 0
    assert main(["get", dev, "step-1", "-o", "out"]) == 0               # from the durable copy
    assert (tmp_path / "elsewhere" / "out" / "model.bin").read_bytes() == src.read_bytes()
    assert not (tmp_path / "elsewhere" / "durable").exists()
    assert main(["tier", "restore", dev, "step-1", "--from", "file://../job/durable"]) == 0   # file:// too


def test_cli_a_destination_that_is_a_file_is_one_line_exit_2_and_not_remembered(tmp_path, capsys):
    """``--to FILE`` where FILE is a regular file (a destination is a folder of generation folders)
    is refused before anything is copied, in one line naming it, exit 2; it used to be remembered,
    print a failure `(retried in 2 s)` per generation that no retry followed, and exit 1."""
    dev, _ = cli_device(tmp_path, 7, 100_000, [1])
    not_a_dir = tmp_path / "notes.txt"
    not_a_dir.write_text("x")
    capsys.readouterr()
    for url in (str(not_a_dir), "file://" + str(not_a_dir)):
        assert main(["tier", "promote", dev, "--to", url]) == 2
        err = capsys.readouterr().err
        assert err == f"retainz: error: {url}: not a directory (a destination holds one folder per generation)\n"
        assert not os.path.exists(dev + ".tier.json")
    assert not_a_dir.read_text() == "x"
