"""``paper_claims.json``: every number the paper states, with its rounding and the runs it comes from.

Format (``docs/experiments.md``)::

    {"format": 1, "source": "<records folder>",
     "claims": [{"id": "...", "value": 1.02 | null, "rounding": 2, "runs": ["<case id>", ...],
                 "text": "what the number is"}, ...]}

``value`` is already rounded to ``rounding`` decimals (null when the quantity does not exist, e.g. no
capacity stop within the sweep); a categorical claim (a capacity stop's cause) has a string value and
``rounding`` null.  :func:`check` compares the claims with an expected file by id and rounded value.
"""

from __future__ import annotations

import json
import math
import os

from retainz.analysis.records import (
    GIB,
    Runs,
    base_policy,
    mean_gib,
    payload_verified,
    policy_name,
    rule_family,
    slug,
    stranded_gib,
    zones_of,
)

__all__ = ["add_claim", "compute_claims", "check", "write_claims", "stop_pressure", "stop_cause", "REFERENCE_PRESSURE", "PRINCIPAL"]

#: Metrics that are outcomes of placement (not timing): equal inputs and decisions must give equal values.
OUTCOME_KEYS = ("host_bytes", "gc_bytes", "waf", "resets", "finishes", "dead_space_byte_steps",
                "unused_capacity_bytes", "unused_capacity_byte_steps", "peak_occupancy", "capacity_stop_step",
                "generations_committed", "decisions")

#: The pressure the headline WAF claims are stated at.
REFERENCE_PRESSURE = 0.9
#: Policies the principal result is stated for: RetainZ and ZenFS-Alloc three ways (as upstream,
#: without application hints, migrating every file).
PRINCIPAL = ("retainz", "zenfs", "zenfs-nohint", "zenfs:migrate=all")


def add_claim(out: list, cid: str, value, rounding: int | None, runs: list[dict], text: str) -> None:
    """Append one claim to ``out`` in the claims file format (module docstring).

    Args:
        out: the claims so far (appended to).
        cid: the claim's id (``experiment.what...``).
        value: a number (rounded here to ``rounding`` decimals; an int when ``rounding`` is 0), a
            string (a categorical claim: its rounding becomes null) or None (the quantity does not exist).
        rounding: decimals.
        runs: the records the value comes from (their ids are listed, sorted).
        text: what the number is.
    """
    if isinstance(value, str):
        rounding = None
    elif value is not None:
        value = round(float(value), rounding)
        if rounding == 0:
            value = int(value)
    out.append({"id": cid, "value": value, "rounding": rounding, "runs": sorted(r["id"] for r in runs),
                "text": text})


def stop_pressure(records: list[dict]) -> tuple[float | None, list[dict]]:
    """Lowest pressure at which a run hit a capacity stop (None if none did), and the runs that show it
    (every run at or below that pressure, or all runs when none stopped)."""
    stops = sorted(r["inputs"]["pressure"] for r in records if r["capacity_stop_step"] is not None)
    if not stops:
        return None, records
    p = stops[0]
    return p, [r for r in records if r["inputs"]["pressure"] <= p]


def stop_cause(records: list[dict]) -> str | None:
    """The cause of the capacity stop at the lowest stop pressure (:func:`stop_pressure`); when runs
    there differ, their causes joined with ``+`` in sorted order; None without a stop."""
    p, _ = stop_pressure(records)
    if p is None:
        return None
    causes = sorted({r.get("capacity_stop_cause") or "unrecorded" for r in records
                     if r["inputs"]["pressure"] == p and r["capacity_stop_step"] is not None})
    return "+".join(causes)


def _first_stop(records: list[dict]) -> dict | None:
    p, _ = stop_pressure(records)
    at = [r for r in records if p is not None and r["inputs"]["pressure"] == p and r["capacity_stop_step"] is not None]
    return at[0] if len(at) == 1 else None


