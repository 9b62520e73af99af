"""What a process using the integrations prints when it ends badly (issue 44.5): the error it raised,
and nothing from RetainZ's own clean-up at interpreter exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from retainz.store import Store
from retainz.zoned import FileDevice, Geometry
from tests.interrupts import ENV

GEOM = Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=ENV, capture_output=True, text=True,
                          timeout=300)


def test_an_uncaught_error_while_a_dcp_writer_holds_its_store_prints_only_that_error(tmp_path):
    """The writer holds the device's store (``jobs.stores.using``) between ``prepare_local_plan`` and
    ``finish``; an uncaught error then ended the process with a ``TypeError`` from the store holder (then integrations/_stores.py)
    printed at exit (the release ran in a finalizer after module teardown).  Now the store is closed
    at exit while the interpreter is whole: its generation is aborted, the device is clean."""
    pytest.importorskip("torch")
    dev = tmp_path / "d.img"
    r = python(f"""
        from torch.distributed.checkpoint.planner import SavePlan
        from retainz.integrations.dcp import ZonedStorageWriter
        from retainz.zoned import Geometry
        w = ZonedStorageWriter({str(dev)!r}, checkpoint_id="/ckpt/step-5",
                               geometry=Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20))
        w.set_up_storage_writer(True, rank=0)
        w.prepare_local_plan(SavePlan([]))
        raise RuntimeError("boom")
    """)
    assert r.returncode == 1
    assert r.stderr.rstrip().splitlines()[-1] == "RuntimeError: boom", r.stderr
    assert "Exception ignored" not in r.stderr and "TypeError" not in r.stderr, r.stderr
    with FileDevice(dev) as d, Store.open(d) as s:
        assert s.generations() == [] and s.fsck().ok


def _call_on_a_held_device(tmp_path, call: str):
    """``(device path, completed process)``: ``call`` run in another process through a ``retainz://``
    filesystem (``fs``, ``DEV``; ``wait`` 0.3 s) while this process holds the device; a
    ``TimeoutError`` is printed as ``TimeoutError: ...``."""
    dev = tmp_path / "d.img"
    FileDevice.create(dev, GEOM).close()
    with FileDevice(dev) as held:
        Store.format(held).close()
        r = python(f"""
            import fsspec
            fs = fsspec.filesystem("retainz", wait=0.3, skip_instance_cache=True)
            DEV = {str(dev)!r}
            try:
                {call}
            except TimeoutError as e:
                print("TimeoutError:", e)
        """)
    return dev, r


def test_a_retainz_path_on_a_busy_device_times_out_with_one_error(tmp_path):
    """A ``retainz://`` file opened for writing on a device another process holds waits ``wait``
    seconds and raises ``TimeoutError``; Python then printed ``Exception ignored ... '_WriteFile'
    object has no attribute '_done'`` (fsspec's finalizer closed a file whose namespace was never
    opened)."""
    dev, r = _call_on_a_held_device(tmp_path, 'fs.open(DEV + "/step-1/a.bin", "wb")')
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"TimeoutError: {dev}: device busy in another process for 0 s"), r.stdout
    assert r.stderr == ""


def test_a_busy_device_is_not_answered_as_an_absent_file(tmp_path):
    """``fs.exists`` on a device another process holds raises the busy device's ``TimeoutError``
    instead of answering ``False``: fsspec's ``AbstractFileSystem.exists`` turns every error of
    ``info`` into "absent", so DCP's ``FsspecWriter`` took a busy device for one without
    ``.metadata`` (its ``overwrite=False`` check passed) and went on to write, each call waiting
    ``wait`` seconds again (found running pytorch's test_file_system_checkpoint.py on
    ``retainz://``: ranks spawned by a process that held the device hung past the test's timeout)."""
    dev, r = _call_on_a_held_device(tmp_path, 'print("exists:", fs.exists(DEV + "/ckpt/step-1/.metadata"))')
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"TimeoutError: {dev}: device busy in another process for 0 s"), r.stdout
    # a free device answers as before: no file there
    r = python(f"""
        import fsspec
        fs = fsspec.filesystem("retainz", wait=0.3, skip_instance_cache=True)
        print("exists:", fs.exists({str(dev)!r} + "/ckpt/step-1/.metadata"), fs.exists({str(dev)!r} + "/../x"))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exists: False False", r.stdout


def test_a_rank_that_finds_the_device_held_without_a_service_is_told_how_to_free_it(tmp_path):
    """A rank of a job (``share``) that finds its device held by a process that does not serve it (here a
    program that opened it with ``Store.open`` itself; a process that opened it through ``retainz://`` or
    ``using`` serves it, tests/jobs/test_jobs_served.py) times out naming what holds it and how to free it;
    before, the line said only 'device busy'."""
    dev, r = _call_on_a_held_device(tmp_path, "from retainz.jobs import stores; "
                                              "stores.using(DEV, wait=0.3, share=True).__enter__()")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"TimeoutError: {dev}: device busy in another process for 0 s"), r.stdout
    assert r.stdout.rstrip().endswith("the process holding it does not serve it to other processes (a store "
                                      "command, a mount starting or stopping, or a program that opened the device "
                                      "with `Store.open` itself): let it finish, or have it open the device "
                                      "through `retainz://`, the DCP plugin or `retainz.jobs.stores.using`, which "
                                      "serve it"), r.stdout
