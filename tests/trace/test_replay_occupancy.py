"""Sizing a replay device by time-averaged occupancy (issue 40 item 4; docs/fleet.md, "Occupancy"):
``retainz replay --occupancy``, the manifest key ``occupancy`` and what the result says."""

from __future__ import annotations

import json
import math

import pytest

from retainz.cli import main
from retainz.experiments.manifest import ManifestError, expand
from retainz.experiments.runner import scaled_layout
from retainz.trace.generate import write_generated
from retainz.trace.io import TraceReader
from retainz.trace.occupancy import mean_live_bytes
from retainz.trace.replay import ReplayConfig, replay

GEO = dict(zone_size=1 << 20, zone_capacity=768 << 10, max_active=8, max_open=8)


@pytest.fixture
def trace(tmp_path):
    path = str(tmp_path / "t.jsonl")
    write_generated(path, scaled_layout("smollm2-135m-dcp", "1/4096"), "torchtitan:interval=100,keep_latest_k=3",
                    3000)
    return path


def _mean_live(path: str) -> float:
    with TraceReader(path) as r:
        header, events = r.header, list(r)
    return float(mean_live_bytes(events, header.schedule["steps"], 4096))


@pytest.mark.parametrize("occupancy", [0.3, 0.5, 0.8])
def test_the_device_is_sized_from_the_mean_live_bytes_and_the_result_says_how_full_it_was(trace, occupancy):
    res = replay(trace, ReplayConfig(occupancy=occupancy, **GEO))
    mean = _mean_live(trace)
    zones = math.ceil(mean / (occupancy * GEO["zone_capacity"]))
    assert res["zones"] == zones
    assert res["mean_live_bytes"] == pytest.approx(mean)
    assert res["occupancy"] == occupancy and res["pressure"] is None
    eff = res["effective_occupancy"]
    assert eff == pytest.approx(mean / (zones * GEO["zone_capacity"]))
    assert occupancy * (zones - 1) / zones < eff <= occupancy        # at most asked, within one zone
    # the peak is above the mean: sized by occupancy, the peak fills more of the device than asked
    assert res["effective_pressure"] > eff
    assert res["capacity_stop_step"] is None or occupancy >= 0.8


def test_a_pressure_sized_result_carries_no_occupancy_keys(trace):
    res = replay(trace, ReplayConfig(pressure=0.9, **GEO))
    assert not {"occupancy", "mean_live_bytes", "effective_occupancy"} & res.keys()


def test_the_cli_takes_occupancy_exclusive_with_the_other_sizings(trace, capsys):
    assert main(["replay", trace, "--occupancy", "0.5", "--zone-size", "1MiB", "--zone-capacity", "768KiB",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["zones"] == math.ceil(_mean_live(trace) / (0.5 * (768 << 10)))
    assert main(["replay", trace, "--occupancy", "0.5", "--zone-size", "1MiB", "--zone-capacity", "768KiB"]) == 0
    out = capsys.readouterr().out
    assert "effective_occupancy" in out and "mean_live_bytes" in out
    for argv, needle in ((["--occupancy", "0.5", "--pressure", "0.9"], "not allowed with argument"),
                         (["--occupancy", "0"], "argument --occupancy: 0 must be above 0 and at most 1"),
                         (["--occupancy", "1.5"], "argument --occupancy: 1.5 must be above 0")):
        assert main(["replay", trace, *argv]) == 2
        assert needle in capsys.readouterr().err


def test_the_config_round_trips_through_the_cli_arguments(trace):
    cfg = ReplayConfig(occupancy=0.42, **GEO)
    assert "--occupancy" in cfg.cli_args() and "--pressure" not in cfg.cli_args()
    with pytest.raises(ValueError, match="exactly one of zones .*, pressure or occupancy"):
        ReplayConfig(occupancy=0.5, pressure=0.9)
    with pytest.raises(ValueError, match=r"occupancy must be in \(0, 1\], not 2"):
        ReplayConfig(occupancy=2)


BASE = {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10", "steps": 5000,
        "zone_size": "64MiB", "zone_capacity": "48MiB", "max_active": 14, "max_open": 14, "policy": "retainz",
        "scale": "1/64"}


def test_a_manifest_case_takes_occupancy_and_its_id_changes_only_when_it_is_set():
    def cases(**kw):
        return expand({"manifest": "t", "format": 1, "defaults": {**BASE, **kw}, "blocks": [{"experiment": "fleet"}]})

    by_pressure = cases(pressure=0.9)[0]
    by_occupancy = cases(occupancy=0.5)[0]
    assert "occupancy" not in by_pressure.inputs                  # ids recorded before the key stay
    assert by_occupancy.inputs["occupancy"] == 0.5 and by_occupancy.inputs["pressure"] is None
    cfg = by_occupancy.replay_config("memory")
    assert cfg.occupancy == 0.5 and cfg.pressure is None
    with pytest.raises(ManifestError, match="give exactly one of them"):
        cases(pressure=0.9, occupancy=0.5)
    with pytest.raises(ManifestError, match="key 'occupancy' must be in"):
        cases(occupancy=1.5)


def test_a_file_system_case_is_not_sized_by_occupancy():
    with pytest.raises(ManifestError, match="a file-system case .* is sized by pressure or zones"):
        expand({"manifest": "t", "format": 1, "defaults": {**BASE, "occupancy": 0.5, "system": "btrfs",
                                                           "device": "guest"},
                "blocks": [{"experiment": "fleet"}]})


def test_a_recorded_occupancy_case_verifies_and_a_wrong_effective_occupancy_is_caught(tmp_path):
    import os

    from retainz.experiments.record import finalize
    from retainz.experiments.runner import run_cases
    from retainz.experiments.verify import verify_dir

    m = {"manifest": "t", "format": 1,
         "defaults": {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=10,keep_latest_k=3", "steps": 400,
                      "scale": "1/16384", "zone_size": 256 << 10, "zone_capacity": 192 << 10,
                      "max_active": 6, "max_open": 6, "occupancy": 0.5},
         "blocks": [{"experiment": "pressure", "axes": {"policy": ["retainz"]}}]}
    (case,) = expand(m, name="m.json")
    run_cases([case], str(tmp_path), jobs=1, progress=False)
    path = os.path.join(tmp_path, f"{case.id}.json")
    rec = json.load(open(path))
    assert rec["inputs"]["occupancy"] == 0.5 and 0.3 < rec["metrics"]["effective_occupancy"] <= 0.5
    assert verify_dir(str(tmp_path)) == (1, [])
    rec["metrics"]["effective_occupancy"] = 0.6
    json.dump(finalize(rec), open(path, "w"))
    (_, problems) = verify_dir(str(tmp_path))
    assert len(problems) == 1 and "effective_occupancy 0.6 does not fit the occupancy asked, 0.5" in problems[0]
