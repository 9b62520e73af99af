"""Replay with time (issue 40): saves that take ``nbytes / write_bandwidth`` steps, their shards written
in units through the real store, interleaved with every other save in flight."""

from __future__ import annotations

import json
import threading

import pytest

from retainz.cli import main
from retainz.experiments.runner import scaled_layout
from retainz.hint import Hint
from retainz.node import NodeStore, Service, socket_path
from retainz.store import Store
from retainz.trace.format import CommitEvent, DeleteEvent, SaveEvent, Shard
from retainz.trace.generate import write_generated
from retainz.trace.mix import mix
from retainz.trace.replay import ReplayConfig, job_of, replay, timed_schedule
from retainz.zoned import FileDevice, Geometry, MemoryDevice

MiB = 1 << 20
GEO = dict(zone_size=256 << 10, zone_capacity=192 << 10, max_active=6, max_open=6)


def _trace(tmp_path, rule, steps, name, layout=("smollm2-135m-dcp", "1/16384")):
    path = str(tmp_path / name)
    write_generated(path, scaled_layout(*layout), rule, steps)
    return path


def _two_jobs(tmp_path, steps, layout=("smollm2-135m-dcp", "1/16384"), interval=500):
    a = _trace(tmp_path, f"torchtitan:interval={interval},keep_latest_k=3", steps, "a.jsonl", layout)
    b = _trace(tmp_path, f"torchtitan:interval={interval},keep_latest_k=5", steps, "b.jsonl", layout)
    out = str(tmp_path / "mix.jsonl")
    mix([a, b], out)
    return out


def test_the_schedule_makes_a_jobs_events_wait_for_its_save_and_lets_other_jobs_overlap():
    def save(gen, job, step, nbytes):
        return SaveEvent(step=step, gen=gen, name=f"j{job}:step-{step}", cls="interval",
                         shards=(Shard("__0_0.distcp", nbytes),))
    events = [save(0, 0, 10, 100), CommitEvent(step=10, gen=0), save(1, 1, 10, 50), CommitEvent(step=10, gen=1),
              save(2, 0, 12, 10), CommitEvent(step=12, gen=2), DeleteEvent(step=12, gen=1)]
    got = [(t, type(ev).__name__, ev.gen, ev.step) for t, ev in timed_schedule(events, rate=10)]
    assert got == [(10.0, "SaveEvent", 0, 10), (10.0, "SaveEvent", 1, 10),       # both jobs save at once
                   (15.0, "CommitEvent", 1, 15),                                 # job 1's 50 B take 5 steps
                   (15.0, "DeleteEvent", 1, 15),                                 # job 1's own delete waits too
                   (20.0, "CommitEvent", 0, 20), (20.0, "SaveEvent", 2, 12),     # job 0's next save waits
                   (21.0, "CommitEvent", 2, 21)]
    assert [job_of(n) for n in ("j0:step-5", "j12:x", "step-5", "jx:step", "run:j0")] == ["j0", "j12", "", "", ""]
    with pytest.raises(ValueError, match="positive"):
        timed_schedule(events, rate=0)


def test_without_write_bandwidth_the_replay_is_serialized_and_one_job_never_overlaps(tmp_path):
    path = _trace(tmp_path, "torchtitan:interval=10,keep_latest_k=3", 300, "one.jsonl")
    serial = replay(path, ReplayConfig(pressure=0.8, **GEO))
    assert "overlapped_bytes" not in serial and "write_bandwidth" not in serial
    timed = replay(path, ReplayConfig(pressure=0.8, write_bandwidth=16 << 10, write_unit=4096, **GEO))
    assert timed["overlapped_bytes"] == 0 and timed["write_bandwidth"] == 16 << 10 and timed["write_unit"] == 4096
    for k in ("host_bytes", "gc_bytes", "waf", "generations_committed", "generations_deleted", "resets"):
        assert timed[k] == serial[k], k
    assert timed["capacity_stop_step"] is None and timed["decisions"] > serial["decisions"]


def test_overlapping_saves_on_a_payload_device_read_back_verified(tmp_path):
    path = _two_jobs(tmp_path, 4000, interval=200)
    r = replay(path, ReplayConfig(pressure=0.8, device="memory-payload", write_bandwidth=8 << 10,
                                  write_unit=8192, **GEO))
    assert r["capacity_stop_step"] is None and r["overlapped_bytes"] > 0
    assert r["bytes_verified"] > 0


def test_two_keep_latest_jobs_saving_at_once_stay_apart_when_their_saves_overlap(tmp_path):
    """The issue's case: TorchTitan keep 3 and keep 5, SmolLM2-135M on ZN540 zones, saving at the same
    steps, each save written at 64 MiB per step.  The older group's open zone is not capacity left
    over while it is still being written, so RetainZ stays at WAF 1.00 (1.51 before, when one stream
    followed the other into every zone it opened); the one log mixes them."""
    path = _two_jobs(tmp_path, 5000, layout=("smollm2-135m-dcp", "1"))
    out = {p: replay(path, ReplayConfig(policy=p, pressure=0.9, write_bandwidth=64 * MiB, write_unit=4 * MiB))
           for p in ("retainz", "oracle", "greedy")}
    assert out["retainz"]["overlapped_bytes"] > 0
    assert out["retainz"]["waf"] == out["oracle"]["waf"] == 1.0
    assert out["retainz"]["capacity_stop_step"] is None
    assert out["greedy"]["waf"] > 1.3


