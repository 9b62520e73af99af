"""The real payload through a real zoned block device: ``retainz payload capture`` run inside the QEMU
guest of :mod:`retainz.vm.guest` with ``--device /dev/nvme0n1``, recorded as a payload run record.

The guest's namespace is blank, so the capture formats it (``integrations._stores``); the checkpoint
(model, AdamW state, RNG state, step) goes through :class:`~retainz.integrations.dcp.ZonedStorageWriter`
onto the namespace via LinuxZonedDevice, a fresh process in the same guest restores it and the resumed
update is compared bit for bit with the uninterrupted one.

A payload run record (``<out_dir>/record.json``, schema :data:`SCHEMA`)::

    schema        "retainz.payload/1"
    device        "guest"
    retention     the retention rule of the saves
    bit_identical true | false
    config        the PayloadConfig of the capture
    result        the capture's result.json (losses, tensors and bytes compared, timings)
    namespace     the guest namespace's geometry
    guest         {status, seconds, timed_out}
    provenance    as run records (retainz.experiments.record.provenance)
    digest        sha256 of the canonical JSON of every other field

This module does not import torch: the capture runs in the guest's own process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["SCHEMA", "PAYLOAD_NAMESPACE", "capture_in_guest"]

SCHEMA = "retainz.payload/1"
#: The guest namespace (bytes): 32 zones of 64 MiB hold the format, two 2-layer checkpoints (~530 MB
#: each, model + AdamW) and slack.  A 30-layer run needs ``zones`` raised.
PAYLOAD_NAMESPACE = {"zones": 32, "zone_size": 64 << 20, "zone_capacity": 64 << 20, "max_open": 14,
                     "max_active": 14}


def capture_in_guest(retention: str, out_dir: str | os.PathLike, *, layers: int = 2, steps: int = 2,
                     cache: str = "cache/payload", memory_mb: int = 3072, timeout: float = 1800.0,
                     zones: int | None = None) -> dict:
    """Boot a guest, run the payload capture on ``/dev/nvme0n1``, return the payload run record.

    Writes ``<out_dir>/record.json`` (the record) and leaves the capture's ``result.json`` and
    ``layout.json`` under ``<out_dir>/capture``.

    Raises:
        RuntimeError: the guest tooling is missing, or the capture left no result (the message carries
            the guest console's tail).
    """
    import retainz
    from retainz.experiments.record import provenance
    from retainz.vm.guest import GuestConfig, ZNSConfig, run_in_guest
    from retainz.vm.setup import VMSetupError

    out = Path(out_dir).resolve()
    cap = out / "capture"
    cap.mkdir(parents=True, exist_ok=True)
    (cap / "result.json").unlink(missing_ok=True)
    _tokenize_on_host(cache)
    ns = dict(PAYLOAD_NAMESPACE, **({"zones": zones} if zones else {}))
    src = os.path.dirname(os.path.dirname(os.path.abspath(retainz.__file__)))
    cfg = GuestConfig(zns=ZNSConfig(**ns), nullblk=None, memory_mb=memory_mb, timeout=timeout,
                      scheduler="mq-deadline", env={"PYTHONPATH": src}, cwd=os.getcwd())
    argv = [sys.executable, "-m", "retainz.cli", "payload", "capture", "--layers", str(layers), "--steps",
            str(steps), "--cache", os.path.abspath(cache), "--retention", retention, "--device", "/dev/nvme0n1",
            "--out", str(cap)]
    try:
        res = run_in_guest(argv, out, cfg, install=False)
    except VMSetupError as e:
        raise RuntimeError(f"the QEMU guest is unavailable: {e} (run `retainz vm setup`)") from None
    if not (cap / "result.json").exists():
        raise RuntimeError(f"the payload capture in the guest left no result (exit {res.status}):\n"
                           f"{res.console_tail()}")
    result = json.loads((cap / "result.json").read_text())
    rec = {"schema": SCHEMA, "device": "guest", "retention": retention, "bit_identical": bool(result["identical"]),
           "config": result["config"], "result": result, "namespace": ns,
           "guest": {"status": res.status, "seconds": round(res.seconds, 1), "timed_out": res.timed_out},
           "provenance": provenance()}
    rec["digest"] = _digest(rec)
    (out / "record.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


def _tokenize_on_host(cache: str) -> None:
    """Tokenize the corpus into the cache before booting: the guest sees the host's root read-only, so
    the capture there could not write its token cache.  Runs in a child process (this one stays free of
    torch).

    Raises:
        RuntimeError: tokenizing failed (the child's error output is in the message).
    """
    import subprocess

    code = ("import sys; from retainz.integrations.payload.train import PayloadConfig, load_tokens; "
            "load_tokens(PayloadConfig(cache=sys.argv[1]))")
    r = subprocess.run([sys.executable, "-c", code, os.path.abspath(cache)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tokenizing the payload corpus in {cache} failed:\n{r.stderr[-2000:]}")


def _digest(rec: dict) -> str:
    import hashlib

    from retainz.experiments.manifest import canonical_json

    return hashlib.sha256(canonical_json({k: v for k, v in rec.items() if k != "digest"}).encode()).hexdigest()
