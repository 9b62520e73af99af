"""Mounting and unmounting: the FUSE binding, the serving process, ``umount``.

The binding is **mfusepy** (``pip install 'retainz[mount]'``), the maintained successor of fusepy:
pure-Python ctypes bindings for the high-level, path-based libfuse 3 API.  It needs no compiler and
no libfuse headers (pyfuse3 builds a Cython extension against ``libfuse3-dev`` and drives everything
through trio's async API, around the low-level inode API), and the path-based API is what the mount's
path -> generation mapping (:mod:`retainz.namespace.names`) wants.  libfuse 3 itself and ``fusermount3``
come from the Debian package ``fuse3`` (``tools/fuse-setup.sh``, run by ``make setup-mount``).

``retainz mount`` serves in the foreground with ``--foreground``; otherwise it starts the serving
process detached (its log: ``DEVICE.mount.log``) and returns once the mount point is mounted, or
fails with the server's error.

A device another process holds (a mount, a ``retainz put``, a training job) is refused at once
(:class:`DeviceHeldError`, within :data:`HELD_WAIT` seconds): the mount never waits on the lock,
so a server whose caller gave up can never mount itself later.  A device a node service holds
(``retainz serve``) is mounted as that service's client.  A foreground server stopped by
SIGINT or SIGTERM unmounts (the ``destroy`` of :class:`~retainz.mount.fs.MountedStore` runs) and
returns normally.

**The mount is a node service too.**  A mount that holds its device serves the device's socket
(:func:`retainz.node.socket_path`) with :class:`retainz.node.Service` over its own store, with the
same access rules and socket mode as ``retainz serve``: the store commands, ``ZonedStorageWriter``
and ``retainz://`` of other processes use the mounted device through it, while the mount's own
bytes stay in this process.  After a client's commit or delete the mount's namespace is refreshed
before the client's reply, so a save committed from another process is under the mount point
by the time its commit returns.  The socket is removed at unmount.

**Unmount.**  The server holds a ``flock`` on the mount point's own directory (the one under the
mount) from before it mounts until its store and device are closed; ``retainz umount`` waits for
that lock, so it returns once this server is done, whether it held the device or was a client of a
``retainz serve`` that keeps holding it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from retainz.errors import RetainZError
from retainz.zoned.file import not_a_device_file

__all__ = ["FuseUnavailableError", "DeviceHeldError", "load_fuse", "serve", "mount", "umount", "is_mounted",
           "mounted_at", "held_message", "lock_holders", "FSTYPE", "HELD_WAIT"]

#: ``/proc/mounts`` type of a RetainZ mount (``fuse.`` + the subtype).
FSTYPE = "fuse.retainz"
#: Seconds a mount waits for a device another process holds before refusing it (a previous
#: mount's server still closing; ``retainz umount`` returns only once the lock is free).
HELD_WAIT = 1.0


class FuseUnavailableError(RetainZError):
    """FUSE cannot be used here: no binding, no libfuse 3, or no ``/dev/fuse``."""


#: libfuse's multi-threaded loop's default thread cap (FUSE_LOOP_MT_DEF_MAX_THREADS, lib/fuse_loop_mt.c),
#: given as the mount's ``max_idle_threads`` (see :func:`serve`).
FUSE_MAX_THREADS = 10


class DeviceHeldError(RetainZError):
    """The device is held by another process (a mount, a store command, a training job)."""


def mounted_at(device: str) -> list[str]:
    """Mount points of RetainZ mounts serving ``device`` (``/proc/self/mounts``; the source is
    ``retainz:`` + the device's real path)."""
    want = "retainz:" + os.path.realpath(device)
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == FSTYPE and _unescape(parts[0]) == want:
                out.append(_unescape(parts[1]))
    return out


def lock_holders(device: str) -> list[int]:
    """Pids of the processes holding a ``flock`` on the device file (``/proc/locks``, matched by the
    file's device and inode); ``[]`` when none or unknown (not Linux, no such file)."""
    try:
        st = os.stat(device)
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    with contextlib.suppress(OSError), open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if "->" in parts:
                continue                  # a waiter, not a holder
            if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want and parts[4].isdigit():
                pids.append(int(parts[4]))
    return sorted(set(pids))


def _command_of(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        words = f.read().split(b"\0")
        text = " ".join(w.decode(errors="replace") for w in words if w)
        return text[:120]
    return ""


def held_message(device: str) -> str:
    """One line saying who holds ``device``: the RetainZ mount(s) serving it and where (with the
    holder's pid), a node service (``retainz serve``, its pid and socket), or the pid and command
    holding its lock (docs/mount.md, docs/node.md)."""
    from retainz.node import socket_path

    where = mounted_at(device)
    pids = lock_holders(device)
    pid_text = f"pid {', '.join(map(str, pids))}" if pids else "pid unknown"
    sock = socket_path(device)
    served = any("serve" in _command_of(p).split() for p in pids) and os.path.exists(sock)
    if where and not served and os.path.exists(sock):
        who = f"it is mounted at {', '.join(where)} (retainz mount, {pid_text}), which serves the store " \
              f"commands and other processes on {sock}: this needs the device itself; " \
              f"`retainz umount {where[0]}` first"
    elif where and not served:
        who = f"it is mounted at {', '.join(where)} (retainz mount, {pid_text}): use the files there, or " \
              f"`retainz umount {where[0]}` first"
    elif served:
        who = f"a node service holds it (retainz serve, {pid_text}, socket {sock})" + \
              (f" and it is mounted through it at {', '.join(where)}" if where else "") + \
              ": this needs the device itself; stop the service first (SIGTERM)"
    elif pids:
        who = f"the store is open in another process ({pid_text}: {_command_of(pids[0]) or 'gone'})"
    else:
        who = "another process has it open (a mount still closing, a retainz command or a training job)"
    return f"{device}: the device is in use: {who}"


def _held_message(device: str) -> str:
    return held_message(device)


def _check_formatted(device: str) -> None:
    """Refuse a device that holds no store (labelled by ``retainz device create`` but never formatted)
    here, in one line, rather than in the server's log.  A device a node service holds is that
    service's to judge (its shared lock cannot be taken; the mount becomes its client).

    Raises:
        ForeignDeviceError: no superblock in the device's first zones (the message says to run
            ``retainz mkfs``).
    """
    from retainz.errors import DeviceBusyError
    from retainz.store.journal import no_store_error
    from retainz.store.store import superblock_zones
    from retainz.zoned import FileDevice

    try:
        dev = FileDevice(device, readonly=True)
    except DeviceBusyError:
        return
    with dev:
        if not superblock_zones(dev):
            raise no_store_error(device)


def _check_free(device: str) -> None:
    """Refuse a device whose lock another process holds (nothing is changed), unless a node service
    holds it and no mount serves it yet: the mount then becomes that service's client.

    Raises:
        DeviceHeldError: the lock is held by a mount (a second mount of one device), or by a process
            that serves no socket (the message says which).
    """
    fd = os.open(device, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        where = mounted_at(device)
        answers = _service_answers(device)
        if where and answers:
            raise DeviceHeldError(f"{device}: the device is in use: it is already mounted at {', '.join(where)} "
                                  f"(one mount per device): use the files there, or `retainz umount {where[0]}` "
                                  "first") from None
        if not answers:
            raise DeviceHeldError(_held_message(device)) from None
    finally:
        os.close(fd)


def _service_answers(device: str) -> bool:
    """Whether a node service listens at ``device``'s socket (:func:`retainz.node.socket_path`): a
    connection is accepted (a killed service's stale socket refuses it)."""
    import socket

    from retainz.node import served

    path = served(device)
    if path is None:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(HELD_WAIT)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def load_fuse():
    """Import the FUSE binding (mfusepy), checking what it needs.

    Raises:
        FuseUnavailableError: the ``mount`` extra is not installed, libfuse 3 is missing, or
            ``/dev/fuse`` does not exist (the message says which and how to fix it).
    """
    if not os.path.exists("/dev/fuse"):
        raise FuseUnavailableError("FUSE is unavailable: /dev/fuse does not exist (load the fuse kernel module, "
                                   "or run the container with --device /dev/fuse)")
    try:
        import mfusepy
    except ImportError:
        raise FuseUnavailableError("FUSE is unavailable: the Python binding mfusepy is not installed "
                                   "(pip install 'retainz[mount]', or make setup-mount)") from None
    except OSError as e:
        raise FuseUnavailableError(f"FUSE is unavailable: libfuse 3 was not found ({e}); install the Debian "
                                   "package fuse3 (make setup-mount)") from None
    return mfusepy


def is_mounted(mountpoint: str) -> bool:
    """True if ``mountpoint`` is a RetainZ FUSE mount (``/proc/self/mounts``), live or stale."""
    target = os.path.realpath(mountpoint)
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and _unescape(parts[1]) == target and parts[2] == FSTYPE:
                return True
    return False


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _check_device_file(device: str) -> None:
    """Refuse what cannot be a mount's device: a missing path, a directory, anything but a regular file.

    Raises:
        FileNotFoundError, IsADirectoryError, ValueError: one line saying what ``device`` is (exit 2)."""
    if os.path.isdir(device):
        raise not_a_device_file(device)
    if os.path.exists(device) and not os.path.isfile(device):
        raise ValueError(f"{device}: not a regular file; a mount's device is a device file (`retainz device create`)")
    if not os.path.isfile(device):
        raise FileNotFoundError(f"{device}: no such device file (create one with `retainz device create` "
                                "and `retainz mkfs`)")


def _check_mountpoint(mountpoint: str) -> None:
    if is_mounted(mountpoint):
        raise FileExistsError(f"{mountpoint}: already a RetainZ mount (retainz umount {mountpoint} first)")
    if os.path.lexists(mountpoint) and not os.path.isdir(mountpoint):
        raise NotADirectoryError(f"{mountpoint}: not a directory (the mount point must be one)")
    if not os.path.isdir(mountpoint):
        raise FileNotFoundError(f"{mountpoint}: no such directory (the mount point must exist)")


def serve(device: str, mountpoint: str, *, retention: str | None = None, wait: float = HELD_WAIT,
          debug: bool = False, access: dict | None = None, promote: dict | None = None) -> None:
    """Open the store on ``device`` and serve it at ``mountpoint`` until unmounted (foreground).

    A mount that holds the device also serves the device's socket to other processes (a
    :class:`retainz.node.Service` over the same store, its namespace refreshed after each client's
    commit or delete); on a device a ``retainz serve`` holds, the mount is that service's client.

    Returns normally when the mount ends by ``retainz umount`` or by SIGINT/SIGTERM of this process
    (libfuse's handlers end the loop; the mount's ``destroy`` commits what is complete, then the
    mount point is unmounted); the socket is removed, the store and the device are closed, and only
    then is the mount point's lock released (what ``retainz umount`` waits for).

    Args:
        device: a FileDevice file holding a RetainZ store (``retainz mkfs``).
        mountpoint: an existing directory.
        retention: ``None``, a rule string, or ``"auto"`` (:class:`~retainz.mount.fs.MountedStore`).
        wait: seconds to wait for a device another process (a previous mount) still holds.
        access: the socket's access rules, as ``retainz serve`` takes them: ``{"mode": 0o600,
            "group": None, "allow_all": False, "grants": {job: frozenset(series)}}`` (each key
            optional; ``None``: the defaults, owner only).
        promote: ``{"url": URL, "policy": SPEC | None, "bandwidth": BYTES_PER_S | None}``: promote what
            the mount commits there, keep the runtime's deletions until durable, read a shard whose
            local copy fails from the durable copy (:class:`~retainz.jobs.tiering.NamespaceTier`).

    Raises:
        FuseUnavailableError, FileNotFoundError, ForeignDeviceError.
        DeviceHeldError: another process holds the device (after ``wait`` seconds).
        DeviceBusyError: a live service already listens at the device's socket.
        FileExistsError: the socket path exists and is not a socket.
        RuntimeError: libfuse failed before serving (its status).
    """
    fuse = load_fuse()
    from retainz.jobs import stores
    from retainz.mount.fs import MountedStore

    _check_device_file(device)
    _check_mountpoint(mountpoint)
    if retention not in (None, "auto"):
        from retainz.retention import parse_rule

        parse_rule(retention)       # a malformed or unknown rule (RULES lists the known ones) is bad input, before mounting
    # libfuse's fuse_main changes the working directory to "/" (fuse_daemonize, also in the foreground):
    # a relative path used after it names another file (issue 44: the read-ahead thread never found a
    # relative mount point, so the mount read in the kernel's 128 KiB requests, at half speed)
    device, mountpoint = os.path.abspath(device), os.path.abspath(mountpoint)
    log = logging.getLogger("retainz.mount")
    with contextlib.ExitStack() as held:
        held.enter_context(_serving_lock(mountpoint))       # released last: after the device is closed
        try:
            # through a node service the mount shows the whole device (its own user's right), or $RETAINZ_JOB's
            # (serve=False: _sharing serves it, with the mount's access rules and view refresh)
            store = held.enter_context(stores.using(device, wait=wait, job=os.environ.get("RETAINZ_JOB", "*"),
                                                    serve=False))
        except TimeoutError:
            raise DeviceHeldError(_held_message(device)) from None
        tier = None
        if promote is not None:
            from retainz.jobs.tiering import NamespaceTier

            tier = NamespaceTier.shared(store, promote["url"], device, policy=promote.get("policy"),
                                        bandwidth=promote.get("bandwidth"))
            held.callback(tier.close)                       # before the store closes
        ops = MountedStore(store, retention=retention, caller=_caller(fuse), tier=tier)
        if ops.retired_at_mount:
            log.info("retired %d older versions at mount", len(ops.retired_at_mount))
        held.enter_context(_sharing(store, device, ops, access or {}))
        threading.Thread(target=_raise_read_ahead, args=(mountpoint,), daemon=True,
                         name="retainz-read-ahead").start()
        # libfuse installs its own SIGINT/SIGTERM/SIGHUP handlers (they end the loop, unmount and call
        # destroy) only where a signal still has its default action: give it back for the serving loop,
        # whatever handler the caller (the retainz command's interrupt rule) had installed.
        previous = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        # max_idle_threads: mfusepy calls libfuse's fuse_main_real of the 3.0 ABI, whose loop converts a
        # v1 loop config (fuse_loop_cfg_convert, lib/fuse_loop_mt.c); left unset, its max_idle_threads is
        # UINT_MAX, refused with "Ignoring invalid max threads value 4294967295 > max (100000)" on every
        # mount (libfuse issue #1003).  The pool keeps libfuse's default of at most 10 threads
        # (FUSE_LOOP_MT_DEF_MAX_THREADS), so 10 idle threads is the same pool, said validly.
        try:
            _binding(fuse)(ops, mountpoint, foreground=True, nothreads=False, debug=debug,
                           fsname=f"retainz:{os.path.realpath(device)}", subtype="retainz", hard_remove=True,
                           max_idle_threads=FUSE_MAX_THREADS)
        except RuntimeError as e:
            # libfuse's fuse_main returns non-zero when a signal (SIGINT, SIGTERM, SIGHUP) ended its
            # loop, after unmounting and calling destroy: that is a clean stop, not a failure
            if not ops.destroyed:
                raise RuntimeError(f"libfuse failed with status {e} (see the lines above)") from None
            log.info("stopped by a signal: unmounted %s", mountpoint)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if ops.inference is not None:
                log.info("retention inferred: %s", ops.inferred())


@contextlib.contextmanager
def _serving_lock(mountpoint: str):
    """Hold a shared ``flock`` on the mount point's own directory (opened before the mount covers it)
    while the server runs; :func:`umount` waits until it can take it exclusively."""
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as e:      # a file system without flock: umount then waits for the device's lock
            logging.getLogger("retainz.mount").info("%s: no flock on the mount point (%s)", mountpoint, e)
        yield
    finally:
        os.close(fd)


#: Seconds between two refreshes of the view of a mount that is the client of a ``retainz serve``
#: (it is not told of the other clients' commits; one ``list`` request each time).
CLIENT_REFRESH = 1.0


@contextlib.contextmanager
def _sharing(store, device: str, ops, access: dict):
    """Share the device with other processes while the mount runs.

    When this process holds the device (``store`` is a :class:`~retainz.store.Store`), serve it on
    ``device``'s socket; a client's commit or delete refreshes the mount's namespace before its reply.
    At exit the service ends every connection (aborting what its clients left open) and removes the
    socket; the store stays open for its opener to close.  When ``store`` is served by another process
    (a ``retainz serve``), refresh the namespace every :data:`CLIENT_REFRESH` seconds instead."""
    from retainz.node import Service, socket_path
    from retainz.store import Store

    def refresh() -> None:
        if not ops.destroyed:
            ops.ns.refresh()

    if not isinstance(store, Store):
        stop = threading.Event()

        def poll() -> None:
            said = None
            while not stop.wait(CLIENT_REFRESH):
                try:
                    refresh()
                except Exception as e:  # noqa: BLE001 - the service went away: the mount's calls say so
                    if str(e) != said:
                        logging.getLogger("retainz.mount").warning("refresh from the node service failed: %s", e)
                    said = str(e)
        thread = threading.Thread(target=poll, name="retainz-refresh", daemon=True)
        thread.start()
        try:
            yield None
        finally:
            stop.set()
            thread.join(timeout=30)
        return

    svc = Service(store, socket_path(device), mode=access.get("mode", 0o600), group=access.get("group"),
                  allow_all=access.get("allow_all", False), grants=access.get("grants"), on_change=refresh,
                  own_store=False)
    thread = threading.Thread(target=svc.serve_forever, name="retainz-node-service", daemon=True)
    thread.start()
    logging.getLogger("retainz.mount").info("serving %s on %s", device, svc.path)
    try:
        yield svc
    finally:
        svc.close()
        thread.join(timeout=30)


def _raise_read_ahead(mountpoint: str, timeout: float = 30.0) -> None:
    """Once ``mountpoint`` is mounted, set its bdi's ``read_ahead_kb`` to :data:`~retainz.mount.fs.READ_AHEAD`
    (``/sys/class/bdi/MAJOR:MINOR``; the kernel gives a FUSE mount 128 KiB, so sequential reads would
    arrive in 128 KiB requests).  Best effort: without permission the mount works at the default."""
    from retainz.mount.fs import READ_AHEAD

    parent = os.stat(os.path.dirname(os.path.abspath(mountpoint))).st_dev
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            dev = os.stat(mountpoint).st_dev
        except OSError:
            dev = parent
        if dev != parent:
            path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
            try:
                with open(path, "w") as f:
                    f.write(str(READ_AHEAD >> 10))
            except OSError as e:
                logging.getLogger("retainz.mount").info("read_ahead_kb left at the default: %s: %s", path, e)
            return
        time.sleep(0.05)


def _binding(fuse):
    """mfusepy's ``FUSE`` with one addition: an open or create whose handle
    :meth:`~retainz.mount.fs.MountedStore.direct_io` names bypasses the kernel's page cache
    (``direct_io``), so readers of a file being replaced read the committed version from the mount,
    never the new bytes a writer left in the cache; a read open that
    :meth:`~retainz.mount.fs.MountedStore.keep_cache` allows keeps the page cache filled by earlier
    opens of the same committed shard (``keep_cache``)."""

    from retainz.zoned.syscalls import foreign_buffer

    class _FUSE(fuse.FUSE):
        # The request's bytes stay in libfuse's buffer: a write hands the namespace a view of it (the
        # namespace copies what it keeps before returning; mfusepy copies it into a bytes first) and a
        # read fills it in place (mfusepy copies a returned bytes into it).
        def write(self, path, buf, size, offset, fip):
            return self.operations.write(None, foreign_buffer(buf, size), offset, fip.contents.fh)

        def read(self, path, buf, size, offset, fip):
            return self.operations.read_into(fip.contents.fh, foreign_buffer(buf, size), offset)

        def open(self, path, fip):
            ret = super().open(path, fip)
            self._direct(fip)
            return ret

        def create(self, path, mode, fip):
            ret = super().create(path, mode, fip)
            self._direct(fip)
            return ret

        def _direct(self, fip):
            fi = fip.contents
            if self.operations.direct_io(fi.fh, fi.flags):
                fi.direct_io = 1
            elif self.operations.keep_cache(fi.fh):
                fi.keep_cache = 1

    return _FUSE


def _caller(fuse):
    """``() -> thread group id`` of the process making the current FUSE request (libfuse's context
    gives a thread id; ``/proc/TID/status`` names its process)."""
    cache: dict[int, int] = {}

    def caller():
        tid = fuse.fuse_get_context()[2]
        tgid = cache.get(tid)
        if tgid is None:
            tgid = tid
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{tid}/status") as f:
                for line in f:
                    if line.startswith("Tgid:"):
                        tgid = int(line.split()[1])
                        break
            if len(cache) > 4096:
                cache.clear()
            cache[tid] = tgid
        return tgid
    return caller


def mount(device: str, mountpoint: str, *, retention: str | None = None, foreground: bool = False,
          timeout: float = 120.0, access: dict | None = None, promote: dict | None = None) -> None:
    """``retainz mount``: serve in the foreground, or start a detached server and wait until mounted.

    ``access``: the rules of the socket the mount serves (:func:`serve`; ``None``: owner only).

    Raises:
        FuseUnavailableError: FUSE cannot be used here.
        FileNotFoundError, FileExistsError: a bad device or mount point.
        ValueError: a malformed retention rule (checked before any server starts).
        DeviceHeldError: another process holds the device (refused at once; no server is left behind).
        ForeignDeviceError: the device holds no store (refused at once; no server, no log).
        RuntimeError: the server exited before mounting (its last log lines of this attempt in the
            message).
        TimeoutError: not mounted after ``timeout`` seconds (the server is killed).
    """
    if retention not in (None, "auto"):
        from retainz.retention import parse_rule

        parse_rule(retention)       # bad input first (here, not in the server's log), then the machine
    load_fuse()
    _check_device_file(device)
    from retainz.zoned import FileDevice

    FileDevice.check_label(device)      # a foreign file is refused here, not in the server's log
    _check_free(device)       # before the mount point: a second mount of the device is "in use", wherever
    _check_mountpoint(mountpoint)
    _check_formatted(device)
    if foreground:
        serve(device, mountpoint, retention=retention, access=access, promote=promote)
        return
    logpath = device + ".mount.log"
    start = os.path.getsize(logpath) if os.path.exists(logpath) else 0
    cmd = [sys.executable, "-m", "retainz.cli", "mount", device, mountpoint, "--foreground"]
    if retention:
        cmd += ["--retention", retention]
    access = access or {}
    if access.get("group") is not None:
        cmd += ["--group", str(access["group"])]
    if access.get("allow_all"):
        cmd += ["--allow-all"]
    for job, series in sorted((access.get("grants") or {}).items()):
        cmd += [arg for s in sorted(series) for arg in ("--grant", f"{job}={s}")]
    for flag, key in (("--promote", "url"), ("--promote-policy", "policy"), ("--promote-bandwidth", "bandwidth")):
        if promote is not None and promote.get(key) is not None:
            cmd += [flag, str(promote[key])]
    with open(logpath, "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + timeout
    try:
        while not is_mounted(mountpoint):
            if proc.poll() is not None:
                with open(logpath, errors="replace") as f:
                    f.seek(start)                    # this attempt's lines only, not earlier mounts'
                    lines = [line.strip() for line in f.readlines() if line.strip()]
                held = [line for line in lines if "the device is in use" in line]
                if held:
                    raise DeviceHeldError(held[-1].split("error: ", 1)[-1])
                tail = lines[-3:]
                raise RuntimeError(f"the mount server exited with status {proc.returncode}: "
                                   + (" / ".join(tail) or "no output") + f" (log: {logpath})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mountpoint}: not mounted after {timeout:.0f} s (log: {logpath})")
            time.sleep(0.05)
    except BaseException:
        # the caller gives up (timeout, Ctrl-C): the server must not stay behind and mount later
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            if is_mounted(mountpoint):           # it mounted in the meantime: a stale mount now
                _unmount_command(mountpoint)
        raise


def _mount_source(mountpoint: str) -> str | None:
    target = os.path.realpath(mountpoint)
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and _unescape(parts[1]) == target and parts[2] == FSTYPE:
                src = _unescape(parts[0])
                return src.split(":", 1)[1] if src.startswith("retainz:") else None
    return None


def _unmount_command(mountpoint: str, *, run: bool = True) -> list[str]:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", mountpoint] if tool else ["umount", mountpoint]
    if run:
        subprocess.run(cmd, capture_output=True)
    return cmd


def umount(mountpoint: str, *, wait: float = 120.0) -> list[str]:
    """``retainz umount``: unmount (``fusermount3 -u``, or ``umount`` without it) and wait until the
    server is done: its socket removed, its store and device closed (it releases the mount point's
    lock last, :func:`_serving_lock`), so a device it held can be used at once.  A server that was
    the client of a ``retainz serve`` is waited for the same way, never for the device's lock, which
    the service keeps.  Works on a stale mount whose server died.

    Returns what the server's unmount said of the checkpoint directories it did not commit (each
    dropped, and why: :meth:`Namespace.unmount`), read from
    its log (``DEVICE.mount.log``, the lines it wrote during this unmount); empty for a server that
    logs elsewhere (``--foreground``: its own stderr) or died.

    Raises:
        FileNotFoundError: ``mountpoint`` is not a RetainZ mount.
        RuntimeError: the unmount command failed (its message).
        TimeoutError: the server is still closing ``wait`` seconds after the unmount.
    """
    if not is_mounted(mountpoint):
        at = mounted_at(mountpoint)          # the device was given, not its mount point
        if at:
            raise FileNotFoundError(f"{mountpoint}: is the device, not a mount point; it is mounted at {at[0]}: "
                                    f"retainz umount {at[0]}")
        raise FileNotFoundError(f"{mountpoint}: not a RetainZ mount")
    device = _mount_source(mountpoint)
    logpath = device + ".mount.log" if device else None
    start = os.path.getsize(logpath) if logpath and os.path.exists(logpath) else 0
    cmd = _unmount_command(mountpoint, run=False)
    busy_until = time.monotonic() + 5            # files being closed (a runtime exiting): retry briefly
    while True:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0:
            break
        msg = (r.stderr or r.stdout).strip()
        if "busy" not in msg.lower() or time.monotonic() > busy_until:
            raise RuntimeError(f"{' '.join(cmd)} failed: {msg}")
        time.sleep(0.2)
    deadline = time.monotonic() + wait
    # the directory under the mount now; where it takes no flock, the device's lock says it instead
    if not _wait_unlocked(mountpoint, deadline) and device and os.path.exists(device):
        _wait_unlocked(device, deadline)
    return unmount_lines(logpath, start)


def unmount_lines(logpath: str | None, start: int) -> list[str]:
    """The ``unmount:`` lines (:meth:`Namespace.unmount`) a server logged to ``logpath`` from byte
    ``start`` on, without the logging prefix; empty when there is no such file."""
    if not logpath or not os.path.exists(logpath):
        return []
    with open(logpath, errors="replace") as f:
        f.seek(start)
        return [line.split(" unmount: ", 1)[1].rstrip("\n") for line in f if " unmount: " in line]


def _wait_unlocked(path: str, deadline: float) -> bool:
    """Wait until nobody holds a ``flock`` on ``path`` (True), or say its file system takes none (False).

    Raises:
        TimeoutError: still held at ``deadline`` (``time.monotonic()``)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if os.path.isdir(path) else 0)
    fd = os.open(path, flags)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: the mount server is still closing after unmount") from None
                time.sleep(0.05)
            except OSError:
                return False
    finally:
        os.close(fd)
