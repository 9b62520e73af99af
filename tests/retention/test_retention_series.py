"""Retention stays in its own job (issue 27 item 7): on a device several jobs share, every retention
path counts, retires and re-hints only the generations of the series (folder) it manages.

Jobs with look-alike names share each device: ``a`` and ``a2``, a folder ``a/sub`` nested in ``a``, a
job whose folder is itself named ``step-1``, the root, and foreign generations whose ids contain
``step-N`` without being anyone's checkpoint.  Each test asserts every job's surviving set exactly as
its rule says, and that nothing of any other job was lost.
"""

from __future__ import annotations

import pytest

from retainz.ids import (
    generation_path,
    member_name,
    members,
    series_folder,
    series_generation_id,
    series_of,
)
from retainz.integrations.retention_callbacks import (
    KeepLatestK,
    MegatronNonPersistentGlobal,
    MegatronRetainInterval,
)
from retainz.retention import rule_hint
from retainz.retention.base import parse_rule
from retainz.retention.retire import retired_after_commit
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice

GEOM = Geometry(nr_zones=96, zone_size=256 << 10, zone_capacity=256 << 10)
#: Generations that are nobody's checkpoint but whose ids contain ``step-N`` (main's KeepLatestK
#: matched them with ``re.search``).
FOREIGN = ("xstep-10", "step-10.tmp", "@notes-step-3.txt", "@a%2Fstep-10.log", "c%2Fstep-5", "b%2Fstep-1%2Fstep-9", "a2x%2Fstep-7")


# -- the definition ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, series", [
    ("a/step-10", "a"), ("a2/step-10", "a2"), ("a/sub/step-10", "a/sub"), ("step-1/step-5", "step-1"),
    ("step-5", ""), ("/jobs/a/step-5/", "jobs/a"), ("a/epoch=0-step=5.ckpt", "a"),
])
def test_the_series_of_a_checkpoint_is_its_parent_directory(path, series):
    assert series_of(path) == series


@pytest.mark.parametrize("gid, path", [
    ("a%2Fstep-10", "a/step-10"), ("@a%2Fepoch%3D0-step%3D5.ckpt", "a/epoch=0-step=5.ckpt"),
    ("a%2Fstep-10#2", "a/step-10"), ("step-500", "step-500"), ("x%2Fa%2E%2Eb%2Fstep-1", "x/a..b/step-1"),
])
def test_generation_ids_name_paths_as_the_filesystem_and_the_mount_name_them(gid, path):
    assert generation_path(gid) == path


def test_membership_is_exact_for_look_alike_names():
    ids = ["step-10", "a%2Fstep-10", "a2%2Fstep-10", "a%2Fsub%2Fstep-10", "step-1%2Fstep-5", "xa%2Fstep-3"]
    got = {s: [member_name(g, s) for g in ids] for s in ("", "a", "a2", "a/sub", "step-1")}
    assert got == {
        "": ["step-10", None, None, None, None, None],
        "a": [None, "step-10", None, None, None, None],
        "a2": [None, None, "step-10", None, None, None],
        "a/sub": [None, None, None, "step-10", None, None],
        "step-1": [None, None, None, None, "step-5", None],
    }


def test_series_ids_round_trip_and_bad_series_are_refused():
    for series in ("", "a", "jobs/a2", "x/a..b"):
        gid = series_generation_id(series, "step-7")
        assert member_name(gid, series) == "step-7" and series_of(generation_path(gid)) == series
    assert series_generation_id(None, "step-7") == "step-7"              # the DCP writer's historical id
    assert series_generation_id("/jobs/a/", "step-7") == "jobs%2Fa%2Fstep-7"
    for bad in ("a//b", "a/../b", "./a", "a/#1"):
        with pytest.raises(ValueError, match="components cannot be empty"):
            series_folder(bad)
    with pytest.raises(ValueError, match="expected one path component"):
        series_generation_id("a", "b/step-1")


