"""SIGINT and SIGTERM during ``dcp.save`` through ``ZonedStorageWriter``, then a resume (issue 27,
item 3): a real training-job process (tests/workers/dcp_interrupt.py) signalled after N bytes of its
save have been written, at many points; then every committed step must load back exactly, the
interrupted step must be absent or complete, and the resumed job (which loads the newest committed
step and saves the step again, ``overwrite=True``) must succeed and leave every step exact.
"""

from __future__ import annotations

import signal
import sys

import pytest

pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")

from tests.interrupts import ENV, ROOT, signal_after  # noqa: E402

pytestmark = pytest.mark.dcp

sys.path.insert(0, str(ROOT / "tests" / "workers"))
import dcp_interrupt as job  # noqa: E402

MiB = 1 << 20
WORKER = [sys.executable, str(ROOT / "tests" / "workers" / "dcp_interrupt.py")]
#: Points inside one 6 MiB save (1 MiB tensors) and past its end.
POINTS = [0, MiB // 2, 2 * MiB, 7 * MiB // 2, 5 * MiB, 6 * MiB]


def committed_steps(device: str) -> dict[int, str]:
    from retainz.jobs import stores

    with stores.using(device) as store:
        rep = store.fsck()
        assert rep.ok, rep.problems
        return {g.step: g.id for g in store.generations()}


def check_all(device: str, steps: set[int]) -> None:
    """Exactly ``steps`` are committed and each loads back exactly."""
    assert set(committed_steps(device)) == steps
    for s in steps:
        assert job.same(job.load(device, s), job.state(s)), f"step {s} does not read back"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dcp_save_interrupted_then_resumed_never_corrupts_a_step(tmp_path, sig):
    import subprocess

    device = str(tmp_path / "rank0.img")
    first = subprocess.run([*WORKER, device, "1"], env=ENV, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    steps = {1}
    interrupted = 0
    for i, n in enumerate(POINTS):
        # a new step (i even) or the same step saved again over a committed one (i odd: overwrite)
        step = max(steps) + 1 if i % 2 == 0 else max(steps)
        out = signal_after([*WORKER, device, str(step)], sig, n, opened=device)
        assert "Traceback" not in out.stderr, out.stderr
        if out.returncode != 0:
            interrupted += 1
            assert out.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), out.stderr
        present = set(committed_steps(device))
        assert present - {step} == steps - {step}           # every other step still there
        check_all(device, present)                           # the interrupted step: absent or exact
        resumed = subprocess.run([*WORKER, device, str(step)], env=ENV, capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr
        assert f"loaded {max(present)}" in resumed.stdout
        steps.add(step)
        check_all(device, steps)
    assert interrupted >= len(POINTS) // 2
