"""NVMe Flexible Data Placement (FDP) devices: a model of a conventional namespace on flash.

* :mod:`retainz.fdp.ftl` - the FTL model: pages, erase blocks grouped into reclaim units (RUs), reclaim
  groups, reclaim unit handles (initially or persistently isolated), over-provisioning, greedy or FIFO
  garbage collection, and the statistics of the FDP statistics log page (0x22);
* :mod:`retainz.fdp.analytic` - the closed forms it is validated against (Desnoyers SYSTOR'12, CacheLib
  EuroSys'25 Theorem 1);
* :mod:`retainz.fdp.validation` - the validation table (model vs analytic, every case of docs/fdp.md).
"""
