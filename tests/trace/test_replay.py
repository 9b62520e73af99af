"""Trace replay through the real store: sizing, determinism, capacity stops, crashes, payload
read-back, recompute mode and the zone map."""

from __future__ import annotations

import json
import math

import pytest

from retainz.cli import main
from retainz.experiments.runner import scaled_layout
from retainz.trace.format import DeleteEvent, SaveEvent
from retainz.trace.generate import write_generated
from retainz.trace.io import TraceReader
from retainz.trace.replay import ReplayConfig, read_events, replay, trace_stats

# Small geometry: 256 KiB zones of 192 KiB capacity; SmolLM2 layout scaled by 1/16384 (~105 KiB/save).
GEO = dict(zone_size=256 << 10, zone_capacity=192 << 10, max_active=6, max_open=6)
#: Smaller zones: a device of at least 32 zones at pressure 0.7 (ZenFS refuses fewer).
GEO32 = dict(GEO, zone_size=64 << 10, zone_capacity=48 << 10)
TIMING = ("decision_cpu_seconds", "wall_seconds")


def _trace(tmp_path, rule="torchtitan:interval=10,keep_latest_k=3", steps=400, name="t.jsonl", **kw):
    path = str(tmp_path / name)
    write_generated(path, scaled_layout("smollm2-135m-dcp", "1/16384"), rule, steps, **kw)
    return path


def _survivors(path):
    saved = {}
    for ev in TraceReader(path):
        if isinstance(ev, SaveEvent):
            saved[ev.gen] = ev
        elif isinstance(ev, DeleteEvent):
            del saved[ev.gen]
    return list(saved.values())


def _strip(r):
    return {k: v for k, v in r.items() if k not in TIMING}


def test_read_events_gives_the_stats_and_every_event_in_trace_order(tmp_path):
    # replay drives the store from this list: it must be exactly what the reader yields
    t = _trace(tmp_path, crash_every=7)
    stats, events = read_events(t)
    assert stats == trace_stats(t)
    with TraceReader(t) as r:
        assert events == list(r)
    assert stats.saves == sum(isinstance(ev, SaveEvent) for ev in events) > 0
    assert any(ev.type == "crash" for ev in events)


def test_pressure_sizes_the_device_from_peak_live_bytes(tmp_path):
    t = _trace(tmp_path)
    st = trace_stats(t)
    r = replay(t, ReplayConfig(policy="greedy", pressure=0.5, **GEO))
    assert r["zones"] == math.ceil(st.peak_live_bytes / (0.5 * GEO["zone_capacity"]))
    assert r["geometry"]["nr_zones"] == r["zones"] + 3 + 2
    assert r["peak_live_bytes"] == st.peak_live_bytes
    assert r["effective_pressure"] <= 0.5