@pytest.mark.parametrize("spec, names, retired", [
    ("torchtitan:interval=10,keep_latest_k=2", ["step-30", "step-100", "step-20", "xstep-1", "step-5.tmp"],
     ["step-20"]),
    ("torchtitan:interval=10,keep_latest_k=0", ["step-10", "step-20", "step-30"], []),
    ("megatron:save_interval=10,retain_interval=30", [f"iter_{s:07d}" for s in (10, 20, 30, 40, 50, 60, 70)],
     ["iter_0000010", "iter_0000020", "iter_0000040", "iter_0000050"]),
    ("megatron:save_interval=10", ["iter_0000010", "iter_0000020"], []),
    ("hf:save_steps=10,save_total_limit=3", [f"checkpoint-{s}" for s in (40, 10, 20, 30, 50)],
     ["checkpoint-10", "checkpoint-20"]),
])
def test_each_rule_retires_by_the_step_its_names_carry(spec, names, retired):
    assert retired_after_commit(parse_rule(spec), [(n, n) for n in names]) == retired


@pytest.mark.parametrize("spec", ["lightning:every_n_train_steps=10,save_top_k=2,metric=synthetic",
                                  "hf:save_steps=10,save_total_limit=2,metric=plateau",
                                  "accelerate:save_steps=10,total_limit=2", "orbax:latest=2"])
def test_rules_the_store_cannot_enact_are_refused(spec):
    with pytest.raises(ValueError, match="retire=False"):
        retired_after_commit(parse_rule(spec), [])


# -- the runtime callbacks -----------------------------------------------------------------------------

def _put(store, gid, step, hint=None):
    w = store.begin_generation(gid, step, hint=hint)
    w.write_shard("model_optim_rng.pt", [bytes([step % 251]) * 3000])
    w.commit()


def _ids(store):
    return {g.id for g in store.generations()}


def test_keep_latest_k_at_the_root_never_touches_another_jobs_generations():
    """The reported fault: a root-folder KeepLatestK purged every id containing ``step-N``."""
    with Store.format(MemoryDevice(GEOM)) as store:
        for gid in FOREIGN:
            _put(store, gid, 1)
        cb = KeepLatestK(2, interval=10)
        deleted = []
        for step in (10, 20, 30, 40):
            _put(store, cb.generation_id(step), step, cb.hint(step))
            deleted += cb.after_commit(store, step)
        assert deleted == ["step-10", "step-20"]
        assert _ids(store) == set(FOREIGN) | {"step-30", "step-40"}


def test_callbacks_of_interleaved_jobs_each_keep_exactly_their_rule():
    jobs = {
        "": KeepLatestK(2, interval=10),
        "a": KeepLatestK(2, interval=10, folder="a"),
        "a2": KeepLatestK(3, interval=10, folder="a2"),
        "a/sub": KeepLatestK(2, interval=10, folder="/a/sub/"),
        "step-1": KeepLatestK(2, interval=10, folder="step-1"),
        "m": MegatronRetainInterval(10, 30, folder="m"),
        "m/sub": MegatronRetainInterval(10, 20, folder="m/sub"),
        "np": MegatronNonPersistentGlobal(5, save_interval=10, folder="np"),
    }
    with Store.format(MemoryDevice(GEOM)) as store:
        for gid in FOREIGN:
            _put(store, gid, 1)
        order = list(jobs)
        for i, step in enumerate(range(5, 81, 5)):
            order = order[i % len(order):] + order[:i % len(order)]      # a different interleaving each step
            for series in order:
                cb = jobs[series]
                if isinstance(cb, MegatronNonPersistentGlobal):
                    if not cb.is_save_step(step):
                        continue
                    gone = cb.before_save(store, step)
                    _put(store, cb.generation_id(step), step, cb.hint(step))
                else:
                    if step % 10:
                        continue
                    _put(store, cb.generation_id(step), step, cb.hint(step))
                    gone = cb.after_commit(store, step)
                assert all(member_name(g, series) is not None for g in gone), (series, gone)
        own = [g for g in store.generations() if g.id not in FOREIGN]
        survivors = {s: sorted(n for n, _ in members(own, s)) for s in jobs}
        assert survivors == {
            "": ["step-70", "step-80"],
            "a": ["step-70", "step-80"],
            "a2": ["step-60", "step-70", "step-80"],
            "a/sub": ["step-70", "step-80"],
            "step-1": ["step-70", "step-80"],
            "m": ["iter_0000030", "iter_0000060", "iter_0000080"],
            "m/sub": ["iter_0000020", "iter_0000040", "iter_0000060", "iter_0000080"],
            "np": ["non_persistent-iter_0000065", "non_persistent-iter_0000075"],
        }
        assert set(FOREIGN) <= _ids(store)
        # a resumed job's new rule re-hints its own series only
        before = {g.id: g.hint for g in store.generations()}
        changed = KeepLatestK(3, interval=10, folder="a").rehint(store, step=85)
        assert sorted(changed) == ["a%2Fstep-70", "a%2Fstep-80"]
        after = {g.id: g.hint for g in store.generations()}
        assert {g for g in after if after[g] != before[g]} == set(changed)


