"""Keep until durable and the durable-copy fallback through the namespace faces (docs/tiers.md, "The
mount and retainz://") and for Megatron's non-persistent local checkpoints: the runtime's own ``rm -r``
of a checkpoint not yet durable takes it out of the view but keeps it on the device until its copy is
verified; a read whose local copy fails its checksum, or is deleted while open, is served from the
durable copy and says so; with no durable copy the read fails as before, naming both reasons."""

from __future__ import annotations

import errno
import logging

import pytest

pytest.importorskip("fsspec", reason="needs fsspec (the tier extra)")

from retainz.integrations.fsspec_fs import RetainZFileSystem  # noqa: E402
from retainz.integrations.retention_callbacks import MegatronNonPersistentLocal  # noqa: E402
from retainz.jobs.stores import using  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.tier import Destination, Promoter  # noqa: E402
from retainz.zoned import FileDevice  # noqa: E402
from tests.tier.test_tier import GEO, payload  # noqa: E402


@pytest.fixture
def faulty(monkeypatch, destination):
    """Every promotion goes through one fault-injecting client of ``destination`` (a directory, S3)."""
    import retainz.tier.promoter as promoter_mod

    fs = destination.faulty()
    real = promoter_mod.Destination
    monkeypatch.setattr(promoter_mod, "Destination", lambda url, **kw: real(url, storage_options=None, fs=fs))
    return fs


@pytest.fixture
def device(tmp_path):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEO)
    Store.format(dev).close()
    dev.close()
    return str(path)


def checkpoint(fs, root: str, step: int, n: int = 150_000) -> dict[str, bytes]:
    """A DCP-shaped checkpoint directory written through ``retainz://`` (committed by its ``.metadata``)."""
    files = {"__0_0.distcp": payload(step, n), ".metadata": payload(step + 1, 200)}
    for name, data in files.items():
        with fs.open(f"{root}/ckpt/step-{step}/{name}", "wb") as f:
            f.write(data)
    return files


def flip_local(device: str, store, gid: str, shard: str) -> None:
    """Flip one byte of ``shard``'s data on the device file (the store keeps it open)."""
    z, off, _, _ = store.generation(gid).shards[shard].extents[0]
    region = store.device.direct_region()[1]
    with open(device, "r+b") as f:
        f.seek(region + z * GEO.zone_size + off + 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))


def test_a_purge_through_retainz_keeps_until_durable(device, destination, faulty):
    url = destination.url
    faulty.down = True                                   # the destination is down
    fs = RetainZFileSystem(promote=url, skip_instance_cache=True)
    root = f"retainz://{device}"
    try:
        saved = {s: checkpoint(fs, root, s) for s in (10, 20, 30)}
        tier = fs.tier(root)
        fs.rm(f"{root}/ckpt/step-10", recursive=True)    # the runtime's purge (TorchTitan, HF)
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/ckpt", detail=False)) == ["step-20", "step-30"]
        store = fs._opened(device).store
        assert "ckpt%2Fstep-10" in [g.id for g in store.generations()]   # kept: its only copy
        assert tier.promoter.deferred == ["ckpt%2Fstep-10"]
        faulty.down = False                              # the destination answers again
        assert tier.promoter.wait(60)
        assert [g.id for g in store.generations()] == ["ckpt%2Fstep-20", "ckpt%2Fstep-30"]
        assert Destination(url).generations() == ["ckpt%2Fstep-10", "ckpt%2Fstep-20", "ckpt%2Fstep-30"]
        fs.rm(f"{root}/ckpt/step-20", recursive=True)    # durable already: deleted at once
        assert tier.promoter.wait(60) and tier.promoter.deferred == []
        assert fs.cat(f"{root}/ckpt/step-30/__0_0.distcp") == saved[30]["__0_0.distcp"]
        assert tier.used == {}                           # read locally
    finally:
        fs.close_devices()
    with using(device) as store:
        assert [g.id for g in store.generations()] == ["ckpt%2Fstep-30"]


