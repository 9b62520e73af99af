"""Run records, the one format between the experiments and their analysis: the canonical JSON that ids
and digests are computed over, the record schema, its digest, and the one reader of a directory of
records.  It imports nothing of the store, so analysis can read records without it."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

__all__ = ["SCHEMA", "canonical_json", "digest", "load_records"]

#: The schema every run record carries (``docs/experiments.md``).
SCHEMA = "retainz.run/1"


def canonical_json(obj: Any) -> str:
    """Sorted-key, compact JSON: the text that ids and digests are computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest(rec: dict) -> str:
    """sha256 over the canonical JSON of ``rec`` without its ``digest`` field."""
    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def load_records(directory: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """Read every record (``*.json``, not hidden) directly in ``directory``, in name order: the one reader
    of run records (``retainz verify`` and ``retainz analyze`` both use it).

    Returns:
        ``([(file name, record)], problems)``: a problem is ``"NAME: what is wrong"`` for a file that
        cannot be read, is not UTF-8 JSON, or is JSON but not an object.  Nothing is raised for a bad
        file: the caller decides (verify lists them all; analysis refuses at the first).
    """
    recs, problems = [], []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                rec = json.load(f)
        except UnicodeDecodeError as e:
            problems.append(f"{name}: not a JSON run record: byte 0x{e.object[e.start]:02x} is not UTF-8 "
                            "text (a binary file?)")
            continue
        except (OSError, json.JSONDecodeError) as e:
            problems.append(f"{name}: not a JSON run record (unreadable: {e})")
            continue
        if not isinstance(rec, dict):
            problems.append(f"{name}: not a run record (a JSON {type(rec).__name__}, not an object)")
            continue
        recs.append((name, rec))
    return recs, problems
