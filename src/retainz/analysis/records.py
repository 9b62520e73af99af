"""Reading run records for analysis (through the record module, :mod:`retainz.runrecord`: analysis
reads records and never imports the store).

Helpers turn a record into the quantities figures, the table and the claims use.
"""

from __future__ import annotations

import os
import re

from retainz.runrecord import digest, load_records

__all__ = ["load", "Runs", "TamperedRecordError", "policy_name", "POLICY_ORDER", "POLICY_STYLE", "rule_family", "layout_name",
           "zones_of", "payload_verified", "mean_gib", "steps_run", "stranded_gib", "GIB", "slug", "layout_rank", "rule_rank", "policy_rank", "base_policy"]

GIB = float(1 << 30)

#: Policies in display order: (base name, display name).
POLICY_ORDER = [("retainz", "RetainZ"), ("retainz-coarse", "RetainZ coarse"), ("retainz-noisy", "RetainZ noisy"),
                ("retainz-nohint", "RetainZ no-hint"), ("oracle", "Oracle"), ("dedicated", "Dedicated"),
                ("common", "Common"), ("greedy", "Greedy log"), ("zenfs", "ZenFS-Alloc"),
                ("zenfs-nohint", "ZenFS-Alloc no-hint")]
#: base policy -> (color, marker, linestyle)
POLICY_STYLE = {
    "retainz": ("#1f4e9c", "o", "-"), "retainz-coarse": ("#4f9fd8", "s", "-"),
    "retainz-noisy": ("#7fb7a4", "D", "-"), "retainz-nohint": ("#9a7fc1", "v", "-"),
    "oracle": ("#222222", "", ":"), "dedicated": ("#e6a23c", "^", "--"), "common": ("#b5651d", "<", "--"),
    "greedy": ("#8c8c8c", ">", "--"), "zenfs": ("#c0392b", "x", "-"),
    "zenfs-nohint": ("#e67e73", "+", ":"), "zenfs:migrate=all": ("#7b241c", "1", "-."),
}


def slug(text: str) -> str:
    """``llama3-8b-fsdp:ranks=8`` -> ``llama3-8b-fsdp-ranks-8`` (claim ids)."""
    return re.sub(r"[^a-z0-9.]+", "-", str(text).lower()).strip("-")


def base_policy(spec: str) -> str:
    return spec.partition(":")[0]


def policy_name(spec: str) -> str:
    """Display name of a policy spec (``retainz-noisy:error=0.5,seed=1`` -> ``RetainZ noisy e=0.5``)."""
    base, _, params = spec.partition(":")
    name = dict(POLICY_ORDER).get(base, base)
    if base == "retainz-noisy":
        kv = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
        name += f" e={kv.get('error', '?')}"
    elif base.startswith("zenfs") and params:
        name += " " + params.replace(",", " ")
    return name


def policy_rank(spec: str) -> tuple:
    bases = [b for b, _ in POLICY_ORDER]
    base = base_policy(spec)
    return (bases.index(base) if base in bases else len(bases), spec)


def rule_family(rule: str) -> str:
    """Display name of a retention rule (``torchtitan:...,async=true`` -> ``TorchTitan async``)."""
    name, _, params = rule.partition(":")
    kv = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
    if name == "torchtitan":
        return f"TorchTitan keep {kv.get('keep_latest_k', '?')}" + (" async" if kv.get("async") == "true" else "")
    if name == "megatron":
        return f"Megatron retain {kv.get('retain_interval', '?')}"
    if name == "lightning":
        return f"Lightning top-{kv.get('save_top_k', '?')}"
    return name


def layout_rank(layout: str) -> tuple:
    """Sort key: small models first."""
    order = ["smollm2", "pythia", "llama3"]
    return (next((i for i, o in enumerate(order) if layout.startswith(o)), len(order)), layout)


def rule_rank(rule: str) -> tuple:
    order = ["torchtitan", "megatron", "lightning", "hf", "orbax"]
    name = rule.partition(":")[0]
    return (order.index(name) if name in order else len(order), rule)


def layout_name(layout: str) -> str:
    names = {"smollm2-135m-dcp": "SmolLM2-135M", "pythia-1b": "Pythia-1B"}
    if layout.startswith("llama3-8b-fsdp"):
        ranks = layout.partition("ranks=")[2]
        return "Llama-3-8B FSDP" + (f" x{ranks}" if ranks else "")
    return names.get(layout, layout)


