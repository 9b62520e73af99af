"""Find or install what the QEMU guest lane needs: QEMU, static busybox, cpio, kmod and a Debian kernel.

Host tools come from Debian's packages (``apt-get install``); the guest kernel is ``apt-get download``-ed
and unpacked with ``dpkg-deb -x`` into a private cache folder (``cache/vm/`` under the repository by
default, ``$RETAINZ_VM_CACHE`` otherwise), then ``depmod -b`` indexes its modules.  Nothing is installed
into ``/boot`` and no initramfs tool runs.  Every step is idempotent: a second call finds everything and
runs no package command at all.

The FDP lane needs QEMU >= 8.0 (``nvme-subsys fdp=on``); Debian bookworm's is 7.2.  The system QEMU is
left alone (the ZNS lane runs on it): :func:`ensure_fdp_qemu` ``apt-get download``-s
``qemu-system-x86`` from Debian's ``bookworm-backports`` through a private apt state in
``cache/vm/apt/`` (its own sources list and package lists; nothing under ``/etc/apt`` changes) and
unpacks it with ``dpkg-deb -x`` into ``cache/vm/qemu/<version>/``.  The unpacked binary uses the host's
shared libraries and firmware (SeaBIOS, option ROMs: installed with the system QEMU); a library it lacks
is named in the error.

Run it as ``python -m retainz.vm.setup`` (``tools/vm-setup.sh`` and ``make vm-setup`` do).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VMSetupError", "Kernel", "HOST_PACKAGES", "default_cache_dir", "ensure_host_tools",
           "ensure_kernel", "ensure_all", "find_qemu", "find_busybox", "qemu_version", "find_fdp_qemu",
           "ensure_fdp_qemu", "FDP_QEMU_MIN", "FDP_QEMU_SOURCE"]

#: Debian packages the lane installs on the host.  btrfs-progs, f2fs-tools and nvme-cli are for the guest
#: (it runs the host's root read-only): the file-system comparison formats the namespace with them, and
#: the FDP lane reads the drive's FDP logs with nvme-cli's fdp plugin (2.3+) beside its own ioctls.
HOST_PACKAGES = ("qemu-system-x86", "busybox-static", "cpio", "kmod", "btrfs-progs", "f2fs-tools", "nvme-cli")
#: The meta-package whose dependency names the current kernel image package.
KERNEL_META = "linux-image-amd64"
#: The first QEMU with FDP emulation (hw/nvme: ``nvme-subsys fdp=on``, 8.0, March 2023).
FDP_QEMU_MIN = (8, 0)
#: The apt source the FDP lane's QEMU comes from (``$RETAINZ_FDP_APT_SOURCE`` overrides): Debian's
#: bookworm-backports carries QEMU 10.0.
FDP_QEMU_SOURCE = ("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                   "http://deb.debian.org/debian bookworm-backports main")
FDP_QEMU_PACKAGE = "qemu-system-x86"
FDP_QEMU_SUITE = "bookworm-backports"


class VMSetupError(RuntimeError):
    """Something the guest lane needs is missing and could not be installed (the message says what
    to do).  ``reason`` is a short machine-readable cause: ``"no-root"``, ``"registry"``,
    ``"not-found"``."""

    def __init__(self, message: str, reason: str = "not-found"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Kernel:
    """An unpacked guest kernel.

    Attributes:
        root: the folder the package was unpacked into (holds ``boot/`` and ``lib/modules/``).
        release: the kernel release, e.g. ``6.1.0-57-amd64``.
        vmlinuz: path of the bootable image.
    """

    root: Path
    release: str
    vmlinuz: Path

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.release


def default_cache_dir() -> Path:
    """``$RETAINZ_VM_CACHE``, else ``cache/vm`` in the repository holding this package (a git-ignored
    folder), else ``~/.cache/retainz/vm`` for an installed copy."""
    env = os.environ.get("RETAINZ_VM_CACHE")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").exists() and (parent / "src" / "retainz").is_dir():
            return parent / "cache" / "vm"
    return Path.home() / ".cache" / "retainz" / "vm"


def _log(msg: str) -> None:
    print(f"retainz vm setup: {msg}", file=sys.stderr, flush=True)


_apt_updated = False


def _apt(args: list[str], what: str, cwd: Path | None = None) -> None:
    """Run ``apt-get ARGS`` (after one ``apt-get update`` per process); ``args=[]`` only updates.

    Raises:
        VMSetupError: not root (reason ``no-root``), or apt-get failed (reason ``registry``).
    """
    global _apt_updated
    if os.geteuid() != 0:
        raise VMSetupError(f"{what} needs root (apt-get); run `sudo make vm-setup` or install "
                           f"{', '.join(HOST_PACKAGES)} yourself", reason="no-root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        _log("apt-get update")
        r = subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise VMSetupError(f"apt-get update failed (is Debian's package registry reachable?):\n"
                               f"{r.stderr.strip()[-2000:]}", reason="registry")
        _apt_updated = True
    if not args:
        return
    _log(" ".join(["apt-get", *args]))
    r = subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise VMSetupError(f"{what}: `apt-get {' '.join(args)}` failed (is Debian's package registry "
                           f"reachable?):\n{r.stderr.strip()[-2000:]}", reason="registry")


def find_qemu() -> str | None:
    """Path of ``qemu-system-x86_64`` (``$RETAINZ_QEMU`` wins), or None."""
    return os.environ.get("RETAINZ_QEMU") or shutil.which("qemu-system-x86_64")


def qemu_version(path: str) -> tuple[int, int] | None:
    """``(major, minor)`` of the QEMU binary at ``path`` (from ``--version``), or None if it does not run."""
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"version (\d+)\.(\d+)", r.stdout)
    return (int(m.group(1)), int(m.group(2))) if r.returncode == 0 and m else None


def _unpacked_qemus(cache: Path) -> list[str]:
    return sorted(glob.glob(str(cache / "qemu" / "*" / "usr" / "bin" / "qemu-system-x86_64")))


def find_fdp_qemu(cache: Path | None = None) -> str | None:
    """A ``qemu-system-x86_64`` with FDP emulation (version >= :data:`FDP_QEMU_MIN`): ``$RETAINZ_FDP_QEMU``,
    else the newest one unpacked into ``cache/qemu/``, else the system QEMU if it is new enough; or None.
    (The version rule: QEMU 8.0's hw/nvme/subsys.c ``nvme_subsys_setup_fdp``.)"""
    env = os.environ.get("RETAINZ_FDP_QEMU")
    if env:
        return env if (qemu_version(env) or (0, 0)) >= FDP_QEMU_MIN else None
    cache = cache or default_cache_dir()
    for cand in reversed(_unpacked_qemus(cache)):
        if (qemu_version(cand) or (0, 0)) >= FDP_QEMU_MIN:
            return cand
    system = find_qemu()
    if system and (qemu_version(system) or (0, 0)) >= FDP_QEMU_MIN:
        return system
    return None


def _private_apt(cache: Path) -> list[str]:
    """``apt-get`` options for a private apt state under ``cache/apt`` that knows only
    :data:`FDP_QEMU_SOURCE` (its own sources list, lists and archive cache; ``/etc/apt`` untouched)."""
    apt = cache / "apt"
    for d in ("lists/partial", "cache/archives/partial"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(os.environ.get("RETAINZ_FDP_APT_SOURCE", FDP_QEMU_SOURCE) + "\n")
    return ["-o", f"Dir::Etc::SourceList={apt / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}",
            "-o", "APT::Sandbox::User=root"]


def _missing_libraries(binary: str) -> list[str]:
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if "not found" in line]


def ensure_fdp_qemu(cache: Path | None = None, install: bool = True) -> str:
    """Return a QEMU with FDP emulation, unpacking Debian's backports ``qemu-system-x86`` into
    ``cache/qemu/<version>/`` if there is none (see the module docstring; the system QEMU is never
    replaced).  Idempotent: a second call finds the unpacked binary and runs no package command.

    Raises:
        VMSetupError: none found and ``install`` is False, not root (``no-root``), the backports source
            unreachable (``registry``), or the unpacked binary lacks host libraries or is older than
            :data:`FDP_QEMU_MIN` (``not-found``; the message names what is missing).
    """
    cache = cache or default_cache_dir()
    found = find_fdp_qemu(cache)
    if found:
        return found
    if os.environ.get("RETAINZ_FDP_QEMU"):
        raise VMSetupError(f"RETAINZ_FDP_QEMU={os.environ['RETAINZ_FDP_QEMU']} is not a QEMU >= "
                           f"{FDP_QEMU_MIN[0]}.{FDP_QEMU_MIN[1]}")
    if not install:
        raise VMSetupError(f"no QEMU >= {FDP_QEMU_MIN[0]}.{FDP_QEMU_MIN[1]} (FDP emulation) in {cache}/qemu "
                           "(run `make vm-setup`)")
    if os.geteuid() != 0:
        raise VMSetupError("downloading QEMU for the FDP lane needs root (apt-get); run `sudo make vm-setup` "
                           "or set RETAINZ_FDP_QEMU to a qemu-system-x86_64 >= 8.0", reason="no-root")
    if not shutil.which("dpkg-deb"):
        raise VMSetupError("dpkg-deb not found: the FDP lane's QEMU is unpacked from a Debian package")
    opts = _private_apt(cache)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    for args in (["update", "-q"], ["download", "-q", f"{FDP_QEMU_PACKAGE}/{FDP_QEMU_SUITE}"]):
        _log(" ".join(["apt-get (private state in cache/vm/apt)", *args]))
        r = subprocess.run(["apt-get", *opts, *args], env=env, capture_output=True, text=True, cwd=debs)
        if r.returncode != 0:
            raise VMSetupError(f"`apt-get {' '.join(args)}` for the FDP lane's QEMU failed (is Debian's "
                               f"{FDP_QEMU_SUITE} reachable?):\n{r.stderr.strip()[-2000:]}", reason="registry")
    deb = sorted(glob.glob(str(debs / f"{FDP_QEMU_PACKAGE}_*.deb")))[-1]
    version = Path(deb).name.split("_")[1].replace("%3a", "_")
    root = cache / "qemu" / version
    tmp = root.with_name(version + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _log(f"unpacking {Path(deb).name}")
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp)], check=True)
    binary = tmp / "usr" / "bin" / "qemu-system-x86_64"
    missing = _missing_libraries(str(binary))
    if missing:
        raise VMSetupError(f"{Path(deb).name}: the host lacks the libraries {', '.join(missing)} "
                           f"(install their Debian packages)")
    have = qemu_version(str(binary))
    if (have or (0, 0)) < FDP_QEMU_MIN:
        raise VMSetupError(f"{Path(deb).name} is QEMU {have}, older than {FDP_QEMU_MIN} (no FDP emulation)")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    os.unlink(deb)  # 10 MB; the unpacked tree is what we keep
    return str(root / "usr" / "bin" / "qemu-system-x86_64")


