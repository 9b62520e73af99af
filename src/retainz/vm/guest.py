"""Boot a throw-away Linux guest under QEMU (TCG) with a real zoned block device, run one command in it.

The guest:

* boots the unpacked Debian kernel from :mod:`retainz.vm.setup` with a tiny initramfs (static busybox,
  the modules ``virtio_pci``, ``9p``/``9pnet_virtio``, ``nvme`` and ``null_blk`` with their dependencies,
  and the ``init`` script below) - nothing is installed into ``/boot``;
* mounts the host's root read-only over 9p (so it uses the host's python and ``.venv``) and the
  output folder read-write at the same path, with a tmpfs on ``/dev/shm`` (``TMPDIR`` and ``HOME``;
  not on ``/tmp``, which would hide a checkout living under the host's ``/tmp``);
* has an emulated NVMe ZNS namespace (``/dev/nvme0n1``) backed by a sparse raw file, optionally a
  memory-backed null_blk zoned device (``/dev/nullb0``) made through configfs, and optionally a small
  regular virtio disk (``/dev/vda``, 4 KiB sectors: f2fs keeps its metadata there);
* loads extra kernel modules on request (``GuestConfig.modules``: e.g. ``btrfs``, ``f2fs``, ``zonefs``
  for the file-system comparison of :mod:`retainz.experiments.fsworkload`);
* runs the command from a script file in the output folder (the kernel command line holds ~2 KiB, so
  nothing of the command goes there), records its exit status there, and powers off.

The host side (:func:`run_in_guest`) waits with a timeout, kills a hung guest, keeps the console log
(``<out>/.retainz-guest/console.log``) and returns the command's exit status.  Always TCG: KVM on these
machines is a paravirtual backend that hangs a stock kernel.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from retainz.vm.console import pump
from retainz.vm.setup import (
    Kernel,
    VMSetupError,
    default_cache_dir,
    ensure_all,
    ensure_fdp_qemu,
    find_busybox,
    find_qemu,
)
from retainz.zoned.model import format_size

__all__ = ["ZNSConfig", "FDPConfig", "NullBlkConfig", "DiskConfig", "ChannelConfig", "PORT_NAME", "GuestConfig",
           "GuestResult", "run_in_guest", "build_initramfs",
           "qemu_command", "GUEST_MODULES", "GUEST_TMP", "STATE_DIR", "EXIT_TIMEOUT", "EXIT_NO_STATUS"]

#: Modules loaded in every guest (with their dependencies, in ``modprobe --show-depends`` order).
GUEST_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "nvme", "null_blk")
#: Module of the regular disk (:class:`DiskConfig`), added when a guest has one.
DISK_MODULE = "virtio_blk"
#: Folder inside the output folder that holds the run's script, status and console log.
STATE_DIR = ".retainz-guest"
#: The guest's writable scratch space (a tmpfs; ``TMPDIR`` and ``HOME``).  Not ``/tmp``: a tmpfs there
#: would hide the host's ``/tmp``, where a checkout (and its ``.venv``) may live.
GUEST_TMP = "/dev/shm"
#: Exit status :func:`run_in_guest` returns for a guest killed at the timeout (as ``timeout(1)``).
EXIT_TIMEOUT = 124
#: Exit status when the guest stopped without recording the command's status (crash, panic).
EXIT_NO_STATUS = 125


@dataclass(frozen=True)
class ZNSConfig:
    """The emulated NVMe ZNS namespace (QEMU ``nvme-ns zoned=true``).

    Attributes (sizes in bytes):
        zones: number of zones.  zone_size: LBA span of a zone (a power of two: Linux 6.1 requires it).
        zone_capacity: writable bytes per zone (< zone_size exercises capacity < size).
        max_open, max_active: the open/active zone limits (0 = unlimited).
        block_size: logical block size, 4096 or 512.
    """

    zones: int = 16
    zone_size: int = 1 << 20
    zone_capacity: int = 768 << 10
    max_open: int = 3
    max_active: int = 4
    block_size: int = 4096

    def check(self) -> None:
        """Raises ValueError on a geometry QEMU or Linux would refuse (the message says which)."""
        if self.zone_size & (self.zone_size - 1) or self.zone_size < self.block_size:
            raise ValueError(f"zone size {self.zone_size} must be a power of two >= the block size "
                             "(Linux 6.1 supports power-of-two zone sizes only)")
        if not self.block_size <= self.zone_capacity <= self.zone_size or self.zone_capacity % self.block_size:
            raise ValueError(f"zone capacity {self.zone_capacity} must be a multiple of the block size, "
                             f"at most the zone size {self.zone_size}")
        if self.zones < 1:
            raise ValueError("need at least one zone")
        if self.max_active and self.max_open > self.max_active:
            raise ValueError(f"max open {self.max_open} exceeds max active {self.max_active}")

    def qemu_args(self, raw: Path) -> list[str]:
        """The ``-drive`` and ``-device`` arguments for this namespace backed by ``raw``."""
        ns = (f"nvme-ns,drive=zns0,bus=nvme0,nsid=1,logical_block_size={self.block_size},"
              f"physical_block_size={self.block_size},zoned=true,zoned.zone_size={self.zone_size},"
              f"zoned.zone_capacity={self.zone_capacity},zoned.max_open={self.max_open},"
              f"zoned.max_active={self.max_active}")
        return ["-drive", f"file={raw},id=zns0,format=raw,if=none,cache=writeback",
                "-device", "nvme,serial=zns0,id=nvme0", "-device", ns]


@dataclass(frozen=True)
class FDPConfig:
    """An emulated NVMe namespace with Flexible Data Placement (QEMU >= 8.0: ``nvme-subsys fdp=on``, one
    endurance group, ``nvme-ns fdp.ruhs``; hw/nvme/subsys.c ``nvme_subsys_setup_fdp``, hw/nvme/ns.c
    ``nvme_ns_init_fdp``).  A conventional namespace: no zones; the host picks a placement handle per
    write (directive type 2, NVMe 2.0 TP4146).

    Attributes (sizes in bytes):
        size: namespace size (a multiple of the block size).
        ru_size: reclaim unit size (``fdp.runs``); QEMU counts each handle's remaining writes per RU in
            logical blocks, so an RU larger than what one handle receives keeps every handle's count
            exact in the RUH Status.
        handles: reclaim unit handles (``fdp.nruh``), all given to the namespace as placement handles
            0..handles-1 (``fdp.ruhs``).
        reclaim_groups: ``fdp.nrg`` (1: the placement identifier is the placement handle).
        block_size: logical block size.
    """

    size: int = 64 << 20
    ru_size: int = 64 << 20
    handles: int = 4
    reclaim_groups: int = 1
    block_size: int = 4096

    def check(self) -> None:
        """Raises ValueError on a geometry QEMU would refuse (the message says which)."""
        if self.size < self.block_size or self.size % self.block_size:
            raise ValueError(f"FDP namespace size {self.size} must be a positive multiple of the block size "
                             f"{self.block_size}")
        if self.ru_size < self.block_size or self.ru_size % self.block_size:
            raise ValueError(f"reclaim unit size {self.ru_size} must be a positive multiple of the block size")
        if not 1 <= self.handles <= 127:
            raise ValueError(f"handles must be 1..127 (QEMU's NVME_FDP_MAXPIDS), got {self.handles}")
        if self.reclaim_groups < 1:
            raise ValueError("need at least one reclaim group")

    def qemu_args(self, raw: Path) -> list[str]:
        """The ``-drive`` and ``-device`` arguments: an FDP subsystem, its controller and the namespace
        backed by ``raw`` (controller ``nvme0`` when the guest has no ZNS namespace)."""
        ruhs = ";".join(str(h) for h in range(self.handles))
        return ["-device", f"nvme-subsys,id=fdpsubsys,nqn=retainz-fdp,fdp=on,fdp.runs={self.ru_size},"
                           f"fdp.nrg={self.reclaim_groups},fdp.nruh={self.handles}",
                "-drive", f"file={raw},id=fdp0,format=raw,if=none,cache=writeback",
                "-device", "nvme,serial=fdp0,id=nvmefdp,subsys=fdpsubsys",
                "-device", f"nvme-ns,drive=fdp0,bus=nvmefdp,nsid=1,logical_block_size={self.block_size},"
                           f"physical_block_size={self.block_size},fdp.ruhs={ruhs}"]


@dataclass(frozen=True)
class NullBlkConfig:
    """A memory-backed null_blk zoned device (configfs).  null_blk counts zone size and capacity in
    MiB, so the smallest geometry with capacity < size is 2 MiB zones of 1 MiB capacity.

    Attributes: zones; zone_size_mb, zone_capacity_mb (MiB); max_open, max_active (0 = unlimited);
    block_size (bytes).
    """

    zones: int = 16
    zone_size_mb: int = 2
    zone_capacity_mb: int = 1
    max_open: int = 3
    max_active: int = 4
    block_size: int = 4096

    def shell(self) -> str:
        """The guest shell lines that create ``/dev/nullb0``."""
        d = "/sys/kernel/config/nullb/nullb0"
        attrs = [("size", self.zones * self.zone_size_mb), ("blocksize", self.block_size),
                 ("memory_backed", 1), ("zoned", 1), ("zone_size", self.zone_size_mb),
                 ("zone_capacity", self.zone_capacity_mb), ("zone_nr_conv", 0),
                 ("zone_max_open", self.max_open), ("zone_max_active", self.max_active), ("power", 1)]
        lines = [f"mkdir {d}"] + [f"echo {v} > {d}/{k}" for k, v in attrs]
        return "\n".join(lines)


@dataclass(frozen=True)
class DiskConfig:
    """A regular (not zoned) virtio disk, ``/dev/vda``, backed by a sparse raw file.

    Attributes: size (bytes, a multiple of the block size); block_size: logical and physical sector
    size (4096: f2fs refuses a metadata device whose sector size differs from the zoned one's).
    """

    size: int = 64 << 20
    block_size: int = 4096

    def check(self) -> None:
        """Raises ValueError on a size QEMU would refuse."""
        if self.size <= 0 or self.size % self.block_size:
            raise ValueError(f"disk size {self.size} must be a positive multiple of the block size "
                             f"{self.block_size}")

    def qemu_args(self, raw: Path) -> list[str]:
        """The ``-drive`` and ``-device`` arguments for this disk backed by ``raw``."""
        return ["-drive", f"file={raw},id=disk0,format=raw,if=none,cache=writeback",
                "-device", f"virtio-blk-pci,drive=disk0,logical_block_size={self.block_size},"
                           f"physical_block_size={self.block_size}"]


#: The virtio-serial port's name (``/sys/class/virtio-ports/*/name`` in the guest).
PORT_NAME = "retainz"
#: Guest kernel module of virtio-serial ports.
PORT_MODULE = "virtio_console"


@dataclass(frozen=True)
class ChannelConfig:
    """A virtio-serial port and an ``ivshmem`` shared-memory window through which a host process uses
    the guest's zoned device (:mod:`retainz.vm.channel` serves it; this is the host's end).

    Attributes:
        socket: the Unix socket QEMU listens on for the port (created by QEMU; removed first if stale).
        window: the shared-memory file (under ``/dev/shm``) backing the ``ivshmem`` window.
        window_size: bytes; a power of two (QEMU maps it as a PCI BAR).
    """

    socket: str
    window: str
    window_size: int = 64 << 20

    def check(self) -> None:
        """Raises ValueError on a window QEMU would refuse."""
        if self.window_size < 4096 or self.window_size & (self.window_size - 1):
            raise ValueError(f"window size {self.window_size} must be a power of two of at least 4 KiB")

    def prepare(self) -> None:
        """Create the window file at its size and remove a stale socket (before QEMU starts)."""
        Path(self.socket).unlink(missing_ok=True)
        with open(self.window, "wb") as f:
            f.truncate(self.window_size)

    def qemu_args(self) -> list[str]:
        """The ``-device``/``-chardev``/``-object`` arguments of the port and the window."""
        return ["-device", "virtio-serial-pci",
                "-chardev", f"socket,id=rzport,path={self.socket},server=on,wait=off",
                "-device", f"virtserialport,chardev=rzport,name={PORT_NAME}",
                "-object", f"memory-backend-file,id=rzwin,mem-path={self.window},size={self.window_size},share=on",
                "-device", "ivshmem-plain,memdev=rzwin"]

    def device_spec(self) -> str:
        """The host's device spec for the guest's served device (:func:`retainz.zoned.open_device`)."""
        return f"remote:socket={self.socket},window={self.window}"


@dataclass
class GuestConfig:
    """How to boot the guest.

    Attributes:
        zns: the NVMe ZNS namespace, or None for no NVMe device.
        nullblk: the null_blk zoned device, or None.
        fdp: an NVMe namespace with Flexible Data Placement, or None (needs QEMU >= 8.0:
            :func:`retainz.vm.setup.find_fdp_qemu`).
        disk: a regular virtio disk (``/dev/vda``), or None.
        modules: extra kernel modules to load (with their dependencies), e.g. ``("btrfs", "f2fs")``.
        memory_mb: guest RAM (128 MiB suffice without torch).
        cpus: virtual CPUs.
        timeout: seconds before a hung guest is killed.
        env: extra environment variables for the command.
        cwd: working directory of the command in the guest (default: the caller's).
        scheduler: I/O scheduler to set on the zoned devices ("" = leave the kernel's default).
        raw_dir: where the ZNS backing file goes (default: a temporary folder, deleted afterwards).
        channel: a virtio-serial port and shared-memory window through which a host process uses the
            guest's zoned device (:mod:`retainz.vm.channel`), or None.
    """

    zns: ZNSConfig | None = field(default_factory=ZNSConfig)
    nullblk: NullBlkConfig | None = field(default_factory=NullBlkConfig)
    fdp: FDPConfig | None = None
    disk: DiskConfig | None = None
    modules: tuple[str, ...] = ()
    memory_mb: int = 512
    cpus: int = 2
    timeout: float = 600.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    scheduler: str = ""
    raw_dir: str | None = None
    channel: ChannelConfig | None = None


@dataclass
class GuestResult:
    """What a guest run left.

    Attributes:
        status: the command's exit status; :data:`EXIT_TIMEOUT` if the guest was killed at the timeout,
            :data:`EXIT_NO_STATUS` if it stopped without recording one.
        out_dir: the output folder (the command's files are there).
        console_log: the guest's console (kernel messages and the command's output).
        seconds: wall time of the boot-to-poweroff.
        timed_out: True if the guest was killed.
    """

    status: int
    out_dir: Path
    console_log: Path
    seconds: float
    timed_out: bool = False

    def console_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the console log (for error messages)."""
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])


