"""The committed recorded runs (results/runs) verify, and the analysis reproduces the expected claims."""

from __future__ import annotations

import json
import os

from retainz.analysis import analyze
from retainz.experiments.manifest import load_manifest
from retainz.experiments.verify import verify_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNS = os.path.join(ROOT, "results", "runs")
EXPECTED = os.path.join(ROOT, "results", "expected_claims.json")


def test_committed_runs_are_the_whole_paper_matrix_and_verify():
    """results/runs holds the replay matrix (paper.json), the file-system comparison recorded in the
    QEMU guest (filesystems.json; not part of paper.json, which runs without a guest) and the fleet
    regime map (fleet.json, run by `make fleet`), the promotion-delay axis (tier.json), the fleet mix on
    the file systems (fleet-filesystems.json, in the guest), the node map with overlapping saves
    (node.json) and the FDP experiment (fdp.json)."""
    _, cases = load_manifest(os.path.join(ROOT, "experiments", "paper.json"))
    cases += load_manifest(os.path.join(ROOT, "experiments", "filesystems.json"))[1]
    cases += load_manifest(os.path.join(ROOT, "experiments", "fleet.json"))[1]
    cases += load_manifest(os.path.join(ROOT, "experiments", "tier.json"))[1]
    cases += load_manifest(os.path.join(ROOT, "experiments", "fleet-filesystems.json"))[1]
    cases += load_manifest(os.path.join(ROOT, "experiments", "node.json"))[1]
    cases += load_manifest(os.path.join(ROOT, "experiments", "fdp.json"))[1]
    names = {n[:-5] for n in os.listdir(RUNS) if n.endswith(".json")}
    assert names == {c.id for c in cases}
    n, problems = verify_dir(RUNS)
    assert (n, problems) == (len(cases), [])


def test_analyze_check_reproduces_the_expected_claims(tmp_path):
    rep = analyze(RUNS, str(tmp_path), check=True, expected=EXPECTED)
    assert rep.differences == [] and not rep.failed, rep.lines
    claims = json.load(open(tmp_path / "paper_claims.json"))["claims"]
    assert len(claims) == len(json.load(open(EXPECTED))["claims"])
    for f in ("pressure.pdf", "mechanisms.pdf", "zonemap.pdf", "placement_table.tex", "fleet_filesystems.png"):
        assert (tmp_path / f).stat().st_size > 1000, f
    # the fleet mix on the file systems: one row per system, three runs each
    rows = [ln for ln in (tmp_path / "fleet_filesystems.md").read_text().splitlines() if ln.startswith("| ")][1:]
    assert [r.split(" | ")[:2] for r in rows] == [["| RetainZ", "3"], ["| btrfs zoned", "3"], ["| f2fs zoned", "3"]]