def find_busybox() -> str | None:
    """Path of a statically linked busybox, or None (a dynamic one cannot run in the bare initramfs
    before the root is mounted)."""
    for cand in (os.environ.get("RETAINZ_BUSYBOX"), "/bin/busybox", "/usr/bin/busybox"):
        if cand and os.path.exists(cand) and _is_static(cand):
            return cand
    return None


def _is_static(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    return b"ld-linux" not in head  # a dynamic ELF names its interpreter in the first pages


def _missing_host_tools() -> list[str]:
    missing = []
    if not find_qemu():
        missing.append("qemu-system-x86")
    if not find_busybox():
        missing.append("busybox-static")
    if not shutil.which("cpio"):
        missing.append("cpio")
    if not (shutil.which("depmod") or os.path.exists("/sbin/depmod")):
        missing.append("kmod")
    for tool, package in (("mkfs.btrfs", "btrfs-progs"), ("mkfs.f2fs", "f2fs-tools"), ("nvme", "nvme-cli")):
        if not (shutil.which(tool) or os.path.exists(f"/sbin/{tool}") or os.path.exists(f"/usr/sbin/{tool}")):
            missing.append(package)
    return missing


def ensure_host_tools(install: bool = True) -> None:
    """Make sure QEMU, static busybox, cpio, kmod, btrfs-progs, f2fs-tools and nvme-cli are on the host.

    Raises:
        VMSetupError: something is missing and ``install`` is False, we are not root, or apt-get
            failed (no registry).
    """
    missing = _missing_host_tools()
    if not missing:
        return
    if not install:
        raise VMSetupError(f"missing host packages: {', '.join(missing)} (run `make vm-setup`)")
    _apt(["install", "-y", "-q", "--no-install-recommends", *missing], "installing " + ", ".join(missing))
    still = _missing_host_tools()
    if still:
        raise VMSetupError(f"installed {', '.join(missing)} but still missing: {', '.join(still)}")


def _cached_kernels(cache: Path) -> list[Kernel]:
    out = []
    for vmlinuz in sorted(glob.glob(str(cache / "kernel" / "*" / "boot" / "vmlinuz-*"))):
        p = Path(vmlinuz)
        root = p.parent.parent
        release = p.name[len("vmlinuz-"):]
        if (root / "lib" / "modules" / release / "modules.dep").exists():
            out.append(Kernel(root=root, release=release, vmlinuz=p))
    return out


def _kernel_package_name() -> str | None:
    r = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split(":", 1)[1].strip()
    return None


def ensure_kernel(cache: Path | None = None, install: bool = True) -> Kernel:
    """Return an unpacked Debian kernel, downloading it into ``cache/kernel/`` if none is there.

    ``$RETAINZ_VM_KERNEL_DIR`` may name an unpacked kernel folder to use instead.

    Raises:
        VMSetupError: no cached kernel and it cannot be downloaded (no root, no registry).
    """
    env_dir = os.environ.get("RETAINZ_VM_KERNEL_DIR")
    if env_dir:
        root = Path(env_dir)
        for vmlinuz in sorted(root.glob("boot/vmlinuz-*")):
            release = vmlinuz.name[len("vmlinuz-"):]
            if (root / "lib" / "modules" / release / "modules.dep").exists():
                return Kernel(root=root, release=release, vmlinuz=vmlinuz)
        raise VMSetupError(f"RETAINZ_VM_KERNEL_DIR={env_dir} holds no boot/vmlinuz-* with indexed modules")
    cache = cache or default_cache_dir()
    have = _cached_kernels(cache)
    if have:
        return have[-1]
    if not install:
        raise VMSetupError(f"no guest kernel in {cache}/kernel (run `make vm-setup`)")
    if not shutil.which("dpkg-deb"):
        raise VMSetupError("dpkg-deb not found: the guest kernel is unpacked from a Debian package")
    _apt([], "updating the package lists")  # the current kernel ABI name comes from fresh lists
    name = _kernel_package_name()
    if name is None:
        raise VMSetupError(f"apt-cache does not know {KERNEL_META}: is Debian's package registry "
                           "configured? (apt-get update)", reason="registry")
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if not glob.glob(str(debs / f"{name}_*.deb")):
        _apt(["download", "-q", name], f"downloading {name}", cwd=debs)
    deb = sorted(glob.glob(str(debs / f"{name}_*.deb")))[-1]
    root = cache / "kernel" / name
    tmp = root.with_name(name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _log(f"unpacking {Path(deb).name}")
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp)], check=True)
    releases = [p.name[len("vmlinuz-"):] for p in (tmp / "boot").glob("vmlinuz-*")]
    if len(releases) != 1:
        raise VMSetupError(f"{deb}: expected one boot/vmlinuz-*, found {releases}")
    depmod = shutil.which("depmod") or "/sbin/depmod"
    subprocess.run([depmod, "-b", str(tmp), releases[0]], check=True)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    os.unlink(deb)  # 70 MB; the unpacked tree is what we keep
    return _cached_kernels(cache)[-1]


def ensure_all(cache: Path | None = None, install: bool = True) -> Kernel:
    """:func:`ensure_host_tools` then :func:`ensure_kernel`; returns the kernel."""
    ensure_host_tools(install)
    return ensure_kernel(cache, install)


def main(argv: list[str] | None = None) -> int:
    """``python -m retainz.vm.setup [--check] [--fdp]``: install what the guest lanes need (or, with
    --check, only say what is missing); exit status 1 if something is missing and cannot be had.  With
    --fdp, the FDP lane's QEMU (:func:`ensure_fdp_qemu`) too, after the rest."""
    argv = sys.argv[1:] if argv is None else argv
    install = "--check" not in argv
    try:
        k = ensure_all(install=install)
        print(f"qemu: {find_qemu()}\nbusybox: {find_busybox()}\nkernel: {k.release} ({k.vmlinuz})")
        if "--fdp" in argv:
            fdp = ensure_fdp_qemu(install=install)
            print(f"fdp qemu: {fdp} (version {'.'.join(map(str, qemu_version(fdp) or ()))})")
    except VMSetupError as e:
        print(f"retainz vm setup: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