def _pressure_claims(runs: Runs, out: list) -> None:
    recs = runs.of("pressure")
    workloads = []
    for r in recs:
        w = (r["inputs"]["layout"], r["inputs"]["rule"])
        if w not in workloads:
            workloads.append(w)
    best = {"retainz": [], "zenfs": []}
    for layout, rule in workloads:
        wl = f"{slug(layout)}.{slug(rule.partition(':')[0])}"
        wrecs = [r for r in recs if r["inputs"]["layout"] == layout and r["inputs"]["rule"] == rule]
        policies = []
        for r in wrecs:
            if r["inputs"]["policy"] not in policies:
                policies.append(r["inputs"]["policy"])
        for pol in policies:
            precs = [r for r in wrecs if r["inputs"]["policy"] == pol]
            p, used = stop_pressure(precs)
            name = f"{policy_name(pol)} on {layout} / {rule_family(rule)}"
            add_claim(out, f"pressure.{wl}.{slug(pol)}.stop_pressure", p, 2, used,
                   f"lowest pressure with a capacity stop for {name} (null: none up to "
                   f"{max(r['inputs']['pressure'] for r in precs)})")
            first = _first_stop(precs)
            if p is not None:
                add_claim(out, f"pressure.{wl}.{slug(pol)}.stop_cause", stop_cause(precs), None,
                       [r for r in used if r["inputs"]["pressure"] == p],
                       f"cause of {name}'s capacity stop at its lowest stop pressure (admission, allocation, "
                       "gc or journal)")
            if first is not None and first.get("capacity_stop_state"):
                st = first["capacity_stop_state"]
                add_claim(out, f"pressure.{wl}.{slug(pol)}.stop_stranded_gib", stranded_gib(first), 1, [first],
                       f"GiB writable in partly filled zones when {name} stopped at pressure {p}")
                add_claim(out, f"pressure.{wl}.{slug(pol)}.stop_dead_gib", st["dead_bytes"] / GIB, 1, [first],
                       f"GiB of dead data not reclaimed when {name} stopped at pressure {p}")
                add_claim(out, f"pressure.{wl}.{slug(pol)}.stop_empty_zones", st["empty_zones"], 0, [first],
                       f"empty zones when {name} stopped at pressure {p}")
            at = [r for r in precs if r["inputs"]["pressure"] == REFERENCE_PRESSURE]
            if len(at) == 1:
                add_claim(out, f"pressure.{wl}.{slug(pol)}.waf_p{REFERENCE_PRESSURE}", at[0]["metrics"]["waf"], 2, at,
                       f"WAF of {name} at pressure {REFERENCE_PRESSURE}")
                if pol in best:
                    best[pol].append(at[0])
        rz = [r for r in wrecs if r["inputs"]["policy"] == "retainz" and r["inputs"]["pressure"] == REFERENCE_PRESSURE]
        zf = [r for r in wrecs if r["inputs"]["policy"] == "zenfs" and r["inputs"]["pressure"] == REFERENCE_PRESSURE]
        if len(rz) == 1 and len(zf) == 1:
            add_claim(out, f"pressure.{wl}.gc_bytes_zenfs_over_retainz_p{REFERENCE_PRESSURE}",
                   zf[0]["metrics"]["gc_bytes"] / rz[0]["metrics"]["gc_bytes"] if rz[0]["metrics"]["gc_bytes"]
                   else None, 1, rz + zf,
                   f"GC bytes of ZenFS-Alloc over RetainZ on {layout} / {rule_family(rule)} at pressure "
                   f"{REFERENCE_PRESSURE} (null: RetainZ copied nothing)")
    if best["retainz"] and best["zenfs"]:
        add_claim(out, f"principal.waf_retainz_max_p{REFERENCE_PRESSURE}",
               max(r["metrics"]["waf"] for r in best["retainz"]), 2, best["retainz"],
               f"highest RetainZ WAF over all pressure-sweep workloads at pressure {REFERENCE_PRESSURE}")
        add_claim(out, f"principal.waf_zenfs_min_p{REFERENCE_PRESSURE}",
               min(r["metrics"]["waf"] for r in best["zenfs"]), 2, best["zenfs"],
               f"lowest ZenFS-Alloc WAF over all pressure-sweep workloads at pressure {REFERENCE_PRESSURE}")
    lowest: dict[str, dict] = {}
    for pol in PRINCIPAL:
        prs = [r for r in recs if r["inputs"]["policy"] == pol]
        if not prs:
            continue
        stops = []
        for layout, rule in workloads:
            p, _ = stop_pressure([r for r in prs if r["inputs"]["layout"] == layout and r["inputs"]["rule"] == rule])
            stops.append(p)
        lowest[pol] = dict(zip(workloads, stops, strict=True))
        no_stop = sum(p is None for p in stops)
        add_claim(out, f"principal.workloads_without_stop.{slug(pol)}", no_stop, 0, prs,
               f"pressure-sweep workloads (of {len(stops)}) where {policy_name(pol)} never hit a capacity stop")
        found = [p for p in stops if p is not None]
        pmin = min(found) if found else None
        add_claim(out, f"principal.stop_pressure_min.{slug(pol)}", pmin, 2, prs,
               f"lowest capacity-stop pressure of {policy_name(pol)} over all workloads (null: none)")
        if pmin is not None:
            at = [r for r in prs if r["inputs"]["pressure"] == pmin and r["capacity_stop_step"] is not None]
            add_claim(out, f"principal.stop_cause_min.{slug(pol)}",
                   "+".join(sorted({r.get("capacity_stop_cause") or "unrecorded" for r in at})), None, at,
                   f"cause of {policy_name(pol)}'s capacity stops at its lowest stop pressure {pmin}")
    top = max((r["inputs"]["pressure"] for r in recs), default=None)
    for layout, rule in workloads:
        wl = f"{slug(layout)}.{slug(rule.partition(':')[0])}"
        if "retainz" not in lowest or "zenfs" not in lowest:
            break
        z, rz = lowest["zenfs"][(layout, rule)], lowest["retainz"][(layout, rule)]
        wrecs = [r for r in recs if r["inputs"]["layout"] == layout and r["inputs"]["rule"] == rule
                 and r["inputs"]["policy"] in ("retainz", "zenfs")]
        add_claim(out, f"principal.margin.{wl}", None if z is None else (rz if rz is not None else top) - z, 2, wrecs,
               f"RetainZ's pressure margin over ZenFS-Alloc on {layout} / {rule_family(rule)}: RetainZ's lowest "
               f"stop pressure (or the sweep's highest, {top}, when it never stopped: a lower bound) minus "
               "ZenFS-Alloc's (null: ZenFS-Alloc never stopped)")
    zenfs_runs = [r for r in runs.records if base_policy(r["inputs"]["policy"]).startswith("zenfs")]
    if zenfs_runs:
        adm = [r for r in zenfs_runs if r.get("capacity_stop_cause") == "admission"]
        add_claim(out, "principal.zenfs_admission_stops", len(adm), 0, adm or zenfs_runs,
               "recorded ZenFS-Alloc runs (any variant, any experiment) whose capacity stop was our store's "
               "admission (upstream has none: must be 0)")


