"""Several nodes promoting their own shards of one generation to one destination (docs/tiers.md,
"Several nodes"): a generation is durable only when every node's node manifest is there and agrees;
until then no node reports it durable or retires its local copy; a torn, disagreeing or clashing node
manifest counts as none; the durable copy restores whole onto one fresh device or per node; and a real
2-rank DCP run (torchrun, one device file per rank) promotes, retires once durable, and loads back on
another node layout from the durable copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fsspec", reason="needs fsspec (the tier extra)")

from retainz.errors import GenerationNotFoundError  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.tier import Destination, Promoter, restore_generation  # noqa: E402
from retainz.zoned import FileDevice  # noqa: E402
from tests.tier.test_tier import GEO, local_bytes, payload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NODES = ["node0", "node1"]


def node_save(store, gid: str, step: int, node: int) -> dict[str, bytes]:
    """Node ``node``'s part of generation ``gid``: its rank's data shard (and node 0 the metadata)."""
    shards = {f"__{node}_0.distcp": payload(step * 10 + node, 200_000)}
    if node == 0:
        shards[".metadata"] = payload(step, 300)
    w = store.begin_generation(gid, step)
    for name, data in shards.items():
        w.write_shard(name, [data])
    w.commit()
    return shards


@pytest.fixture
def nodes(tmp_path):
    """Two simulated nodes: one device file each, formatted."""
    devs, stores = [], []
    for i in range(2):
        d = FileDevice.create(tmp_path / f"node{i}.img", GEO)
        devs.append(d)
        stores.append(Store.format(d))
    yield stores
    for s in stores:
        s.close()
    for d in devs:
        d.close()


def promoter(store, url, node, world=NODES, **kw):
    return Promoter(store, url, node=node, nodes=world, retry_seconds=0, **kw)


def test_durable_only_once_every_node_has_promoted_its_part(nodes, tmp_path, destination):
    url = destination.url
    saved = {}
    for i, s in enumerate(nodes):
        saved.update(node_save(s, "step-10", 10, i))
    p0, p1 = promoter(nodes[0], url, "node0"), promoter(nodes[1], url, "node1")
    dest = Destination(url)
    assert not p0.run_pending()                          # node0's part is verified, node1's is missing
    assert [r.state for r in p0.status()] == ["nodes"] and not p0.is_durable("step-10")
    assert p0.backlog() == (1, nodes[0].generation("step-10").size)
    assert dest.generations() == [] and dest.manifest("step-10") is None
    assert dest.node_names("step-10") == ["node0"]
    assert p0.retire(nodes[0], "step-10", 30) is False    # the local copy is kept: deferred
    assert nodes[0].generation("step-10").id == "step-10" and p0.deferred == ["step-10"]
    assert p1.run_pending()                              # node1 completes the world: durable for it
    assert p1.is_durable("step-10") and [r.state for r in p1.status()] == ["durable"]
    assert p0.run_pending()                              # node0 looks again: durable, and retires
    with pytest.raises(GenerationNotFoundError):
        nodes[0].generation("step-10")
    assert dest.generations() == ["step-10"]
    m = dest.manifest("step-10")
    assert m.nodes == ("node0", "node1") and sorted(c.name for c in m.shards) == sorted(saved)

    # a fresh node gets the whole generation on one device; a replacement node only its own part
    fd = FileDevice.create(tmp_path / "fresh.img", GEO)
    with Store.format(fd) as fresh:
        restore_generation(fresh, dest, "step-10")
        assert local_bytes(fresh, "step-10") == saved
    fd.close()
    fd = FileDevice.create(tmp_path / "node1-new.img", GEO)
    with Store.format(fd) as repl:
        restore_generation(repl, dest, "step-10", node="node1")
        assert local_bytes(repl, "step-10") == {"__1_0.distcp": saved["__1_0.distcp"]}
        with pytest.raises(GenerationNotFoundError, match="no node 'node7'"):
            restore_generation(repl, dest, "step-10", node="node7")
    fd.close()


def _both_promoted(nodes, url, world1=NODES):
    for i, s in enumerate(nodes):
        node_save(s, "step-10", 10, i)
    p0, p1 = promoter(nodes[0], url, "node0"), promoter(nodes[1], url, "node1", world=world1)
    p0.run_pending()
    p1.run_pending()
    return p0, p1, Destination(url)


@pytest.mark.parametrize("fault", ["torn", "other-world", "same-shard", "object-gone"])
def test_a_bad_node_part_leaves_the_generation_not_durable(nodes, destination, fault):
    url = destination.url
    if fault == "other-world":      # node1 believes in a world of three nodes
        p0, p1, dest = _both_promoted(nodes, url, world1=["node0", "node1", "node2"])
    elif fault == "same-shard":     # node1 holds a shard named as node0's
        w = nodes[1].begin_generation("step-10", 10)
        w.write_shard(".metadata", [payload(99, 300)])
        w.commit()
        node_save(nodes[0], "step-10", 10, 0)
        p0, p1 = promoter(nodes[0], url, "node0"), promoter(nodes[1], url, "node1")
        p0.run_pending()
        p1.run_pending()
        dest = Destination(url)
    else:
        p0, p1, dest = _both_promoted(nodes, url)
        assert dest.generations() == ["step-10"] and p0.is_durable("step-10")
        if fault == "torn":
            path = "step-10/MANIFEST.node1.json"
            destination.pipe(path, destination.cat(path)[:-40])
        else:
            destination.fs().rm_file(destination.path("step-10/data/__1_0.distcp"))
    # no node reports it durable, the listing leaves it out, and node0 keeps its local copy
    assert not p0.is_durable("step-10") and not p1.is_durable("step-10")
    # the listing reads manifests only (unverified), so a vanished object shows in it; the rest do not
    assert dest.generations() == (["step-10"] if fault == "object-gone" else [])
    assert p0.retire(nodes[0], "step-10", 30) is False and nodes[0].generation("step-10").id == "step-10"
    if fault in ("torn", "object-gone"):             # the node whose part is bad copies it again
        assert p1.run_pending() and p0.run_pending()
        assert p1.is_durable("step-10") and dest.generations() == ["step-10"]
        with pytest.raises(GenerationNotFoundError):    # node0's deferred retirement ran once durable
            nodes[0].generation("step-10")


def test_promoter_needs_its_node_in_the_world(nodes, tmp_path):
    with pytest.raises(ValueError, match="must be one of nodes"):
        Promoter(nodes[0], (tmp_path / "d").as_uri(), node="node9", nodes=NODES)
    with pytest.raises(ValueError, match="give both or neither"):
        Promoter(nodes[0], (tmp_path / "d").as_uri(), node="node0")


# -- a real 2-rank DCP run --------------------------------------------------------------------------


def test_two_ranks_on_two_nodes_promote_to_one_destination_and_load_on_another_layout(tmp_path, destination):
    torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    import torch.distributed.checkpoint as dcp

    from retainz.integrations.dcp import ZonedStorageReader
    from retainz.jobs import stores
    from tests.workers.dcp_ranks import full

    devices, url = tmp_path / "devs", destination.url      # the ranks reach S3 through the AWS_* variables
    devices.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "tests/workers/tier_nodes.py"), str(devices), url],
        capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = {r["rank"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    assert sorted(out) == [0, 1] and out[0]["ok"] and out[1]["ok"]
    assert set(out[0]["states"].values()) == {"durable"} == set(out[1]["states"].values())
    assert out[0]["lost"] == [] == out[1]["lost"]      # after every save: each one local or durable

    dest = Destination(url)
    every = ["step-10", "step-20", "step-30", "step-40"]
    assert dest.generations() == every
    for gid in every:
        assert dest.node_names(gid) == ["rank0", "rank1"]
        assert sorted(c.name for c in dest.manifest(gid).shards) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    local = {}
    for r in (0, 1):
        with stores.using(str(devices / f"rank{r}.img")) as store:
            local[r] = [g.id for g in store.generations()]
    assert local[0] == ["step-30", "step-40"]
    assert {"step-30", "step-40"} <= set(local[1]) <= {"step-20", "step-30", "step-40"}

    def load(device, step):
        sd = {"sharded": torch.zeros(64, 16), "replicated": torch.zeros(33), "meta": {"step": -1, "tag": ""}}
        r = ZonedStorageReader(str(device), durable=url)
        dcp.load(sd, storage_reader=r, checkpoint_id=f"{devices}/step-{step}")
        f = full(step)
        assert torch.equal(sd["sharded"], f["sharded"]) and torch.equal(sd["replicated"], f["replicated"])
        assert sd["meta"] == {"step": step, "tag": f"s{step}"}
        return r.used

    # one process, the original layout: step-10 was retired on both nodes: both parts from the durable copy
    assert load(devices, 10) == {0: f"durable copy at {url}", 1: f"durable copy at {url}"}
    # one node with no device at all
    assert load(tmp_path / "nothing.img", 20) == {0: f"durable copy at {url}", 1: f"durable copy at {url}"}
    # a fresh node: the whole generation restored onto one device, then loaded from it alone
    fd = FileDevice.create(tmp_path / "fresh.img", GEO)
    with Store.format(fd) as fresh:
        restore_generation(fresh, dest, "step-30")
    fd.close()
    assert load(tmp_path / "fresh.img", 30) == {0: "local", 1: "local"}
