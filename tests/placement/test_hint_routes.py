"""One hint vocabulary (issue 12): every route carries the one ``retainz.hint.Hint`` the retention rules
predict, one lifetime classifier, one ``NAME:k=v`` parser, one step parser.

The routes: the DCP writer, the ``retainz://`` file system, the mount's operations (driven directly,
no kernel), the retention callbacks, and a trace written and read back.  Each hint is compared with the
hint of the rule's own driven run (``drive``), which is an independent path through the rule
(the session's schedule, not :func:`~retainz.retention.save_hint`'s window).
"""

from __future__ import annotations

import math

import pytest

from retainz.hint import DEFAULT_MEDIUM, DEFAULT_SHORT, Hint, Lifetime, class_bounds, lifetime_class
from retainz.integrations.retention_callbacks import KeepLatestK
from retainz.placement import make_allocator
from retainz.retention import (
    RULES,
    AtStep,
    Permanent,
    drive,
    explicit_hint,
    parse_condition,
    parse_rule,
    parse_step,
    rule_hint,
)
from retainz.store import Store
from retainz.trace.format import SaveEvent, hint_from_json, hint_to_json
from retainz.trace.generate import generate
from retainz.trace.io import TraceReader, TraceWriter
from retainz.trace.layouts import get_layout
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from retainz.zoned.spec import open_device

RULE = "torchtitan:interval=500,keep_latest_k=15"
CONDITION = "after_newer:k=15,of_class=interval,timing=after_commit"
#: TorchTitan keeps step s until the 15th newer interval save commits: s + 15 * 500; a lifetime of
#: 7,500 steps is 15 intervals, MEDIUM (2 < 15 <= 20 intervals).
EXPECTED = {0: Hint(7500, Lifetime.MEDIUM, CONDITION), 500: Hint(8000, Lifetime.MEDIUM, CONDITION)}
GEOM = Geometry(nr_zones=48, zone_size=1 << 20, zone_capacity=1 << 20)


def driven_hints(spec: str, total: int, first_step: int = 0) -> dict[int, Hint]:
    """The hint of every save of the rule's driven run (first save of each step)."""
    out: dict[int, Hint] = {}
    for a in drive(parse_rule(spec).start(total, first_step=first_step)):
        if a.kind == "save":
            out.setdefault(a.step, a.hint)
    return out


def test_the_retention_rule_predicts_step_0_like_any_interval_save():
    """TorchTitan's seed checkpoint step-0 is purged like any step-N: the rule's driven run and the
    save-time hint agree at step 0 and 500 (the old integrations predictor said LONG at step 0)."""
    driven = driven_hints(RULE, 20_000)
    for step, want in EXPECTED.items():
        assert driven[step] == want
        assert rule_hint(RULE, step) == want


def test_the_retention_callbacks_route_carries_the_rules_hint():
    cb = KeepLatestK(15, interval=500)
    assert cb.rule == RULE
    for step, want in EXPECTED.items():
        assert cb.hint(step) == want


def test_the_mount_route_carries_the_rules_hint():
    pytest.importorskip("fsspec", reason="the mount streams through the fsspec filesystem's sink (mount extra)")
    from retainz.mount.fs import MountedStore

    store = Store.format(MemoryDevice(GEOM))
    ms = MountedStore(store, retention=RULE)
    ms.mkdir("/run", 0o755)
    for step in EXPECTED:
        ms.mkdir(f"/run/step-{step}", 0o755)
        for name, data in (("__0_0.distcp", b"d" * 5000), (".metadata", b"m" * 100)):
            fh = ms.create(f"/run/step-{step}/{name}", 0o644)
            ms.write(f"/run/step-{step}/{name}", data, 0, fh)
            ms.release(f"/run/step-{step}/{name}", fh)
    for step, want in EXPECTED.items():
        assert store.generation(f"run%2Fstep-{step}").hint == want
    store.close()


