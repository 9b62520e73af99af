"""Crash-consistency testing of the store, shipped with it so users can run it against their own
devices (``retainz crashtest``): the fault-injecting device (:mod:`.faulty`: power cuts, torn
writes, injected I/O errors, corrupt reads) and the power-cut campaigns (:mod:`.crashtest`).
Nothing in the store, placement or devices imports this package."""

from retainz.testing.faulty import FaultyDevice, IOFault, power_cut_states

__all__ = ["FaultyDevice", "IOFault", "power_cut_states"]
