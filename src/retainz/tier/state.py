"""The tier's local settings: where a device promotes to, by which policy, and the generations the
runtime asked for by name (docs/tiers.md, "What survives a crash").

Durability is never recorded here: it is read from the destination's manifests.  This file holds only
what a restart needs to know to carry on: ``{"format": 1, "url": URL, "policy": SPEC, "bandwidth":
BYTES_PER_S | null, "requested": [GEN...], "node": NODE | null, "nodes": [NODE...]}`` (``node``/``nodes``:
this device's node of several promoting to one destination), written whole to ``PATH.tmp``, fsynced, then renamed
over ``PATH`` (a crash leaves the old file or the new one).  A device file ``dev.img`` keeps it at
``dev.img.tier.json`` (:func:`state_path_for`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from retainz.zoned.spec import parse_device

__all__ = ["TierSettings", "state_path_for", "STATE_SUFFIX", "remember"]

#: What :func:`state_path_for` appends to a device file's path.
STATE_SUFFIX = ".tier.json"


def state_path_for(device: str) -> str | None:
    """The settings file of device ``device`` (a device spec, :func:`retainz.zoned.parse_device`):
    ``DEVICE.tier.json`` beside a device file; ``None`` for a device that is not a file (``zbd:``,
    ``/dev/...``, ``remote:``, ``mem:``), which must be given one."""
    spec = parse_device(device)
    return spec.path + STATE_SUFFIX if spec.is_file else None


@dataclass
class TierSettings:
    """The settings file's content (module docstring)."""

    url: str
    policy: str = "all"
    bandwidth: int | None = None
    requested: list[str] = field(default_factory=list)
    node: str | None = None
    nodes: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: str) -> TierSettings | None:
        """The settings at ``path``, ``None`` when there is no file.

        Raises:
            ValueError: a file that is not a tier settings file (one line naming it)."""
        try:
            with open(path, "rb") as f:
                obj = json.loads(f.read(1 << 20))
            if obj.get("format") != 1 or not isinstance(obj["url"], str):
                raise ValueError("unknown format")
            bw = obj.get("bandwidth")
            node = obj.get("node")
            return cls(obj["url"], str(obj.get("policy", "all")), None if bw is None else int(bw),
                       [str(g) for g in obj.get("requested", [])], None if node is None else str(node),
                       [str(n) for n in obj.get("nodes", [])])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not a RetainZ tier settings file ({e})") from None

    def save(self, path: str) -> None:
        """Write the settings atomically (tmp, fsync, rename, fsync of the directory)."""
        blob = json.dumps({"format": 1, "url": self.url, "policy": self.policy, "bandwidth": self.bandwidth,
                           "requested": sorted(set(self.requested)), "node": self.node,
                           "nodes": sorted(set(self.nodes))}, indent=1).encode()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remember(path: str, url: str, policy: str, bandwidth: float | None, node: str | None = None,
             nodes: list[str] | tuple[str, ...] = ()) -> None:
    """Record the destination a promoter of the device started with (``retainz tier status``, ``df``
    and ``get`` then need no ``--to``): the file is rewritten when any of these changed; the runtime's
    requests by name are kept when the URL is the same.

    Raises:
        OSError: the file could not be written (the caller logs it; promotion goes on without it)."""
    try:
        saved = TierSettings.load(path)
    except ValueError:
        saved = None
    bw = None if bandwidth is None else int(bandwidth)
    new = TierSettings(url, policy, bw, saved.requested if saved is not None and saved.url == url else [],
                       node, sorted(set(nodes)))
    if saved != new:
        new.save(path)
