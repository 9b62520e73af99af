"""A host process's store on the guest's zoned device: the guest serves its device
(:mod:`retainz.zoned.remote`) over a virtio-serial port, with an ``ivshmem`` shared-memory window for
the data, and the host opens it as ``remote:socket=PATH,window=PATH``.

Why: under TCG, importing torch in the guest takes about a minute and a training update several, so
the real payload (:mod:`retainz.experiments.payload`) runs on the host, at host speed, while every
byte of its checkpoints is written to, and read back from, the guest's NVMe ZNS namespace by the
guest's kernel (``LinuxZonedDevice``: ``O_DIRECT`` writes at the write pointer, zone ioctls).
Measured on this project's 2-core machines (TCG): a virtio-serial port carries about 3 MB/s host to
guest and 20 MB/s guest to host; the shared window and 9p about 45 MB/s, the guest's copy speed.

Host side: :func:`serving` boots a guest that serves its device and yields the device spec to open;
:class:`~retainz.vm.guest.ChannelConfig` gives QEMU's arguments.  Guest side:
``python -m retainz.vm.channel DEVICE`` serves ``DEVICE`` on the port named :data:`PORT_NAME` until
the host sends ``shutdown``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from retainz.vm.guest import PORT_NAME, ChannelConfig

__all__ = ["Serving", "serving", "remove_stale_channels", "CHANNEL_PREFIX", "WINDOW_PREFIX", "IVSHMEM_ID",
           "find_port", "map_window", "serve_device", "block_stat", "main"]

#: PCI vendor and device id of QEMU's ``ivshmem-plain`` (Red Hat, 0x1110).
IVSHMEM_ID = ("0x1af4", "0x1110")

@dataclass
class Serving:
    """A guest serving its device to this host (what :func:`serving` yields).

    Attributes:
        channel: the host's end; ``channel.device_spec()`` opens the served device.
        stats_path: where the guest writes :func:`serve_device`'s result when it stops.
        result: the guest's :class:`~retainz.vm.guest.GuestResult` once it stopped.
        error: what made the guest fail to run, if anything.
    """

    channel: ChannelConfig
    stats_path: Path
    result: object | None = None
    error: BaseException | None = None

    @property
    def spec(self) -> str:
        return self.channel.device_spec()

    def stats(self) -> dict:
        """What the guest served (:func:`serve_device`'s result), ``{}`` if it wrote none."""
        return json.loads(self.stats_path.read_text()) if self.stats_path.exists() else {}


#: Seconds to wait for QEMU to create the channel's socket.
SOCKET_WAIT = 60.0

#: Name prefixes of a channel's socket folder (in the temporary folder) and window file (in
#: ``/dev/shm``); the owning process's pid follows, then ``-`` and a random part.
CHANNEL_PREFIX, WINDOW_PREFIX = "retainz-chan-", "retainz-window-"


def remove_stale_channels(tmp_dir: str, shm_dir: str) -> list[str]:
    """Remove the socket folders and shared-memory windows that a killed process left behind
    (``kill -9`` of ``retainz vm serve`` runs no clean-up; a window is 64 MiB of RAM in ``/dev/shm``):
    those whose owner pid (in the name) is no longer running.  Entries of running processes and
    names without a pid are left alone.  Returns the paths removed."""
    removed = []
    for folder, prefix in ((tmp_dir, CHANNEL_PREFIX), (shm_dir, WINDOW_PREFIX)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
            if not pid.isdigit() or _running(int(pid)):
                continue
            path = os.path.join(folder, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True            # another user's process
    return True


@contextlib.contextmanager
def serving(out_dir: str | os.PathLike, cfg, device: str = "/dev/nvme0n1") -> Iterator[Serving]:
    """Boot a guest (:func:`retainz.vm.guest.run_in_guest` with ``cfg`` plus a channel) that serves
    ``device``, and yield once its server answers.
    On exit ask the server to stop, wait for the guest to power off, remove the socket and window.

    Args:
        out_dir: the guest's output folder (console log, ``served.json``).
        cfg: a :class:`~retainz.vm.guest.GuestConfig`; its ``timeout`` bounds the whole serving.
        device: the guest's zoned device to serve.

    Raises:
        RuntimeError: QEMU did not create the socket within :data:`SOCKET_WAIT` seconds, or the guest
            stopped before its server answered (the message gives QEMU's or the guest's reason).
    """
    import retainz
    from retainz.vm.guest import run_in_guest

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    remove_stale_channels(tempfile.gettempdir(), shm)
    tag = f"{os.getpid()}-"
    sock_dir = tempfile.mkdtemp(prefix=CHANNEL_PREFIX + tag)      # a short path: sockets allow ~107 bytes
    fd, window = tempfile.mkstemp(prefix=WINDOW_PREFIX + tag, dir=shm)
    os.close(fd)
    channel = ChannelConfig(socket=os.path.join(sock_dir, "port.sock"), window=window)
    src = os.path.dirname(os.path.dirname(os.path.abspath(retainz.__file__)))
    cfg = dataclasses.replace(cfg, channel=channel, env={"PYTHONPATH": src, **cfg.env}, cwd=cfg.cwd or os.getcwd())
    handle = Serving(channel=channel, stats_path=out / "served.json")
    handle.stats_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "retainz.vm.channel", device, "--stats", str(handle.stats_path)]

    def boot() -> None:
        try:
            handle.result = run_in_guest(argv, out, cfg, install=False)
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the handle
            handle.error = e

    guest = threading.Thread(target=boot, name="retainz-serving-guest", daemon=True)
    guest.start()
    try:
        deadline = time.monotonic() + SOCKET_WAIT
        while not os.path.exists(channel.socket):
            if not guest.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(_not_serving(device, handle, out, "QEMU created no socket"))
            time.sleep(0.1)
        _probe(channel, cfg.timeout, handle, device, out)
        yield handle
    finally:
        _stop(channel)
        guest.join(timeout=120)
        shutil.rmtree(sock_dir, ignore_errors=True)
        os.unlink(window)


def _probe(channel: ChannelConfig, timeout: float, handle: Serving, device: str, out: Path) -> None:
    """Wait until the guest's server answers a hello (the guest has booted and serves).

    Raises:
        RuntimeError: the guest stopped (or never started) instead; the message says why.
    """
    try:
        _connect(channel, timeout).close()
    except OSError as e:
        for _ in range(50):                       # let the guest's thread record how QEMU ended
            if handle.result is not None or handle.error is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(_not_serving(device, handle, out, str(e))) from None


def _connect(channel: ChannelConfig, timeout: float):
    """A RemoteZonedDevice on the channel, quietly waiting up to ``timeout`` seconds for the hello."""
    from retainz.zoned.remote import RemoteZonedDevice

    with open(channel.window, "r+b") as f:
        window = mmap.mmap(f.fileno(), 0)
    return RemoteZonedDevice.connect_unix(channel.socket, window, timeout=timeout, notice=None,
                                          window_name=channel.window)


def _not_serving(device: str, handle: Serving, out: Path, why: str) -> str:
    state = out / ".retainz-guest"
    qemu = (state / "qemu.stderr").read_text(errors="replace").strip().splitlines() if (
        state / "qemu.stderr").exists() else []
    if handle.error is not None:
        why = str(handle.error)
    elif qemu:
        why = f"QEMU: {qemu[-1]}"
    elif handle.result is not None:
        why = f"the guest stopped (status {handle.result.status})"
    return f"the guest did not start serving {device}: {why} (console log: {state / 'console.log'})"


def _stop(channel: ChannelConfig) -> None:
    """Ask the guest's server to stop (the guest then powers off); a guest that no longer answers is
    left to its timeout."""
    try:
        dev = _connect(channel, 30.0)
    except OSError:
        return
    try:
        dev.shutdown()
    except OSError:
        pass
    finally:
        dev.close()


def find_port(name: str = PORT_NAME) -> str:
    """The guest's ``/dev/vportNpM`` of the virtio-serial port called ``name``.

    Raises:
        FileNotFoundError: no such port (module ``virtio_console`` not loaded, or no port).
    """
    root = Path("/sys/class/virtio-ports")
    for d in sorted(root.glob("*")) if root.exists() else []:
        if (d / "name").read_text().strip() == name:
            return f"/dev/{d.name}"
    raise FileNotFoundError(f"no virtio-serial port named {name!r} in {root}")


def map_window() -> mmap.mmap:
    """Map the ``ivshmem`` window: BAR 2 of the PCI device :data:`IVSHMEM_ID`, through sysfs.

    Raises:
        FileNotFoundError: no ivshmem device.
    """
    for d in sorted(Path("/sys/bus/pci/devices").glob("*")):
        if ((d / "vendor").read_text().strip(), (d / "device").read_text().strip()) == IVSHMEM_ID:
            fd = os.open(d / "resource2", os.O_RDWR)
            try:
                return mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
    raise FileNotFoundError("no ivshmem PCI device (vendor 0x1af4, device 0x1110)")


def serve_device(path: str, *, port: str | None = None) -> dict:
    """Serve the zoned device ``path`` over the port and window until the host asks to stop.

    Connections come one after the other (the capture, then its fresh resume process): when the host
    closes one, the port reads end-of-file until the next connects.

    Returns:
        ``{"device", "connections", "device_bytes_written", "device_bytes_read"}``: the bytes are the
        kernel's count for the device (``/sys/block/NAME/stat`` sectors written and read, 512-byte
        units) over the serving, so they include nothing that did not reach the device.
    """
    from retainz.zoned import open_device
    from retainz.zoned.remote import FdStream, serve

    port = port or find_port()
    window = map_window()
    device = open_device(path)
    fd = os.open(port, os.O_RDWR)
    before = block_stat(path)
    print(f"retainz channel: serving {path} ({device.geometry.nr_zones} zones) on {port}, "
          f"window {len(window)} bytes", flush=True)
    served = 0
    try:
        while True:
            first = _wait_for_data(fd)
            served += 1
            if serve(device, _Prefixed(first, FdStream(fd)), window):
                break
    finally:
        os.close(fd)
        device.close()
        window.close()
    after = block_stat(path)
    return {"device": path, "connections": served,
            "device_bytes_written": (after[1] - before[1]) * 512, "device_bytes_read": (after[0] - before[0]) * 512}


def block_stat(path: str) -> tuple[int, int]:
    """``(sectors read, sectors written)`` of a block device: fields 3 and 7 of
    ``/sys/block/NAME/stat`` (Documentation/block/stat.rst), in 512-byte units whatever the block size."""
    fields = Path(f"/sys/block/{os.path.basename(os.path.realpath(path))}/stat").read_text().split()
    return int(fields[2]), int(fields[6])


def _wait_for_data(fd: int) -> bytes:
    """The first byte of the next connection (the port reads end-of-file while no host is connected)."""
    while True:
        b = os.read(fd, 1)
        if b:
            return b
        time.sleep(0.05)


class _Prefixed:
    """A stream whose first bytes were already read."""

    def __init__(self, head: bytes, stream):
        self.head, self.stream = head, stream

    def send(self, data) -> None:
        self.stream.send(data)

    def recv_exact(self, n: int) -> bytes:
        if not self.head:
            return self.stream.recv_exact(n)
        take, self.head = self.head[:n], self.head[n:]
        return take + (self.stream.recv_exact(n - len(take)) if n > len(take) else b"")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retainz.vm.channel",
                                 description="(in the guest) serve a zoned device to the host")
    ap.add_argument("device", help="the zoned block device, e.g. /dev/nvme0n1")
    ap.add_argument("--stats", help="write what was served (serve_device's result) to this JSON file")
    args = ap.parse_args(argv)
    stats = serve_device(args.device)
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1) + "\n")
    print(f"retainz channel: stopped after {stats['connections']} connection(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
