"""TorchTitan 0.3.0's own CheckpointManager (unmodified) on a retainz:// folder: its saves become
generations, its purge thread retires them through the fsspec filesystem, its load discovery finds the
latest committed step-N folder, and a resume restores the weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="needs the runtimes extra (make setup-torch)")


pytestmark = pytest.mark.dcp
ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, mode: str) -> dict:
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry

    device = tmp_path / "dev.img"
    dev = FileDevice.create(device, Geometry(nr_zones=64, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(ROOT / "tests/workers/torchtitan_run.py"), str(device), mode],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sync_purge_keeps_latest_k(tmp_path):
    """interval=10, keep_latest_k=2, 50 steps: step s is purged once the save at s + 2*10 completes; the
    last step (50, model-only) is saved without a purge."""
    r = _run(tmp_path, "disabled")
    assert r["after"] == {"10": ["step-10"], "20": ["step-10", "step-20"], "30": ["step-20", "step-30"],
                          "40": ["step-30", "step-40"], "50": ["step-30", "step-40", "step-50"]}
    # generation ids are the folder paths; step from the name; hint = step + k*interval
    assert r["final"] == {"ckpt%2Fstep-30": [30, 50], "ckpt%2Fstep-40": [40, 60], "ckpt%2Fstep-50": [50, 70]}
    assert r["load_step"] == 50                       # discovery: latest step-N holding .metadata
    assert r["loaded"] is True and r["weights_equal"] is True and r["weights_differ_from_final"] is True


def test_async_purge_runs_after_dispatch(tmp_path):
    """async mode: the purge is enqueued right after the save is dispatched, so the folder listed may not
    hold the in-flight save yet: after each save, the 2 newest committed saves are always there and at
    most one older one."""
    r = _run(tmp_path, "async")
    saves = [10, 20, 30, 40, 50]
    before = set()
    for i, step in enumerate(saves):
        have = {int(n.split("-")[1]) for n in r["after"][str(step)]}
        if step == 50:                                   # the last step: saved, never purging
            assert have == before | {50}
            continue
        newest = set(saves[max(0, i - 1):i + 1])
        assert newest <= have <= set(saves[max(0, i - 2):i + 1]), (step, have)
        before = have
    assert {"ckpt%2Fstep-40", "ckpt%2Fstep-50"} <= set(r["final"])
    assert r["loaded"] is True and r["weights_equal"] is True
