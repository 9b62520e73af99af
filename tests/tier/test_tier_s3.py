"""Tiers against a real S3-protocol endpoint: s3fs over HTTP on loopback to moto's standalone server,
started and stopped by the tests (one per session, tests/conftest.py; no in-process mock).  What only
an S3 endpoint has: storage options given from Python, an endpoint nobody listens on, an endpoint that
dies mid-upload; plus promotion, restore and a corrupted object through explicit options (the rest of
the tier suite runs on S3 too, through the ``destination`` fixture).  Nothing committed is lost and
nothing reported durable is not."""

from __future__ import annotations

import pytest

pytest.importorskip("s3fs", reason="needs the tier-test extra (s3fs)")
pytest.importorskip("moto.server", reason="needs the tier-test extra (moto[server])")

from retainz.store import Store  # noqa: E402
from retainz.tier import Destination, Promoter, read_durable_shard, restore_generation  # noqa: E402
from retainz.zoned import FileDevice  # noqa: E402
from tests.tier.test_tier import GEO, local_bytes, save  # noqa: E402
from tests.tierdest import free_port, moto_server, options  # noqa: E402

BUCKET = "ckpt"


@pytest.fixture(scope="module")
def s3(moto_endpoint):
    """The session's moto server (tests/conftest.py) with the bucket ``BUCKET``; its endpoint URL."""
    import s3fs

    fs = s3fs.S3FileSystem(**options(moto_endpoint))
    if not fs.exists(BUCKET):
        fs.call_s3("create_bucket", Bucket=BUCKET)
    yield moto_endpoint


@pytest.fixture
def store(tmp_path):
    dev = FileDevice.create(tmp_path / "dev.img", GEO)
    s = Store.format(dev)
    yield s
    s.close()
    dev.close()


def durable(url: str, endpoint: str, gid: str) -> dict[str, bytes]:
    """The durable copy read by a fresh s3fs client (independent of the promoter)."""
    dest = Destination(url, storage_options=options(endpoint))
    m = dest.manifest(gid)
    return {c.name: b"".join(read_durable_shard(dest, m, c.name)) for c in m.shards}


def test_promote_to_s3_and_restore_onto_a_fresh_device(s3, store, tmp_path):
    url = f"s3://{BUCKET}/restore"
    saved = {g: save(store, g, s, 700_000) for g, s in (("step-1", 1), ("step-2", 2))}
    with Promoter(store, url, storage_options=options(s3)).start() as p:
        assert p.wait(120)
        assert {r.id: r.state for r in p.status()} == {"step-1": "durable", "step-2": "durable"}
    assert {g: durable(url, s3, g) for g in saved} == saved
    dev = FileDevice.create(tmp_path / "fresh.img", GEO)
    with Store.format(dev) as fresh:
        restore_generation(fresh, Destination(url, storage_options=options(s3)), "step-2")
        assert local_bytes(fresh, "step-2") == saved["step-2"]
    dev.close()


def test_a_corrupted_s3_object_is_detected_and_copied_again(s3, store):
    import s3fs

    url = f"s3://{BUCKET}/corrupt"
    saved = save(store, "step-1", 1)
    p = Promoter(store, url, storage_options=options(s3))
    assert p.run_pending()
    fs = s3fs.S3FileSystem(**options(s3))
    key = f"{BUCKET}/corrupt/step-1/data/model.bin"
    data = bytearray(fs.cat_file(key))
    data[10] ^= 0xFF
    fs.pipe_file(key, bytes(data))                      # same size, other bytes
    assert p.is_durable("step-1")                       # the cheap check cannot see it...
    assert len(p.verify(deep=True)) == 1                # ...the read-back does
    assert not p.is_durable("step-1") and p.status()[0].state == "pending"
    assert p.run_pending()
    assert durable(url, s3, "step-1") == saved


def test_an_unreachable_endpoint_reports_nothing_durable(s3, store):
    saved = save(store, "step-1", 1)
    dead = f"http://127.0.0.1:{free_port()}"         # nobody listens there
    p = Promoter(store, f"s3://{BUCKET}/down", storage_options=options(dead))
    assert not p.run_pending()
    [row] = p.status()
    assert row.state == "failed" and "s3://" in row.error and not p.is_durable("step-1")
    assert p.retire(store, "step-1", 2) is False and local_bytes(store, "step-1") == saved   # kept
    live = Promoter(store, f"s3://{BUCKET}/down", storage_options=options(s3))
    assert live.run_pending() and durable(f"s3://{BUCKET}/down", s3, "step-1") == saved


def test_an_endpoint_that_dies_mid_upload_leaves_no_durable_copy(store, s3):
    import s3fs

    saved = save(store, "step-1", 1, 3_000_000)
    with moto_server() as (endpoint, proc):
        s3fs.S3FileSystem(**options(endpoint)).call_s3("create_bucket", Bucket=BUCKET)
        killed = []

        def progress(n):
            if not killed and p.bytes_sent > 1_000_000:
                proc.kill()                                 # the server dies while the object is sent
                proc.wait()
                killed.append(True)

        p = Promoter(store, f"s3://{BUCKET}/dies", storage_options=options(endpoint), bandwidth=8 << 20,
                     on_progress=progress)
        assert not p.run_pending()
        assert killed and p.status()[0].state == "failed" and not p.is_durable("step-1")
    assert local_bytes(store, "step-1") == saved
    live = Promoter(store, f"s3://{BUCKET}/dies", storage_options=options(s3))
    assert live.run_pending() and durable(f"s3://{BUCKET}/dies", s3, "step-1") == saved
