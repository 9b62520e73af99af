"""The fleet mix on file systems (experiment fleet-filesystems): medians and ranges over reruns, from
records alone (retainz.analysis.filesystems)."""

from __future__ import annotations

from retainz.analysis.filesystems import (
    fleet_filesystem_claims,
    fleet_filesystems_figure,
    fleet_filesystems_table,
)
from retainz.analysis.records import Runs


def _record(system: str, rerun: int, waf: float, *, enospc=None, fill=0.7, resets=0, throughput=10e6,
            ok=True, errno=None) -> dict:
    inputs = {"system": system, "policy": "retainz", "rerun": rerun, "fleet": {"concurrency": 4, "churn": 4},
              "trace_seed": 0, "steps": 10000, "scale": "1/80", "zone_size": 256 << 20,
              "zone_capacity": 256 << 20, "pressure": 0.7}
    metrics = {"device_waf": waf, "device_bytes_written": int(waf * 27e9), "enospc_step": enospc,
               "peak_fill": fill, "zone_resets": resets, "save_throughput": throughput, "verify_ok": ok,
               "namespace_zones": 65, "trace_bytes": 27e9, "trace_peak_live_bytes": 12.15e9}
    if errno is not None:
        metrics["stop_errno"] = errno
    return {"id": f"{system}-{rerun}", "tags": {"experiment": "fleet-filesystems", "label": None},
            "inputs": inputs, "metrics": metrics}


def _runs() -> Runs:
    recs = [_record("retainz", k, 1.0003, throughput=t) for k, t in enumerate((20e6, 30e6, 25e6))]
    recs += [_record("btrfs", k, w, resets=r, throughput=12.5e6) for k, (w, r) in
             enumerate(((1.10, 40), (1.08, 44), (1.12, 38)))]
    recs += [_record("f2fs", 0, 1.20, enospc=7000, fill=0.6, errno="EROFS"),
             _record("f2fs", 1, 1.30, enospc=7500, fill=0.62, ok=False)]
    recs.append({**_record("btrfs", 0, 9.0), "tags": {"experiment": "filesystems", "label": None}})  # another experiment
    return Runs(recs, [], "test")


def test_the_table_gives_each_system_its_median_and_range_over_the_reruns():
    lines = fleet_filesystems_table(_runs()).splitlines()
    assert lines[0].startswith("Fleet: mean concurrency 4, churn 4, seed 0, 10,000 steps, shards scaled by 1/80; "
                               "namespace 65 zones of 256 MiB (capacity 256 MiB), pressure 0.7 (peak live 12.2 GB")
    rows = {row.split(" | ")[0].lstrip("| "): row.split(" | ") for row in lines[4:]}
    assert list(rows) == ["RetainZ", "btrfs zoned", "f2fs zoned"]
    btrfs = rows["btrfs zoned"]
    assert btrfs[1] == "3" and btrfs[2] == "1.1000 (1.0800-1.1200)" and btrfs[3] == "3.64%"
    assert btrfs[5] == "none" and btrfs[7] == "40 (38-44)"
    assert btrfs[8] == "0.50 (0.50-0.50)"           # 12.5 MB/s over the store's median, 25 MB/s
    f2fs = rows["f2fs zoned"]
    assert f2fs[1] == "2" and f2fs[2] == "1.2500 (1.2000-1.3000)"       # an even count: the mean of the middle two
    # each errno the runs stopped with (a record without one stopped at ENOSPC)
    assert f2fs[5] == "2 of 2: ENOSPC x1, EROFS x1, step 7,250 (7,000-7,500)" and f2fs[9].startswith("1 of 2 FAILED")
    assert rows["RetainZ"][8] == "1.00 (0.80-1.20)"


def test_the_claims_name_each_system_and_count_the_runs_that_read_back():
    out: list = []
    fleet_filesystem_claims(_runs(), out)
    claims = {c["id"]: c["value"] for c in out}
    assert claims["fleetfs.btrfs.runs"] == 3 and claims["fleetfs.f2fs.runs"] == 2
    assert (claims["fleetfs.btrfs.device_waf_median"], claims["fleetfs.btrfs.device_waf_min"],
            claims["fleetfs.btrfs.device_waf_max"]) == (1.1, 1.08, 1.12)
    assert claims["fleetfs.f2fs.stopped_runs"] == 2 and claims["fleetfs.retainz.stopped_runs"] == 0
    assert claims["fleetfs.f2fs.fill_reached_median"] == 0.61
    assert claims["fleetfs.runs_read_back_ok"] == 7


def test_no_fleet_records_no_table_and_no_claims():
    runs = Runs([_record("btrfs", 0, 1.1) | {"tags": {"experiment": "filesystems", "label": None}}], [], "test")
    out: list = []
    fleet_filesystem_claims(runs, out)
    assert fleet_filesystems_table(runs) == "" and out == []


def test_the_figure_is_drawn_from_the_records(tmp_path):
    from retainz.analysis.figures import setup_style

    setup_style()
    paths = fleet_filesystems_figure(_runs(), str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["fleet_filesystems.pdf", "fleet_filesystems.png"]
    assert all((tmp_path / p.rsplit("/", 1)[1]).stat().st_size > 5000 for p in paths)
    assert fleet_filesystems_figure(Runs([], [], "test"), str(tmp_path / "none")) == []