def test_a_read_falls_back_to_the_durable_copy(device, destination, faulty, caplog):
    url = destination.url
    fs = RetainZFileSystem(promote=url, skip_instance_cache=True)
    root = f"retainz://{device}"
    try:
        saved = checkpoint(fs, root, 10)
        tier = fs.tier(root)
        assert tier.promoter.wait(60)
        faulty.down = True
        checkpoint(fs, root, 20)                         # never promoted: the destination is down
        store = fs._opened(device).store
        flip_local(device, store, "ckpt%2Fstep-10", "__0_0.distcp")
        flip_local(device, store, "ckpt%2Fstep-20", "__0_0.distcp")
        faulty.down = False
        tier.promoter.close()                            # step-20 stays local only
        with caplog.at_level(logging.WARNING, logger="retainz.tier"):
            assert fs.cat(f"{root}/ckpt/step-10/__0_0.distcp") == saved["__0_0.distcp"]
        assert tier.used == {("ckpt%2Fstep-10", "__0_0.distcp"): f"durable copy at {url}"}
        assert any("reading the durable copy at" in r.getMessage() for r in caplog.records)
        with pytest.raises(OSError) as ei:               # no durable copy: the checksum failure stands
            fs.cat(f"{root}/ckpt/step-20/__0_0.distcp")
        assert ei.value.errno == errno.EIO and "no durable copy either" in str(ei.value)
    finally:
        fs.close_devices()


def test_a_checkpoint_deleted_while_open_is_read_from_the_durable_copy(device, destination, faulty):
    url = destination.url
    fs = RetainZFileSystem(promote=url, skip_instance_cache=True)
    root = f"retainz://{device}"
    try:
        saved = checkpoint(fs, root, 10, 2_500_000)     # several extents: the handle has read one
        tier = fs.tier(root)
        assert tier.promoter.wait(60)
        with fs.open(f"{root}/ckpt/step-10/__0_0.distcp", "rb", block_size=4096) as f:
            head = f.read(4096)
            fs._opened(device).store.delete("ckpt%2Fstep-10")   # gone locally (another process, by hand)
            rest = f.read()
        assert head + rest == saved["__0_0.distcp"]
        assert tier.used == {("ckpt%2Fstep-10", "__0_0.distcp"): f"durable copy at {url}"}
    finally:
        fs.close_devices()


def test_megatron_non_persistent_local_keeps_until_durable(tmp_path, destination, faulty):
    url = destination.url
    devs, stores = [], []
    for r in range(2):
        d = FileDevice.create(tmp_path / f"rank{r}.img", GEO)
        devs.append(d)
        stores.append(Store.format(d))
    try:
        cb = MegatronNonPersistentLocal(10, ranks=2)
        # each rank's iterations are its own generations (iter_N_<rank>_local): one destination per rank
        cb.promoters = [Promoter(s, f"{url}/rank{r}", retry_seconds=0) for r, s in enumerate(stores)]
        faulty.down = True

        def save(step):
            for r, s in enumerate(stores):
                w = s.begin_generation(cb.generation_id(step, r), step, hint=cb.hint(step))
                w.write_shard("model.pt", [payload(step * 10 + r, 50_000)])
                w.commit()

        save(10)
        save(20)
        assert cb.after_commit_all(stores, 20) == [[], []]        # iter 10 is nowhere durable: kept
        for r, s in enumerate(stores):
            assert [g.id for g in s.generations()] == [cb.generation_id(10, r), cb.generation_id(20, r)]
            assert cb.promoters[r].deferred == [cb.generation_id(10, r)]
        faulty.down = False
        for p in cb.promoters:
            assert p.run_pending()                                 # durable: the deferred deletion runs
        for r, s in enumerate(stores):
            assert [g.id for g in s.generations()] == [cb.generation_id(20, r)]
    finally:
        for s in stores:
            s.close()
        for d in devs:
            d.close()


