"""A job's checkpoints: the layer between the store (and the node service, the tiers) and the faces.

* :mod:`retainz.jobs.stores` - the one way to open a store for any device spec, local or served, shared
  by every face of a process;
* :mod:`retainz.jobs.ranks` - which process of a job this is (the ranks of one save join one generation).
"""