@pytest.mark.dcp
def test_the_dcp_and_fsspec_routes_carry_the_rules_hint(tmp_path):
    torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    fsspec = pytest.importorskip("fsspec")
    import torch.distributed.checkpoint as dcp

    from retainz.integrations.dcp import ZonedStorageWriter
    from retainz.integrations.fsspec_fs import RetainZFileSystem
    from retainz.jobs import stores

    devices = {}
    for route in ("dcp", "fsspec"):
        path = tmp_path / f"{route}.img"
        FileDevice.create(path, GEOM).close()
        with open_device(str(path)) as dev:
            Store.format(dev).close()
        devices[route] = str(path)
    writer = ZonedStorageWriter(devices["dcp"], retention=RULE)
    fsspec.config.conf["retainz"] = {"retention": RULE}
    try:
        for step in EXPECTED:
            dcp.save({"x": torch.ones(4)}, storage_writer=writer, checkpoint_id=f"step-{step}")
            dcp.save({"x": torch.ones(4)}, checkpoint_id=f"retainz://{devices['fsspec']}/ckpt/step-{step}")
    finally:
        fsspec.config.conf.pop("retainz", None)
        RetainZFileSystem.close_all()
        RetainZFileSystem.clear_instance_cache()
    with stores.using(devices["dcp"]) as store:
        got_dcp = {step: store.generation(f"step-{step}").hint for step in EXPECTED}
    with stores.using(devices["fsspec"]) as store:
        got_fsspec = {step: store.generation(f"ckpt%2Fstep-{step}").hint for step in EXPECTED}
    assert got_dcp == EXPECTED
    assert got_fsspec == EXPECTED


EVERY_RULE = ["torchtitan:interval=10,keep_latest_k=3", "torchtitan:interval=10,keep_latest_k=0,async=true",
              "megatron:save_interval=10,retain_interval=30,non_persistent_interval=5",
              "lightning:every_n_train_steps=10,save_top_k=3", "lightning:every_n_train_steps=10,save_top_k=2,metric=synthetic",
              "hf:save_steps=10,save_total_limit=2", "hf:save_steps=10,save_total_limit=2,metric=plateau",
              "accelerate:save_steps=10,total_limit=2", "orbax:latest=2,every_steps=30,save_interval_steps=5"]


@pytest.mark.parametrize("spec", EVERY_RULE)
def test_a_trace_records_and_reads_back_the_same_hints(spec, tmp_path):
    """The trace route: the generator writes the rule's hints, the reader gives the same objects back
    (no second hint type), and the JSON is the v1 object form."""
    header, events = generate(get_layout("pythia-1b"), spec, 200, seed=3)
    events = list(events)
    path = tmp_path / "t.jsonl"
    with TraceWriter(str(path), header) as w:
        for ev in events:
            w.write(ev)
    read = [ev for ev in TraceReader(str(path)) if isinstance(ev, SaveEvent)]
    written = [ev for ev in events if isinstance(ev, SaveEvent)]
    assert [ev.hint for ev in read] == [ev.hint for ev in written]
    assert [ev.hint for ev in written] == [a.hint for a in drive(parse_rule(spec).start(200, seed=3))
                                           if a.kind == "save"]
    for ev in written:
        obj = hint_to_json(ev.hint)
        assert obj["condition"] == parse_condition(ev.hint.condition).to_json()
        assert hint_from_json(obj["condition"], ev.hint.reclaim_step, obj["lifetime"]) == ev.hint


def test_a_condition_text_reads_back_whole():
    for spec in EVERY_RULE:
        for a in drive(parse_rule(spec).start(120, seed=1)):
            if a.kind == "save":
                c = parse_condition(a.hint.condition)
                assert c.describe() == a.hint.condition
    with pytest.raises(ValueError, match="unknown kind 'nosuch'"):
        parse_condition("nosuch:x=1")
    with pytest.raises(ValueError, match="expected at="):
        parse_condition("at_step:k=1")


def test_explicit_conditions_are_retention_conditions():
    assert explicit_hint("permanent", 200) == Hint(math.inf, Lifetime.EXTREME, Permanent("explicit").describe())
    assert explicit_hint("after:100", 200) == Hint(300, Lifetime.SHORT, AtStep(300).describe())
    assert explicit_hint("at_step:20000", 200) == Hint(20000, Lifetime.LONG, AtStep(20000).describe())
    assert explicit_hint("after:100", None) == Hint()
    with pytest.raises(ValueError, match="expected permanent, at_step:N, after:N"):
        explicit_hint("tomorrow", 5)


def test_an_unknown_rule_names_every_registered_rule_at_every_step():
    """The one list of known runtimes is the rules registry (no shadow list, also at step 0)."""
    for step in (0, 1, 500):
        with pytest.raises(ValueError) as e:
            rule_hint("keep_everything", step)
        assert str(e.value) == f"unknown retention rule 'keep_everything'; valid rules: {', '.join(RULES)}"


@pytest.mark.parametrize("call, what", [
    (lambda: make_allocator("retainz:neighbors"), "policy retainz"),
    (lambda: parse_rule("torchtitan:interval"), "retention rule torchtitan"),
    (lambda: get_layout("pythia-1b:dp"), "layout pythia-1b"),
])
def test_one_spec_grammar_one_error(call, what):
    item = {"policy retainz": "neighbors", "retention rule torchtitan": "interval", "layout pythia-1b": "dp"}[what]
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == f"{what}: expected key=value, got {item!r}"