def test_crash_traces_and_a_write_unit_alone_are_refused(tmp_path, capsys):
    path = str(tmp_path / "c.jsonl")
    write_generated(path, scaled_layout("smollm2-135m-dcp", "1/16384"), "torchtitan:interval=10,keep_latest_k=3",
                    100, crash_every=3)
    with pytest.raises(ValueError, match="crash events"):
        replay(path, ReplayConfig(pressure=0.8, write_bandwidth=4096, **GEO))
    with pytest.raises(ValueError, match="needs write_bandwidth"):
        ReplayConfig(pressure=0.8, write_unit=2 * MiB)
    with pytest.raises(ValueError, match="multiple of the block size"):
        ReplayConfig(pressure=0.8, write_bandwidth=MiB, write_unit=1000)
    assert main(["replay", path, "--pressure", "0.8", "--write-unit", "2MiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--write-bandwidth" in err


def test_the_cli_takes_sizes_and_prints_the_overlap(tmp_path, capsys):
    path = _two_jobs(tmp_path, 2000, interval=200)
    argv = ["replay", path, "--pressure", "0.8", "--zone-size", "256KiB", "--zone-capacity", "192KiB",
            "--max-active", "6", "--max-open", "6", "--write-bandwidth", "8KiB", "--write-unit", "8KiB"]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["write_bandwidth"] == 8192 and r["write_unit"] == 8192 and r["overlapped_bytes"] > 0
    assert main(argv) == 0
    assert "overlapped_bytes" in capsys.readouterr().out


# -- the node service's concurrent clients and the replay's interleaving decide alike -------------------
NODE_GEO = Geometry(nr_zones=40, zone_size=4 * MiB, zone_capacity=4 * MiB, max_active=6, max_open=6)
UNIT = 8 * MiB                       # the node client's claim batch (retainz.node.client.BATCH)
SAVES = {"a": (100, 1000, {"__0_0.distcp": 2 * UNIT, "__1_0.distcp": 2 * UNIT}),   # job a: 2 ranks
         "b": (100, 1500, {"__0_0.distcp": 3 * UNIT})}                                # job b: 1 rank
#: The interleaving: (generation, shard) per unit, as the two jobs' ranks write at once.
ORDER = [("a", "__0_0.distcp"), ("b", "__0_0.distcp"), ("a", "__1_0.distcp"), ("a", "__0_0.distcp"),
         ("b", "__0_0.distcp"), ("a", "__1_0.distcp"), ("b", "__0_0.distcp")]


def _extents(store) -> dict:
    """(generation, shard) -> its extents (zone, offset, bytes) for the two jobs' saves."""
    return {(g.id, n): [e[:3] for e in s.extents] for g in store.generations() if g.id in SAVES
            for n, s in g.shards.items()}


def _prefill(store) -> None:
    """An older generation whose last zone is left open (a join candidate for both jobs)."""
    w = store.begin_generation("old", 10, hint=Hint(reclaim_step=1200), declared_size=6 * MiB)
    w.write_shard("x", [b"o" * MiB] * 6)
    w.commit()


def test_served_clients_writing_at_once_are_placed_as_the_replay_places_the_same_interleaving(tmp_path):
    device = str(tmp_path / "dev.img")
    dev = FileDevice.create(device, NODE_GEO)
    Store.format(dev).close()
    store = Store.open(dev)
    _prefill(store)
    svc = Service(store, socket_path(device))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    try:
        shards, clients = {}, []
        for gen, (step, reclaim, files) in SAVES.items():
            total = sum(files.values())
            for name in files:       # each rank its own client and writer, joining its job's generation
                c = NodeStore.connect(device, job="")
                clients.append(c)
                w = c.begin_generation(gen, step, hint=Hint(reclaim_step=reclaim), declared_size=total,
                                       join=f"run-{gen}", ranks=len(files))
                shards[gen, name] = (w, w.open_shard(name))
        for key in ORDER:
            shards[key][1].write(bytes([ord(key[0])]) * UNIT)
        for _, s in shards.values():
            s.close()
        for gen in SAVES:
            writers = [w for (g, _), (w, _) in shards.items() if g == gen]
            for w in writers[1:]:
                w.leave()
            writers[0].commit()
        served = _extents(svc.store)
        for c in clients:
            c.close()
    finally:
        svc.close()
        t.join()
        dev.close()

    # the replay's path: the same store code on a payload-less device, each shard a writer counted unit by unit
    with Store.format(MemoryDevice(NODE_GEO, payload=False)) as local:
        w = local.begin_generation("old", 10, hint=Hint(reclaim_step=1200), declared_size=6 * MiB)
        w.write_counted_shard("x", 6 * MiB)
        w.commit()
        writers, streams = {}, {}
        for gen, (step, reclaim, files) in SAVES.items():
            writers[gen] = local.begin_generation(gen, step, hint=Hint(reclaim_step=reclaim),
                                                  declared_size=sum(files.values()))
            for name in files:
                streams[gen, name] = writers[gen].open_shard(name)
        for key in ORDER:
            streams[key].count(UNIT)
        for s in streams.values():
            s.close()
        for w in writers.values():
            w.commit()
        replayed = _extents(local)
    assert served == replayed
    # and the two jobs did not share a zone: b does not follow a into the zones a was filling
    zones = {g: {e[0] for (gg, _), ext in replayed.items() if gg == g for e in ext} for g in SAVES}
    assert not zones["a"] & zones["b"]


# -- each job of a format-2 fleet at its own rate (write_bandwidth "fleet") -------------------------------
def _fleet_trace(tmp_path, name, async_save):
    from retainz.trace.fleet import FleetConfig, write_fleet

    cfg = FleetConfig.from_json({"fleet": 2, "steps": 3000, "concurrency": 8, "churn": 6, "interval": 100,
                                 "scale": "1/1024", "jobs": [{"model": "smollm2-135m", "gpus": 1, "weight": 1,
                                                              "async": async_save}]})
    path = str(tmp_path / name)
    write_fleet(path, cfg, seed=1)
    return path


def test_per_job_rates_set_each_jobs_save_duration():
    def save(gen, job, step, nbytes):
        return SaveEvent(step=step, gen=gen, name=f"j{job}:step-{step}", cls="interval",
                         shards=(Shard("__0_0.distcp", nbytes),))
    events = [save(0, 0, 10, 100), CommitEvent(step=10, gen=0), save(1, 1, 10, 100), CommitEvent(step=10, gen=1)]
    got = [(t, type(ev).__name__, ev.gen) for t, ev in timed_schedule(events, rate={"j0": 10, "j1": 50})]
    assert got == [(10.0, "SaveEvent", 0), (10.0, "SaveEvent", 1),
                   (12.0, "CommitEvent", 1),                      # job 1 writes its 100 B at 50 B a step
                   (20.0, "CommitEvent", 0)]                      # job 0 at 10 B a step
    with pytest.raises(ValueError, match="no write bandwidth for job 'j1'"):
        timed_schedule(events, rate={"j0": 10})
    with pytest.raises(ValueError, match="positive"):
        timed_schedule(events, rate={"j0": 10, "j1": 0})


def test_fleet_rates_replay_each_job_at_the_rate_its_header_records(tmp_path, capsys):
    from retainz.trace.io import TraceReader
    from retainz.trace.replay import fleet_rates

    sync, paced = _fleet_trace(tmp_path, "sync.jsonl", False), _fleet_trace(tmp_path, "async.jsonl", True)
    with TraceReader(sync) as r:
        header = r.header
    rates = fleet_rates(header)
    jobs = header.layout["jobs"]
    assert len(rates) == len(jobs) > 4 and set(rates.values()) == {1_230_000_000 // 1024}
    # every job synchronous at one rate: "fleet" is that rate given as a number
    geo = dict(zone_size=256 << 10, zone_capacity=256 << 10, max_active=14, max_open=14)
    one = replay(sync, ReplayConfig(occupancy=0.5, write_bandwidth=1_230_000_000 // 1024, write_unit=16384, **geo))
    per = replay(sync, ReplayConfig(occupancy=0.5, write_bandwidth="fleet", write_unit=16384, **geo))
    assert per["write_bandwidth"] == "fleet"
    for k in ("waf", "host_bytes", "gc_bytes", "overlapped_bytes", "zones", "capacity_stop_step"):
        assert per[k] == one[k], k
    # asynchronous jobs paced to their next save: each save is in flight far longer, so saves overlap more
    with TraceReader(paced) as r:
        prates = fleet_rates(r.header)
    assert all(prates[k] < rates[k] for k in prates)
    slow = replay(paced, ReplayConfig(occupancy=0.5, write_bandwidth="fleet", write_unit=16384, **geo))
    assert slow["overlapped_bytes"] > 3 * per["overlapped_bytes"] > 0
    # a trace without per-job rates is refused, in the CLI's words
    plain = _trace(tmp_path, "torchtitan:interval=10,keep_latest_k=3", 300, "one.jsonl")
    with pytest.raises(ValueError, match="format-2 fleet"):
        replay(plain, ReplayConfig(pressure=0.8, write_bandwidth="fleet", **GEO))
    assert main(["replay", plain, "--pressure", "0.8", "--write-bandwidth", "fleet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--write-bandwidth fleet" in err
    assert main(["replay", sync, "--occupancy", "0.5", "--zone-size", "256KiB", "--max-active", "14",
                 "--max-open", "14", "--write-bandwidth", "fleet", "--write-unit", "16KiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overlapped_bytes"] == per["overlapped_bytes"]
