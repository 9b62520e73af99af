"""Device specifications: the strings users pass on the command line.

=================================  ===============================================================
spec                               device
=================================  ===============================================================
``PATH`` or ``file:PATH``          :class:`FileDevice` at PATH (created by ``retainz device create``)
``/dev/NAME`` or ``zbd:/dev/NAME``  ``LinuxZonedDevice`` (a real zoned block device)
``mem:KEY=VALUE,...``              a fresh :class:`MemoryDevice`; keys are the geometry's
                                   (``zones``, ``zone_size``, ``zone_capacity``, ``block_size``,
                                   ``max_open``, ``max_active``) plus ``payload=true|false``
``fdp:KEY=VALUE,...``              a fresh :class:`~retainz.zoned.fdp.FdpNamespaceDevice` (an FDP
                                   namespace on the FTL model, docs/fdp.md): the ``mem:`` keys plus
                                   ``ru_size`` (default: the zone capacity), ``spare`` (the spare
                                   factor, default 0.07), ``ruh=II|PI``, ``unit`` (the model's page,
                                   default the block size); ``max_active`` is the number of handles
``nvme-fdp:dev=/dev/nvmeXnY,...``  a real NVMe namespace with FDP (``LinuxFdpDevice``,
                                   :mod:`retainz.zoned.linuxfdp`): keys ``dev``, ``zone_capacity``,
                                   ``ru_size`` (required), ``zones``, ``handles`` (default: all)
``remote:socket=PATH[,window=F]``  a device served by :func:`retainz.zoned.remote.serve` on the
                                   Unix socket PATH, its data through the shared-memory file F
                                   (the QEMU guest's device: :mod:`retainz.vm.channel`)
=================================  ===============================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from retainz.errors import DeviceFormatError
from retainz.spec import parse_spec
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import Geometry, parse_size

__all__ = ["open_device", "parse_device", "DeviceSpec", "parse_geometry", "parse_fdp_options", "GEOMETRY_KEYS",
           "FDP_KEYS"]

GEOMETRY_KEYS = ("zones", "zone_size", "zone_capacity", "block_size", "max_open", "max_active")
_DEFAULTS = {"zones": "64", "zone_size": "1MiB", "zone_capacity": "", "block_size": "4096",
             "max_open": "14", "max_active": "14"}


def parse_geometry(options: dict[str, str]) -> Geometry:
    """Build a :class:`Geometry` from string options (``zones``, ``zone_size`` with units...).

    Missing keys take small defaults (64 zones of 1 MiB, capacity = size, 14 open/active).

    Raises:
        DeviceFormatError: an unknown key, an unparseable value or an inconsistent geometry.
    """
    unknown = set(options) - set(GEOMETRY_KEYS)
    if unknown:
        raise DeviceFormatError(f"unknown geometry key(s) {', '.join(sorted(unknown))}; valid: "
                                + ", ".join(GEOMETRY_KEYS))
    opts = {**_DEFAULTS, **options}
    values = {}
    for key in ("block_size", *(k for k in GEOMETRY_KEYS if k != "block_size")):
        raw = opts[key]
        if key in ("zones", "max_open", "max_active"):
            try:
                values[key] = int(raw)
            except ValueError:
                raise DeviceFormatError(f"bad geometry: {key}={raw!r} is not an integer") from None
            continue
        if not raw:
            values[key] = None
            continue
        try:   # sizes: the one parser, units exactly as written
            values[key] = parse_size(raw, what=key)
        except ValueError as e:
            why = str(e).split(": ", 1)[-1]
            raise DeviceFormatError(f"bad geometry: {key}={raw!r} is not a size: {why}") from None
        if key == "block_size" and values[key] not in (512, 4096):   # NVMe LBA formats the project supports
            raise DeviceFormatError(f"bad geometry: block size {values[key]} is not 512 or 4096")
        block = values.get("block_size")
        if key != "block_size" and block and values[key] % block:
            raise DeviceFormatError(f"bad geometry: {key}={raw!r} ({values[key]:,} B) is not a multiple of the "
                                    f"block size ({block} B)")
    zone_size = values["zone_size"]
    return Geometry(nr_zones=values["zones"], zone_size=zone_size,
                    zone_capacity=values["zone_capacity"] or zone_size, block_size=values["block_size"],
                    max_open=values["max_open"], max_active=values["max_active"])


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device specification (the module docstring's table): what every command and face
    decides by, instead of testing prefixes.

    Attributes:
        kind: ``"file"`` (a device file), ``"zbd"`` (a zoned block device), ``"mem"`` (in memory),
            ``"fdp"`` (an FDP namespace model in memory, :mod:`retainz.zoned.fdp`), ``"nvme-fdp"`` (a real
            FDP namespace, :mod:`retainz.zoned.linuxfdp`) or ``"remote"`` (a served device,
            :mod:`retainz.zoned.remote`).
        path: the device file's or block device's path (``file:`` and ``zbd:`` dropped; ``nvme-fdp:``'s
            ``dev``); ``""`` for
            ``mem:``, ``fdp:`` and ``remote:``.
        text: the specification as written.
    """

    kind: str
    path: str
    text: str

    @property
    def is_file(self) -> bool:
        """A device file: locked per process with ``flock``, beside which its socket and settings live."""
        return self.kind == "file"

    @property
    def persistent(self) -> bool:
        """Outlives the process that opens it (everything but ``mem:`` and ``fdp:``)."""
        return self.kind not in ("mem", "fdp")

    @property
    def key(self) -> str:
        """One name per device: a device file's real path, a block device's path, else the text."""
        if self.kind == "file":
            return os.path.realpath(self.path)
        return self.path if self.kind in ("zbd", "nvme-fdp") else self.text

    def exists(self) -> bool:
        """The device is there to open (a device file that exists; any other kind: the open says)."""
        return self.kind != "file" or os.path.exists(self.path)

    def open(self, *, readonly: bool = False) -> ZonedDevice:
        """Open the device (:func:`open_device`'s errors)."""
        if self.kind == "mem":
            return _open_memory(self.text)
        if self.kind == "fdp":
            return _open_fdp(self.text)
        if self.kind == "remote":
            return _open_remote(self.text)
        if self.kind == "nvme-fdp":
            return _open_nvme_fdp(self.text, readonly)
        if self.kind == "zbd":
            return _open_linux(self.path, readonly)
        from retainz.zoned.file import FileDevice, not_a_device_file

        if os.path.isdir(self.path):
            raise not_a_device_file(self.path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"{self.path}: no such device file")
        return FileDevice(self.path, readonly=readonly)

    def create(self, geometry: Geometry) -> ZonedDevice:
        """Create the device file with ``geometry`` (its parent folders too).

        Raises:
            ValueError: the spec names no device file (only files are created).
            FileExistsError: the file exists."""
        if self.kind != "file":
            raise ValueError(f"{self.text}: only a device file can be created, not a {self.kind} device")
        from retainz.zoned.file import FileDevice

        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        return FileDevice.create(self.path, geometry)