def test_replay_runs_the_store_and_counts_every_host_byte(tmp_path):
    t = _trace(tmp_path)
    st = trace_stats(t)
    r = replay(t, ReplayConfig(policy="retainz", pressure=0.5, **GEO))
    assert r["capacity_stop_step"] is None
    assert r["generations_committed"] == st.saves == 40
    saves = [ev for ev in TraceReader(t) if isinstance(ev, SaveEvent)]
    assert r["host_bytes"] == sum(-(-s.nbytes // 4096) * 4096 for ev in saves for s in ev.shards)
    assert r["waf"] == (r["host_bytes"] + r["gc_bytes"]) / r["host_bytes"]
    assert r["generations_deleted"] == 40 - 4  # keep_latest_k=3 plus the final, permanent save
    assert r["trace_sha256"] == st.sha256


def test_replay_is_deterministic(tmp_path):
    t = _trace(tmp_path, rule="megatron:save_interval=10,retain_interval=50")
    a = replay(t, ReplayConfig(policy="retainz", pressure=0.9, **GEO))
    b = replay(t, ReplayConfig(policy="retainz", pressure=0.9, **GEO))
    assert json.dumps(_strip(a), sort_keys=True) == json.dumps(_strip(b), sort_keys=True)


@pytest.mark.parametrize("policy", ["greedy", "retainz", "zenfs", "zenfs-nohint", "zenfs:migrate=all", "oracle",
                                    "dedicated", "common"])
def test_recompute_mode_decides_exactly_as_cached_mode(tmp_path, policy):
    t = _trace(tmp_path, rule="megatron:save_interval=10,retain_interval=50")
    geo, p = (GEO32, 0.7) if policy.startswith("zenfs") else (GEO, 0.8)
    cached = replay(t, ReplayConfig(policy=policy, pressure=p, **geo))
    checked = replay(t, ReplayConfig(policy=policy, pressure=p, verify_summaries=True, **geo))
    a, b = _strip(cached), _strip(checked)
    a.pop("verify_summaries"), b.pop("verify_summaries")
    assert a == b


def test_capacity_stop_ends_cleanly_with_the_step(tmp_path):
    t = _trace(tmp_path, rule="torchtitan:interval=10,keep_latest_k=0")  # keeps everything
    r = replay(t, ReplayConfig(policy="greedy", zones=4, **GEO))
    assert r["capacity_stop_step"] is not None and 10 <= r["capacity_stop_step"] <= 400
    assert r["generations_committed"] == r["capacity_stop_step"] // 10 - 1


def test_crash_events_recover_and_payload_reads_back(tmp_path):
    t = _trace(tmp_path, rule="megatron:save_interval=10,retain_interval=50", crash_every=7)
    st = trace_stats(t)
    assert st.header.crash_every == 7
    r = replay(t, ReplayConfig(policy="retainz", pressure=0.8, device="memory-payload", **GEO))
    assert r["crashes"] >= 3
    assert r["capacity_stop_step"] is None
    assert r["bytes_verified"] > 0
    counted = replay(t, ReplayConfig(policy="retainz", pressure=0.8, **GEO))
    assert counted["crashes"] == r["crashes"]
    assert counted["host_bytes"] == r["host_bytes"]


def test_file_device_that_exists_is_refused_untouched(tmp_path, capsys):
    """--device file:PATH makes a new device: an existing file (a store, anything) is never
    overwritten, and the message names no flag the command does not have."""
    t = _trace(tmp_path, steps=30)
    victim = tmp_path / "keep.img"
    victim.write_bytes(b"precious" * 512)
    code = main(["replay", str(t), "--pressure", "0.7", "--device", f"file:{victim}"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == (f"retainz: error: {victim} exists: --device file:PATH makes a new "
                                         "device file for the replay; remove it or name another path")
    assert victim.read_bytes() == b"precious" * 512


def test_file_device_payload_is_verified(tmp_path):
    t = _trace(tmp_path, steps=120)
    r = replay(t, ReplayConfig(policy="retainz", pressure=0.7, device=f"file:{tmp_path / 'r.img'}", **GEO))
    survivors = _survivors(t)
    assert len(survivors) == 4  # keep_latest_k=3 and the final, permanent save
    assert r["bytes_verified"] == sum(s.nbytes for ev in survivors for s in ev.shards)
    assert r["device"] == "file"


def test_zone_map_shape(tmp_path):
    t = _trace(tmp_path)
    r = replay(t, ReplayConfig(policy="retainz", pressure=0.8, zone_map=True, **GEO))
    zm = r["zone_map"]
    assert zm["format"] == 1 and zm["zones"] == r["zones"] + 2  # the GC reserve zones are data zones too
    assert zm["groups"] == zm["zones"]
    assert 1 < len(zm["steps"]) <= 200 and zm["steps"] == sorted(zm["steps"])
    for key in ("live", "dead", "unused"):
        assert len(zm[key]) == len(zm["steps"]) and all(len(row) == zm["groups"] for row in zm[key])
    assert all(0 <= lv + d + u <= 100 for b in range(len(zm["steps"]))
               for lv, d, u in zip(zm["live"][b], zm["dead"][b], zm["unused"][b], strict=True))
    assert max(max(row) for row in zm["live"]) > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(zones=4, pressure=0.5), "exactly one"),
    (dict(), "exactly one"),
    (dict(pressure=1.5), "pressure must be in"),
    (dict(pressure=0), "pressure must be in"),
    (dict(pressure=True), "pressure must be in"),
    (dict(zones=0), "at least 2"),
    (dict(zones=1), "at least 2"),
    (dict(zones=4.0), "zones must be an integer"),
    (dict(zones=4, reserve_zones=-1), "reserve_zones cannot be negative"),
    (dict(zones=4, meta_zones=-3), "meta_zones cannot be negative"),
    (dict(zones=4, zone_size=0), "zone size must be a positive"),
    (dict(zones=4, zone_capacity=-4096), "zone capacity must be a positive"),
    (dict(zones=4, zone_capacity=512 << 10), "at most the zone size"),
    (dict(zones=4, block_size=1024), "block size 1024 is not 512 or 4096"),
    (dict(zones=4, max_open=8), "max open zones 8 exceeds max active zones 6"),
    (dict(zones=4, device="tape"), "unknown replay device"),
    (dict(zones=4, device="file:"), "unknown replay device"),
    (dict(zones=4, policy="nope"), "unknown policy"),
    (dict(zones=4, policy="retainz-noisy:error=x"), "retainz-noisy"),
    (dict(zones=4, zone_map="yes"), "zone_map must be true or false"),
])
def test_a_bad_configuration_is_one_line_naming_it(kwargs, message):
    """Every field is checked when the configuration is built, before any trace is read."""
    with pytest.raises(ValueError, match=message) as e:
        ReplayConfig(**{**GEO, **kwargs})
    assert "\n" not in str(e.value)


def test_pressure_sizing_beyond_the_zone_limit_is_refused(tmp_path):
    t = _trace(tmp_path, steps=50)
    with pytest.raises(ValueError, match="limit is"):
        replay(t, ReplayConfig(pressure=1e-9, **GEO))


def test_configuration_resolves_the_zone_capacity_and_sizes_the_device():
    assert ReplayConfig(zones=4).zone_capacity == 1077 << 20              # the ZN540's, with its 2 GiB zones
    assert ReplayConfig(zones=4, zone_size=256 << 10).zone_capacity == 256 << 10
    c = ReplayConfig(pressure=0.5, **GEO)
    assert c.data_zones(10 * GEO["zone_capacity"]) == 20
    assert c.data_zones(1) == 1
    g = c.geometry(20)
    assert (g.nr_zones, g.zone_size, g.zone_capacity, g.max_open) == (3 + 2 + 20, 256 << 10, 192 << 10, 6)
    assert ReplayConfig(zones=7, **GEO).data_zones(10**15) == 7           # explicit zones ignore the trace


@pytest.mark.parametrize("config", [
    ReplayConfig(policy="zenfs:migrate=all", pressure=0.85, **GEO),
    ReplayConfig(policy="greedy", zones=9, reserve_zones=4, meta_zones=5, block_size=512, device="memory-payload",
                 seed=7, zone_map=True, verify_summaries=True, verify_payload=False, **GEO),
    ReplayConfig(zones=40, device="/dev/nvme0n1"),
])
def test_cli_args_parse_back_to_the_same_configuration(config):
    """The guest runs a case as ``retainz replay`` with :meth:`ReplayConfig.cli_args`: the CLI must
    build exactly the configuration the runner meant."""
    import argparse

    from retainz.cli import replay as cli_replay

    parser = argparse.ArgumentParser()
    cli_replay.register(parser.add_subparsers())
    args = parser.parse_args(["replay", "t.jsonl", *config.cli_args()])
    assert cli_replay.config_from_args(args) == config


@pytest.mark.parametrize("argv, message", [
    (["--pressure", "1.5"], "argument --pressure: 1.5 must be above 0 and at most 1"),     # the flags' words
    (["--zones", "1"], "argument --zones: 1 is under 2"),
    (["--zones", "4", "--reserve-zones", "-2"], "argument --reserve-zones: -2 is negative"),
    (["--zones", "4", "--zone-size", "256KiB", "--zone-capacity", "512KiB"], "at most the zone size"),
    (["--zones", "4", "--device", "tape"], "unknown replay device 'tape'"),
    (["--zones", "4", "--policy", "nope"], "unknown policy 'nope'"),
])
def test_cli_refuses_a_bad_configuration_with_one_line_and_exit_2(tmp_path, capsys, argv, message):
    t = _trace(tmp_path, steps=30)
    assert main(["replay", t, *argv]) == 2
    cap = capsys.readouterr()
    assert message in cap.err and len(cap.err.strip().splitlines()) == 1 and cap.out == ""


def test_zone_capacity_defaults_to_the_zone_size_off_the_zn540_geometry(tmp_path):
    t = _trace(tmp_path, steps=50)
    r = replay(t, ReplayConfig(policy="greedy", pressure=0.8, zone_size=256 << 10, max_active=6, max_open=6))
    assert r["geometry"]["zone_capacity"] == 256 << 10


def test_cli_json_and_errors(tmp_path, capsys):
    t = _trace(tmp_path, steps=60)
    assert main(["replay", t, "--policy", "retainz", "--pressure", "0.8", "--zone-size", "256KiB",
                 "--zone-capacity", "192KiB", "--max-active", "6", "--max-open", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "retainz" and out["generations_committed"] == 6
    bad = tmp_path / "bad.jsonl"
    bad.write_text(open(t).readline() + '{"type": "save", "step": "ten"}\n')
    assert main(["replay", str(bad), "--zones", "4"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2:" in err and len(err.strip().splitlines()) == 1


def test_a_capacity_stop_records_its_cause_and_state(tmp_path):
    t = _trace(tmp_path, rule="torchtitan:interval=10,keep_latest_k=0")  # keeps everything
    r = replay(t, ReplayConfig(policy="greedy", zones=4, **GEO))
    assert r["capacity_stop_cause"] == "admission" and r["admission_reserve_zones"] == 2
    st = r["capacity_stop_state"]
    assert set(st) == {"empty_zones", "open_free_bytes", "dead_bytes", "live_bytes"}
    assert st["live_bytes"] > 0 and st["dead_bytes"] == 0
    ok = replay(t, ReplayConfig(policy="greedy", zones=400, **GEO))
    assert ok["capacity_stop_step"] is None and ok["capacity_stop_cause"] is None
    assert ok["capacity_stop_state"] is None


def test_zenfs_stops_in_allocation_with_pinned_dead_bytes_that_migrate_all_collects(tmp_path):
    """Checkpoint shards are not .sst files: upstream ZenFS GC moves none of them, so dead bytes stay
    pinned next to live ones and the stop is the allocation's; ``zenfs:migrate=all`` copies them.
    Four meta zones: on 48 KiB zones store format 6's close record takes 2 of a journal zone's 12
    blocks, and with 3 the journal's limit came first (step 320, the allocation's at 330)."""
    t = _trace(tmp_path, rule="megatron:save_interval=10,retain_interval=50")
    sst = replay(t, ReplayConfig(policy="zenfs", pressure=0.7, meta_zones=4, **GEO32))
    every = replay(t, ReplayConfig(policy="zenfs:migrate=all", pressure=0.7, meta_zones=4, **GEO32))
    assert sst["admission_reserve_zones"] == every["admission_reserve_zones"] == 0
    assert sst["gc_bytes"] == 0 and sst["capacity_stop_cause"] == "allocation"
    assert sst["capacity_stop_state"]["dead_bytes"] > 0 and sst["capacity_stop_state"]["empty_zones"] == 0
    assert every["gc_bytes"] > 0
    assert every["capacity_stop_step"] is None or every["capacity_stop_step"] > sst["capacity_stop_step"]


@pytest.mark.parametrize("policy", ["zenfs", "zenfs-nohint"])
def test_zenfs_decides_alike_on_payload_and_payload_less_devices(tmp_path, policy):
    """A shard keeps its zone until full on the payload device too: the same decisions and outcome."""
    t = _trace(tmp_path, rule="megatron:save_interval=10,retain_interval=50")
    a = replay(t, ReplayConfig(policy=policy, pressure=0.6, **GEO32))
    b = replay(t, ReplayConfig(policy=policy, pressure=0.6, device="memory-payload", **GEO32))
    keys = ("decisions", "host_bytes", "gc_bytes", "resets", "finishes", "dead_space_byte_steps",
            "capacity_stop_step", "capacity_stop_cause", "capacity_stop_state")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert b["bytes_verified"] > 0


def test_a_trace_without_saves_sized_by_pressure_says_so(tmp_path, capsys):
    t = _trace(tmp_path, steps=30)
    header_only = tmp_path / "h.trace"
    with open(t) as f:
        header_only.write_text(f.readline())         # the header line alone: a valid trace, no saves
    code = main(["replay", str(header_only), "--pressure", "0.9"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == ("retainz: error: the trace saves nothing (peak live 0 bytes): no device "
                                         "size follows from --pressure; give --zones")
    assert main(["replay", str(header_only), "--zones", "4"]) == 0     # and replays with a size given