def test_device_specs_share_the_grammar():
    from retainz.errors import DeviceFormatError

    with pytest.raises(DeviceFormatError) as e:
        open_device("mem:zones=8,zone_size")
    assert str(e.value) == "device spec mem: expected key=value, got 'zone_size'"
    dev = open_device("mem: zones = 8 , zone_size = 64KiB ,")
    assert dev.geometry.nr_zones == 8 and dev.geometry.zone_size == 64 << 10


def test_one_lifetime_classifier_with_one_set_of_bounds():
    """The placement fallback (a hint without a class) and the rules classify alike at TorchTitan's
    default interval, and the bounds are 2 and 20 save intervals."""
    assert (DEFAULT_SHORT, DEFAULT_MEDIUM) == class_bounds(500) == (1000, 10_000)
    rule = parse_rule("torchtitan:interval=500,keep_latest_k=25")
    for a in drive(rule.start(30_000)):
        if a.kind == "save":
            assert lifetime_class(a.hint.reclaim_step, a.step) == a.hint.lifetime
    zenfs = make_allocator("zenfs")
    assert zenfs.lifetime_of(Hint(reclaim_step=10_500), 500) == Lifetime.MEDIUM
    assert zenfs.lifetime_of(Hint(reclaim_step=10_501), 500) == Lifetime.LONG


@pytest.mark.parametrize("name, strict, on_a_file_system", [
    ("step-500", 500, 500), ("iter_0001000", 1000, 1000), ("checkpoint-7", 7, 7), ("global_step9", 9, 9),
    ("tmp-checkpoint-7", None, 7), ("epoch=0-step=500.ckpt", None, 500), ("run/epoch=1_step=20", None, 20),
    ("step-5.tmp", None, None), ("xstep=5", None, None), ("tmp-checkpoint-" + "9" * 19, None, None),
])
def test_one_step_parser(name, strict, on_a_file_system):
    from retainz.namespace.names import is_checkpoint_dir_name

    assert parse_step(name) == strict
    assert parse_step(name, file_names=True) == on_a_file_system
    if not name.endswith(".ckpt") and "/" not in name:
        assert is_checkpoint_dir_name(name) == (on_a_file_system is not None)


@pytest.mark.parametrize("spec, what", [("retainz:neighbors=2,neighbors=3", "policy"),
                                        ("mem:zones=8,zones=16", "device"),
                                        ("torchtitan:interval=5,interval=6", "retention rule")])
def test_one_spec_grammar_refuses_a_key_given_twice(spec, what):
    from retainz.retention import parse_rule
    from retainz.zoned.spec import open_device

    build = {"policy": make_allocator, "device": open_device, "retention rule": parse_rule}[what]
    with pytest.raises(ValueError, match="given twice"):
        build(spec)


def test_spec_grammar_items_and_values():
    from retainz.spec import parse_spec

    # empty items are skipped wherever they are; a value may itself hold "="
    assert parse_spec("p:,a=1,,b = x=y ,", "policy") == ("p", [("a", "1"), ("b", "x=y")])
    assert parse_spec("", "policy") == ("", [])


@pytest.mark.parametrize("text, message", [
    (":k", "policy ':k': expected key=value, got 'k'"),
    ("p:=1", "policy p: expected key=value, got '=1'"),
    (":k=1,k=2", "policy ':k=1,k=2': key k given twice"),
    ("p:k=1,k=2", "policy p: key k given twice"),
])
def test_spec_grammar_errors_name_the_spec(text, message):
    from retainz.spec import parse_spec

    with pytest.raises(ValueError) as e:
        parse_spec(text, "policy")
    assert str(e.value) == message


def test_class_bounds_of_a_one_step_interval_and_the_refusal():
    assert class_bounds(1) == (2, 20)
    with pytest.raises(ValueError) as e:
        class_bounds(0)
    assert str(e.value) == "interval must be >= 1 step, got 0"


def test_explicit_condition_edges():
    permanent = Hint(math.inf, Lifetime.EXTREME, Permanent("explicit").describe())
    assert explicit_hint("never", 5) == explicit_hint(" Permanent ", 5) == permanent
    # at_step:N without the save's step: the prediction, but no lifetime class
    assert explicit_hint("at_step:500", None) == Hint(500, Lifetime.NOT_SET, AtStep(500).describe())
    # the class counts from the save's step, also from step 0
    assert explicit_hint("at_step:1100", 200).lifetime == Lifetime.SHORT
    assert explicit_hint("at_step:1001", 0).lifetime == Lifetime.MEDIUM
    with pytest.raises(ValueError, match="expected permanent, at_step:N, after:N"):
        explicit_hint("soon:5", 10)