def parse_device(spec: str | os.PathLike) -> DeviceSpec:
    """The one parser of device specifications (the module docstring's table): ``mem`` or ``mem:...``,
    ``remote:...``, ``zbd:PATH``, ``file:PATH``, ``/dev/NAME`` or an existing block device (zbd), any
    other path (a device file).  A ``mem:``/``fdp:`` spec's values are checked here (its geometry, its
    payload, an FDP namespace's options), so every command names a malformed spec before anything else
    it would say of the device; the other kinds' form only: :meth:`DeviceSpec.open` checks the rest.

    Raises:
        DeviceFormatError: ``file:`` or ``zbd:`` with no path after it; a ``mem:`` or ``fdp:`` spec with
        an unknown key or a bad value (``bad device spec 'TEXT': ...``).
    """
    text = os.fspath(spec)
    if text == "mem" or text.startswith("mem:"):
        _check_in_memory(text, "mem")
        return DeviceSpec("mem", "", text)
    if text == "fdp" or text.startswith("fdp:"):
        _check_in_memory(text, "fdp")
        return DeviceSpec("fdp", "", text)
    if text.startswith("remote:"):
        return DeviceSpec("remote", "", text)
    if text.startswith("nvme-fdp:"):
        return DeviceSpec("nvme-fdp", _nvme_fdp_options(text)["dev"], text)
    for prefix, kind in (("zbd:", "zbd"), ("file:", "file")):
        if text.startswith(prefix):
            if not text[len(prefix):]:
                raise DeviceFormatError(f"bad device spec {text!r}: no path after {prefix}")
            return DeviceSpec(kind, text[len(prefix):], text)
    if text.startswith("/dev/") or (os.path.exists(text) and _is_block_device(text)):
        return DeviceSpec("zbd", text, text)
    return DeviceSpec("file", text, text)


