"""How a refused namespace call is reported: an ``OSError`` with the errno a system call returns.

The FUSE mount returns ``-errno``; ``retainz://`` raises the error, so ``ENOENT`` is a
``FileNotFoundError`` and so on.  :func:`errno_of` maps the store's errors onto errnos.
"""

from __future__ import annotations

import errno
import logging
import os

from retainz.errors import InvalidIdError, NoSpaceError, ReadOnlyStoreError
from retainz.namespace import names as L

__all__ = ["NamespaceError", "errno_of"]

log = logging.getLogger("retainz.namespace")


def errno_of(e: BaseException) -> int:
    """The errno a store error becomes at the system call that reports it: ``ENOSPC`` for
    :class:`~retainz.errors.NoSpaceError` (data zones or journal full), ``ENAMETOOLONG`` for an id
    over 255 bytes, ``EINVAL`` for another id rule, ``EROFS`` for a store opened read-only
    (:class:`~retainz.errors.ReadOnlyStoreError`), ``EIO`` for anything else."""
    if isinstance(e, NoSpaceError):
        return errno.ENOSPC
    if isinstance(e, ReadOnlyStoreError):
        return errno.EROFS
    if isinstance(e, InvalidIdError):
        return L.errno_of_id(e)
    if isinstance(e, OSError) and e.errno:
        return e.errno
    return errno.EIO


class NamespaceError(OSError):
    """A refused namespace call: an ``OSError`` with the errno (the mount returns ``-errno``;
    ``retainz://`` raises it, so ``ENOENT`` is a ``FileNotFoundError`` and so on); logged, as a
    warning unless it is ``ENOENT``: a missing path is what every probe (Python's imports, a runtime
    looking for its latest checkpoint) gets, and would otherwise grow the mount log without bound."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(code, message or os.strerror(code))
        if message:
            log.log(logging.DEBUG if code == errno.ENOENT else logging.WARNING, "%s", message)
