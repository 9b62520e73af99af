"""Guest cases: the replay command runs inside the QEMU NVMe ZNS guest and matches the in-memory device.

Needs QEMU, busybox and the guest kernel (``retainz vm setup``; ``make test`` installs them through the
zns_guest lane's set-up); skipped, with the reason, where they are missing.
"""

from __future__ import annotations

import json
import os

import pytest

from retainz.experiments.manifest import load_manifest
from retainz.experiments.runner import run_cases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _guest_ready() -> str | None:
    try:
        from retainz.vm.setup import ensure_all, find_qemu

        if find_qemu() is None:
            return "qemu-system-x86_64 not installed"
        ensure_all(install=False)
    except Exception as e:  # noqa: BLE001 - any missing piece means: skip
        return f"QEMU guest unavailable: {e}"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_guest_ready() is not None, reason=str(_guest_ready()))
def test_guest_replay_matches_memory(tmp_path):
    _, cases = load_manifest(os.path.join(ROOT, "experiments", "guest.json"))
    cases = [c for c in cases if c.inputs["policy"] == "retainz"]          # one guest boot keeps it short
    s = run_cases(cases, str(tmp_path), jobs=2, progress=False)
    recs = {r["inputs"]["device"]: r for r in
            (json.load(open(tmp_path / n)) for n in os.listdir(tmp_path) if n.endswith(".json"))}
    assert s.ok == 2, {d: r.get("error", {}).get("message") for d, r in recs.items()}
    g, m = recs["guest"]["metrics"], recs["memory"]["metrics"]
    assert g["device"] == "/dev/nvme0n1"
    for k in ("host_bytes", "gc_bytes", "resets", "finishes", "capacity_stop_step", "generations_committed",
              "dead_space_byte_steps"):
        assert g[k] == m[k], k