def open_device(spec: str, *, readonly: bool = False) -> ZonedDevice:
    """Open the device a specification string names (see the module docstring):
    ``parse_device(spec).open(readonly=readonly)``.

    Raises:
        FileNotFoundError: no such path (or no socket at a ``remote:`` spec's path).
        NotADeviceError: the path is not a RetainZ device file nor a zoned block device.
        DeviceFormatError: a malformed ``mem:`` or ``remote:`` specification.
        RemoteDeviceError: the remote device's server did not answer as expected.
    """
    return parse_device(spec).open(readonly=readonly)


def _in_memory_options(spec: str) -> tuple[dict[str, str], bool]:
    """A ``mem:``/``fdp:`` spec's ``KEY=VALUE`` options, and its ``payload=true|false`` (default true)
    taken out of them.

    Raises:
        DeviceFormatError: a malformed spec, or a payload other than true or false."""
    try:
        options = dict(parse_spec(spec, "device spec")[1])
    except ValueError as e:
        raise DeviceFormatError(str(e)) from None
    payload = options.pop("payload", "true").lower()
    if payload not in ("true", "false"):
        raise DeviceFormatError(f"bad device spec {spec!r}: payload must be true or false")
    return options, payload == "true"


def _check_in_memory(text: str, kind: str) -> None:
    """Check a ``mem:``/``fdp:`` spec's values as its open would (:func:`parse_geometry`,
    :func:`parse_fdp_options`, ``FdpNamespaceDevice.check``), building nothing.

    Raises:
        DeviceFormatError: naming the spec (``bad device spec 'TEXT': ...``) and what is wrong."""
    try:
        opts, _ = _in_memory_options(text)
        if kind == "fdp":
            from retainz.zoned.fdp import FdpNamespaceDevice

            kw = parse_fdp_options(opts)
            FdpNamespaceDevice.check(parse_geometry(opts), **kw)
        else:
            parse_geometry(opts)
    except DeviceFormatError as e:
        why = str(e)
        if why.startswith(("bad device spec '", "device spec ")):       # it names the spec already
            raise
        why = why.removeprefix("bad device spec: ").removeprefix("bad geometry: ")
        raise DeviceFormatError(f"bad device spec {text!r}: {why}") from None


def _open_memory(spec: str) -> ZonedDevice:
    from retainz.zoned.memory import MemoryDevice

    opts, payload = _in_memory_options(spec)
    return MemoryDevice(parse_geometry(opts), payload=payload)


#: The keys of an ``fdp:`` spec beyond the geometry's (:class:`~retainz.zoned.fdp.FdpNamespaceDevice`).
FDP_KEYS = ("ru_size", "spare", "ruh", "unit", "handles")


def parse_fdp_options(options: dict[str, str]) -> dict:
    """The FDP namespace's own options of an ``fdp:`` spec (``ru_size``, ``spare``, ``ruh``, ``unit``) as
    :class:`~retainz.zoned.fdp.FdpNamespaceDevice` keyword arguments; the keys are removed from
    ``options`` (what is left is the geometry's).

    Raises:
        DeviceFormatError: a size or number that does not parse.
    """
    kw: dict = {"ruh_type": options.pop("ruh", "II").upper()}
    for key in ("ru_size", "unit"):
        if key in options:
            raw = options.pop(key)
            try:
                kw[key] = parse_size(raw, what=key)
            except ValueError as e:
                raise DeviceFormatError(f"bad device spec: {key}={raw!r} is not a size: "
                                        f"{str(e).split(': ', 1)[-1]}") from None
    if "spare" in options:
        raw = options.pop("spare")
        try:
            kw["spare_factor"] = float(raw)
        except ValueError:
            raise DeviceFormatError(f"bad device spec: spare={raw!r} is not a number") from None
    if "handles" in options:
        raw = options.pop("handles")
        if raw != "1":
            raise DeviceFormatError(f"bad device spec: handles={raw!r}: give handles=1 (no placement "
                                    f"identifiers) or leave it out (one handle per active zone)")
        kw["handles"] = 1
    return kw