# -- the DCP writer -----------------------------------------------------------------------------------

torch_needed = pytest.mark.dcp


def _dcp():
    pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    import torch
    import torch.distributed.checkpoint as dcp

    from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
    return torch, dcp, ZonedStorageWriter, ZonedStorageReader


@pytest.fixture
def device(tmp_path):
    from retainz.jobs import stores
    from retainz.zoned import FileDevice

    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    Store.format(dev).close()
    dev.close()
    yield str(path)
    assert stores.open_count() == 0


def _survivors(device, series):
    from retainz.jobs import stores

    with stores.using(device) as store:
        own = [g for g in store.generations() if g.id not in FOREIGN]
        return sorted((g.step, name) for name, g in members(own, series))


def _all(device):
    from retainz.jobs import stores

    with stores.using(device) as store:
        return {g.id: (g.hint.reclaim_step, g.hint.condition) for g in store.generations()}


WRITER_JOBS = {     # series -> (rule, checkpoint name format, kept after the last save)
    None: ("torchtitan:interval=10,keep_latest_k=2", "step-{}", [50, 60]),
    "a": ("torchtitan:interval=10,keep_latest_k=2", "step-{}", [50, 60]),
    "a2": ("torchtitan:interval=10,keep_latest_k=3", "step-{}", [40, 50, 60]),
    "a/sub": ("torchtitan:interval=10,keep_latest_k=2", "step-{}", [50, 60]),
    "step-1": ("torchtitan:interval=10,keep_latest_k=2", "step-{}", [50, 60]),
    "m": ("megatron:save_interval=10,retain_interval=30", "iter_{:07d}", [30, 60]),
    "h": ("hf:save_steps=10,save_total_limit=2", "checkpoint-{}", [50, 60]),
    "k": ("torchtitan:interval=10,keep_latest_k=0", "step-{}", [10, 20, 30, 40, 50, 60]),
}


def _expected(rule: str, saved: list[int]) -> list[int]:
    r = parse_rule(rule)
    if r.name == "megatron":
        return [s for s in saved[:-1] if s % r.retain_interval == 0] + saved[-1:]
    k = getattr(r, "keep_latest_k", None) or getattr(r, "save_total_limit", None)
    return saved[-k:] if k else saved


