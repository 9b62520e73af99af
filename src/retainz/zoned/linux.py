"""A real Linux zoned block device (``/dev/nvmeXnY``, null_blk zoned...) through the kernel's ioctls.

Not implemented yet: it is the subject of the "Real zoned block devices" issue.  Opening one raises
:class:`~retainz.errors.ZoneOpNotSupportedError` with that explanation.
"""

from __future__ import annotations

from retainz.errors import ZoneOpNotSupportedError

__all__ = ["LinuxZonedDevice"]


class LinuxZonedDevice:
    """Placeholder until the real-device issue lands."""

    def __init__(self, path: str, *, readonly: bool = False):
        raise ZoneOpNotSupportedError(f"{path}: real zoned block devices are not supported yet")
