"""The real-size lane: checkpoints of real size on devices past 4 GiB, through every face.

Each face runs the same life of a training job: five saves, keep-the-latest-2 retention deleting the
older ones, a file replaced twice, copying GC, close (or unmount) and reopen (or remount), then every
byte of every live generation read back and compared with the deterministic stream it was written
from (:mod:`tests.pattern`: no copy is kept), and ``fsck`` clean.  The faces: the CLI (``put``,
``get -o -``, ``rm``, ``gc``, ``fsck``), DCP through ``ZonedStorageWriter``/``ZonedStorageReader``,
``retainz://`` (fsspec) and the FUSE mount.  Plus a power-cut campaign and the black-box kill campaign
on a device past 4 GiB.

Sizes (``RETAINZ_SCALE``): ``ci`` (the default, what ``make test`` runs) is the smallest that still
crosses 2^32-byte offsets: 1 GiB zones of 16 MiB capacity, so every data zone lies at 3 GiB and beyond
(sparse), with 64 MiB generations.  ``full`` (``make test-scale``) is the real thing: a 64-zone device of
ZN540-like zones (2 GiB, 1,077 MiB capacity; 67 GiB of capacity on a 128 GiB span, sparse) with 16 GiB
generations.  ``RETAINZ_SCALE_GEN_BYTES`` overrides the generation size.  Every test is marked
``scale``: ``pytest -m scale`` runs this lane alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from retainz.zoned import FileDevice, Geometry
from retainz.zoned.model import parse_size
from tests import pattern
from tests.conftest import GiB, high

pytestmark = pytest.mark.scale

MiB = 1 << 20
SHARDS = 4          # data files per generation (DCP's __N_0.distcp), plus a small .metadata
SAVES = 5
KEEP = 2


@dataclasses.dataclass(frozen=True)
class Scale:
    geometry: Geometry
    gen_bytes: int

    @property
    def shard_bytes(self) -> int:
        return self.gen_bytes // SHARDS


def scale() -> Scale:
    """The lane's sizes (module docstring)."""
    name = os.environ.get("RETAINZ_SCALE", "ci")
    if name == "full":
        g = Geometry(nr_zones=64, zone_size=2 * GiB, zone_capacity=1077 * MiB, block_size=4096, max_open=14,
                     max_active=14)
        gen = 16 * GiB
    elif name == "ci":
        g = Geometry(nr_zones=24, zone_size=GiB, zone_capacity=16 * MiB, block_size=4096, max_open=8,
                     max_active=8)
        gen = 64 * MiB
    else:
        raise ValueError(f"RETAINZ_SCALE={name!r}: ci or full")
    if "RETAINZ_SCALE_GEN_BYTES" in os.environ:
        gen = parse_size(os.environ["RETAINZ_SCALE_GEN_BYTES"])
    return Scale(g, gen)


