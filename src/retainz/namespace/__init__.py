"""The namespace: one directory tree over the store for every face (the FUSE mount, ``retainz://``).

* :mod:`~retainz.namespace.names` - the rules: paths -> generation ids and shard names, the names the
  store can keep, each runtime's commit point;
* :mod:`~retainz.namespace.model` - :class:`Namespace`, which owns the path state and applies the
  rules (commit points, replace-on-commit, rename, removal, retention inference).
"""

from retainz.namespace.model import Entry, Namespace, NamespaceError, errno_of

__all__ = ["Entry", "Namespace", "NamespaceError", "errno_of"]
