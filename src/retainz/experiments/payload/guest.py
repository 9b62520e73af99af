"""The real payload through a real zoned block device: ``retainz payload capture`` with its
checkpoints on the NVMe ZNS namespace of a QEMU guest, recorded as a payload run record.

The guest serves its namespace ``/dev/nvme0n1`` (``LinuxZonedDevice``: the kernel's zone ioctls,
``O_DIRECT`` writes at the write pointer, mq-deadline) over a virtio-serial port and a shared-memory
window (:mod:`retainz.vm.channel`); on the host, the capture trains, saves the checkpoint (model,
AdamW state, RNG state, step) through :class:`~retainz.integrations.dcp.ZonedStorageWriter` onto
``remote:socket=...`` (the blank namespace is formatted by the writer, :func:`retainz.jobs.stores.open_store`), a
fresh host process mounts the store from the namespace again, restores it, and the resumed update is
compared bit for bit with the uninterrupted one.  torch runs on the host because under TCG importing
it takes about a minute in the guest and an update several; every checkpoint byte still goes to the
guest's device and comes back from it.

A payload run record (``<out_dir>/record.json``, schema :data:`SCHEMA`)::

    schema        "retainz.payload/1"
    device        "guest"
    retention     the retention rule of the saves
    bit_identical true | false
    config        the PayloadConfig of the capture
    result        the capture's result.json (losses, tensors and bytes compared, timings)
    namespace     the guest namespace's geometry
    guest         {status, seconds, timed_out, device, channel, connections, device_bytes_written,
                  device_bytes_read}: the serving guest; the bytes are the guest kernel's count for
                  the namespace (/sys/block/nvme0n1/stat) while it served
    provenance    as run records (retainz.experiments.record.provenance)
    digest        sha256 of the canonical JSON of every other field

This module does not import torch: the capture runs in a child process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from retainz.runrecord import digest

__all__ = ["SCHEMA", "PAYLOAD_NAMESPACE", "GUEST_DEVICE", "capture_in_guest"]

SCHEMA = "retainz.payload/1"
#: The guest's zoned device the checkpoints go to.
GUEST_DEVICE = "/dev/nvme0n1"
#: The guest namespace (bytes): 32 zones of 64 MiB hold the format, two 2-layer checkpoints (~530 MB
#: each, model + AdamW) and slack.  A 30-layer run needs ``zones`` raised.
PAYLOAD_NAMESPACE = {"zones": 32, "zone_size": 64 << 20, "zone_capacity": 64 << 20, "max_open": 14,
                     "max_active": 14}


def capture_in_guest(retention: str, out_dir: str | os.PathLike, *, layers: int = 2, steps: int = 2,
                     cache: str = "cache/payload", memory_mb: int = 512, timeout: float = 1800.0,
                     zones: int | None = None) -> dict:
    """Boot a guest serving its namespace, run the payload capture on it, return the payload run record.

    Writes ``<out_dir>/record.json`` (the record) and leaves the capture's ``result.json``,
    ``layout.json`` and ``capture.log`` under ``<out_dir>/capture``.

    Args:
        retention: the retention rule the checkpoints are saved under (e.g.
            ``megatron:save_interval=1,retain_interval=2``).
        timeout: seconds for the whole run (the guest is killed then).
        zones: namespace zones (default :data:`PAYLOAD_NAMESPACE`).

    Raises:
        RuntimeError: the guest tooling is missing, the guest did not start serving, the capture did not
            finish within ``timeout``, or it left no result (one line: the capture's own error, and
            where its log is).
    """
    from retainz.experiments.record import provenance
    from retainz.vm.channel import serving
    from retainz.vm.guest import GuestConfig, ZNSConfig
    from retainz.vm.setup import VMSetupError, ensure_all

    out = Path(out_dir).resolve()
    cap = out / "capture"
    cap.mkdir(parents=True, exist_ok=True)
    (cap / "result.json").unlink(missing_ok=True)
    _tokenize_on_host(cache)
    try:
        ensure_all(install=False)
    except VMSetupError as e:
        raise RuntimeError(f"the QEMU guest is unavailable: {e} (run `retainz vm setup`)") from None
    ns = dict(PAYLOAD_NAMESPACE, **({"zones": zones} if zones else {}))
    cfg = GuestConfig(zns=ZNSConfig(**ns), nullblk=None, memory_mb=memory_mb, timeout=timeout,
                      scheduler="mq-deadline")
    t0 = time.monotonic()
    with serving(out, cfg, GUEST_DEVICE) as guest:
        argv = [sys.executable, "-m", "retainz.cli", "payload", "capture", "--layers", str(layers), "--steps",
                str(steps), "--cache", os.path.abspath(cache), "--retention", retention,
                "--device", guest.spec, "--out", str(cap)]
        with open(cap / "capture.log", "w") as log:
            try:
                capture_status = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                                                timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the payload capture did not finish within {timeout:g} s; its log: "
                                   f"{cap / 'capture.log'}") from None
    if guest.error is not None:
        raise RuntimeError(f"the payload guest failed: {guest.error}")
    res = guest.result
    if not (cap / "result.json").exists():
        raise RuntimeError(f"the payload capture failed (exit {capture_status}): "
                           f"{_cause(cap / 'capture.log')}; its log: {cap / 'capture.log'}")
    result = json.loads((cap / "result.json").read_text())
    device_io = guest.stats()
    rec = {"schema": SCHEMA, "device": "guest", "retention": retention, "bit_identical": bool(result["identical"]),
           "config": result["config"], "result": result, "namespace": ns,
           "guest": {"status": res.status if res else None, "timed_out": res.timed_out if res else True,
                     "seconds": round(time.monotonic() - t0, 1), "device": GUEST_DEVICE,
                     "channel": "virtio-serial port + ivshmem window (retainz.vm.channel)",
                     "connections": device_io.get("connections"),
                     "device_bytes_written": device_io.get("device_bytes_written"),
                     "device_bytes_read": device_io.get("device_bytes_read")},
           "provenance": provenance()}
    rec["digest"] = digest(rec)
    (out / "record.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


def _cause(log: Path) -> str:
    """The capture's own error line from its log (``retainz: error: ...`` or the last ``...Error: ...``
    of a traceback, the innermost cause being last), else its last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("retainz: error: "):
            return ln[len("retainz: error: "):]
    causes = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    return causes[0] if causes else (lines[-1] if lines else "no output")


def _tokenize_on_host(cache: str) -> None:
    """Tokenize the corpus into the cache before booting: the guest sees the host's root read-only, so
    the capture there could not write its token cache.  Runs in a child process (this one stays free of
    torch).

    Raises:
        RuntimeError: tokenizing failed (the child's error output is in the message).
    """
    import subprocess

    code = ("import sys; from retainz.experiments.payload.train import PayloadConfig, load_tokens; "
            "load_tokens(PayloadConfig(cache=sys.argv[1]))")
    r = subprocess.run([sys.executable, "-c", code, os.path.abspath(cache)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tokenizing the payload corpus in {cache} failed:\n{r.stderr[-2000:]}")


