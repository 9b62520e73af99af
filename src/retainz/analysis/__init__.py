"""Analysis: figures, the placement table and the claims file, recomputed from run records alone.

This package reads JSON records and uses numpy and matplotlib; it never imports the store, the
placement policies or the device layer (a test checks it), so the committed records under
``results/runs`` reproduce every number without rerunning anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from retainz.analysis import claims as _claims
from retainz.analysis.records import NoRecordsError, load

__all__ = ["analyze", "AnalysisReport"]


@dataclass
class AnalysisReport:
    """What :func:`analyze` wrote and found.

    Attributes:
        outputs: files written.
        lines: human-readable report lines (what was written, check differences).
        differences: ``--check`` differences (empty when the claims match).
        failed: True when ``--check`` found differences (or had no expected file).
    """

    outputs: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    failed: bool = False


def analyze(records_dir: str, out_dir: str, *, check: bool = False, expected: str | None = None,
            write_expected: bool = False) -> AnalysisReport:
    """Recompute every figure, the table and the claims from the records in ``records_dir``.

    Args:
        records_dir: folder of run records.
        out_dir: where ``pressure.pdf``, ``mechanisms.pdf``, ``zonemap.pdf``, ``regimes.pdf``,
            ``filesystems.pdf`` (each with a PNG copy; the regime map and the file-system outputs only
            when the records hold their experiments), ``placement_table.tex``, ``filesystems.md``, ``fleet_filesystems.md``, ``fleet_map.md`` (with fleet records), ``node_map.md`` (with node records),
            ``fdp_map.md`` and ``fdp.pdf`` (with FDP records, :mod:`retainz.analysis.fdpmap`),
            ``paper_claims.json`` and its Markdown rendering ``paper_claims.md`` go (created).
        check: compare the rounded claims with ``expected``; differences make the report failed.
        expected: the expected claims file for ``check``.
        write_expected: write the computed claims to ``expected`` (to accept a new recorded matrix).

    Raises:
        NoRecordsError: ``records_dir`` holds no ok record (nothing is written).
        TamperedRecordError: a record's digest does not match its content.
    """
    from retainz.analysis.fdpmap import fdp_claims, fdp_figure, fdp_table
    from retainz.analysis.figures import mechanisms_figure, pressure_figure, setup_style
    from retainz.analysis.filesystems import (
        filesystem_claims,
        filesystems_figure,
        fleet_filesystem_claims,
        fleet_filesystems_figure,
        write_fleet_table,
        write_table,
    )
    from retainz.analysis.fleetmap import fleet_claims, fleet_table
    from retainz.analysis.nodemap import node_claims, node_table
    from retainz.analysis.regimes import regime_claims, regime_figure
    from retainz.analysis.table import render_table
    from retainz.analysis.tiermap import tier_claims, tier_table
    from retainz.analysis.zonemap import zonemap_figure

    rep = AnalysisReport()
    runs = load(records_dir)
    if not runs.records:
        failed = f" ({len(runs.failed)} failed)" if runs.failed else ""
        raise NoRecordsError(f"{records_dir}: no ok run record to analyze{failed}; write some with "
                             f"`retainz run MANIFEST --output {records_dir}`")
    os.makedirs(out_dir, exist_ok=True)
    rep.lines.append(f"{records_dir}: {len(runs.records)} ok records, {len(runs.failed)} failed")
    setup_style()
    for fn in (pressure_figure, mechanisms_figure, zonemap_figure, regime_figure, filesystems_figure,
               fleet_filesystems_figure, write_table, write_fleet_table, fleet_table, node_table, tier_table,
               fdp_table, fdp_figure):
        rep.outputs += fn(runs, out_dir)
    tex = render_table(runs)
    if tex:
        p = os.path.join(out_dir, "placement_table.tex")
        with open(p, "w", encoding="utf-8") as f:
            f.write(tex)
        rep.outputs.append(p)
    claims = _claims.compute_claims(runs)
    filesystem_claims(runs, claims)
    fleet_filesystem_claims(runs, claims)
    regime_claims(runs, claims)
    fleet_claims(runs, claims)
    node_claims(runs, claims)
    tier_claims(runs, claims)
    fdp_claims(runs, claims)
    p = os.path.join(out_dir, "paper_claims.json")
    _claims.write_claims(p, claims, os.path.normpath(records_dir))
    rep.outputs.append(p)
    p = os.path.join(out_dir, "paper_claims.md")
    with open(p, "w", encoding="utf-8") as f:
        f.write(_claims.render_claims_markdown(claims, os.path.normpath(records_dir)))
    rep.outputs.append(p)
    rep.lines += [f"wrote {o}" for o in rep.outputs]
    rep.lines.append(f"{len(claims)} claims")
    if write_expected:
        if not expected:
            raise ValueError("write_expected needs an expected path")
        _claims.write_claims(expected, claims, os.path.normpath(records_dir))
        rep.lines.append(f"wrote the expected claims {expected}")
    if check:
        if not expected or not os.path.exists(expected):
            rep.failed = True
            rep.lines.append(f"check: no expected claims file {expected}")
            return rep
        rep.differences = _claims.check(claims, expected)
        rep.failed = bool(rep.differences)
        rep.lines += [f"differs: {d}" for d in rep.differences]
        rep.lines.append(f"check: {len(rep.differences)} difference(s) against {expected}"
                         if rep.differences else f"check: all {len(claims)} claims match {expected}")
        source = _claims.expected_source(expected)
        if rep.differences and source and os.path.normpath(source) != os.path.normpath(records_dir):
            rep.lines.append(f"check: {expected} was written from the records in {source}, not {records_dir}: "
                             "compare records of the same manifests (or pass --expected)")
    return rep