def _placement_claims(runs: Runs, out: list) -> None:
    for r in runs.of("placement"):
        row = slug(r["tags"]["label"] or r["inputs"]["policy"])
        pol = slug(r["inputs"]["policy"].partition(":")[0])
        m, what = r["metrics"], f"placement row '{r['tags']['label']}' under {policy_name(r['inputs']['policy'])}"
        add_claim(out, f"placement.{row}.{pol}.waf", m["waf"], 2, [r], f"WAF, {what}")
        add_claim(out, f"placement.{row}.{pol}.gc_gib", m["gc_bytes"] / GIB, 1, [r], f"GC GiB copied, {what}")
        add_claim(out, f"placement.{row}.{pol}.dead_gib", mean_gib(r, "dead_space_byte_steps"), 1, [r],
               f"mean dead-but-unreclaimed GiB over the steps run, {what}")
        add_claim(out, f"placement.{row}.{pol}.unused_gib", mean_gib(r, "unused_capacity_byte_steps"), 1, [r],
               f"mean unusable GiB over the steps run (capacity finished or left part-empty, unwritten), {what}")
        add_claim(out, f"placement.{row}.{pol}.capacity_stop_step", r["capacity_stop_step"], 0, [r],
               f"capacity stop step (null: none), {what}")
        if r["capacity_stop_step"] is not None:
            add_claim(out, f"placement.{row}.{pol}.stop_cause", r.get("capacity_stop_cause") or "unrecorded", None,
                   [r], f"cause of the capacity stop, {what}")
            add_claim(out, f"placement.{row}.{pol}.stranded_gib", stranded_gib(r), 1, [r],
                   f"GiB writable in partly filled zones at the capacity stop, {what}")


