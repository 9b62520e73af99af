"""Helpers for the FUSE mount tests: a formatted device file and ``retainz mount``/``umount`` through
the real command (a detached server process), with FUSE required in CI."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def require_fuse() -> None:
    """Skip where FUSE cannot exist (no /dev/fuse, no libfuse 3, no binding); in CI (``CI=true``,
    root with /dev/fuse, ``make setup-mount`` run) a missing piece fails the test instead."""
    from retainz.mount.runner import FuseUnavailableError, load_fuse

    try:
        load_fuse()
    except FuseUnavailableError as e:
        if os.environ.get("CI") in ("true", "1"):
            pytest.fail(f"CI must be able to mount: {e}")
        pytest.skip(str(e))


def env() -> dict:
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def retainz(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the ``retainz`` command (``python -m retainz.cli``)."""
    r = subprocess.run([sys.executable, "-m", "retainz.cli", *args], capture_output=True, text=True,
                       timeout=timeout, env=env())
    if check and r.returncode != 0:
        raise AssertionError(f"retainz {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def make_device(tmp_path, *, zones: int = 48, zone_size: str = "4MiB") -> str:
    """A FileDevice holding an empty store (``retainz device create`` + ``retainz mkfs``)."""
    device = str(tmp_path / "dev.img")
    retainz("device", "create", device, "--zones", str(zones), "--zone-size", zone_size)
    retainz("mkfs", device)
    return device


@contextlib.contextmanager
def mounted(device: str, mnt, *args: str):
    """``retainz mount DEVICE MNT ARGS`` for the duration; ``retainz umount`` after (also after a
    failure)."""
    os.makedirs(mnt, exist_ok=True)
    retainz("mount", device, str(mnt), *args)
    try:
        yield Path(mnt)
    finally:
        from retainz.mount.runner import is_mounted

        if is_mounted(str(mnt)):
            retainz("umount", str(mnt))


def serve_foreground(device: str, mnt, *args: str) -> subprocess.Popen:
    """Start ``retainz mount --foreground`` as a child (the test owns its pid) and wait until mounted."""
    from retainz.mount.runner import is_mounted

    os.makedirs(mnt, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "retainz.cli", "mount", device, str(mnt), "--foreground", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
    deadline = time.monotonic() + 60
    while not is_mounted(str(mnt)):
        if proc.poll() is not None:
            raise AssertionError(f"mount server exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("not mounted after 60 s")
        time.sleep(0.05)
    return proc


def generations(device: str) -> dict:
    """``{generation id: GenerationInfo}`` of the store on a device file (the mount must be gone)."""
    from retainz.jobs import stores

    with stores.using(device, wait=30) as store:
        return {g.id: g for g in store.generations()}


def paths(device: str) -> dict:
    """``{path in the mount: GenerationInfo}``: ids resolved as the mount does (a generation renamed
    while being written carries its path in its layout shard)."""
    from retainz import ids
    from retainz.jobs import stores
    from retainz.namespace import names as layout

    out = {}
    with stores.using(device, wait=30) as store:
        for g in store.generations():
            path = ids.parse_generation_id(g.id)[1]
            if layout.LAYOUT_SHARD in g.shards:
                path = layout.read_layout(b"".join(store.read_shard(g.id, layout.LAYOUT_SHARD)))[0]
            out[path] = g
    return out


def fsck_clean(device: str) -> bool:
    r = retainz("fsck", device, check=False)
    return r.returncode == 0 and "clean" in r.stdout
