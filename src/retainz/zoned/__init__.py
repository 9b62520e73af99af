"""Zoned devices: the NVMe ZNS zone model and its backends.

* :class:`MemoryDevice` - in process, payload optional (trace replay);
* :class:`FileDevice` - the embedded default, a sparse file with a checksummed zone-state header;
* ``LinuxZonedDevice`` (``retainz.zoned.linux``) - a real zoned block device through the kernel ioctls.

Fault injection around an emulated device (power cuts, torn writes, I/O errors) is
:class:`retainz.zoned.faulty.FaultyDevice`.

:func:`open_device` turns a device specification string into a device.
"""

from retainz.zoned.device import WriteData, ZonedDevice, ZoneOp
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.file import FileDevice
from retainz.zoned.memory import MemoryDevice
from retainz.zoned.model import (
    DeviceInfo,
    Geometry,
    Zone,
    ZoneCond,
    ZoneType,
    format_size,
    format_sizes,
    parse_size,
)
from retainz.zoned.spec import DeviceSpec, open_device, parse_device, parse_geometry

__all__ = [
    "DeviceInfo", "DeviceSpec", "EmulatedZonedDevice", "FileDevice", "Geometry",
    "MemoryDevice", "WriteData", "Zone", "ZoneCond", "ZoneOp", "ZoneType", "ZonedDevice",
    "format_size", "format_sizes", "open_device", "parse_device", "parse_geometry", "parse_size",
]
