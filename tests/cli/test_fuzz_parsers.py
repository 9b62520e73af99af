"""Issue 15 item 9: every parser of untrusted bytes fuzzed with hypothesis.

Each target gets random inputs, inputs near valid ones (valid encodings with random fields, valid
encodings with a bit flipped or bytes replaced) and must answer with a parse or with its documented
error type, never another exception and never a hang.  A bit flip inside a checksummed frame (a
superblock, a journal record, a zone-state slot, a digested run record) is refused, or, where the
checksum still matches (the flip fell outside what it covers), parses to exactly the original.

The default lane runs 150 inputs per target; the slow lane runs ``RETAINZ_FUZZ_EXAMPLES`` (100,000)
inputs split evenly over the targets, each printing its count; ``RETAINZ_FUZZ_SEED`` (0) seeds them."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import uuid

import crc32c
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, seed, settings

from retainz.errors import CorruptJournalError, RetainZError
from retainz.store import Store
from retainz.store.format import MAGIC, Superblock
from retainz.store.journal import parse_zone, scan
from retainz.store.records import FRAME_HEADER, decode, frame, unframe
from retainz.zoned import Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice
from retainz.zoned.model import ZoneCond

#: Generated inputs of the slow lane, over every target.
FUZZ_EXAMPLES = int(os.environ.get("RETAINZ_FUZZ_EXAMPLES", "100000"))
#: The inputs' seed: fixed, so that CI reruns the same inputs; set another for a new long run.
FUZZ_SEED = int(os.environ.get("RETAINZ_FUZZ_SEED", "0"))
DEFAULT_EXAMPLES = 150
GEOM = Geometry(nr_zones=12, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096, max_open=3,
                max_active=4)
_SB = struct.Struct("<8sII16sQIIQQIII64s")   # the superblock layout (retainz.store.format)


def _lanes(fn):
    """Two tests of one fuzz body: the default lane's (``DEFAULT_EXAMPLES`` inputs) and the slow
    lane's (its share of ``FUZZ_EXAMPLES``); each counts the inputs it ran and checks the count."""
    count = {"n": 0}

    def body(*a, **kw):
        count["n"] += 1
        fn(*a, **kw)

    scratch = "scratch" in fn.__code__.co_varnames[:fn.__code__.co_argcount]

    def make(n: int, slow: bool):
        def test(tmp_path):
            def inner(**kw):
                body(tmp_path, **kw) if scratch else body(**kw)
            run = seed(FUZZ_SEED)(settings(max_examples=n, deadline=None, database=None,
                                           suppress_health_check=list(HealthCheck))(given(**fn.strategies)(inner)))
            count["n"] = 0
            run()
            print(f"fuzz {fn.__name__}: {count['n']} inputs")
            assert count["n"] >= n
        test.__name__ = fn.__name__ + ("_slow" if slow else "")
        test.__doc__ = fn.__doc__
        return pytest.mark.slow(test) if slow else test

    return make(DEFAULT_EXAMPLES, False), make(math.ceil(FUZZ_EXAMPLES / len(TARGETS)), True)


def strategies(**kw):
    def deco(fn):
        fn.strategies = kw
        return fn
    return deco


def _flip(data: bytes, bit: int) -> bytes:
    bit %= 8 * len(data)
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# -- superblock ----------------------------------------------------------------------------------------
def _sb() -> Superblock:
    return Superblock(uuid=uuid.UUID(int=7), sequence=5, part=1, geometry=GEOM, meta_zones=3,
                      gc_reserve_zones=2, policy="greedy")


u32, u64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)


@strategies(fields=st.tuples(u32, u32, st.binary(min_size=16, max_size=16), u64, u32, u32, u64, u64, u32, u32, u32,
                             st.binary(max_size=64)),
            raw=st.binary(max_size=5000), bit=st.integers(0, 8 * 4096), magic=st.booleans())