def test_the_mount_keeps_deletions_until_durable_and_reads_the_durable_copy(tmp_path, destination):
    import os
    import time

    from tests.mountcheck import generations, make_device, mounted, require_fuse

    require_fuse()
    device = make_device(tmp_path, zones=24, zone_size="1MiB")
    url = destination.url                            # the mount server reaches S3 through the AWS_* variables
    dest = Destination(url)
    files = {"model.safetensors": payload(1, 300_000), "trainer_state.json": b'{"global_step": 1}'}

    def hf_save(ck):
        os.makedirs(ck)
        for name, data in files.items():             # HF Trainer's commit point, trainer_state.json, last
            with open(ck / name, "wb") as f:
                f.write(data)

    # promotion capped at 4 KiB/s: checkpoint-1 (300 kB) is far from durable when the runtime deletes it
    with mounted(device, tmp_path / "mnt", "--promote", url, "--promote-bandwidth", "4KiB") as mnt:
        hf_save(mnt / "run" / "checkpoint-1")
        hf_save(mnt / "run" / "checkpoint-2")
        os.system(f"rm -r {mnt / 'run' / 'checkpoint-1'}")             # the runtime's rotation
        assert os.listdir(mnt / "run") == ["checkpoint-2"]
    assert "run%2Fcheckpoint-1" in generations(device)                 # kept on the device: not durable
    assert dest.generations() == []

    # mounted again at full speed (the 4 KiB/s cap is remembered in dev.img.tier.json: give another); the
    # kept checkpoint shows again (deferrals live in memory); deleted again, it goes once its copy is
    # verified
    with mounted(device, tmp_path / "mnt", "--promote", url, "--promote-bandwidth", "1GiB") as mnt:
        assert sorted(os.listdir(mnt / "run")) == ["checkpoint-1", "checkpoint-2"]
        os.system(f"rm -r {mnt / 'run' / 'checkpoint-1'}")
        deadline = time.monotonic() + 120
        while len(dest.generations()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert dest.generations() == ["run%2Fcheckpoint-1", "run%2Fcheckpoint-2"]
    assert "run%2Fcheckpoint-1" not in generations(device)             # deleted once durable

    # a byte of checkpoint-2's model flipped on the device: the mount reads the durable copy, and logs it
    dev = FileDevice(device)
    with Store.open(dev) as store:
        g = store.generation("run%2Fcheckpoint-2")
        shard = next(s for s in g.shards if "model" in s)
        z, off, _, _ = g.shards[shard].extents[0]
        region = dev.direct_region()[1]
    dev.close()
    with open(device, "r+b") as f:
        f.seek(region + z * (1 << 20) + off + 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    log = device + ".mount.log"
    with mounted(device, tmp_path / "mnt", "--promote", url) as mnt:
        assert (mnt / "run" / "checkpoint-2" / "model.safetensors").read_bytes() == files["model.safetensors"]
    with open(log) as f:
        assert f"reading the durable copy at {url}" in f.read()


def test_a_capped_copy_stops_within_a_quarter_second_of_bytes():
    """Closing a promoter (an unmount) must not wait for a whole extent at the capped rate: under a cap
    the bytes go in pieces of a quarter second's worth (4 KiB at least), and a stop is seen between
    pieces."""
    from retainz.tier import RateLimit
    from retainz.tier.copy import _paced

    now = [0.0]
    limit = RateLimit(64 << 10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    sent = []
    it = _paced(iter([b"x" * (1 << 20)]), limit, stop=lambda: len(sent) >= 2)
    with pytest.raises(InterruptedError):
        for part in it:
            sent.append(len(part))
    assert sent == [16 << 10, 16 << 10]                  # 2 pieces of 16 KiB sent, not the 1 MiB chunk
    assert now[0] == pytest.approx(0.0 + 0.0)            # both within the first second's burst
