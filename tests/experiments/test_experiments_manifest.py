"""Manifest expansion: case counts of the committed manifests, stable ids, clear errors for bad input."""

from __future__ import annotations

import collections
import json
import os

import pytest

from retainz.experiments.manifest import ManifestError, case_id, expand, load_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXP = os.path.join(ROOT, "experiments")

BASE = {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10", "steps": 5000,
        "zone_size": "64MiB", "zone_capacity": "48MiB", "max_active": 14, "max_open": 14, "pressure": 0.9}


def manifest(blocks, **top):
    return {"manifest": "t", "format": 1, "defaults": dict(BASE), "blocks": blocks, **top}


@pytest.mark.parametrize("name,total,per_experiment", [
    ("pressure", 528, {"pressure": 528}),
    ("mechanisms", 46, {"cost": 14, "hints": 14, "admission": 18}),
    ("placement", 21, {"placement": 21}),
    ("capacity", 16, {"capacity": 16}),
    ("uncertain", 260, {"uncertain": 260}),
    ("multitenant", 272, {"multitenant": 272}),
    ("geometry", 140, {"geometry": 140}),
    ("paper", 1283, {"pressure": 528, "cost": 14, "hints": 14, "admission": 18, "placement": 21, "capacity": 16,
                     "uncertain": 260, "multitenant": 272, "geometry": 140}),
    ("guest", 4, {"guest": 4}),
    ("quick", 230, {"pressure": 176, "cost": 9, "hints": 4, "admission": 3, "placement": 21, "capacity": 4,
                    "uncertain": 4, "geometry": 4, "multitenant": 5}),
])
def test_committed_manifests_expand_to_documented_counts(name, total, per_experiment):
    m, cases = load_manifest(os.path.join(EXP, f"{name}.json"))
    assert m["manifest"] == name
    assert len(cases) == total
    assert dict(collections.Counter(c.tags["experiment"] for c in cases)) == per_experiment
    assert len({c.id for c in cases}) == total


def test_pressure_manifest_covers_layouts_rules_policies_pressures():
    _, cases = load_manifest(os.path.join(EXP, "pressure.json"))
    assert {c.inputs["layout"] for c in cases} == {"smollm2-135m-dcp", "pythia-1b", "llama3-8b-fsdp:ranks=8"}
    assert {c.inputs["rule"].partition(":")[0] for c in cases} == {"torchtitan", "megatron"}
    assert {c.inputs["policy"].partition(":")[0] for c in cases} == {
        "retainz", "retainz-nohint", "retainz-coarse", "retainz-noisy", "common", "dedicated", "greedy", "oracle",
        "zenfs", "zenfs-nohint"}
    assert {c.inputs["policy"] for c in cases} >= {"zenfs", "zenfs-nohint", "zenfs:migrate=all"}
    ps = sorted({c.inputs["pressure"] for c in cases})
    assert ps[0] == 0.5 and ps[-1] == 0.98
    assert {c.inputs["reserve_zones"] for c in cases} == {4}          # a fixed reserve
    caps = {c.inputs["layout"]: c.inputs["zone_capacity"] for c in cases}   # sizes parsed to bytes
    assert caps == {"smollm2-135m-dcp": (1077 << 20) // 4, "pythia-1b": 1077 << 20,
                    "llama3-8b-fsdp:ranks=8": 1077 << 20}


def test_placement_manifest_has_sixteen_labelled_rows():
    _, cases = load_manifest(os.path.join(EXP, "placement.json"))
    labels = list(dict.fromkeys(c.tags["label"] for c in cases))
    assert len(labels) == 16
    assert labels[:2] == ["RetainZ", "No hints"] and labels[-1] == "Top-3 by metric"
    zm = sorted(c.inputs["policy"] for c in cases if c.inputs["zone_map"])
    assert zm == ["retainz", "zenfs"]
    noise = [c.inputs["policy"] for c in cases if c.tags["label"] == "Hint noise 0.5"]
    assert noise == ["retainz-noisy:error=0.5,seed=1"]     # no ZenFS run under a change it cannot see


