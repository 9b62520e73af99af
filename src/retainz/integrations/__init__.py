"""Integrations with training runtimes (optional extra ``retainz[torch]``).

* :mod:`retainz.integrations.dcp` - PyTorch Distributed Checkpoint ``ZonedStorageWriter`` /
  ``ZonedStorageReader`` (imports torch);
* :mod:`retainz.integrations.fsspec_fs` - the ``retainz://`` fsspec filesystem, so DCP's fsspec
  writer, TorchTitan's CheckpointManager and Lightning's ModelCheckpoint run unmodified (imports fsspec);
* :mod:`retainz.integrations.retention_callbacks` - Megatron-style retention adapters over the store's
  delete, and a TorchTitan-style purge helper (no torch needed);
* :mod:`retainz.experiments.payload` - the real-payload check (SmolLM2-135M architecture).

Nothing here is imported by the core: ``import retainz`` never imports torch or fsspec.
"""
