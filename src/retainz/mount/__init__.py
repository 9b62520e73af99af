"""``retainz mount``: a RetainZ store as a directory tree, for every training runtime, unmodified.

* :mod:`~retainz.mount.fs` - :class:`MountedStore`, the FUSE operations: an adapter over
  :class:`retainz.namespace.Namespace` (paths -> generations and shards, each runtime's commit point);
* :mod:`~retainz.mount.runner` - the binding (mfusepy over libfuse 3), ``mount``/``umount``.

Retention without configuration (``--retention auto``) is :mod:`retainz.retention.inference`.
"""

from retainz.mount.runner import FuseUnavailableError, is_mounted, load_fuse, mount, serve, umount

__all__ = ["FuseUnavailableError", "is_mounted", "load_fuse", "mount", "serve", "umount"]
