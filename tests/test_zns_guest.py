"""The QEMU ZNS guest lane: the device conformance suite against real Linux zoned block devices.

One guest is booted for the whole session (``zns_guest_run``): it has an emulated NVMe ZNS namespace
(``/dev/nvme0n1``) and a null_blk zoned device (``/dev/nullb0``), runs pytest on :data:`GUEST_TEST_FILES`
with ``RETAINZ_TEST_ZBD`` naming both devices (``-k linux`` keeps only the real-device parameters), and
writes junit XML into the shared output folder ``out/zns_guest/``.  The tests here assert on that XML, so
a failure inside the guest shows up by name.  The console log stays in ``out/zns_guest/.retainz-guest/``.

Run with ``pytest -m zns_guest`` (``make test`` does).  Where QEMU cannot be had (no root, no package
registry) the lane skips locally with the reason, and fails under ``CI=true``.
"""

from __future__ import annotations

import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.zns_guest

ROOT = Path(__file__).resolve().parent.parent
#: Test files run inside the guest.  Add the store's crash and recovery tests here once they use
#: ``any_device`` (they then run against the real devices too).
GUEST_TEST_FILES = ["tests/test_device_conformance.py"]
OUT = ROOT / "out" / "zns_guest"
JUNIT = OUT / "junit.xml"
#: Seconds before a hung guest is killed (the lane's budget is 5 minutes in all).
GUEST_TIMEOUT = float(os.environ.get("RETAINZ_GUEST_TIMEOUT", "240"))
DEVICES = {"nvme": "/dev/nvme0n1", "nullblk": "/dev/nullb0"}


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"the QEMU ZNS guest lane cannot run on this CI machine: {reason}", pytrace=False)
    pytest.skip(f"QEMU ZNS guest lane unavailable: {reason}")


@pytest.fixture(scope="session")
def zns_guest_run():
    """Boot the guest once; returns ``(GuestResult, parsed junit testcases)``."""
    from retainz.vm.guest import GuestConfig, NullBlkConfig, ZNSConfig, run_in_guest
    from retainz.vm.setup import VMSetupError, ensure_all

    try:
        ensure_all(install=True)
    except VMSetupError as e:
        _unavailable(str(e))
    OUT.mkdir(parents=True, exist_ok=True)
    JUNIT.unlink(missing_ok=True)
    files = [f for f in GUEST_TEST_FILES if (ROOT / f).exists()]
    cfg = GuestConfig(zns=ZNSConfig(), nullblk=NullBlkConfig(), timeout=GUEST_TIMEOUT, cwd=str(ROOT),
                      env={"RETAINZ_TEST_ZBD": ",".join(DEVICES.values())})
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--tb=short",
           "-k", "linux", f"--junitxml={JUNIT}", *files]
    t0 = time.monotonic()
    result = run_in_guest(cmd, OUT, cfg)
    print(f"\nzns_guest: guest ran {len(files)} file(s) in {time.monotonic() - t0:.1f} s, exit status "
          f"{result.status}; console log {result.console_log}")
    return result, _parse_junit(JUNIT)


def _parse_junit(path: Path) -> list[dict]:
    if not path.exists():
        return []
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        message = ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "") + "\n" + (el.text or "")
                break
        cases.append({"name": f"{tc.get('classname')}::{tc.get('name')}", "outcome": outcome,
                      "message": message.strip()})
    return cases


def test_guest_ran_the_suite_and_exited_zero(zns_guest_run):
    result, cases = zns_guest_run
    assert not result.timed_out, (f"the guest hung and was killed after {GUEST_TIMEOUT:.0f} s; log:\n"
                                  f"{result.console_tail()}")
    assert cases, f"no junit results (guest exit {result.status}); console:\n{result.console_tail()}"
    bad = [c for c in cases if c["outcome"] in ("failed", "error")]
    assert not bad, "failed inside the guest:\n" + "\n\n".join(f"{c['name']}\n{c['message'][:1500]}"
                                                                for c in bad)
    assert result.status == 0, f"guest pytest exited {result.status}; console:\n{result.console_tail()}"


@pytest.mark.parametrize("kind", sorted(DEVICES))
def test_conformance_passes_on_real_device(zns_guest_run, kind):
    _, cases = zns_guest_run
    dev = DEVICES[kind]
    mine = [c for c in cases if f"linux:{dev}" in c["name"]]
    passed = [c for c in mine if c["outcome"] == "passed"]
    failed = [c["name"] for c in mine if c["outcome"] in ("failed", "error")]
    assert not failed, f"{dev}: {len(failed)} failed: {failed}"
    assert len(passed) >= 20, f"{dev}: only {len(passed)} conformance tests passed (of {len(mine)})"
    # the limit tests must have run, not skipped (the guest geometry has 0 < max_open < max_active)
    limit_tests = [c for c in mine if "limit" in c["name"]]
    assert limit_tests and all(c["outcome"] == "passed" for c in limit_tests), limit_tests