@torch_needed
def test_zoned_storage_writers_of_interleaved_jobs_retire_only_their_series(device):
    """After save N only what the job's rule keeps remains in its series, the deletes happen once the
    save has committed, every other job is untouched, and survivors carry the rule's hints."""
    torch, dcp, ZonedStorageWriter, ZonedStorageReader = _dcp()
    from retainz.jobs import stores

    with stores.using(device) as store:
        for gid in FOREIGN:
            _put(store, gid, 1)
    writers = {s: ZonedStorageWriter(device, retention=rule, series=s) for s, (rule, _, _) in WRITER_JOBS.items()}
    saved: dict = {s: [] for s in WRITER_JOBS}
    order = list(WRITER_JOBS)
    for i, step in enumerate(range(10, 61, 10)):
        order = order[i % len(order):] + order[:i % len(order)]
        for s in order:
            rule, fmt, _ = WRITER_JOBS[s]
            others = {g: h for g, h in _all(device).items() if member_name(g, s) is None}
            dcp.save({"w": torch.full((64,), float(step))}, storage_writer=writers[s],
                     checkpoint_id=f"/ckpt/{s or 'root'}/{fmt.format(step)}")
            saved[s].append(step)
            assert _survivors(device, s) == [(st, fmt.format(st)) for st in _expected(rule, saved[s])]
            assert {g: h for g, h in _all(device).items() if member_name(g, s) is None} == others
    for s, (rule, fmt, kept) in WRITER_JOBS.items():
        assert [st for st, _ in _survivors(device, s)] == kept
        for st in kept:
            gid = series_generation_id(s, fmt.format(st))
            want = rule_hint(rule, st)
            assert _all(device)[gid] == (want.reclaim_step, want.condition)
    assert set(FOREIGN) <= set(_all(device))
    out = {"w": torch.zeros(64)}
    dcp.load(out, storage_reader=ZonedStorageReader(device, series="a2"), checkpoint_id="/x/step-40")
    assert torch.equal(out["w"], torch.full((64,), 40.0))


@torch_needed
def test_a_save_that_never_commits_retires_nothing(device):
    torch, dcp, ZonedStorageWriter, _ = _dcp()
    from torch.distributed.checkpoint.api import CheckpointException

    w = ZonedStorageWriter(device, retention="torchtitan:interval=10,keep_latest_k=2", series="a")
    for step in (10, 20):
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id=f"step-{step}")

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises((CheckpointException, RuntimeError)):
        dcp.save({"w": torch.ones(8), "bad": Unpicklable()}, storage_writer=w, checkpoint_id="step-30")
    assert _survivors(device, "a") == [(10, "step-10"), (20, "step-20")]
    dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id="step-30")
    assert _survivors(device, "a") == [(20, "step-20"), (30, "step-30")]


@torch_needed
def test_a_resumed_job_with_a_smaller_k_retires_to_it_and_rehints_the_survivors(device):
    torch, dcp, ZonedStorageWriter, _ = _dcp()
    k4, k2 = "torchtitan:interval=10,keep_latest_k=4", "torchtitan:interval=10,keep_latest_k=2"
    w = ZonedStorageWriter(device, retention=k4, series="a")
    for step in (10, 20, 30, 40):
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id=f"step-{step}")
    assert [s for s, _ in _survivors(device, "a")] == [10, 20, 30, 40]
    w = ZonedStorageWriter(device, retention=k2, series="a")
    dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id="step-50")
    assert [s for s, _ in _survivors(device, "a")] == [40, 50]
    hints = _all(device)
    for st in (40, 50):
        want = rule_hint(k2, st)
        assert hints[f"a%2Fstep-{st}"] == (want.reclaim_step, want.condition)


@torch_needed
def test_an_explicit_condition_puts_a_save_outside_the_rule(device):
    torch, dcp, ZonedStorageWriter, _ = _dcp()
    w = ZonedStorageWriter(device, retention="torchtitan:interval=10,keep_latest_k=2")
    for step in (10, 20, 30, 40):
        w.set_condition("permanent" if step == 20 else None)
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id=f"step-{step}")
    assert [s for s, _ in _survivors(device, "")] == [20, 30, 40]
    assert _all(device)["step-20"][0] == float("inf")