def fuzz_superblock(fields, raw, bit, magic):
    """Superblock.decode: random blocks, blocks with a valid crc and random fields, valid
    superblocks with a bit flipped."""
    block = (MAGIC + raw) if magic else raw
    try:
        assert Superblock.decode(block, GEOM) is None or block[:8] == MAGIC
    except (RetainZError, ValueError) as e:
        assert isinstance(e, RetainZError)
    body = _SB.pack(MAGIC, *fields)
    block = (body + struct.pack("<I", crc32c.crc32c(body))).ljust(4096, b"\0")
    try:
        sb = Superblock.decode(block, GEOM)
    except RetainZError:
        pass
    else:
        version, flags, raw_uuid, seq, part, nz, zsize, zcap, bs, meta, reserve, policy = fields
        assert sb is not None and sb.version == version
        assert (sb.flags, sb.uuid.bytes, sb.sequence, sb.part, sb.meta_zones, sb.gc_reserve_zones) == (
            flags, raw_uuid, seq, part, meta, reserve)
        assert (sb.geometry.nr_zones, sb.geometry.zone_size, sb.geometry.zone_capacity,
                sb.geometry.block_size) == (nz, zsize, zcap, bs)
        assert sb.policy.encode() == policy.rstrip(b"\0")
    good = _sb()
    enc = good.encode()
    flipped = _flip(enc, bit)
    try:
        got = Superblock.decode(flipped, GEOM)
    except RetainZError:
        return
    assert got is None or got == good, "a damaged superblock was accepted with other content"


# -- journal records -----------------------------------------------------------------------------------
_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                     max_leaves=6)
_kinds = st.sampled_from([b"c", b"g", b"d", b"m", b"s", b"S", b"E", b"x", b"", b"c\xff"])
_keys = st.sampled_from(["o", "now", "z", "g", "r", "s", "n", "metrics", "commit_seq"])


@strategies(raw=st.binary(max_size=300), kind=_kinds,
            body=st.one_of(_json, st.dictionaries(_keys, _json, max_size=7)), shaped=st.booleans())
def fuzz_record_decode(raw, kind, body, shaped):
    """records.decode: random payloads, or known kinds with random JSON bodies, raise only the
    documented ValueError, KeyError, TypeError or IndexError (what recovery turns into
    CorruptJournalError)."""
    payload = kind + b" " + json.dumps(body, allow_nan=True).encode() if shaped else raw
    try:
        decode(payload)
    except (ValueError, KeyError, TypeError, IndexError):
        pass


@strategies(payloads=st.lists(st.binary(min_size=1, max_size=5000), min_size=1, max_size=5),
            bit=st.integers(0, 2**40), tail=st.booleans(), full=st.booleans(), garbage=st.binary(max_size=9000))
def fuzz_journal_zone(payloads, bit, tail, full, garbage):
    """journal.parse_zone: random zones raise only CorruptJournalError; a zone of valid records with
    one bit flipped is refused, or parses to the original records, or (the last zone of a chain)
    to all but the last one, as a torn tail, the one thing a crash can also leave."""
    bs = 4096
    for buf in (bytes(bs) + garbage, bytes(bs) + b"".join(frame(p, bs) for p in payloads)):
        try:
            parse_zone(buf, bs, len(buf), bs, zone=0, tail=tail, full=full)
        except CorruptJournalError:
            pass
    zone = bytes(bs) + b"".join(frame(p, bs) for p in payloads)
    bad = bytes(zone[:bs]) + _flip(zone[bs:], bit)
    try:
        out = parse_zone(bad, bs, len(bad), bs, zone=0, tail=tail, full=full)
    except CorruptJournalError:
        return
    if out.payloads != payloads:
        assert tail and out.torn and out.payloads == payloads[:-1], "a damaged record was accepted"
    n, total, ok = unframe(frame(payloads[0], bs), 0, len(frame(payloads[0], bs)), bs)
    assert ok and n == len(payloads[0]) and total % bs == 0 and total >= n + FRAME_HEADER


_IMAGE: dict = {}


def _store_image():
    """A store with a few generations on a FaultyDevice (reads of it can be corrupted) and what a
    clean mount finds."""
    if not _IMAGE:
        dev = FaultyDevice(MemoryDevice(GEOM))
        with Store.format(dev) as s:
            for i in range(4):
                w = s.begin_generation(f"g{i}", i)
                w.write_shard("s", [bytes([i]) * (3000 * i + 1)])
                w.commit()
            s.delete("g1", step=5)
        zones = [(z.start, z.wp - z.start if z.cond != ZoneCond.FULL else z.capacity)
                 for z in dev.report_zones(0, 3) if z.cond != ZoneCond.EMPTY]
        _IMAGE.update(dev=dev, zones=zones, scan=scan(dev).payloads)
    return _IMAGE


