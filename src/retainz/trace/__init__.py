"""Traces: the v1 format (versioned JSON Lines), checkpoint layouts of real models, and generation.

* :mod:`~retainz.trace.format` - header and event dataclasses, their JSON forms, :class:`TraceFormatError`;
* :mod:`~retainz.trace.validate` - the line parsers and the event-sequence :class:`Validator`;
* :mod:`~retainz.trace.io` - :class:`TraceReader` / :func:`read_trace` (every line validated: line numbers
  in errors), :class:`TraceWriter` / :func:`write_trace`;
* :mod:`~retainz.trace.layouts` - ``smollm2-135m-dcp``, ``pythia-1b``, ``llama3-8b-fsdp[:ranks=N]``, each
  shard with its source (measured or computed);
* :mod:`~retainz.trace.generate` - layout + retention rule + steps + seed -> trace.

Replay (running a trace through the store) lives in ``retainz.trace.replay``.
"""

from retainz.trace.format import (
    VERSION,
    CommitEvent,
    CrashEvent,
    DeleteEvent,
    Event,
    SaveEvent,
    Shard,
    Trace,
    TraceFormatError,
    TraceHeader,
    actual_reclaim_steps,
)
from retainz.trace.generate import GenerateStats, generate, generate_trace, write_generated
from retainz.trace.io import TraceReader, TraceWriter, read_trace, write_trace
from retainz.trace.layouts import LAYOUTS, Layout, ShardSpec, get_layout, list_layouts

__all__ = [
    "LAYOUTS", "VERSION", "CommitEvent", "CrashEvent", "DeleteEvent", "Event", "GenerateStats", "Layout",
    "SaveEvent", "Shard", "ShardSpec", "Trace", "TraceFormatError", "TraceHeader", "TraceReader",
    "TraceWriter", "actual_reclaim_steps", "generate", "generate_trace", "get_layout", "list_layouts", "read_trace", "write_generated",
    "write_trace",
]
