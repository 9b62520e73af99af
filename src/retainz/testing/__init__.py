"""Crash-consistency campaigns, shipped with the store so users can run them against their own devices
(``retainz crashtest``): power cuts at every write boundary (:mod:`.crashtest`) and SIGKILLed writer
processes (:mod:`.blackbox`). The fault-injecting device they run on is a device wrapper and lives with the
devices (:mod:`retainz.zoned.faulty`). This is the lab: nothing in the product imports it."""