@strategies(pick=st.integers(0, 2**40), mask=st.integers(1, 255))
def fuzz_journal_image(pick, mask):
    """journal.scan and a read-only mount over a store image with one corrupted byte in a meta zone:
    only typed errors; a success finds the original records and generations."""
    img = _store_image()
    dev = img["dev"]
    start, written = img["zones"][pick % len(img["zones"])]
    dev.corruptions = {start + (pick // 7) % written: mask}
    try:
        try:
            found = scan(dev)
        except RetainZError:
            pass
        else:
            def same(payloads):   # which copy of a duplicated record was read does not matter
                return [p.replace(b'{"cp":1', b'{"cp":0', 1) for p in payloads]

            got, want = same(found.payloads), same(img["scan"])
            if got != want:
                from retainz.store.recovery import replay

                def state(payloads):
                    cat = replay(payloads).catalog
                    return sorted((g.id, g.commit_seq, g.state.value) for g in cat.gens.values())

                # a torn last record dropped, or the previous chain replayed for a damaged snapshot
                # record (format 5): the same generations
                assert (got == want[:len(got)] and len(got) == len(want) - 1) or (
                    any("previous journal chain" in n for n in found.notes)
                    and state(found.payloads) == state(img["scan"])), "damage accepted"
        try:
            with Store.open(dev, readonly=True) as s:
                assert {g.id for g in s.generations()} <= {"g0", "g2", "g3"}
        except RetainZError:
            pass
    finally:
        dev.corruptions = {}


# -- FileDevice zone-state slots -------------------------------------------------------------------------
@strategies(raw=st.binary(max_size=4200), nz=st.integers(1, 300), bit=st.integers(0, 2**30),
            conds=st.lists(st.integers(0, 255), min_size=8, max_size=8),
            written=st.lists(st.integers(0, 2**64 - 1), min_size=8, max_size=8))
def fuzz_zone_state_slot(raw, nz, bit, conds, written):
    """zoned.file.decode_state_slot: a slot-sized buffer of random bytes decodes or answers None; a valid
    slot with a bit flipped answers None or the original state."""
    from retainz.zoned.file import decode_state_slot, encode_state_slot, state_slot_size

    size = state_slot_size(nz)
    decode_state_slot(raw.ljust(size, b"\0")[:size], nz)
    conds = [c % 6 for c in conds]
    size = state_slot_size(8)
    good = encode_state_slot(9, [ZoneCond(c) if c in ZoneCond.__members__.values() else c for c in conds],
                        written, size)
    want = decode_state_slot(good, 8)
    assert want is not None
    got = decode_state_slot(_flip(good, bit), 8)
    assert got is None or got == want, "a damaged zone-state slot was accepted"


_DEVFILE: dict = {}


@strategies(pos=st.integers(0, 2**30), data=st.binary(min_size=1, max_size=64))
def fuzz_file_device_header(scratch, pos, data):
    """FileDevice(path) over a device file whose label or zone-state slots hold overwritten bytes:
    a device, or NotADeviceError / CorruptDeviceError / DeviceFormatError (RetainZError)."""
    from retainz.zoned import FileDevice

    if _DEVFILE.get("dir") != scratch:
        path = scratch / "dev.img"
        with FileDevice.create(path, GEOM) as d:
            d.write(d.zone(4).start, b"x" * 8192)
            d.flush()
        with open(path, "rb") as f:
            _DEVFILE.update(dir=scratch, path=path, head=f.read(3 * 4096))
    path, head = _DEVFILE["path"], _DEVFILE["head"]
    at = pos % len(head)
    bad = (head[:at] + data + head[at + len(data):])[:len(head)]
    with open(path, "r+b") as f:
        f.write(bad)
    try:
        with FileDevice(path) as d:
            d.report_zones()
    except RetainZError:
        pass
    finally:
        with open(path, "r+b") as f:
            f.write(head)


# -- trace lines -----------------------------------------------------------------------------------------
_TRACE: list[str] = []


def _trace_lines() -> list[str]:
    if not _TRACE:
        from retainz.experiments.runner import scaled_layout
        from retainz.trace.generate import write_generated

        buf = io.StringIO()
        write_generated(buf, scaled_layout("smollm2-135m-dcp", "1/16384"), "torchtitan:interval=10,keep_latest_k=3",
                        60, crash_every=25)
        _TRACE.extend(buf.getvalue().splitlines(keepends=True))
    return _TRACE


@strategies(text=st.text(max_size=400), line=st.integers(0, 10**6), pos=st.integers(0, 10**6),
            junk=st.text(max_size=12), value=_json,
            mode=st.sampled_from(["random", "replace", "drop", "dup", "json", "cut"]))
def fuzz_trace(text, line, pos, junk, value, mode):
    """trace TraceReader / read_trace (retainz.trace): random text, or a valid trace with one line damaged
    (bytes replaced, a line dropped or repeated, a field set to random JSON, the file cut short)
    raise only TraceFormatError."""
    from retainz.trace import TraceFormatError, TraceReader

    lines = list(_trace_lines())
    i = line % len(lines)
    if mode == "replace":
        j = pos % len(lines[i])
        lines[i] = lines[i][:j] + junk + lines[i][j + len(junk):]
    elif mode == "drop":
        del lines[i]
    elif mode == "dup":
        lines.insert(i, lines[i])
    elif mode == "json":
        obj = json.loads(lines[i])
        keys = sorted(obj)
        obj[keys[pos % len(keys)]] = value
        lines[i] = json.dumps(obj) + "\n"
    elif mode == "cut":
        lines = lines[:i] + [lines[i][:pos % len(lines[i])]]
    src = text if mode == "random" else "".join(lines)
    try:
        with TraceReader(io.StringIO(src), name="fuzz.jsonl") as r:
            for _ in r:
                pass
    except TraceFormatError:
        pass


@strategies(raw=st.binary(max_size=600))
def fuzz_trace_file(scratch, raw):
    """read_trace on a file of random bytes (not UTF-8, NUL, anything): TraceFormatError only."""
    from retainz.trace import TraceFormatError, read_trace

    path = scratch / "fuzz-trace.jsonl"
    path.write_bytes(raw)
    try:
        read_trace(str(path))
    except TraceFormatError:
        pass


# -- run records ------------------------------------------------------------------------------------------
def _record() -> dict:
    from retainz.runrecord import digest as record_digest

    rec = {"tags": {"experiment": "fuzz", "case": "c"}, "inputs": {"policy": "greedy", "zones": 40},
           "status": "ok", "result": {"waf": 1.25, "host_bytes": 10}}
    rec["digest"] = record_digest(rec)
    return rec


@strategies(raw=st.binary(max_size=400), obj=_json, bit=st.integers(0, 2**30),
            mode=st.sampled_from(["bytes", "json", "flip"]))
def fuzz_run_records(scratch, raw, obj, bit, mode):
    """analysis.records.load over a folder with one record: random bytes, random JSON, or a valid
    record with a bit flipped: ValueError (TamperedRecordError, not JSON) or the records; a flipped
    record that loads is the original."""
    from retainz.analysis.records import load

    folder = scratch / "fuzz-records"
    folder.mkdir(exist_ok=True)
    path = folder / "r.json"
    data = {"bytes": raw, "json": json.dumps(obj).encode(),
            "flip": _flip(json.dumps(_record(), sort_keys=True).encode(), bit)}[mode]
    path.write_bytes(data)
    try:
        runs = load(str(folder))
    except ValueError:
        return
    if mode == "flip" and runs.records:
        assert runs.records == [_record()], "a damaged record was accepted"


# -- manifests --------------------------------------------------------------------------------------------
_mkeys = st.sampled_from(["manifest", "description", "format", "include", "defaults", "blocks", "notes", "x"])
_ckeys = st.sampled_from(["experiment", "layout", "rule", "policy", "steps", "pressure", "zone_size", "zones",
                          "scale", "seed", "tenants", "geometry", "max_active", "crash_every", "device"])


@strategies(raw=st.binary(max_size=300),
            top=st.dictionaries(_mkeys, _json, max_size=4),
            cases=st.lists(st.dictionaries(_ckeys, _json | st.lists(_json, max_size=3), max_size=5), max_size=2),
            mode=st.sampled_from(["bytes", "top", "shaped"]))
def fuzz_manifest(scratch, raw, top, cases, mode):
    """experiments.manifest.load_manifest: random bytes, random manifests or manifests of valid shape
    with random case values raise only ManifestError."""
    from retainz.experiments.manifest import ManifestError, load_manifest

    folder = scratch / "fuzz-manifest"
    folder.mkdir(exist_ok=True)
    path = folder / "m.json"
    shaped = {"manifest": "fuzz", "format": 1, "blocks": [{"experiment": "fuzz", "cases": cases}]}
    path.write_bytes({"bytes": raw, "top": json.dumps(top).encode(), "shaped": json.dumps(shaped).encode()}[mode])
    try:
        load_manifest(path)
    except ManifestError:
        pass


TARGETS = [fuzz_superblock, fuzz_record_decode, fuzz_journal_zone, fuzz_journal_image, fuzz_zone_state_slot,
           fuzz_file_device_header, fuzz_trace, fuzz_trace_file, fuzz_run_records, fuzz_manifest]

for _fn in TARGETS:
    for _test in _lanes(_fn):
        globals()["test_" + _test.__name__] = _test
del _fn, _test