@torch_needed
def test_a_rule_the_store_cannot_enact_is_refused_unless_it_only_hints(device):
    torch, dcp, ZonedStorageWriter, _ = _dcp()
    rule = "lightning:every_n_train_steps=10,save_top_k=2,metric=synthetic"
    with pytest.raises(ValueError, match="retention rule lightning: not enacted by the store"):
        ZonedStorageWriter(device, retention=rule)
    w = ZonedStorageWriter(device, retention="torchtitan:interval=10,keep_latest_k=2", retire=False)
    for step in (10, 20, 30):
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id=f"step-{step}")
    assert [s for s, _ in _survivors(device, "")] == [10, 20, 30]


@torch_needed
def test_a_writer_without_a_series_keeps_only_the_latest_k_of_the_root(device):
    """``ZonedStorageWriter(retention="...keep_latest_k=2")`` used to keep every save (hints only)."""
    torch, dcp, ZonedStorageWriter, _ = _dcp()
    rule = "torchtitan:interval=10,keep_latest_k=2"
    w = ZonedStorageWriter(device, retention=rule)
    seen = {}
    for step in (10, 20, 30, 40):
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
        seen[step] = [s for s, _ in _survivors(device, "")]
    assert seen == {10: [10], 20: [10, 20], 30: [20, 30], 40: [30, 40]}
    want = {f"step-{s}": (rule_hint(rule, s).reclaim_step, rule_hint(rule, s).condition) for s in (30, 40)}
    assert _all(device) == want


# -- the retainz:// file system -------------------------------------------------------------------------

@pytest.fixture
def fs_device(device):
    pytest.importorskip("fsspec")
    import fsspec

    from retainz.integrations.fsspec_fs import RetainZFileSystem

    fsspec.config.conf.pop("retainz", None)
    yield device
    RetainZFileSystem.close_all()
    RetainZFileSystem.clear_instance_cache()


def _fs(retention):
    import fsspec

    from retainz.integrations.fsspec_fs import RetainZFileSystem

    RetainZFileSystem.close_all()
    RetainZFileSystem.clear_instance_cache()
    return fsspec.filesystem("retainz", retention=retention)


def _dcp_dir(fs, device, d):
    with fs.open(f"{device}/{d}/__0_0.distcp", "wb") as f:
        f.write(b"\1" * 5000)
    with fs.open(f"{device}/{d}/.metadata", "wb") as f:
        f.write(b"md")


def test_the_filesystem_rehints_only_the_series_it_saves_into(fs_device):
    """A job resumed with keep_latest_k=3 re-hints its own checkpoints, not the other jobs' ones
    (``a2``, ``a/sub``, and ``a``'s single-file checkpoints stay as they were saved)."""
    k10, k3 = "torchtitan:interval=10,keep_latest_k=10", "torchtitan:interval=10,keep_latest_k=3"
    fs = _fs(k10)
    for d in ("a", "a2", "a/sub"):
        for step in (10, 20):
            _dcp_dir(fs, fs_device, f"{d}/step-{step}")
    before = _all(fs_device)
    fs = _fs(k3)
    _dcp_dir(fs, fs_device, "a/step-30")
    after = _all(fs_device)
    changed = {g for g in before if after[g] != before[g]}
    assert changed == {"a%2Fstep-10", "a%2Fstep-20"}
    assert all(after[g] == (rule_hint(k3, s).reclaim_step, rule_hint(k3, s).condition)
               for g, s in (("a%2Fstep-10", 10), ("a%2Fstep-20", 20), ("a%2Fstep-30", 30)))