@pytest.mark.parametrize("name", ["paper", "quick", "guest"])
def test_every_zenfs_case_has_a_device_zenfs_accepts(name, tmp_path):
    """Upstream ZenFS refuses fewer than 32 zones (ZENFS_MIN_ZONES): every ZenFS-Alloc case, and every
    case it is compared with, is sized to at least that from its trace's peak live bytes."""
    import math

    from retainz.experiments.runner import RetainZBackend
    from retainz.placement.zenfs import ZENFS_MIN_ZONES
    from retainz.trace.replay import trace_stats

    _, cases = load_manifest(os.path.join(EXP, f"{name}.json"))
    # compared: same experiment, row, trace and geometry (a manifest may run the same trace on a
    # geometry too small for ZenFS without it: uncertain.json, geometry.json, multitenant.json)
    def group(c):
        return (c.tags["experiment"], c.tags["label"], c.trace, c.inputs["zone_capacity"], c.inputs["max_active"])

    zenfs_groups = {group(c) for c in cases if c.inputs["policy"].startswith("zenfs")}
    peak = {}
    small = []
    for c in cases:
        if group(c) not in zenfs_groups:
            continue
        if c.inputs["zones"] is not None:
            data = c.inputs["zones"]
        else:
            if c.trace not in peak:
                path = str(tmp_path / f"{c.trace.key()}.jsonl")
                RetainZBackend().generate_trace(c.trace, path)
                peak[c.trace] = trace_stats(path).peak_live_bytes
            data = math.ceil(peak[c.trace] / (c.inputs["pressure"] * c.inputs["zone_capacity"]))
        nr = data + c.inputs["reserve_zones"] + c.replay_config("memory").meta_zones
        if nr < ZENFS_MIN_ZONES:
            small.append((c.id, nr))
    assert zenfs_groups and not small


def test_capacity_manifest_scales_pythia_on_the_file_device():
    _, cases = load_manifest(os.path.join(EXP, "capacity.json"))
    assert {c.inputs["layout"] for c in cases} == {"pythia-1b"}
    assert {c.inputs["scale"] for c in cases} == {"1/1024"}
    assert collections.Counter(c.inputs["device"] for c in cases) == {"file": 8, "memory": 8}


def test_quick_has_the_shape_of_paper_and_no_guest_cases():
    _, quick = load_manifest(os.path.join(EXP, "quick.json"))
    _, paper = load_manifest(os.path.join(EXP, "paper.json"))
    assert {c.tags["experiment"] for c in quick} == {c.tags["experiment"] for c in paper}
    assert "guest" not in {c.inputs["device"] for c in quick}