S = scale()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _give_the_disk_back(tmp_path):
    """Each test's device and source files go when it ends: pytest keeps every ``tmp_path`` of a
    session, and at full size the faces' files together (about 9 x the generation size) would
    outgrow the disk before the last test runs."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


def env() -> dict:
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def retainz(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "retainz.cli", *args], capture_output=True, text=True,
                       timeout=timeout, env=env())
    if r.returncode != 0:
        raise AssertionError(f"retainz {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def make_device(tmp_path) -> str:
    g = S.geometry
    path = str(tmp_path / "dev.img")
    FileDevice.create(path, g).close()
    retainz("mkfs", path)
    return path


def fsck_clean(device: str) -> dict:
    rep = json.loads(retainz("fsck", device, "--json").stdout)
    assert rep["ok"], rep["problems"][:5]
    assert rep["unverifiable_bytes"] == 0
    return rep


def shard_names() -> list[str]:
    return [f"__{j}_0.distcp" for j in range(SHARDS)]


def seed(gen: str, shard: str) -> int:
    return pattern.seed_of(gen, shard)


@dataclasses.dataclass
class Expect:
    """The live generations and their shards: ``{name: {shard: (seed, size)}}``."""

    gens: dict[str, dict[str, tuple[int, int]]] = dataclasses.field(default_factory=dict)

    def save(self, name: str, shards: dict[str, tuple[int, int]]) -> None:
        self.gens[name] = shards

    def drop(self, name: str) -> None:
        del self.gens[name]

    def data_bytes(self) -> int:
        return sum(n for shards in self.gens.values() for _, n in shards.values())


def life(save, delete, replace) -> Expect:
    """The job's life (module docstring) on one face: ``save(name, step, {shard: (seed, size)})``,
    ``delete(name)``, ``replace(version)`` (the replaced file's second and third versions)."""
    expect = Expect()
    for i in range(1, SAVES + 1):
        name = f"step-{100 * i}"
        shards = {s: (seed(name, s), S.shard_bytes + 4096 * j + 123) for j, s in enumerate(shard_names())}
        save(name, 100 * i, shards)
        expect.save(name, shards)
        if i > KEEP:
            old = f"step-{100 * (i - KEEP)}"
            delete(old)
            expect.drop(old)
        if i in (2, 4):     # a file written, then replaced by a new version at a later step
            version = i // 2
            shards = {"final.pt": (seed("final", version), S.shard_bytes // 2 + version)}
            replace(version, shards)
            expect.save("final", shards)
    return expect


def offsets_cross_4_gib(device: str) -> None:
    """Some committed extent of the store lies past 2^32 bytes of the device, and the device file
    holds no more disk blocks than its zones' written bytes and its label and state slots: every
    reset zone's blocks were given back (a hole punched at a truncated offset leaks, or worse)."""
    from retainz.store import Store

    with FileDevice(device, readonly=True) as dev, Store.open(dev, readonly=True) as store:
        zs = dev.geometry.zone_size
        top = max(z * zs + off + n for g in store.generations() for s in g.shards.values()
                  for z, off, n, _ in s.extents)
        written = sum(z.written for z in dev.report_zones())
        slack = dev._data_offset + dev.geometry.nr_zones * dev.geometry.block_size   # the host file system's rounding
    assert top > 1 << 32, top
    assert os.stat(device).st_blocks * 512 <= written + slack, (os.stat(device).st_blocks * 512, written)


# -- the CLI ----------------------------------------------------------------------------------------

def _get_stream(device: str, gen: str, shard: str, seed_: int, size: int) -> None:
    """``retainz get DEV GEN SHARD -o -`` compared with the stream as it arrives."""
    check = pattern.Checker(seed_, size, f"{gen}/{shard}")
    with subprocess.Popen([sys.executable, "-m", "retainz.cli", "get", device, gen, shard, "-o", "-"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env()) as p:
        while piece := p.stdout.read(pattern.CHUNK):
            check.feed(piece)
        err = p.stderr.read().decode()
    assert p.returncode == 0, err
    check.done()


def test_cli_put_get_rm_replace_gc_fsck(tmp_path):
    device = make_device(tmp_path)
    src = tmp_path / "src"
    src.mkdir()

    def files(shards):
        paths = []
        for name, (sd, n) in shards.items():
            pattern.write_file(src / name, sd, n)
            paths.append(str(src / name))
        return paths

    def save(name, step, shards):
        retainz("put", device, name, *files(shards), "--step", str(step))

    def replace(version, shards):
        args = ["put", device, "final", *files(shards), "--step", str(1000 + version)]
        retainz(*args, *(["--replace"] if version > 1 else []))

    expect = life(save, lambda name: retainz("rm", device, name), replace)
    shutil.rmtree(src)
    gc = json.loads(retainz("gc", device, "--force", "--json").stdout)
    assert gc["errors"] == []
    ls = json.loads(retainz("ls", device, "--json").stdout)
    assert sorted(g["id"] for g in ls) == sorted(expect.gens)
    for gen, shards in expect.gens.items():
        for shard, (sd, n) in shards.items():
            _get_stream(device, gen, shard, sd, n)
    rep = fsck_clean(device)
    assert rep["bytes_verified"] == expect.data_bytes()
    offsets_cross_4_gib(device)


# -- DCP through ZonedStorageWriter / ZonedStorageReader ---------------------------------------------

def test_dcp_zoned_storage_writer_and_reader(tmp_path):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    import torch.distributed.checkpoint as dcp

    from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
    from retainz.store import Store

    device = make_device(tmp_path)
    src = tmp_path / "src"
    src.mkdir()

    def tensors(shards, mode):
        """One uint8 tensor per shard over the shard's source file (an mmap: page cache, not memory)."""
        out = {}
        for name, (sd, n) in shards.items():
            path = src / name
            if mode == "c":
                pattern.write_file(path, sd, n)
            else:                               # a zeroed file of the right size to load into
                with open(path, "wb") as f:
                    f.truncate(n)
            out[name.replace(".", "_")] = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode=mode, shape=(n,)))
        return out

    def save(name, step, shards, overwrite=False):
        sd = tensors(shards, "c")
        dcp.save(sd, storage_writer=ZonedStorageWriter(device, name, step=step, overwrite=overwrite))
        del sd

    def delete(name):
        with FileDevice(device) as dev, Store.open(dev) as store:
            store.delete(name)

    expect = life(save, delete, lambda v, shards: save("final", 1000 + v, shards, overwrite=v > 1))
    with FileDevice(device) as dev, Store.open(dev) as store:
        assert store.gc(force=True).errors == []
    for gen, shards in expect.gens.items():
        sd = tensors(shards, "r+")
        dcp.load(sd, storage_reader=ZonedStorageReader(device, gen))
        del sd                                  # a shared mapping: the loaded bytes are in the files
        for name, (s, n) in shards.items():
            pattern.verify_file(src / name, s, n, f"{gen}/{name}")
    fsck_clean(device)
    offsets_cross_4_gib(device)


# -- retainz:// (fsspec) -------------------------------------------------------------------------------

def test_fsspec_retainz_url(tmp_path):
    fsspec = pytest.importorskip("fsspec")

    device = make_device(tmp_path)
    fs = fsspec.filesystem("retainz", skip_instance_cache=True)
    root = f"{device}/run"

    def write(path, sd, n):
        with fs.open(path, "wb") as f:
            for piece in pattern.chunks(sd, n):
                f.write(piece)

    def save(name, step, shards):
        for shard, (sd, n) in shards.items():
            write(f"{root}/{name}/{shard}", sd, n)
        with fs.open(f"{root}/{name}/.metadata", "wb") as f:     # DCP's commit point
            f.write(b"metadata of " + name.encode())

    def replace(version, shards):
        (shard, (sd, n)), = shards.items()
        write(f"{root}/{shard}", sd, n)

    expect = life(save, lambda name: fs.rm(f"{root}/{name}", recursive=True), replace)
    fs.close_devices()
    retainz("gc", device, "--force")
    fs = fsspec.filesystem("retainz", skip_instance_cache=True)     # a new instance: reopened
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    assert listed == sorted([n for n in expect.gens if n != "final"] + ["final.pt"])
    for gen, shards in expect.gens.items():
        for shard, (sd, n) in shards.items():
            path = f"{root}/{shard}" if gen == "final" else f"{root}/{gen}/{shard}"
            check = pattern.Checker(sd, n, path)
            with fs.open(path, "rb") as f:
                while piece := f.read(pattern.CHUNK):
                    check.feed(piece)
            check.done()
    fs.close_devices()
    fsck_clean(device)
    offsets_cross_4_gib(device)


# -- the FUSE mount ----------------------------------------------------------------------------------

def test_mount(tmp_path):
    from tests.mountcheck import mounted, require_fuse

    require_fuse()
    device = make_device(tmp_path)
    mnt = tmp_path / "mnt"

    def write(path: Path, sd, n):
        with open(path, "wb") as f:
            for piece in pattern.chunks(sd, n):
                f.write(piece)

    with mounted(device, mnt) as m:
        run = m / "run"

        def save(name, step, shards):
            (run / name).mkdir(parents=True)
            for shard, (sd, n) in shards.items():
                write(run / name / shard, sd, n)
            (run / name / ".metadata").write_bytes(b"metadata of " + name.encode())

        def replace(version, shards):
            (shard, (sd, n)), = shards.items()
            write(run / f"{shard}.tmp", sd, n)
            os.replace(run / f"{shard}.tmp", run / shard)

        expect = life(save, lambda name: shutil.rmtree(run / name), replace)
    retainz("gc", device, "--force")
    with mounted(device, mnt) as m:     # remounted: the same tree, every byte
        run = m / "run"
        assert sorted(os.listdir(run)) == sorted([n for n in expect.gens if n != "final"] + ["final.pt"])
        for gen, shards in expect.gens.items():
            for shard, (sd, n) in shards.items():
                path = run / shard if gen == "final" else run / gen / shard
                pattern.verify_file(path, sd, n)
    fsck_clean(device)
    offsets_cross_4_gib(device)


# -- crashes on a device past 4 GiB ---------------------------------------------------------------------

def test_power_cut_campaign_past_4_gib(crash_ledger):
    """Every write boundary of the ``mixed`` workload cut, on the campaign geometry with zones past
    2^31 and 2^32 bytes (a payload MemoryDevice: the offsets the store computes cross both)."""
    from retainz.testing import crashtest

    rep = crashtest.campaign("mixed", geometry=high(crashtest.GEOMETRY))
    crash_ledger.append(("mixed, zones past 4 GiB (memory)", [rep]))
    assert rep.points > 100 and rep.failures == [], (rep.points, rep.failures[:3])


def test_power_cut_campaign_on_a_file_device_past_4_gib(tmp_path, crash_ledger):
    """The ``basic`` workload's cuts on a FileDevice whose zones lie past 4 GiB: the device reruns the
    workload for every state (hole punches, state slots and reopen on the real file)."""
    from retainz.testing import crashtest

    n = [0]

    def make(g):
        n[0] += 1
        return FileDevice.create(tmp_path / f"cut-{n[0] % 4}.img", g, force=True)

    rep = crashtest.campaign("basic", geometry=high(crashtest.GEOMETRY), make_device=make)
    crash_ledger.append(("basic, zones past 4 GiB (FileDevice)", [rep]))
    assert rep.points > 20 and rep.failures == [], (rep.points, rep.failures[:3])


def test_black_box_kills_past_4_gib(tmp_path):
    from retainz.testing import blackbox

    g = high(blackbox.GEOMETRY)
    rounds = int(os.environ.get("RETAINZ_SCALE_KILLS", "40"))
    rep = blackbox.run(tmp_path, rounds, geometry=g)
    assert rep.iterations == rounds and rep.failures == [], rep.failures[:3]
    assert rep.commits_acknowledged > 0


# -- more zones than 16 bits index -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["memory", "file", "remote-window-file"])
def test_device_zone_indexes_past_16_bits(tmp_path, kind):
    """Zones 65,536 and on (at 2^32 bytes and beyond): written, finished, reset and reported, then the
    device reopened, with every other zone's data intact."""
    from tests.conftest import WIDE
    from tests.conftest import make_device as device_of

    dev = device_of(kind, tmp_path, WIDE)
    bs, n = WIDE.block_size, WIDE.nr_zones
    picks = [5, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, n - 1]
    for z in picks:          # within the 4-active-zone limit: 65,536 finished, 65,537 reset as they go
        dev.write(dev.zone(z).start, pattern.block(z, 0, 2 * bs))
        if z == picks[2]:
            dev.finish_zone(z)
        elif z == picks[3]:
            dev.reset_zone(z)
    dev.flush()
    if kind == "file":
        dev.close()
        dev = FileDevice(tmp_path / "dev.img")
    try:
        zones = dev.report_zones((1 << 16) - 2, 4)
        assert [z.index for z in zones] == list(range((1 << 16) - 2, (1 << 16) + 2))
        assert zones[2].start == (1 << 16) * WIDE.zone_size and zones[2].start >= 1 << 32
        assert [z.written for z in zones] == [0, 2 * bs, WIDE.zone_capacity, 0]
        for z in (5, (1 << 16) - 1, 1 << 16, n - 1):
            assert dev.read(dev.zone(z).start, 2 * bs) == pattern.block(z, 0, 2 * bs), z
        assert dev.read(dev.zone(picks[3]).start, bs) == bytes(bs)
    finally:
        dev.close()


def test_store_past_65536_zones_and_64_gib():
    """The store on 65,600 zones of 1 MiB (a payload-less MemoryDevice, as replay uses): generations
    fill zones past index 65,536 and offsets past 2^36 bytes; deletes, GC, a reopen and fsck keep the
    committed set, and the zone table equals a recomputation."""
    from retainz.hint import Hint
    from retainz.store import Store
    from retainz.zoned import MemoryDevice

    g = Geometry(nr_zones=(1 << 16) + 64, zone_size=2 * MiB, zone_capacity=MiB, block_size=4096, max_open=14,
                 max_active=14)
    dev = MemoryDevice(g, payload=False)
    store = Store.format(dev)
    gen_bytes = 4 * GiB
    names = []
    for i in range((g.nr_zones - store.meta_zones - 8) * MiB // gen_bytes):
        w = store.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=10_000), declared_size=gen_bytes)
        w.write_counted_shard("a", gen_bytes)
        w.commit()
        names.append(f"g{i}")
    top = max(z for n in names for z, *_ in store.generation(n).shards["a"].extents)
    assert top >= 1 << 16, top
    for n in names[1::2]:
        store.delete(n, step=100)
    store.close()
    store = Store.open(dev)
    try:
        assert [x.id for x in store.generations()] == names[0::2]
        assert store.table.key() == store.recompute_table().key()
        assert store.fsck().ok
        rep = store.gc(force=True)
        assert rep.errors == []
        assert store.table.key() == store.recompute_table().key()
    finally:
        store.close()
    store = Store.open(dev)
    assert [x.id for x in store.generations()] == names[0::2] and store.fsck().ok
    store.close()
