"""A ``.metadata`` shard is input: ZonedStorageReader resolves only DCP's metadata types from it.

torch 2.13's ``FileSystemReader.read_metadata`` runs ``pickle.load`` on ``.metadata``; a checkpoint
someone else could write would run their code.  Every global outside DCP's metadata types is refused
before anything it names is called, unless the caller says it trusts the device.
"""

from __future__ import annotations

import os
import pickle
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
import torch.distributed.checkpoint as dcp  # noqa: E402

from retainz.integrations.dcp import (  # noqa: E402
    METADATA_SHARD,
    UnsafeMetadataError,
    ZonedStorageReader,
    ZonedStorageWriter,
    load_metadata,
)
from retainz.jobs import stores  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.zoned import FileDevice, Geometry  # noqa: E402

pytestmark = pytest.mark.dcp


class _Planted:
    """Unpickling this calls ``target(*args)``: what a hostile ``.metadata`` does."""

    def __init__(self, target, *args):
        self.target, self.args = target, args

    def __reduce__(self):
        return self.target, self.args


@pytest.fixture
def device(tmp_path):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    yield str(path)
    assert stores.open_count() == 0


def _plant(device: str, gen: str, blob: bytes) -> None:
    with stores.using(device) as store:
        w = store.begin_generation(gen, 1)
        w.write_shard(METADATA_SHARD, [blob])
        w.commit()


def _load_error(device, gen, **kw):
    with pytest.raises(dcp.api.CheckpointException) as ei:
        dcp.load({"x": torch.zeros(2)}, storage_reader=ZonedStorageReader(device, **kw), checkpoint_id=gen)
    return ei.value.failures[0][0]


@pytest.mark.parametrize("target", [os.mkdir, exec, eval, getattr, __import__, pickle.loads,
                                    torch.load, subprocess.run, os.system])
def test_any_foreign_global_is_refused_before_it_runs(device, tmp_path, target):
    marker = tmp_path / "ran"
    args = {os.mkdir: (str(marker),), exec: (f"open({str(marker)!r}, 'w')",),
            eval: (f"open({str(marker)!r}, 'w')",)}.get(target, ("x",))
    _plant(device, "step-1", pickle.dumps(_Planted(target, *args)))
    err = _load_error(device, "step-1")  # dcp.load reports read_metadata's failure in its own words
    assert f".{target.__name__}, not a DCP metadata type: refused" in str(err)
    assert "trust_metadata=True" in str(err)
    assert not marker.exists()
    with stores.using(device) as store:
        blob = b"".join(store.read_shard("step-1", METADATA_SHARD))
    with pytest.raises(UnsafeMetadataError, match=f"names [\\w.]*{target.__name__}, not a DCP"):
        load_metadata(blob)
    assert not marker.exists()


def test_trusted_device_loads_any_pickle(device, tmp_path):
    marker = tmp_path / "ran"
    _plant(device, "step-1", pickle.dumps(_Planted(os.mkdir, str(marker))))
    _load_error(device, "step-1", trust_metadata=True)  # mkdir returns None, not Metadata: load fails after
    assert marker.is_dir()


def test_real_checkpoints_load_under_the_restriction(device):
    sd = {"w": torch.randn(5, 3), "bf16": torch.ones(4, dtype=torch.bfloat16), "i": torch.arange(6),
          "b": torch.rand(3) > 0.5, "nested": {"step": 3, "lr": [0.1, 0.2], "name": "run"}, "raw": b"\x00\x01"}
    dcp.save(sd, storage_writer=ZonedStorageWriter(device), checkpoint_id="/ckpt/step-7")
    with stores.using(device) as store:
        blob = b"".join(store.read_shard("step-7", METADATA_SHARD))
    md = load_metadata(blob)
    assert md.state_dict_metadata.keys() == pickle.loads(blob).state_dict_metadata.keys()
    assert md.state_dict_metadata["bf16"].properties.dtype == torch.bfloat16
    out = {"w": torch.zeros(5, 3), "bf16": torch.zeros(4, dtype=torch.bfloat16), "i": torch.zeros(6, dtype=torch.int64),
           "b": torch.zeros(3, dtype=torch.bool), "nested": {"step": 0, "lr": [], "name": ""}, "raw": b""}
    dcp.load(out, storage_reader=ZonedStorageReader(device), checkpoint_id="/ckpt/step-7")
    assert torch.equal(out["w"], sd["w"]) and torch.equal(out["bf16"], sd["bf16"]) and out["raw"] == sd["raw"]
    assert out["nested"] == sd["nested"]


def test_not_a_pickle_is_an_unpickling_error():
    with pytest.raises(pickle.UnpicklingError):
        load_metadata(b"\x00not a pickle")
