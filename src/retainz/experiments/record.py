"""Run records: the schema, provenance and the record digest.

A record is one JSON object per case (``<output>/<case id>.json``)::

    schema       "retainz.run/1"
    id           the case id (= case_id(tags, inputs))
    manifest     name of the manifest the case came from
    tags         {"experiment": ..., "label": ...}
    inputs       the case's replay inputs (sizes in bytes; see retainz.experiments.manifest.CASE_FIELDS)
    backend      "retainz" for real runs (tests use doubles with other names)
    provenance   {retainz_version, git_revision, git_dirty, python, platform}
    trace        {key, sha256, bytes, file}          (absent if trace generation failed)
    status       "ok" | "failed"
    metrics      the replay's result dict, verbatim except zone_map      (status ok)
    capacity_stop_step   copied from metrics (null when none)              (status ok)
    capacity_stop_cause  copied from metrics: admission | allocation | gc | journal (null: none)
    capacity_stop_state  copied from metrics: {empty_zones, open_free_bytes, dead_bytes,
                         live_bytes} at the refusal (null when no stop)
    zone_map     the replay's zone-state timeline, when the case asked      (optional)
    error        {type, message, traceback}                                (status failed)
    timing       {wall_seconds, cpu_seconds, trace_seconds}
    digest       sha256 of the canonical JSON of every other field

The digest makes any edit of a committed record detectable by ``retainz verify``.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess

from retainz import __version__
from retainz.runrecord import SCHEMA, digest

__all__ = ["METRIC_KEYS", "finalize", "provenance"]

#: Metrics every ok record must carry (the replay contract).
METRIC_KEYS = ("host_bytes", "gc_bytes", "waf", "resets", "finishes", "dead_space_byte_steps",
               "unused_capacity_bytes", "unused_capacity_byte_steps", "peak_occupancy", "capacity_stop_step",
               "generations_committed", "decisions", "decision_cpu_seconds")


def finalize(rec: dict) -> dict:
    """Stamp the schema and the digest on a record (returns a new dict)."""
    out = {"schema": SCHEMA, **{k: v for k, v in rec.items() if k != "digest"}}
    out["digest"] = digest(out)
    return out


@functools.lru_cache(maxsize=1)
def provenance() -> dict:
    """Where a record came from: package version, git revision of the source tree (or "unknown"),
    whether tracked files had local changes, Python version and platform (no host name)."""
    src = os.path.dirname(os.path.abspath(__file__))
    rev, dirty = "unknown", None
    try:
        r = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            rev = r.stdout.strip()
            d = subprocess.run(["git", "-C", src, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
            dirty = bool(d.stdout.strip()) if d.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"retainz_version": __version__, "git_revision": rev, "git_dirty": dirty,
            "python": platform.python_version(), "platform": f"{platform.system()}-{platform.machine()}"}
