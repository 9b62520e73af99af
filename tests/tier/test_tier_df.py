"""Promotion counters in ``retainz df`` (docs/tiers.md, "Counters in df"): durable generations and the
backlog (generations, bytes), asked of the destination the device remembers (``DEV.tier.json``), which
``retainz tier promote`` and every promoting writer or face record; a destination that does not answer
shows as failed, and df still answers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fsspec", reason="needs fsspec (the tier extra)")

from retainz.cli import main  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.zoned import FileDevice  # noqa: E402
from tests.tier.test_tier import GEO, save  # noqa: E402


def df(capsys, device: str) -> tuple[str, dict]:
    capsys.readouterr()
    assert main(["df", device]) == 0
    text = capsys.readouterr().out
    assert main(["df", device, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def test_df_counts_durable_generations_and_the_backlog(tmp_path, destination, capsys):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEO)
    with Store.format(dev) as store:
        save(store, "step-1", 1)
        save(store, "step-2", 2)
    dev.close()
    text, d = df(capsys, str(path))
    assert "Promotion" not in text and "tier" not in d             # no destination: no counters
    url = destination.url
    assert main(["tier", "promote", str(path), "--to", url]) == 0
    dev = FileDevice(path)
    with Store.open(dev) as store:
        save(store, "step-3", 3, 500_000)                          # committed after the promotion
        size3 = store.generation("step-3").size
    dev.close()
    text, d = df(capsys, str(path))
    assert d["tier"] == {"url": url, "policy": "all", "durable": 2, "backlog": {"generations": 1, "bytes": size3},
                         "failed": 0, "error": ""}
    assert f"Promotion: 2 generations durable at {url}; backlog 1 generation, {size3 / 2**20:,.2f} MiB" in text


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_df_says_when_the_destination_does_not_answer(tmp_path, capsys, monkeypatch, kind):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEO)
    with Store.format(dev) as store:
        save(store, "step-1", 1)
    dev.close()
    if kind == "dir":
        blocker = tmp_path / "afile"
        blocker.write_bytes(b"x")
        url = (blocker / "ckpt").as_uri()                          # under a regular file: nothing can be made
    else:
        pytest.importorskip("s3fs", reason="needs the tier-test extra (s3fs)")
        from tests.tierdest import aws_env, forget_s3_clients, free_port

        for k, v in aws_env(f"http://127.0.0.1:{free_port()}").items():   # an endpoint nobody listens on
            monkeypatch.setenv(k, v)
        forget_s3_clients()
        url = "s3://ckpt/run"
    assert main(["tier", "promote", str(path), "--to", url]) == 1
    text, d = df(capsys, str(path))
    assert d["tier"]["durable"] == 0 and d["tier"]["backlog"]["generations"] == 1
    assert "1 failed (" in text.splitlines()[-1]


def test_a_promoting_writer_records_its_destination_for_df(tmp_path, destination, capsys):
    torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    import torch.distributed.checkpoint as dcp

    from retainz.integrations.dcp import ZonedStorageWriter

    dev, url = tmp_path / "dev.img", destination.url
    w = ZonedStorageWriter(str(dev), geometry=GEO, promote=url, promote_policy="every:n=20")
    try:
        for step in (10, 20):
            dcp.save({"w": torch.arange(1000.0) * step}, storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
        assert w.promoter.wait(60)
    finally:
        w.close()
    _, d = df(capsys, str(dev))
    assert d["tier"]["url"] == url and d["tier"]["policy"] == "every:n=20"
    assert d["tier"]["durable"] == 1 and d["tier"]["backlog"] == {"generations": 0, "bytes": 0}