def _cost_claims(runs: Runs, out: list) -> None:
    recs = [r for r in runs.of("cost") if r["metrics"]["decisions"]]
    variants: dict[str, list[dict]] = {}
    for r in recs:
        v = base_policy(r["inputs"]["policy"]) + ("-recompute" if r["inputs"]["verify_summaries"] else "")
        variants.setdefault(v, []).append(r)
    for v, rs in variants.items():
        rs = sorted(rs, key=lambda r: zones_of(r) or 0)
        for r in rs:
            us = 1e6 * r["metrics"]["decision_cpu_seconds"] / r["metrics"]["decisions"]
            add_claim(out, f"cost.{v}.us_per_decision.z{zones_of(r)}", us, 2, [r],
                   f"decision CPU microseconds per extent, {v}, {zones_of(r)} zones")
            add_claim(out, f"cost.{v}.replay_cpu_us_per_extent.z{zones_of(r)}",
                   1e6 * r["timing"]["cpu_seconds"] / r["metrics"]["decisions"], 2, [r],
                   f"CPU microseconds of the whole replay per extent placed (process time), {v}, "
                   f"{zones_of(r)} zones")
        if len(rs) >= 2:
            lo, hi = rs[0], rs[-1]
            f = lambda r: r["metrics"]["decision_cpu_seconds"] / r["metrics"]["decisions"]  # noqa: E731
            add_claim(out, f"cost.{v}.growth", f(hi) / f(lo) if f(lo) else None, 1, [lo, hi],
                   f"decision cost at {zones_of(hi)} zones over that at {zones_of(lo)} zones ({v}; "
                   f"zone count grew {zones_of(hi) / max(1, zones_of(lo) or 1):.0f}x)")
    # cached summaries vs recompute: same decisions, so the same metrics (timing aside)
    same, pairs = True, []
    for r in variants.get("retainz-recompute", []):
        twin = [c for c in variants.get("retainz", []) if c["inputs"]["zone_size"] == r["inputs"]["zone_size"]
                and c["inputs"]["zone_capacity"] == r["inputs"]["zone_capacity"]]
        if len(twin) == 1:
            pairs += [r, twin[0]]
            same &= all(r["metrics"].get(k) == twin[0]["metrics"].get(k) for k in OUTCOME_KEYS)
            twin = twin[0]
            if twin["timing"]["cpu_seconds"] > 0:
                add_claim(out, f"cost.recompute_slowdown.z{zones_of(r)}",
                       r["timing"]["cpu_seconds"] / twin["timing"]["cpu_seconds"], 1, [r, twin],
                       f"replay CPU with summaries recomputed on every decision over replay CPU with cached "
                       f"summaries, {zones_of(r)} zones")
    if pairs:
        add_claim(out, "cost.recompute_identical", 1 if same else 0, 0, pairs,
               "1 when every recompute-mode run has exactly the metrics of its cached-summary twin")


def _hint_claims(runs: Runs, out: list) -> None:
    for r in runs.of("hints"):
        add_claim(out, f"hints.{slug(r['inputs']['rule'].partition(':')[0])}.{slug(r['inputs']['policy'])}.waf",
               r["metrics"]["waf"], 2, [r],
               f"WAF with hints '{policy_name(r['inputs']['policy'])}', {rule_family(r['inputs']['rule'])}, "
               f"pressure {r['inputs']['pressure']}")


