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
``remote:socket=PATH[,window=F]``  a device served by :func:`retainz.zoned.remote.serve` on the
                                   Unix socket PATH, its data through the shared-memory file F
                                   (the QEMU guest's device: :mod:`retainz.vm.channel`)
=================================  ===============================================================
"""

from __future__ import annotations

import os

from retainz.errors import DeviceFormatError
from retainz.spec import parse_spec
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import Geometry, parse_size

__all__ = ["open_device", "parse_geometry", "parse_fdp_options", "GEOMETRY_KEYS", "FDP_KEYS"]

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
        block = values.get("block_size")
        if key != "block_size" and block and values[key] % block:
            raise DeviceFormatError(f"bad geometry: {key}={raw!r} ({values[key]:,} B) is not a multiple of the "
                                    f"block size ({block} B)")
    zone_size = values["zone_size"]
    return Geometry(nr_zones=values["zones"], zone_size=zone_size,
                    zone_capacity=values["zone_capacity"] or zone_size, block_size=values["block_size"],
                    max_open=values["max_open"], max_active=values["max_active"])


def open_device(spec: str, *, readonly: bool = False) -> ZonedDevice:
    """Open the device a specification string names (see the module docstring).

    Raises:
        FileNotFoundError: no such path (or no socket at a ``remote:`` spec's path).
        NotADeviceError: the path is not a RetainZ device file nor a zoned block device.
        DeviceFormatError: a malformed ``mem:`` or ``remote:`` specification.
        RemoteDeviceError: the remote device's server did not answer as expected.
    """
    if spec.startswith("mem:") or spec == "mem":
        from retainz.zoned.memory import MemoryDevice

        try:
            opts = dict(parse_spec(spec, "device spec")[1])
        except ValueError as e:
            raise DeviceFormatError(str(e)) from None
        payload = opts.pop("payload", "true").lower()
        if payload not in ("true", "false"):
            raise DeviceFormatError(f"bad device spec {spec!r}: payload must be true or false")
        return MemoryDevice(parse_geometry(opts), payload=payload == "true")
    if spec.startswith("fdp:") or spec == "fdp":
        return _open_fdp(spec)
    if spec.startswith("remote:"):
        return _open_remote(spec)
    if spec.startswith("zbd:"):
        spec = spec[4:]
        return _open_linux(spec, readonly)
    if spec.startswith("file:"):
        spec = spec[5:]
        if not spec:
            raise DeviceFormatError("bad device spec 'file:': no path after file:")
    elif spec.startswith("/dev/") or (os.path.exists(spec) and _is_block_device(spec)):
        return _open_linux(spec, readonly)
    if not os.path.exists(spec):
        raise FileNotFoundError(f"{spec}: no such device file")
    from retainz.zoned.file import FileDevice

    return FileDevice(spec, readonly=readonly)


#: The keys of an ``fdp:`` spec beyond the geometry's (:class:`~retainz.zoned.fdp.FdpNamespaceDevice`).
FDP_KEYS = ("ru_size", "spare", "ruh", "unit")


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
    return kw


def _open_fdp(spec: str) -> ZonedDevice:
    from retainz.zoned.fdp import FdpNamespaceDevice

    try:
        opts = dict(parse_spec(spec, "device spec")[1])
    except ValueError as e:
        raise DeviceFormatError(str(e)) from None
    payload = opts.pop("payload", "true").lower()
    if payload not in ("true", "false"):
        raise DeviceFormatError(f"bad device spec {spec!r}: payload must be true or false")
    kw = parse_fdp_options(opts)
    return FdpNamespaceDevice(parse_geometry(opts), payload=payload == "true", **kw)


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


def _is_block_device(path: str) -> bool:
    import stat

    return stat.S_ISBLK(os.stat(path).st_mode)


def _open_linux(path: str, readonly: bool) -> ZonedDevice:
    from retainz.zoned.linux import LinuxZonedDevice

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such block device (zoned ones: `lsblk -o NAME,ZONED`)")
    return LinuxZonedDevice(path, readonly=readonly)