def _open_fdp(spec: str) -> ZonedDevice:
    from retainz.zoned.fdp import FdpNamespaceDevice

    opts, payload = _in_memory_options(spec)
    kw = parse_fdp_options(opts)
    return FdpNamespaceDevice(parse_geometry(opts), payload=payload, **kw)


def _open_remote(spec: str) -> ZonedDevice:
    import mmap

    from retainz.zoned.remote import RemoteZonedDevice

    try:
        opts = dict(parse_spec(spec, "device spec")[1])
    except ValueError as e:
        raise DeviceFormatError(str(e)) from None
    unknown = set(opts) - {"socket", "window"}
    if unknown or not opts.get("socket") or opts.get("window") == "":
        raise DeviceFormatError(f"bad device spec {spec!r}: expected remote:socket=PATH[,window=FILE]")
    window = None
    if "window" in opts:
        path = opts["window"]
        try:
            with open(path, "r+b") as f:
                window = mmap.mmap(f.fileno(), 0)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such window file") from None
        except (OSError, ValueError) as e:      # an empty file, /dev/null, a directory...
            raise DeviceFormatError(f"{path}: cannot be mapped as a shared-memory window "
                                    f"({getattr(e, 'strerror', None) or e})") from None
    return RemoteZonedDevice.connect_unix(opts["socket"], window, window_name=opts.get("window", ""))


_NVME_FDP_KEYS = ("dev", "zone_capacity", "ru_size", "zones", "handles")


def _nvme_fdp_options(spec: str) -> dict:
    """A ``nvme-fdp:`` spec's options as :class:`~retainz.zoned.linuxfdp.LinuxFdpDevice` arguments
    (``dev`` -> ``path``).

    Raises:
        DeviceFormatError: an unknown or missing key, a size or count that does not parse."""
    usage = "expected nvme-fdp:dev=/dev/nvmeXnY,zone_capacity=SIZE,ru_size=SIZE[,zones=N][,handles=N]"
    try:
        opts = dict(parse_spec(spec, "device spec")[1])
    except ValueError as e:
        raise DeviceFormatError(str(e)) from None
    unknown = set(opts) - set(_NVME_FDP_KEYS)
    missing = [k for k in ("dev", "zone_capacity", "ru_size") if not opts.get(k)]
    if unknown or missing:
        raise DeviceFormatError(f"bad device spec {spec!r}: "
                                + (f"unknown key(s) {', '.join(sorted(unknown))}" if unknown
                                   else f"no {', '.join(missing)}") + f"; {usage}")
    out: dict = {"dev": opts["dev"]}
    for key in ("zone_capacity", "ru_size"):
        try:
            out[key] = parse_size(opts[key], what=key)
        except ValueError as e:
            raise DeviceFormatError(f"bad device spec {spec!r}: {key}={opts[key]!r} is not a size: "
                                    f"{str(e).split(': ', 1)[-1]}") from None
    for key in ("zones", "handles"):
        if key in opts:
            if not opts[key].isdigit() or int(opts[key]) < 1:
                raise DeviceFormatError(f"bad device spec {spec!r}: {key}={opts[key]!r} is not a positive count")
            out[key] = int(opts[key])
    return out


def _open_nvme_fdp(spec: str, readonly: bool) -> ZonedDevice:
    from retainz.zoned.linuxfdp import LinuxFdpDevice

    kw = _nvme_fdp_options(spec)
    path = kw.pop("dev")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such block device (an NVMe namespace with FDP: `nvme fdp configs`)")
    return LinuxFdpDevice(path, readonly=readonly, **kw)


def _is_block_device(path: str) -> bool:
    import stat

    return stat.S_ISBLK(os.stat(path).st_mode)


def _open_linux(path: str, readonly: bool) -> ZonedDevice:
    from retainz.zoned.linux import LinuxZonedDevice

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such block device (zoned ones: `lsblk -o NAME,ZONED`)")
    return LinuxZonedDevice(path, readonly=readonly)
