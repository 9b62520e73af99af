"""The namespace: one directory tree over the store for every face (the FUSE mount, ``retainz://``).

* :mod:`~retainz.namespace.names` - the rules: paths -> generation ids and shard names, the names the
  store can keep, each runtime's commit point;
* :mod:`~retainz.namespace.errors` - :class:`NamespaceError`, how a refused call is reported (an errno);
* :mod:`~retainz.namespace.hooks` - what a namespace is told by the face over it (:class:`Face`) and
  by a durable tier (:class:`DurableTier`), given to its constructor;
* :mod:`~retainz.namespace.commit` - the commit protocol: the generations a namespace writes (files
  and checkpoint directories being written), from begun to committed or abandoned (``Commits``);
* :mod:`~retainz.namespace.tree` - the tree visible now and the calls that change its shape (``Tree``:
  ``mkdir``, ``unlink``, ``rmdir``, ``rm -r``, ``rename``);
* :mod:`~retainz.namespace.model` - :class:`Namespace`, the POSIX-like calls every face makes, over
  those parts (open, read, write, truncate, close, fsync, release, stat, and the tree's calls).
"""

from retainz.namespace.errors import NamespaceError, errno_of
from retainz.namespace.hooks import DurableTier, Face
from retainz.namespace.model import Entry, Namespace, OpenState

__all__ = ["DurableTier", "Entry", "Face", "Namespace", "NamespaceError", "OpenState", "errno_of"]
