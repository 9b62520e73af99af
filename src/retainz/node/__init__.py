"""The node service: one process owns a device; many processes (ranks, jobs) write their data to it
directly and commit through the service (docs/node.md).

* :mod:`.protocol`: the wire format (length-prefixed JSON frames), the bounds on every field, the
  socket path rule (:func:`socket_path`).
* :mod:`.service`: :class:`Service` and :func:`serve` (``retainz serve DEVICE``).
* :mod:`.client`: :class:`NodeStore`, a store served over the socket (what the integrations use when a
  service runs for their device).
"""

from retainz.node.client import NodeStore, served
from retainz.node.protocol import PROTOCOL, socket_path
from retainz.node.service import Service, serve

__all__ = ["NodeStore", "Service", "serve", "served", "socket_path", "PROTOCOL"]
