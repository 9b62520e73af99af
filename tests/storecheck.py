"""Skip helper: the real store is needed (tests run against both the store and tests/fakestore.py)."""

from __future__ import annotations

import pytest


def require_store() -> None:
    """Skip the calling test, with the reason, while ``retainz.store`` cannot format a device yet."""
    try:
        from retainz.store import Store
        from retainz.zoned import Geometry, MemoryDevice
    except ImportError as e:
        pytest.skip(f"retainz.store does not import yet: {e}")
    try:
        Store.format(MemoryDevice(Geometry(nr_zones=8, zone_size=1 << 20, zone_capacity=1 << 20))).close()
    except NotImplementedError:
        pytest.skip("the store is not implemented yet (skeleton only)")
