"""The store: the backend that executes everything (docs/architecture.md, docs/store.md).

Public surface (everything else in this package is private)::

    from retainz.store import Store
    with Store.format(device) as store:          # or Store.open(device)
        w = store.begin_generation("step-100", 100, hint=Hint(reclaim_step=300), declared_size=n)
        w.write_shard("__0_0.distcp", chunks)      # streaming (or open_shard + write, push-style)
        w.commit()                                 # the commit record is durable when this returns
        for chunk in store.read_shard("step-100", "__0_0.distcp"): ...
        store.delete("step-100", step=300)
"""

from retainz.store.store import Store
from retainz.store.types import (
    Extent,
    FsckReport,
    GCReport,
    GenerationInfo,
    GenState,
    ShardInfo,
    SpaceReport,
    StoreMetrics,
)
from retainz.store.writer import GenerationWriter, ShardWriter

__all__ = ["Store", "GenerationWriter", "ShardWriter", "Extent", "FsckReport", "GCReport", "GenerationInfo", "GenState",
           "ShardInfo", "SpaceReport", "StoreMetrics"]