def _admission_claims(runs: Runs, out: list) -> None:
    for r in runs.of("admission"):
        i = r["inputs"]
        add_claim(out, f"admission.{slug(i['rule'].partition(':')[0])}.{slug(i['policy'])}.p{i['pressure']}.waf",
               r["metrics"]["waf"], 2, [r],
               f"WAF of {policy_name(i['policy'])}, {rule_family(i['rule'])}, pressure {i['pressure']}")


def _capacity_claims(runs: Runs, out: list) -> None:
    recs = runs.of("capacity")
    files = [r for r in recs if r["inputs"]["device"] == "file"]
    if not files:
        return
    verified = sum(payload_verified(r) for r in files)
    add_claim(out, "capacity.payload_gib_verified", verified / GIB, 2, files,
           "GiB of pattern payload written to FileDevice, read back and checked (all file-device trials)")
    add_claim(out, "capacity.file_trials", len(files), 0, files, "capacity trials run on FileDevice with payload")
    agree, pairs = True, []
    keys = [k for k in OUTCOME_KEYS if k != "decisions"]
    ddiff = 0
    for r in files:
        twin = _memory_twins(recs, r)
        if len(twin) == 1:
            pairs += [r, twin[0]]
            agree &= all(r["metrics"][k] == twin[0]["metrics"][k] for k in keys)
            ddiff = max(ddiff, abs(r["metrics"]["decisions"] - twin[0]["metrics"]["decisions"]))
    if pairs:
        add_claim(out, "capacity.file_matches_memory", 1 if agree else 0, 0, pairs,
               "1 when every FileDevice trial has exactly the placement outcome (bytes, GC, resets, finishes, "
               "dead/unused byte-steps, peak occupancy, capacity stop, commits) of the same case on the "
               "in-memory device")
        add_claim(out, "capacity.max_decision_difference", ddiff, 0, pairs,
               "largest difference in allocation decisions between a FileDevice trial and its in-memory twin")
    stops = [r for r in files if r["capacity_stop_step"] is not None]
    add_claim(out, "capacity.file_trials_with_stop", len(stops), 0, files,
           "FileDevice trials that ended in a capacity stop (committed data intact: verified on read-back)")


def _memory_twins(recs: list, r: dict) -> list:
    """Records of the same case as ``r`` run on the in-memory device (inputs equal but the device)."""
    same = {k: v for k, v in r["inputs"].items() if k != "device"}
    return [m for m in recs if m["inputs"]["device"] == "memory"
            and {k: v for k, v in m["inputs"].items() if k != "device"} == same]


def _guest_claims(runs: Runs, out: list) -> None:
    recs = runs.of("guest")
    guests = [r for r in recs if r["inputs"]["device"] == "guest"]
    if not guests:
        return
    keys = [k for k in OUTCOME_KEYS if k != "decisions"]
    agree, pairs = True, []
    for r in guests:
        twin = _memory_twins(recs, r)
        if len(twin) == 1:
            pairs += [r, twin[0]]
            agree &= all(r["metrics"][k] == twin[0]["metrics"][k] for k in keys)
    if pairs:
        add_claim(out, "guest.matches_memory", 1 if agree else 0, 0, pairs,
               "1 when every replay on the QEMU NVMe ZNS guest has exactly the placement outcome of the same "
               "case on the in-memory device")


def compute_claims(runs: Runs) -> list[dict]:
    """The claims of the replay experiments (pressure, placement, cost, hints, admission, capacity,
    guest), in a stable order.  The file-system comparison and the regime map state their own
    (:func:`retainz.analysis.filesystems.filesystem_claims`, :func:`retainz.analysis.regimes.regime_claims`);
    :func:`retainz.analysis.analyze` gathers them all."""
    out: list[dict] = []
    for part in (_pressure_claims, _placement_claims, _cost_claims, _hint_claims, _admission_claims,
                 _capacity_claims, _guest_claims):
        part(runs, out)
    return out


