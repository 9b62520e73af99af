"""``retainz verify DIR``: check run records (schema, digests, hashes, internal consistency).

Checks per record:

* it parses and has every field of its status (``docs/experiments.md``), schema ``retainz.run/1``;
* ``id`` equals :func:`~retainz.experiments.manifest.case_id` of its tags and inputs, and the file is
  named after it;
* ``digest`` equals the recomputed digest (any edit shows);
* ok records: every metric of :data:`~retainz.experiments.record.METRIC_KEYS`; non-negative counters;
  ``waf == (host_bytes + gc_bytes) / host_bytes`` (1.0 when nothing was written);
  ``capacity_stop_step`` null or within the trace's steps and equal to the metrics' one;
  ``capacity_stop_cause`` (when recorded) one of ``STOP_CAUSES`` exactly when there is a stop;
  ``decisions >= 0`` with ``decision_cpu_seconds >= 0``;
* the trace sha256 is 64 hex digits, equal to the replay's own trace hash when it reports one, equal
  across records of the same trace spec, and equal to the cached trace file's sha256 when that file is
  present.
"""

from __future__ import annotations

import math
import os
import re

from retainz.errors import STOP_CAUSES
from retainz.experiments.manifest import TAG_FIELDS, case_id
from retainz.experiments.record import METRIC_KEYS
from retainz.runrecord import SCHEMA, digest, load_records