_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /newroot /out
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "retainz-guest: $*"; poweroff -f; }
while read -r ko args; do
  insmod "/lib/modules/$ko" $args 2>/dev/null || echo "retainz-guest: insmod $ko failed (ignored)"
done < /modules.order
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none out /out || fail "cannot mount the output share"
. /out/STATE_DIR/guest.conf || fail "no guest.conf in the output share"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro root /newroot || fail "cannot mount the host root"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/shm
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mkdir -p "/newroot$RETAINZ_OUT" 2>/dev/null
mount --move /out "/newroot$RETAINZ_OUT" || fail "cannot move the output share to $RETAINZ_OUT"
if [ -n "$RETAINZ_NULLBLK" ]; then
  mount -t configfs configfs /sys/kernel/config
  sh "/newroot$RETAINZ_OUT/STATE_DIR/nullblk.sh" || echo "retainz-guest: null_blk setup failed"
fi
for dev in nvme0n1 nullb0; do
  if [ -n "$RETAINZ_SCHED" ] && [ -e /sys/block/$dev/queue/scheduler ]; then
    echo "$RETAINZ_SCHED" > /sys/block/$dev/queue/scheduler || echo "retainz-guest: cannot set $RETAINZ_SCHED on $dev"
  fi
done
echo "retainz-guest: running the command"
chroot /newroot /bin/sh "$RETAINZ_OUT/STATE_DIR/cmd.sh" < /dev/console > /dev/console 2>&1
echo $? > "/newroot$RETAINZ_OUT/STATE_DIR/status"
sync
umount "/newroot$RETAINZ_OUT" 2>/dev/null
poweroff -f
""".replace("STATE_DIR", STATE_DIR)


def _log(msg: str) -> None:
    print(f"retainz vm: {msg}", file=sys.stderr, flush=True)


def _module_order(kernel: Kernel, names: tuple[str, ...] = GUEST_MODULES) -> list[Path]:
    seen: dict[Path, None] = {}
    for name in names:
        r = subprocess.run(["modprobe", "-d", str(kernel.root), "-S", kernel.release, "--show-depends",
                            name], capture_output=True, text=True)
        if r.returncode != 0:
            raise VMSetupError(f"kernel {kernel.release}: module {name} not found: {r.stderr.strip()}")
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "insmod":
                seen.setdefault(Path(os.path.normpath(parts[1])), None)
    return list(seen)


def build_initramfs(kernel: Kernel, cache: Path | None = None, modules: tuple[str, ...] = ()) -> Path:
    """Build (or reuse) the guest's initramfs: static busybox, the :data:`GUEST_MODULES` plus ``modules``
    and ``init``.

    Cached under ``cache`` by a hash of its inputs, so it is built once per kernel.

    Raises:
        VMSetupError: no static busybox, a module missing from the kernel, cpio failed.
    """
    busybox = find_busybox()
    if busybox is None:
        raise VMSetupError("no static busybox (Debian package busybox-static); run `make vm-setup`")
    cache = cache or default_cache_dir()
    mods = _module_order(kernel, GUEST_MODULES + tuple(m for m in modules if m not in GUEST_MODULES))
    h = hashlib.sha256(_INIT.encode())
    h.update(kernel.release.encode())
    h.update(Path(busybox).read_bytes())
    order = [m.name + (" nr_devices=0" if m.name.startswith("null_blk.") else "") for m in mods]
    h.update("\n".join(order).encode())
    out = cache / f"initramfs-{kernel.release}-{h.hexdigest()[:12]}.cpio"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="initramfs-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        for d in ("bin", "lib/modules", "proc", "sys", "dev", "newroot", "out"):
            (root / d).mkdir(parents=True)
        shutil.copy2(busybox, root / "bin" / "busybox")
        for m in mods:
            shutil.copy2(m, root / "lib" / "modules" / m.name)
        (root / "modules.order").write_text("".join(f"{n}\n" for n in order))
        init = root / "init"
        init.write_text(_INIT)
        init.chmod(0o755)
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        partial = out.with_suffix(".partial")
        with open(partial, "wb") as f:
            r = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"],
                               input=("\n".join(files) + "\n").encode(), cwd=root, stdout=f,
                               stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise VMSetupError(f"cpio failed: {r.stderr.decode(errors='replace')}")
        partial.rename(out)
    return out


def qemu_command(qemu: str, kernel: Kernel, initramfs: Path, out_dir: Path, cfg: GuestConfig,
                 raw: Path | None, console_log: Path, disk_raw: Path | None = None,
                 fdp_raw: Path | None = None) -> list[str]:
    """The full QEMU command line (TCG, no defaults, serial console to stdout and ``console_log``)."""
    cmd = [qemu, "-M", "q35", "-accel", "tcg", "-cpu", "max", "-smp", str(cfg.cpus),
           "-m", f"{cfg.memory_mb}M", "-nodefaults", "-nographic", "-no-reboot",
           "-chardev", f"stdio,id=con0,signal=off,logfile={console_log}", "-serial", "chardev:con0",
           "-kernel", str(kernel.vmlinuz), "-initrd", str(initramfs),
           "-append", "console=ttyS0 loglevel=3 panic=-1 rdinit=/init",
           "-fsdev", "local,id=rootfs,path=/,security_model=none,readonly=on,multidevs=remap",
           "-device", "virtio-9p-pci,fsdev=rootfs,mount_tag=root",
           "-fsdev", f"local,id=outfs,path={out_dir},security_model=none,multidevs=remap",
           "-device", "virtio-9p-pci,fsdev=outfs,mount_tag=out"]
    if cfg.zns is not None and raw is not None:
        cmd += cfg.zns.qemu_args(raw)
    if cfg.fdp is not None and fdp_raw is not None:
        cmd += cfg.fdp.qemu_args(fdp_raw)
    if cfg.disk is not None and disk_raw is not None:
        cmd += cfg.disk.qemu_args(disk_raw)
    if cfg.channel is not None:
        cmd += cfg.channel.qemu_args()
    return cmd


def _die_with_parent() -> None:
    """In the QEMU child before exec: be killed when the process that started it dies (Linux
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so a killed ``retainz`` leaves no guest running.  Best
    effort (logged and counted where the platform has no ``prctl``)."""
    import signal

    from retainz.zoned.syscalls import best_effort, set_parent_death_signal

    best_effort("prctl", set_parent_death_signal, int(signal.SIGKILL))


def _guest_env(cfg: GuestConfig) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
           "HOME": GUEST_TMP, "TMPDIR": GUEST_TMP, "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8",
           "TERM": "dumb"}
    for key in ("VIRTUAL_ENV", "PYTHONPATH"):     # a checkout run with its sources first tests them in the guest too
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(cfg.env)
    return env


def run_in_guest(command: list[str], out_dir: str | os.PathLike, cfg: GuestConfig | None = None, *,
                 stream: bool = False, install: bool = True) -> GuestResult:
    """Boot a guest, run ``command`` in it, return its exit status and where its files are.

    Args:
        command: argv of the command (run by ``/bin/sh`` from a script file in the output folder).
        out_dir: the host folder shared read-write at the same path in the guest; created if needed.
        cfg: the guest's devices and limits.
        stream: copy the guest console to this process's stdout as it runs, terminal control sequences
            stripped (:mod:`retainz.vm.console`); else only to the log (raw).
        install: install missing packages / download the kernel if needed (see :mod:`retainz.vm.setup`).

    Returns:
        a :class:`GuestResult`; a timed-out guest has status :data:`EXIT_TIMEOUT` and its log kept.

    Raises:
        VMSetupError: QEMU, busybox or the kernel are missing and cannot be installed.
        ValueError: an impossible device geometry.
    """
    cfg = cfg or GuestConfig()
    if cfg.zns is not None:
        cfg.zns.check()
    if cfg.disk is not None:
        cfg.disk.check()
    if cfg.fdp is not None:
        cfg.fdp.check()
    if cfg.channel is not None:
        cfg.channel.check()
    kernel = ensure_all(install=install)
    if cfg.fdp is not None:
        qemu = ensure_fdp_qemu(install=install)
    else:
        qemu = find_qemu()
    if qemu is None:
        raise VMSetupError("qemu-system-x86_64 not found (Debian package qemu-system-x86)")
    modules = (tuple(cfg.modules) + ((DISK_MODULE,) if cfg.disk is not None else ())
               + ((PORT_MODULE,) if cfg.channel is not None else ()))
    initramfs = build_initramfs(kernel, modules=modules)
    out = Path(out_dir).resolve()
    state = out / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    for stale in ("status", "console.log"):
        (state / stale).unlink(missing_ok=True)
    env = _guest_env(cfg)
    cwd = cfg.cwd or os.getcwd()
    script = ["#!/bin/sh", "# written by retainz.vm.guest: the command the guest runs"]
    script += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    script += [f"cd {shlex.quote(cwd)} || exit 126", shlex.join(command)]
    (state / "cmd.sh").write_text("\n".join(script) + "\n")
    conf = [f"RETAINZ_OUT={shlex.quote(str(out))}",
            f"RETAINZ_NULLBLK={'1' if cfg.nullblk else ''}",
            f"RETAINZ_SCHED={shlex.quote(cfg.scheduler)}"]
    (state / "guest.conf").write_text("\n".join(conf) + "\n")
    if cfg.nullblk:
        (state / "nullblk.sh").write_text(cfg.nullblk.shell() + "\n")
    console_log = state / "console.log"
    raw_parent = Path(cfg.raw_dir) if cfg.raw_dir else None
    with tempfile.TemporaryDirectory(prefix="retainz-zns-", dir=raw_parent) as tmp:
        raw = None
        if cfg.zns is not None:
            raw = Path(tmp) / "zns.raw"
            with open(raw, "wb") as f:
                f.truncate(cfg.zns.zones * cfg.zns.zone_size)
        disk_raw = None
        if cfg.disk is not None:
            disk_raw = Path(tmp) / "disk.raw"
            with open(disk_raw, "wb") as f:
                f.truncate(cfg.disk.size)
        fdp_raw = None
        if cfg.fdp is not None:
            fdp_raw = Path(tmp) / "fdp.raw"
            with open(fdp_raw, "wb") as f:
                f.truncate(cfg.fdp.size)
        if cfg.channel is not None:
            cfg.channel.prepare()
        cmd = qemu_command(qemu, kernel, initramfs, out, cfg, raw, console_log, disk_raw, fdp_raw)
        (state / "qemu.cmd").write_text(shlex.join(cmd) + "\n")
        if cfg.zns is not None:
            _log(f"booting {kernel.release} (TCG, {cfg.cpus} CPUs, {cfg.memory_mb} MiB): NVMe ZNS "
                 f"{cfg.zns.zones} x {format_size(cfg.zns.zone_size)} zones "
                 f"(capacity {format_size(cfg.zns.zone_capacity)})"
                 + (", null_blk zoned" if cfg.nullblk else ""))
        if cfg.fdp is not None:
            _log(f"booting {kernel.release} under {qemu} (TCG): NVMe FDP namespace "
                 f"{format_size(cfg.fdp.size)}, {cfg.fdp.handles} placement handles, RU "
                 f"{format_size(cfg.fdp.ru_size)}")
        t0 = time.monotonic()
        # streamed through ConsoleFilter: the console's terminal resets and clear-screens stay off stdout
        qemu_err = open(state / "qemu.stderr", "wb")     # QEMU's own complaints (a bad -m, a missing file)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if stream else subprocess.DEVNULL,
                                stderr=qemu_err, start_new_session=True, preexec_fn=_die_with_parent)
        qemu_err.close()
        console = pump(proc.stdout) if stream else None
        timed_out = False
        try:
            proc.wait(timeout=cfg.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        seconds = time.monotonic() - t0
        if console is not None:
            console.join(timeout=10)
            proc.stdout.close()
    status_file = state / "status"
    if timed_out:
        status = EXIT_TIMEOUT
        _log(f"guest killed after {cfg.timeout:.0f} s (timeout); console log kept in {console_log}")
    elif status_file.exists():
        try:
            status = int(status_file.read_text().strip())
        except ValueError:
            status = EXIT_NO_STATUS
    else:
        status = EXIT_NO_STATUS
        why = (state / "qemu.stderr").read_text(errors="replace").strip().splitlines()
        _log(f"the guest stopped without recording the command's status (QEMU exit {proc.returncode}"
             + (f": {why[-1]}" if why else "") + f"); see {console_log}")
    return GuestResult(status=status, out_dir=out, console_log=console_log, seconds=seconds,
                       timed_out=timed_out)