def test_ids_are_stable_and_independent_of_axis_order():
    a = expand(manifest([{"experiment": "pressure", "axes": {"policy": ["retainz", "zenfs"], "pressure": [0.5, 0.9]}}]))
    b = expand(manifest([{"experiment": "pressure", "axes": {"pressure": [0.9, 0.5], "policy": ["zenfs", "retainz"]}}]))
    assert len(a) == 4
    assert sorted(c.id for c in a) == sorted(c.id for c in b)
    one = [c for c in a if c.inputs["policy"] == "retainz" and c.inputs["pressure"] == 0.9][0]
    assert one.id == case_id(one.tags, one.inputs)
    assert one.id.startswith("pressure-retainz-") and len(one.id.rsplit("-", 1)[1]) == 12
    # pinned: the id is a pure function of tags + inputs, so it never changes across releases
    assert one.id == "pressure-retainz-" + __import__("hashlib").sha256(
        json.dumps({"tags": one.tags, "inputs": one.inputs}, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()[:12]


def test_rows_axes_zipped_axes_and_row_lists():
    cases = expand(manifest([{
        "experiment": "cost",
        "axes": {"geometry": [{"zone_size": "16MiB", "zone_capacity": "16MiB"},
                              {"zone_size": "4MiB", "zone_capacity": "4MiB"}]},
        "rows": [{"policy": ["retainz", "zenfs"]}, {"policy": "retainz", "verify_summaries": True, "label": "r"}],
    }]))
    assert len(cases) == 6
    assert {(c.inputs["zone_size"], c.inputs["zone_capacity"]) for c in cases} == {(16 << 20, 16 << 20),
                                                                                  (4 << 20, 4 << 20)}
    assert sum(c.inputs["verify_summaries"] for c in cases) == 2


@pytest.mark.parametrize("mutate,needle", [
    (lambda m: m["defaults"].update(polcy="retainz"), "unknown key 'polcy'"),
    (lambda m: m["defaults"].pop("layout"), "missing key 'layout'"),
    (lambda m: m["defaults"].update(steps="many"), "key 'steps' must be int"),
    (lambda m: m["defaults"].update(zones=10), "key 'pressure'/'zones'"),
    (lambda m: m["defaults"].update(pressure=1.5), "key 'pressure' must be in (0, 1)"),
    (lambda m: m["defaults"].update(zone_capacity="128MiB"), "key 'zone_capacity'"),
    (lambda m: m["defaults"].update(zone_size="64 parsecs"), "key 'zone_size'"),
    (lambda m: m["defaults"].update(scale="2"), "key 'scale'"),
    (lambda m: m["defaults"].update(device="tape"), "key 'device'"),
    (lambda m: m["defaults"].update(max_open=20), "key 'max_open'"),
    (lambda m: m["defaults"].update(verify_summaries=1), "key 'verify_summaries' must be bool"),
    (lambda m: m.update(format=2), "key 'format'"),
    (lambda m: m.update(colour="blue"), "unknown top-level key 'colour'"),
    (lambda m: m["blocks"][0].pop("experiment"), "key 'experiment' is required"),
    (lambda m: m["blocks"][0]["axes"].update(policy=[]), "key 'policy' must be a non-empty list"),
    (lambda m: m["blocks"][0]["axes"].update(geometry=["x"]), "key 'geometry' is not a case field"),
    (lambda m: m["blocks"][0].update(rows=[{"label": "a"}, {"label": "a"}]), "duplicate case"),
    (lambda m: m["blocks"][0]["axes"].update(policy=["retainz", "nope"]), "key 'policy': unknown policy 'nope'"),
    (lambda m: m["blocks"][0]["axes"].update(policy=["retainz:neighbors=zz"]),
     "key 'policy': policy retainz: neighbors='zz' is not an integer"),
    (lambda m: m["blocks"][0]["axes"].update(policy=["zenfs:reserved_zones=-100"]),
     "key 'policy': policy zenfs: reserved_zones=-100 is out of range"),
    (lambda m: m["defaults"].update(pressure=None, zones=-1), "key 'zones' must be >= 1, got -1"),
    (lambda m: m["defaults"].update(pressure=None, zones=0), "key 'zones' must be >= 1, got 0"),
    (lambda m: m["defaults"].update(pressure=0), "key 'pressure' must be in (0, 1)"),
    (lambda m: m["defaults"].update(reserve_zones=-1), "key 'reserve_zones' must be >= 0, got -1"),
    (lambda m: m["defaults"].update(max_active=0), "key 'max_active' must be positive"),
    (lambda m: m["defaults"].update(zone_capacity=0), "key 'zone_capacity'"),
    (lambda m: m["defaults"].update(rule="nope"), "key 'rule': unknown retention rule 'nope'"),
    (lambda m: m["defaults"].update(rule="torchtitan:interval=x"), "key 'rule': "),
    (lambda m: m["defaults"].update(layout="nope"), "key 'layout': unknown layout 'nope'"),
    (lambda m: m["blocks"][0]["axes"].update(rule=["torchtitan:interval=500,keep_latest_k=3", "nope"]),
     "key 'rule': unknown retention rule 'nope'"),
    (lambda m: m.update(blocks=[]), "no cases"),
    (lambda m: m["defaults"].update(steps=10 ** 12), "key 'steps': 1000000000000 steps at one save every 500"),
])
def test_bad_manifests_fail_with_an_error_naming_the_key(mutate, needle):
    m = manifest([{"experiment": "pressure", "axes": {"policy": ["retainz"]}}])
    mutate(m)
    with pytest.raises(ManifestError) as e:
        expand(m, name="bad.json")
    assert needle in str(e.value)
    assert str(e.value).startswith("bad.json")


def test_bad_policy_names_the_block_and_row():
    m = manifest([{"experiment": "pressure", "axes": {"policy": ["retainz"]}},
                  {"experiment": "placement", "rows": [{"policy": "zenfs"}, {"policy": "nope"}]}])
    with pytest.raises(ManifestError) as e:
        expand(m, name="bad.json")
    assert str(e.value).startswith("bad.json block 1 (placement) row 1: key 'policy': unknown policy 'nope'")


def test_a_bad_axis_value_is_located_by_its_axes():
    """A value out of range that came from an axis names the combination it came from, not only the
    row the axes were laid under."""
    m = manifest([{"experiment": "pressure", "axes": {"policy": ["retainz", "zenfs"], "pressure": [0.5, 1.5]}}])
    with pytest.raises(ManifestError) as e:
        expand(m, name="bad.json")
    assert str(e.value) == ("bad.json block 0 (pressure) row 0 at axes policy='retainz', pressure=1.5: "
                            "key 'pressure' must be in (0, 1), got 1.5")


def test_cli_run_refuses_a_bad_policy_before_running_anything(tmp_path, capsys):
    from retainz.cli import main

    bad = manifest([{"experiment": "pressure", "axes": {"policy": ["retainz", "nope"]}}])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert main(["run", str(tmp_path / "bad.json"), "--output", str(tmp_path / "out")]) == 2
    assert ("bad.json block 0 (pressure) row 0 at axes policy='nope': key 'policy': unknown policy 'nope'"
            in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_guest_cases_need_explicit_zones():
    m = manifest([{"experiment": "x", "defaults": {"device": "guest"}, "axes": {"policy": ["retainz"]}}])
    with pytest.raises(ManifestError, match="guest case needs an explicit zone count"):
        expand(m)


def test_include_cycle_and_bad_json(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"manifest": "a", "format": 1, "include": ["b.json"]}))
    (tmp_path / "b.json").write_text(json.dumps({"manifest": "b", "format": 1, "include": ["a.json"]}))
    with pytest.raises(ManifestError) as e:
        load_manifest(tmp_path / "a.json")
    assert str(e.value) == "a.json > b.json > a.json: key 'include': cycle through a.json"
    (tmp_path / "sub").mkdir()                  # an error inside an include names the chain
    (tmp_path / "sub" / "bad.json").write_text(json.dumps(manifest([{"experiment": "x", "defaults": {"policy": "retainz"},
                                                                  "rows": [{"steps": -5}]}])))
    (tmp_path / "top.json").write_text(json.dumps({"manifest": "t", "format": 1, "include": ["sub/bad.json"]}))
    with pytest.raises(ManifestError) as e:
        load_manifest(tmp_path / "top.json")
    assert str(e.value).startswith("top.json > sub/bad.json block 0 (x) row 0: key 'steps' must be positive")
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(ManifestError, match="c.json: not valid JSON"):
        load_manifest(tmp_path / "c.json")


def test_cli_run_reports_a_bad_manifest_with_status_2(tmp_path, capsys):
    from retainz.cli import main

    bad = manifest([{"experiment": "pressure", "axes": {"policy": ["retainz"]}}])
    bad["defaults"]["steps"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert main(["run", str(tmp_path / "bad.json"), "--output", str(tmp_path / "out")]) == 2
    assert "key 'steps' must be positive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_tenants_cases_mix_jobs_and_leave_one_job_cases_unchanged():
    jobs = [{"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10"},
            {"layout": "pythia-1b", "rule": "megatron:save_interval=1000,retain_interval=5000", "offset": 250}]
    m = {"manifest": "t", "format": 1, "defaults": {**BASE, "policy": "retainz"},
         "blocks": [{"experiment": "multitenant", "rows": [{"tenants": jobs}, {}]}]}
    mixed, single = expand(m)
    assert mixed.inputs["tenants"] == [{**jobs[0], "offset": 0}, jobs[1]]
    assert mixed.inputs["layout"] == "mix:smollm2-135m-dcp+pythia-1b"
    assert mixed.trace.tenants == (("smollm2-135m-dcp", jobs[0]["rule"], 0), ("pythia-1b", jobs[1]["rule"], 250))
    # a one-job case has no tenants input, so its id and trace key are those it always had
    assert "tenants" not in single.inputs
    assert single.id == case_id(single.tags, single.inputs)
    assert mixed.trace.key() != single.trace.key()
    # a list of tenant lists expands the row
    m["blocks"][0]["rows"] = [{"tenants": [jobs, list(reversed(jobs))]}]
    assert len(expand(m)) == 2


@pytest.mark.parametrize("tenants, needle", [
    ([{"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10"}], "at least 2 jobs"),
    ([{"layout": "a", "rule": "b"}, {"layout": "a", "rule": "b", "offset": -1}], "'offset' must be an integer"),
    ([{"layout": "a", "rule": "b"}, {"layout": "a", "rule": "b", "offset": 5000}], "not below steps"),
    ([{"layout": "a", "rule": "b"}, {"layout": "a", "rules": "b"}], "unknown key 'rules'"),
    ([{"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10"},
      {"layout": "a", "rule": "torchtitan:interval=500,keep_latest_k=10"}], "job 1: key 'layout': unknown layout 'a'"),
    ([{"layout": "smollm2-135m-dcp", "rule": "nope"},
      {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10"}],
     "job 0: key 'rule': unknown retention rule 'nope'"),
])
def test_bad_tenants_name_the_key(tenants, needle):
    m = {"manifest": "t", "format": 1, "defaults": {**BASE, "policy": "retainz"},
         "blocks": [{"experiment": "multitenant", "rows": [{"tenants": tenants}]}]}
    with pytest.raises(ManifestError, match="tenants") as e:
        expand(m)
    assert needle in str(e.value)


def test_a_device_override_is_checked_like_the_manifest(tmp_path, capsys):
    """``retainz run --device`` lays the device over every case before the checks: a case it makes
    invalid is refused up front (exit 2, nothing written), and a valid one gets the same id a
    manifest naming that device gives."""
    from retainz.cli import main

    guest = manifest([{"experiment": "x", "defaults": {"device": "guest", "zones": 40, "pressure": None,
                                                       "guest_memory_mib": 2048, "policy": "retainz"}}])
    (tmp_path / "g.json").write_text(json.dumps(guest))
    assert main(["run", str(tmp_path / "g.json"), "--output", str(tmp_path / "o1"), "--device", "memory"]) == 2
    assert ("g.json block 0 (x) row 0 with device='memory': key 'guest_memory_mib' sizes the QEMU guest, but "
            "device 'memory' runs no guest" in capsys.readouterr().err)
    plain = manifest([{"experiment": "x", "defaults": {"policy": "retainz"}}])    # a pressure, no zone count
    (tmp_path / "p.json").write_text(json.dumps(plain))
    assert main(["run", str(tmp_path / "p.json"), "--output", str(tmp_path / "o2"), "--device", "guest"]) == 2
    assert "with device='guest': key 'zones': a guest case needs an explicit zone count" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    as_file = manifest([{"experiment": "x", "defaults": {"device": "file", "policy": "retainz"}}])
    assert [c.id for c in expand(plain, overrides={"device": "file"})] == [c.id for c in expand(as_file)]


def test_a_duplicate_case_names_both_places():
    m = manifest([{"experiment": "x", "defaults": {"policy": "retainz"}, "axes": {"pressure": [0.5, 0.5]}}])
    with pytest.raises(ManifestError) as e:
        expand(m, name="dup.json")
    assert str(e.value).startswith("dup.json block 0 (x) row 0 at axes pressure=0.5: duplicate case x-retainz-")
    assert "the same axis or list value twice (same experiment" in str(e.value)
    m = manifest([{"experiment": "x", "defaults": {"policy": "retainz"}, "rows": [{"seed": 1}, {"seed": [2, 1]}]}])
    with pytest.raises(ManifestError) as e:
        expand(m, name="dup.json")
    assert str(e.value).startswith("dup.json block 0 (x) row 1: duplicate case x-retainz-")
    assert "the same as dup.json block 0 (x) row 0 (same experiment" in str(e.value)


def test_a_duplicate_with_an_included_case_names_the_include(tmp_path):
    one = manifest([{"experiment": "x", "defaults": {"policy": "retainz"}, "axes": {"seed": [0, 1]}}])
    (tmp_path / "a.json").write_text(json.dumps(one))
    (tmp_path / "top.json").write_text(json.dumps({"manifest": "t", "format": 1, "include": ["a.json"],
                                                   "defaults": dict(BASE, policy="retainz"),
                                                   "blocks": [{"experiment": "x", "rows": [{"seed": 1}]}]}))
    with pytest.raises(ManifestError) as e:
        load_manifest(tmp_path / "top.json")
    assert str(e.value).startswith("top.json block 0 (x) row 0: duplicate case x-retainz-")
    assert "the same as top.json > a.json block 0 (x) row 0 at axes seed=1 (" in str(e.value)


def test_a_device_override_that_merges_two_cases_says_so():
    m = manifest([{"experiment": "x", "defaults": {"policy": "retainz", "zones": 40, "pressure": None},
                   "axes": {"device": ["memory", "file"]}}])
    with pytest.raises(ManifestError) as e:
        expand(m, name="g.json", overrides={"device": "memory"})
    assert str(e.value).startswith("g.json block 0 (x) row 0 at axes device='file' with device='memory': duplicate "
                                   "case x-retainz-")
    assert ("the same as g.json block 0 (x) row 0 at axes device='memory' with device='memory'" in str(e.value)
            and str(e.value).endswith("; device='memory' made two cases one"))


def test_an_axis_value_a_row_overrides_is_not_blamed():
    m = manifest([{"experiment": "x", "axes": {"pressure": [0.5], "policy": ["retainz"]},
                   "rows": [{"pressure": 1.5}]}])          # the row's pressure is the bad one
    with pytest.raises(ManifestError) as e:
        expand(m, name="bad.json")
    assert str(e.value) == ("bad.json block 0 (x) row 0 at axes policy='retainz': key 'pressure' must be in (0, 1), "
                            "got 1.5")


@pytest.mark.parametrize("include, needle", [
    ("other.json", "key 'include' must list file names, got 'other.json'"),
    (["nosuch.json"], "key 'include': no manifest file"),
])
def test_bad_includes_name_the_including_manifest(tmp_path, include, needle):
    (tmp_path / "top.json").write_text(json.dumps({"manifest": "t", "format": 1, "include": include}))
    with pytest.raises(ManifestError) as e:
        load_manifest(tmp_path / "top.json")
    assert str(e.value).startswith("top.json: ") and needle in str(e.value)


@pytest.mark.parametrize("fields, needle", [
    ({"zone_size": "1000B", "zone_capacity": 1000}, "zone size 1000 is not a positive multiple of the block size"),
    ({"zones": 1, "pressure": None}, "zones must be at least 2"),
    ({"zones": 40, "pressure": None, "max_active": 1, "max_open": 1}, "fewer than 2 active zones"),
    ({"max_active": 1, "max_open": 1}, "fewer than 2 active zones"),                 # sized by pressure too
    ({"zones": 3, "pressure": None, "policy": "zenfs"}, "ZenFS refuses fewer than 32"),
])
def test_a_case_the_replay_or_the_store_refuses_is_refused_by_the_manifest(tmp_path, capsys, fields, needle):
    """What would only fail inside a worker (a failed record, exit 1) is bad input (exit 2) before
    anything runs: the replay configuration's rules, and the store's when the zone count is given."""
    from retainz.cli import main

    m = manifest([{"experiment": "x", "defaults": {"policy": "retainz"}, "axes": {"seed": [0]}, "rows": [fields]}])
    (tmp_path / "m.json").write_text(json.dumps(m))
    assert main(["run", str(tmp_path / "m.json"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("retainz: error: m.json block 0 (x) row 0 at axes seed=0: ") and needle in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_write_bandwidth_and_unit_are_sizes_in_the_inputs_and_the_replay_configuration():
    """Issue 40: a case replays with time when it names write_bandwidth; absent (the default), its
    inputs and id are those of the serialized case."""
    blocks = [{"experiment": "e", "axes": {"policy": ["retainz"]}},
              {"experiment": "e", "axes": {"policy": ["retainz"]}, "defaults": {"write_bandwidth": "64MiB"}},
              {"experiment": "e", "axes": {"policy": ["retainz"]},
               "defaults": {"write_bandwidth": 1 << 20, "write_unit": "4MiB"}}]
    serial, timed, unit = expand(manifest(blocks))
    assert "write_bandwidth" not in serial.inputs and "write_unit" not in serial.inputs
    assert serial.replay_config("memory").write_bandwidth is None
    assert timed.inputs["write_bandwidth"] == 64 << 20 and "write_unit" not in timed.inputs
    assert (timed.replay_config("memory").write_bandwidth, timed.replay_config("memory").write_unit) == (64 << 20,
                                                                                                        1 << 20)
    assert unit.inputs["write_unit"] == 4 << 20 and unit.replay_config("memory").write_unit == 4 << 20
    assert len({serial.id, timed.id, unit.id}) == 3
    with pytest.raises(ManifestError, match="'write_unit' needs a write_bandwidth"):
        expand(manifest([{"experiment": "e", "axes": {"policy": ["retainz"]}, "defaults": {"write_unit": "2MiB"}}]))
    with pytest.raises(ManifestError, match="'write_bandwidth' must be a positive"):
        expand(manifest([{"experiment": "e", "axes": {"policy": ["retainz"]}, "defaults": {"write_bandwidth": 0}}]))


def test_fdp_manifest_sweeps_op_policies_and_zns():
    """experiments/fdp.json (issue 43 item 4): every OP x policy on an fdp: device, plus the ZNS case."""
    import json

    cases = expand(json.load(open("experiments/fdp.json")))
    fdp = [c for c in cases if c.inputs["device"].startswith("fdp:")]
    assert {c.inputs["device"].split(",")[0] for c in fdp} == {"fdp:spare=0.07", "fdp:spare=0.14", "fdp:spare=0.28"}
    assert {c.inputs["policy"] for c in fdp} == {"retainz", "dedicated:by=job", "oracle"}
    assert sum("handles=1" in c.inputs["device"] for c in fdp) == 9
    assert {c.inputs["device"] for c in cases} - {c.inputs["device"] for c in fdp} == {"memory"}


def test_write_bandwidth_fleet_takes_each_jobs_rate_from_a_format_2_fleet_only():
    """Issue 40 item 5: ``"write_bandwidth": "fleet"`` replays each job of a format-2 fleet at its own
    rate; a case without such a fleet is refused before anything runs."""
    fleet = {"fleet": 2, "concurrency": 2, "churn": 4}
    (case,) = expand(manifest([{"experiment": "e", "axes": {"policy": ["retainz"]},
                                "defaults": {"fleet": fleet, "write_bandwidth": "fleet"}}]))
    assert case.inputs["write_bandwidth"] == "fleet" and case.replay_config("memory").write_bandwidth == "fleet"
    for bad in ({"write_bandwidth": "fleet"}, {"fleet": {"fleet": 1}, "write_bandwidth": "fleet"}):
        with pytest.raises(ManifestError, match="'write_bandwidth': \"fleet\" takes each job's rate from a format-2"):
            expand(manifest([{"experiment": "e", "axes": {"policy": ["retainz"]}, "defaults": bad}]))


@pytest.mark.parametrize("name, total, occupancies, seeds, policies", [
    ("node", 1134, [0.2, 0.4, 0.6], 3, 7),
    ("node-full", 6720, [0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75], 5, 8),
])
def test_node_manifests_cover_overlap_mix_geometry_occupancy_seeds_and_every_practical_policy(
        name, total, occupancies, seeds, policies):
    """experiments/node.json and its full size (issue 40 item 5, docs/fleet.md "The node map")."""
    from retainz.analysis.regimes import PRACTICAL

    _, cases = load_manifest(os.path.join(EXP, f"{name}.json"))
    assert len(cases) == total == len({c.id for c in cases})
    assert {c.tags["experiment"] for c in cases} == {"node"}
    assert all(c.inputs["fleet"]["fleet"] == 2 and c.inputs["occupancy"] is not None for c in cases)
    assert sorted({c.inputs["occupancy"] for c in cases}) == occupancies
    assert len({c.inputs["trace_seed"] for c in cases}) == seeds
    pols = {c.inputs["policy"] for c in cases}
    assert len(pols) == policies and "oracle" in pols and {p.split(":")[0] for p in pols} >= set(PRACTICAL)
    assert {c.tags["label"] for c in cases} == {"zn540", "pm1731a"}
    overlap = {(c.inputs.get("write_bandwidth"), any(j.get("async") for j in c.inputs["fleet"]["jobs"])) for c in cases}
    assert overlap == {(None, False), ("fleet", False), ("fleet", True)}
    # the mixes: every class below a node, every class a node or more, and both
    per_node = {tuple(sorted(j["gpus"] >= 8 for j in c.inputs["fleet"]["jobs"])) for c in cases}
    assert per_node == {(False,), (True, True, True, True), (False, True, True, True, True)}
    # geometries scale with the shards: a ZN540 zone of 1077 MiB and a PM1731a zone of 96 MiB at full size
    scale = {c.inputs["scale"] for c in cases}
    assert len(scale) == 1
    num, den = (int(x) for x in scale.pop().split("/"))
    assert {(c.tags["label"], c.inputs["zone_capacity"] * den // num, c.inputs["max_active"]) for c in cases} == \
        {("zn540", 1077 << 20, 14), ("pm1731a", 96 << 20, 384)}