def test_runtime_purges_through_the_filesystem_stay_in_their_folders(fs_device):
    """HF Trainer's rotation (save_total_limit: ``_sorted_checkpoints`` of ``output_dir/checkpoint-*``,
    ``rmtree`` of all but the last L) and Lightning's top-k by validation loss (``ModelCheckpoint``
    removes the worst ``epoch=E-step=N.ckpt`` of ``dirpath``) run as the runtimes run them, for
    interleaved jobs ``h``/``h2``/``h/sub`` and ``l``/``l2``: each keeps exactly what its rule says."""
    fs = _fs(None)
    dev = fs_device
    hf = {"h": 2, "h2": 3, "h/sub": 1}
    topk = {"l": 2, "l2": 3}
    loss = {"l": lambda s: (s - 45) ** 2, "l2": lambda s: 100 - s}       # l: best around step 40-50
    kept_l: dict = {j: {} for j in topk}
    for step in range(10, 91, 10):
        for out, limit in hf.items():
            d = f"{out}/checkpoint-{step}"
            for name in ("model.safetensors", "trainer_state.json"):
                with fs.open(f"{dev}/{d}/{name}", "wb") as f:
                    f.write(bytes([step]) * 3000)
            ckpts = sorted((int(p.rsplit("-", 1)[1]), p) for p in fs.glob(f"{dev}/{out}/checkpoint-*"))
            for _, p in ckpts[:-limit]:
                fs.rm(p, recursive=True)
        for dirpath, k in topk.items():
            name = f"epoch=0-step={step}.ckpt"
            with fs.open(f"{dev}/{dirpath}/{name}", "wb") as f:
                f.write(bytes([step]) * 2000)
            kept_l[dirpath][name] = loss[dirpath](step)
            if len(kept_l[dirpath]) > k:
                worst = max(kept_l[dirpath], key=kept_l[dirpath].get)
                del kept_l[dirpath][worst]
                fs.rm(f"{dev}/{dirpath}/{worst}")
    listing = {j: sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{dev}/{j}", detail=False)
                         if not fs.isdir(p) or "checkpoint-" in p) for j in (*hf, *topk)}
    assert listing == {
        "h": ["checkpoint-80", "checkpoint-90"],
        "h2": ["checkpoint-70", "checkpoint-80", "checkpoint-90"],
        "h/sub": ["checkpoint-90"],
        "l": ["epoch=0-step=40.ckpt", "epoch=0-step=50.ckpt"],
        "l2": ["epoch=0-step=70.ckpt", "epoch=0-step=80.ckpt", "epoch=0-step=90.ckpt"],
    }
    # HF: one generation per checkpoint directory (the namespace's rule, the same as through the mount,
    # committed at trainer_state.json); Lightning: one per file; nothing else left
    assert sorted(g.id for g in _gens_of(dev)) == sorted(
        [f"{j.replace('/', '%2F')}%2Fcheckpoint-{s}" for j, keep in (("h", (80, 90)), ("h2", (70, 80, 90)),
                                                                     ("h/sub", (90,))) for s in keep]
        + [f"@{j}%2Fepoch=0-step={s}.ckpt" for j, keep in (("l", (40, 50)), ("l2", (70, 80, 90))) for s in keep])
    assert fs.ls(f"{dev}/h/checkpoint-90", detail=False) == [f"{dev}/h/checkpoint-90/model.safetensors",
                                                             f"{dev}/h/checkpoint-90/trainer_state.json"]


def _gens_of(device):
    from retainz.jobs import stores

    with stores.using(device) as store:
        return list(store.generations())


# -- the mount's inferred retention ----------------------------------------------------------------------