def zones_of(rec: dict) -> int | None:
    """The device's data-zone count: the replay's ``zones`` (data zones, meta and reserve excluded),
    else its geometry, else the case's explicit zones."""
    m = rec.get("metrics", {})
    if isinstance(m.get("zones"), int):
        return m["zones"]
    g = m.get("geometry") or {}
    for k in ("zones", "data_zones", "nr_zones"):
        if isinstance(g.get(k), int):
            return g[k]
    return rec["inputs"].get("zones")


def payload_verified(rec: dict) -> int:
    """Payload bytes the replay read back and checked (0 on the payload-less device)."""
    m = rec.get("metrics", {})
    return int(m.get("bytes_verified", m.get("payload_bytes_verified", 0)) or 0)


def steps_run(rec: dict) -> int:
    """Training steps the run covered: its capacity-stop step, else the trace's steps (at least 1)."""
    stop = rec.get("capacity_stop_step")
    return max(1, stop if stop is not None else rec["inputs"]["steps"])


def mean_gib(rec: dict, key: str) -> float:
    """A byte-steps metric divided by the steps actually run (:func:`steps_run`), in GiB: the mean
    over the run, not diluted by steps a stopped run never reached."""
    return rec["metrics"][key] / steps_run(rec) / GIB


def stranded_gib(rec: dict) -> float | None:
    """GiB of writable capacity stranded in partly filled zones at the capacity stop (the policy
    would not write there), None without a stop or for a record made before stop states."""
    st = rec.get("capacity_stop_state")
    return st["open_free_bytes"] / GIB if st else None


class Runs:
    """The ok records of a folder, with the failed ones counted."""

    def __init__(self, records: list[dict], failed: list[dict], source: str):
        self.records = records
        self.failed = failed
        self.source = source

    def of(self, experiment: str, **inputs) -> list[dict]:
        """Ok records of one experiment whose inputs equal the given values."""
        return [r for r in self.records if r["tags"]["experiment"] == experiment
                and all(r["inputs"].get(k) == v for k, v in inputs.items())]

    def one(self, experiment: str, **inputs) -> dict | None:
        rs = self.of(experiment, **inputs)
        return rs[0] if len(rs) == 1 else None

    def values(self, experiment: str, key: str) -> list:
        """Distinct values of an input key among an experiment's records, in first-seen order."""
        out = []
        for r in self.records:
            if r["tags"]["experiment"] == experiment and r["inputs"].get(key) not in out:
                out.append(r["inputs"].get(key))
        return out


class TamperedRecordError(ValueError):
    """A record whose digest does not match its content (edited after it was written)."""

    exit_status = 1   # ``retainz analyze`` exits 1, as ``retainz verify`` does for a bad record


class NoRecordsError(ValueError):
    """A records folder holds no ok run record: nothing to analyze (an empty claims file would pass)."""

    exit_status = 1   # an operation failure, as for a tampered record


def load(directory: str) -> Runs:
    """Read every record (``*.json``) directly in ``directory``.

    Raises:
        TamperedRecordError: a record has no digest or its digest does not match its content
            (names the file; ``retainz verify`` lists every problem).
        ValueError: a ``*.json`` file that is not JSON text, or JSON that is not a run record (names
            the file).
    """
    recs, problems = load_records(directory)
    if problems:
        raise ValueError(f"{os.path.join(directory, problems[0])}; run `retainz verify {directory}`")
    ok, failed = [], []
    for name, rec in recs:
        path = os.path.join(directory, name)
        if not {"tags", "inputs", "status"} <= rec.keys():
            raise ValueError(f"{path}: not a run record (a JSON object without tags, inputs and status); "
                             f"run `retainz verify {directory}`")
        if rec.get("digest") != digest(rec):
            what = "has no digest" if "digest" not in rec else "digest mismatch"
            raise TamperedRecordError(f"{path}: {what} (the record was edited after it was written); "
                                      f"refusing to analyze it: run `retainz verify {directory}`")
        (ok if rec.get("status") == "ok" else failed).append(rec)
    return Runs(ok, failed, directory)