def expected_source(path: str) -> str | None:
    """The records folder an expected-claims file was written from (its ``source``), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            source = json.load(f).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) else None


def write_claims(path: str, claims: list[dict], source: str) -> None:
    """Write ``claims`` (read from the records in ``source``) to ``path`` in the claims file format.

    Raises:
        ValueError: two claims share an id (a bug in a claims part: ids must be unique).
    """
    ids = [c["id"] for c in claims]
    if len(ids) != len(set(ids)):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"claim ids must be unique: {', '.join(dup[:5])} appear more than once")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "source": source, "claims": claims}, f, indent=1)
        f.write("\n")


#: Sections of the Markdown claims report, by the first component of a claim id, in reading order.
REPORT_SECTIONS = [("principal", "The principal result"), ("regime", "The regime map"),
                   ("pressure", "WAF and capacity stops against space pressure"),
                   ("placement", "The placement table"), ("hints", "Hint precision"),
                   ("admission", "Common admission"), ("cost", "Allocation cost"),
                   ("capacity", "Payload on a FileDevice"), ("filesystems", "btrfs and f2fs on the same namespace")]


def _shown(value, rounding: int | None) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if rounding is None:
        return f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"
    return f"{value:,.{rounding}f}" if rounding > 0 else f"{round(value):,}"


def render_claims_markdown(claims: list[dict], source: str) -> str:
    """The claims as a Markdown report (``paper_claims.md``): one section per kind of claim, a table of
    what each claim says, its value as rounded for comparison, and how many run records it rests on.
    The JSON file stays the one the check reads; this is for people."""
    lines = ["# Claims", "", f"Recomputed from the run records in `{source}` by `retainz analyze`; "
             f"{len(claims)} claims. Each value is shown at the rounding `--check` compares. "
             "`paper_claims.json` holds the same claims with the ids of the runs behind each.", ""]
    known = {k for k, _ in REPORT_SECTIONS}
    sections = REPORT_SECTIONS + sorted({(c["id"].split(".")[0], c["id"].split(".")[0]) for c in claims
                                         if c["id"].split(".")[0] not in known})
    for key, title in sections:
        part = [c for c in claims if c["id"].split(".")[0] == key]
        if not part:
            continue
        lines += [f"## {title}", "", "| claim | value | runs |", "|---|---:|---:|"]
        for c in part:
            text = c.get("text", c["id"]).replace("|", "\\|")
            lines.append(f"| {text} | {_shown(c['value'], c.get('rounding'))} | {len(c.get('runs', []))} |")
        lines.append("")
    return "\n".join(lines)


def read_expected(path: str) -> dict[str, dict]:
    """The claims of an expected-claims file (:func:`write_claims`), by id.

    Raises:
        FileNotFoundError: no such file (or a directory).
        ValueError: not JSON text, or JSON that is not a claims file (an object whose ``claims`` lists
            objects with an ``id`` and a ``value``); the message names the file.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such expected-claims file (write one with --write-expected)")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not an expected-claims file (not JSON text: {e})") from None
    claims = doc.get("claims") if isinstance(doc, dict) else None
    if not isinstance(claims, list) or not all(isinstance(c, dict) and {"id", "value"} <= c.keys() for c in claims):
        raise ValueError(f"{path}: not an expected-claims file (a JSON object whose 'claims' lists objects with "
                         "an id and a value)")
    return {c["id"]: c for c in claims}


def check(claims: list[dict], expected_path: str) -> list[str]:
    """Differences between ``claims`` and the expected file (by id and rounded value).

    Raises:
        FileNotFoundError, ValueError: as :func:`read_expected`."""
    exp = read_expected(expected_path)
    got = {c["id"]: c for c in claims}
    diffs = []
    for cid in sorted(set(exp) | set(got)):
        if cid not in got:
            diffs.append(f"{cid}: expected {exp[cid]['value']!r}, not computed")
        elif cid not in exp:
            diffs.append(f"{cid}: computed {got[cid]['value']!r}, not in the expected file")
        else:
            a, b = got[cid]["value"], exp[cid]["value"]
            same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, abs_tol=1e-12))
            if not same:
                diffs.append(f"{cid}: computed {a!r}, expected {b!r}")
    return diffs