def test_the_mount_infers_and_hints_each_series_on_its_own():
    """``--retention auto`` with HF-like jobs ``a`` (limit 2), ``a2`` (limit 3) and ``a/sub`` (limit 2)
    interleaved, each rotating its own ``output_dir`` (unlink + rmdir): one rule per series, and each
    job's surviving set is its own rule's."""
    pytest.importorskip("fsspec", reason="the mount streams through the fsspec filesystem's sink (mount extra)")
    from retainz.mount.fs import MountedStore

    store = Store.format(MemoryDevice(GEOM))
    ms = MountedStore(store, retention="auto")
    jobs = {"a": 2, "a2": 3, "a/sub": 2}
    for d in ("/a", "/a2", "/a/sub"):
        ms.mkdir(d, 0o755)
    for step in range(10, 121, 10):
        for job, limit in jobs.items():
            root = f"/{job}/checkpoint-{step}"
            ms.mkdir(root, 0o755)
            for name in ("model.safetensors", "trainer_state.json"):
                fh = ms.create(f"{root}/{name}", 0o644)
                ms.write(f"{root}/{name}", bytes([step]) * 3000, 0, fh)
                ms.release(f"{root}/{name}", fh)
            ckpts = sorted(int(n.rsplit("-", 1)[1]) for n in ms.readdir(f"/{job}", None)
                           if str(n).startswith("checkpoint-"))
            for old in ckpts[:-limit]:
                for name in ("model.safetensors", "trainer_state.json"):
                    ms.unlink(f"/{job}/checkpoint-{old}/{name}")
                ms.rmdir(f"/{job}/checkpoint-{old}")
    rules = {j: ms.inference.rule(j) for j in jobs}
    assert {j: (r.name, r.k, r.interval) for j, r in rules.items()} == {
        "a": ("keep_latest", 2, 10), "a2": ("keep_latest", 3, 10), "a/sub": ("keep_latest", 2, 10)}
    survivors = {j: sorted(g.step for _, g in members(store.generations(), j)) for j in jobs}
    assert survivors == {"a": [110, 120], "a2": [100, 110, 120], "a/sub": [110, 120]}
    assert store.generation("a2%2Fcheckpoint-120").hint.condition == "inferred:keep_latest:k=3,interval=10"
    store.close()


@torch_needed
def test_a_non_coordinator_rank_retires_when_its_next_save_starts(tmp_path):
    """Rank 1 commits its generation in ``write_data``, before the coordinator's commit completes the
    checkpoint, so it retires only once the next save starts: k + 1 on its device in between."""
    torch, _, ZonedStorageWriter, _ = _dcp()
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    from retainz.jobs import stores

    pattern = str(tmp_path / "rank{rank}.img")
    w = ZonedStorageWriter(pattern, retention="torchtitan:interval=10,keep_latest_k=2", series="a", geometry=GEOM)
    seen = []
    for step in (10, 20, 30, 40):
        w.reset(f"/ckpt/a/step-{step}")
        w.set_up_storage_writer(False, rank=1)
        planner = DefaultSavePlanner()
        planner.set_up_planner({"w": torch.full((16,), float(step))}, is_coordinator=False)
        plan = w.prepare_local_plan(planner.create_local_plan())
        w.write_data(plan, planner).wait()
        with stores.using(pattern.format(rank=1)) as store:
            seen.append(sorted(g.step for _, g in members(store.generations(), "a")))
    assert seen == [[10], [10, 20], [10, 20, 30], [20, 30, 40]]
    assert stores.open_count() == 0


@torch_needed
def test_a_failed_purge_leaves_the_committed_save_and_is_retried_at_the_next(monkeypatch):
    torch, dcp, ZonedStorageWriter, _ = _dcp()
    from retainz.errors import ZonedDeviceError

    with Store.format(MemoryDevice(GEOM)) as store:
        w = ZonedStorageWriter(store, retention="torchtitan:interval=10,keep_latest_k=2", series="a")
        for step in (10, 20):
            dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id=f"step-{step}")
        real = store.delete
        calls = []

        def failing(gid, **kw):
            calls.append(gid)
            raise ZonedDeviceError("injected: the journal write of the delete failed")

        monkeypatch.setattr(store, "delete", failing)
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id="step-30")   # committed; purge fails
        assert calls == ["a%2Fstep-10"] and w.retire_failures == 1
        assert sorted(g.step for _, g in members(store.generations(), "a")) == [10, 20, 30]
        monkeypatch.setattr(store, "delete", real)
        dcp.save({"w": torch.ones(8)}, storage_writer=w, checkpoint_id="step-40")
        assert sorted(g.step for _, g in members(store.generations(), "a")) == [30, 40]
