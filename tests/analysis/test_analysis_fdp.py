"""The FDP experiment's analysis (retainz.analysis.fdpmap) on hand-made records: placements, the
over-provisioning, media per application byte, the claims, the table and the figure."""

from __future__ import annotations

import pytest

from retainz.analysis.fdpmap import fdp_claims, fdp_figure, fdp_table, media_per_app_byte, placement, spare
from retainz.analysis.records import Runs

GIB = 1 << 30
FLEET = {"fleet": 2, "concurrency": 4, "churn": 16}


def rec(policy, device, *, pressure=0.9, host=100 * GIB, gc=0, journal=0, mbmw=None, hbmw=None, moved=0, pad=0,
        stop=None, rus=100, seed=0):
    m = {"host_bytes": host, "gc_bytes": gc, "journal_bytes": journal, "waf": (host + gc) / host,
         "geometry": {"nr_zones": 80, "zone_capacity": 256 << 20}}
    if device.startswith("fdp"):
        hbmw = hbmw if hbmw is not None else host + gc + journal
        mbmw = mbmw if mbmw is not None else hbmw + moved + pad
        m["fdp"] = {"host_bytes_written": hbmw, "media_bytes_written": mbmw, "device_waf": mbmw / hbmw,
                    "media_reallocated_bytes": moved, "padding_bytes": pad, "reclaim_units": rus,
                    "ru_bytes": 64 << 20, "peak_valid_share": 0.8 if moved else 0.75}
    inputs = {"policy": policy, "device": device, "pressure": pressure, "fleet": FLEET, "trace_seed": seed,
              "scale": "1/64", "zone_capacity": 256 << 20}
    return {"id": f"fdp-{policy}-{device}-{pressure}", "tags": {"experiment": "fdp", "label": None}, "inputs": inputs,
            "capacity_stop_step": stop, "metrics": m}


def sweep():
    out = []
    for sp in (0.07, 0.28):
        dev = f"fdp:spare={sp},unit=1MiB,ru_size=64MiB"
        # no PIDs: GC relocates 10 GiB at 7 %, nothing at 28 %
        out.append(rec("retainz", dev + ",handles=1", moved=10 * GIB if sp == 0.07 else 0))
        out.append(rec("dedicated:by=job", dev, pad=3 * GIB))           # padding only: 1.03 at both OPs
        out.append(rec("retainz", dev, pad=1 * GIB, gc=GIB))            # store GC 1 GiB, padding 1 GiB
        out.append(rec("oracle", dev))
    out += [rec("retainz", "memory", gc=GIB, journal=GIB), rec("dedicated:by=job", "memory", stop=500)]
    return out


def test_placement_spare_and_media_per_app_byte():
    r = sweep()
    assert [placement(x) for x in r[:4]] == ["no-pid", "handle-per-job", "retainz", "oracle"]
    assert spare(r[0]) == 0.07 and spare(r[-1]) is None
    assert spare(rec("retainz", "fdp:unit=1MiB")) == 0.07  # the device's default
    assert placement(rec("greedy", "fdp:spare=0.1")) is None
    # FDP: MBMW / application bytes (journal 0 here): 1 + the store's GC + the padding
    assert media_per_app_byte(r[2]) == pytest.approx((101 + 1) / 100)
    assert media_per_app_byte(r[-2]) == pytest.approx(102 / 100)    # ZNS: host + GC + journal


def test_claims():
    out = []
    fdp_claims(Runs(sweep(), [], "t"), out)
    got = {c["id"]: c["value"] for c in out}
    assert got["fdp.cells"] == 1
    assert got["fdp.c4.s0.z256M.p0.9.no-pid.op0.07.device_waf"] == 1.1
    assert got["fdp.c4.s0.z256M.p0.9.no-pid.op0.28.device_waf"] == 1.0
    assert got["fdp.c4.s0.z256M.p0.9.handle-per-job.op0.07.device_waf"] == 1.03
    assert got["fdp.c4.s0.z256M.p0.9.zns.retainz.media_per_app_byte"] == 1.02
    assert got["fdp.c4.s0.z256M.p0.9.zns.handle-per-job.media_per_app_byte"] == 1.0
    assert got["fdp.c4.s0.z256M.p0.9.stops"] == 1                   # the ZNS handle per job
    assert got["fdp.max_relocated_share"] == 0.1
    assert got["fdp.max_padding_share"] == 0.03
    assert got["fdp.max_peak_valid_share"] == 0.8
    assert got["fdp.max_device_waf_spread_over_op"] == 0.1         # no-pid: 1.1 at 7 %, 1.0 at 28 %
    # RetainZ 1.02 vs a handle per job 1.03 per application byte at both OPs: two wins by 0.01
    assert (got["fdp.retainz_vs_per_job.wins"], got["fdp.retainz_vs_per_job.ties"],
            got["fdp.retainz_vs_per_job.losses"]) == (2, 0, 0)
    assert got["fdp.retainz_vs_per_job.median_margin"] == 0.01
    out = []
    recs = sweep()
    recs[2]["capacity_stop_step"] = 700                               # RetainZ stops at 7 %, per job completes
    fdp_claims(Runs(recs, [], "t"), out)
    got = {c["id"]: c["value"] for c in out}
    assert (got["fdp.retainz_vs_per_job.losses"], got["fdp.retainz_vs_per_job.stops_where_per_job_completes"]) == (1, 1)
    nothing = []
    fdp_claims(Runs([], [], "t"), nothing)
    assert nothing == []


def test_table_and_figure(tmp_path):
    runs = Runs(sweep(), [], "t")
    paths = fdp_table(runs, str(tmp_path))
    text = open(paths[0]).read()
    assert "| c4.s0.z256M | 0.9 | 0.07 | 1.100 (GC 10.0%) | 1.030 | 1.010 | 1.000 |" in text
    assert "| c4.s0.z256M | 0.9 | ZNS | - | - | - | - | - / 1.000 (stop 500) / 1.020 / - | 20.00 |" in text
    assert "6.25 |" in text                                           # 100 RUs of 64 MiB; ZNS: 80 zones of 256 MiB
    figs = fdp_figure(runs, str(tmp_path))
    assert [p.rsplit(".", 1)[1] for p in figs] == ["pdf", "png"]
    assert fdp_table(Runs([], [], "t"), str(tmp_path)) == [] and fdp_figure(Runs([], [], "t"), str(tmp_path)) == []