__all__ = ["verify_dir", "verify_record"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_COMMON = ("schema", "id", "manifest", "tags", "inputs", "backend", "provenance", "status", "timing", "digest")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def verify_record(name: str, rec: dict, directory: str | None = None) -> list[str]:
    """Problems with one record (empty when it is valid)."""
    p: list[str] = []
    missing = [k for k in _COMMON if k not in rec]
    status = rec.get("status")
    if status == "ok":
        missing += [k for k in ("trace", "metrics", "capacity_stop_step") if k not in rec]
    elif status == "failed":
        missing += [k for k in ("error",) if k not in rec]
    elif "status" in rec:
        p.append(f"{name}: status must be 'ok' or 'failed', got {status!r}")
    if missing:
        p.append(f"{name}: missing field(s) {', '.join(missing)}")
        return p
    if rec["schema"] != SCHEMA:
        p.append(f"{name}: schema {rec['schema']!r}, expected {SCHEMA!r}")
    if rec["digest"] != digest(rec):
        p.append(f"{name}: digest mismatch (the record was edited after it was written)")
    tags, inputs = rec["tags"], rec["inputs"]
    if not isinstance(tags, dict) or not isinstance(inputs, dict) or set(tags) != set(TAG_FIELDS):
        p.append(f"{name}: tags/inputs malformed")
        return p
    try:
        cid = case_id(tags, inputs)
    except (KeyError, TypeError) as e:
        p.append(f"{name}: inputs lack {e}")
        return p
    if rec["id"] != cid:
        p.append(f"{name}: id {rec['id']} does not match its tags and inputs ({cid})")
    if name != f"{rec['id']}.json":
        p.append(f"{name}: file name does not match id {rec['id']}")
    tr = rec.get("trace")
    if tr is not None:
        if not isinstance(tr, dict) or not _HEX64.match(str(tr.get("sha256", ""))):
            p.append(f"{name}: trace sha256 is not 64 hex digits")
        elif directory and tr.get("file"):
            tp = os.path.normpath(os.path.join(directory, tr["file"]))
            if os.path.exists(tp):
                from retainz.trace.io import sha256_file

                if sha256_file(tp) != tr["sha256"]:
                    p.append(f"{name}: trace sha256 differs from the cached trace file {tr['file']}")
    if status != "ok":
        return p
    m = rec["metrics"]
    if not isinstance(m, dict):
        p.append(f"{name}: metrics is not an object")
        return p
    if inputs.get("system") is not None:
        return p + _verify_filesystem(name, m, rec)
    absent = [k for k in METRIC_KEYS if k not in m]
    if absent:
        p.append(f"{name}: metrics lack {', '.join(absent)}")
        return p
    bad = [f"{name}: metric {k} must be a non-negative number, got {m[k]!r}" for k in METRIC_KEYS
           if k != "capacity_stop_step" and (not _num(m[k]) or m[k] < 0)]
    if bad:
        return p + bad
    host, gc = m["host_bytes"], m["gc_bytes"]
    want = (host + gc) / host if host else 1.0
    if not math.isclose(m["waf"], want, rel_tol=1e-9, abs_tol=1e-12):
        p.append(f"{name}: waf {m['waf']} != (host_bytes + gc_bytes) / host_bytes = {want}")
    stop = m["capacity_stop_step"]
    if stop != rec["capacity_stop_step"]:
        p.append(f"{name}: capacity_stop_step {rec['capacity_stop_step']!r} differs from metrics' {stop!r}")
    if stop is not None and (not isinstance(stop, int) or not 0 <= stop <= inputs.get("steps", stop)):
        p.append(f"{name}: capacity_stop_step {stop!r} is outside the trace's steps")
    if "capacity_stop_cause" in m:    # records made since stop causes were recorded
        cause = m["capacity_stop_cause"]
        if cause != rec.get("capacity_stop_cause"):
            p.append(f"{name}: capacity_stop_cause {rec.get('capacity_stop_cause')!r} differs from metrics' "
                     f"{cause!r}")
        if (stop is None) != (cause is None) or (cause is not None and cause not in STOP_CAUSES):
            p.append(f"{name}: capacity_stop_cause {cause!r} does not fit capacity_stop_step {stop!r} "
                     f"(a stop has one of {', '.join(STOP_CAUSES)}; no stop has none)")
    occ, eff = inputs.get("occupancy"), m.get("effective_occupancy")
    if occ is not None and (not _num(eff) or not 0 < eff <= occ * (1 + 1e-9)):
        p.append(f"{name}: effective_occupancy {eff!r} does not fit the occupancy asked, {occ!r} (sizing by "
                 "occupancy rounds the zone count up, so it is at most the one asked)")
    sha = m.get("trace_sha256")
    if sha is not None and tr is not None and sha != tr.get("sha256"):
        p.append(f"{name}: replay's trace_sha256 differs from the record's trace sha256")
    return p


def _verify_filesystem(name: str, m: dict, rec: dict) -> list[str]:
    """A file-system comparison record (retainz.experiments.filesystems): its fields and their arithmetic."""
    from retainz.experiments.filesystems import FS_METRIC_KEYS

    absent = [k for k in FS_METRIC_KEYS if k not in m]
    if absent:
        return [f"{name}: metrics lack {', '.join(absent)}"]
    p = []
    if m["system"] != rec["inputs"]["system"].partition(":")[0]:
        p.append(f"{name}: metrics' system {m['system']!r} is not the case's {rec['inputs']['system']!r}")
    if m["checkpoint_bytes"] and not math.isclose(m["device_waf"], m["device_bytes_written"] / m["checkpoint_bytes"],
                                                  rel_tol=1e-9):
        p.append(f"{name}: device_waf {m['device_waf']} != device_bytes_written / checkpoint_bytes")
    if (m["enospc_step"] is None) != (m["enospc_fill"] is None):
        p.append(f"{name}: enospc_step and enospc_fill must both be set or both null")
    if m["capacity_stop_step"] != m["enospc_step"] or rec["capacity_stop_step"] != m["enospc_step"]:
        p.append(f"{name}: capacity_stop_step differs from enospc_step")
    return p


def verify_dir(directory: str) -> tuple[int, list[str]]:
    """Verify every record in ``directory``; returns ``(records checked, problems)``."""
    recs, problems = load_records(directory)
    by_trace: dict[str, tuple[str, str]] = {}
    for name, rec in recs:
        problems += verify_record(name, rec, directory)
        tr = rec.get("trace")
        if isinstance(tr, dict) and tr.get("key") and tr.get("sha256"):
            seen = by_trace.setdefault(tr["key"], (name, tr["sha256"]))
            if seen[1] != tr["sha256"]:
                problems.append(f"{name}: trace {tr['key']} has sha256 {tr['sha256'][:12]}..., "
                                f"but {seen[0]} has {seen[1][:12]}...")
    if not recs and not problems:
        problems.append(f"{directory}: no records")
    return len(recs), problems
