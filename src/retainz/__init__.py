"""RetainZ: retention-aware placement of AI training checkpoints on zoned (ZNS) SSDs."""

__version__ = "0.1.0"
