"""The metadata fault model, as a campaign (issue 41 item 5; :mod:`retainz.testing.metadamage`).

Stores built by real workloads (two jobs keeping their last three checkpoints, a replaced ``last``,
a hint update, forced GC passes; many small generations deleted out of order) are damaged one fault
at a time: every metadata 4 KiB block destroyed in turn (all of them here: a second), and one byte
flipped at a sample of metadata offsets (``RETAINZ_DAMAGE_SAMPLE``, default 300 per store; ``all``
runs every offset: ``make test-damage``).  After a read-only open, or ``fsck --repair`` when it
refuses: nothing deleted or replaced is listed, every live generation is recovered or named.

Format version 5 (two copies of every appended record, the previous chain as the snapshot's
copy) makes every such single fault cost nothing: no committed generation lost, named or not, for a
zeroed block, a block of random bytes ("noise"), a flipped byte, or a power cut tearing any of the
workload's last writes (``RETAINZ_TORN_SAMPLE``, default 12 writes x 3 tears; ``all``: every write
of the workload, ``make test-damage``).
"""

from __future__ import annotations

import ast
import os

import pytest

from retainz.testing.metadamage import (
    TEAR_LANDED,
    WORKLOADS,
    build_store,
    damage_sites,
    run_campaign,
    run_torn,
)

_SAMPLE = os.environ.get("RETAINZ_DAMAGE_SAMPLE", "300")
SAMPLE = None if _SAMPLE == "all" else int(_SAMPLE)
_TORN = os.environ.get("RETAINZ_TORN_SAMPLE", "12")
TORN_SAMPLE = None if _TORN == "all" else int(_TORN)


def _report(capsys, workload, c):
    with capsys.disabled():
        print(f"\n{workload} {c.kind}: {c.sites} sites, {c.opened_intact} opened intact, {c.repaired} repaired, "
              f"{c.named_lost} named lost, {c.named_unknown} named unknown, {c.named_anonymous} named by count, "
              f"{c.resurrected} resurrected, {c.unnamed} unnamed, {c.lost} committed generations lost")


@pytest.mark.parametrize("kind", ["block", "noise"])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_destroyed_metadata_block_loses_no_committed_generation(workload, kind, capsys):
    """Every 4 KiB block of every meta zone, zeroed or filled with random bytes in turn: the store
    opens with every live generation and nothing deleted, without a repair (each record's other
    copy, or the previous chain for a snapshot batch, stands in)."""
    c = run_campaign(workload, kind)
    _report(capsys, workload, c)
    assert c.failures == [] and c.resurrected == 0 and c.lost == 0
    assert c.sites >= 20 and c.opened_intact == c.sites


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_two_adjacent_destroyed_blocks_never_bring_a_deleted_generation_back(workload, capsys):
    """Two faults at once: every run of two adjacent metadata blocks zeroed (both copies of a record,
    of a snapshot head or end, of a superblock).  Generations may be lost, but never silently and
    nothing deleted or replaced comes back.  A chain whose snapshot head or end was lost used to be
    passed over for the previous chain: what was committed since the last rollover vanished unnamed
    (``jobs``: a-step-12 and b-step-12, at two sites), and what was deleted since was listed again
    (the CLI trial, ``test_store_journal``)."""
    c = run_campaign(workload, "pair")
    _report(capsys, workload, c)
    assert c.failures == [] and c.resurrected == 0 and c.unnamed == 0
    assert c.sites >= 20 and c.opened_intact + c.repaired == c.sites


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_a_lost_tail_of_any_length_never_brings_a_deleted_generation_back(workload, capsys):
    """Every meta zone's appended records zeroed from each of their blocks to the zone's end (a lost
    tail of one block up to every record since the snapshot: the issue 41 trial's 16 KiB run at the
    end of a Full chain zone is one of them).  Records are lost, and nothing deleted or replaced
    comes back: format 6 ends every finished chain zone in a close record, so a Full zone's zeros are
    damage, not padding.  The one loss that cannot be named: commits whose records were the last ones
    in the journal, lost with every copy and no record after them (their ids were only there)."""
    c = run_campaign(workload, "tail")
    _report(capsys, workload, c)
    assert c.resurrected == 0 and c.sites >= 20 and c.opened_intact + c.repaired == c.sites
    last = {"jobs": {"a-step-12", "b-step-12"}, "churn": set()}[workload]     # the workload's last commits
    for f in c.failures:
        assert "repaired without" in f and set(ast.literal_eval(f[f.index("["):f.index("]") + 1])) <= last, f


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_a_flipped_byte_at_metadata_offsets_loses_no_committed_generation(workload, capsys):
    c = run_campaign(workload, "byte", sample=SAMPLE)
    _report(capsys, workload, c)
    assert c.failures == [] and c.resurrected == 0 and c.lost == 0
    assert c.opened_intact + c.repaired == c.sites and c.sites >= min(SAMPLE or 1000, 1000)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_a_torn_last_write_loses_no_committed_generation(workload, capsys):
    """A power cut tearing each of the workload's last writes (the closing sync record's copies,
    the last deletions and commits, their data): must-survive ⊆ recovered ⊆ may-survive, nothing
    committed lost, nothing deleted back."""
    c = run_torn(workload, sample=TORN_SAMPLE)
    _report(capsys, workload, c)
    assert c.failures == [] and c.resurrected == 0 and c.lost == 0
    assert c.sites >= len(TEAR_LANDED) * min(TORN_SAMPLE or 12, 12) and c.opened_intact + c.repaired == c.sites


def test_the_workloads_build_what_the_fault_model_needs():
    """Deletes, a replaced version, GC moves, several jobs: the stores hold each."""
    dev, truth = build_store("jobs")
    assert truth.deleted and truth.replaced and len({g.split("-")[0] for g in truth.live if "-step-" in g}) == 2
    assert len(damage_sites(dev, "byte")) > 20 * len(damage_sites(dev, "block"))


def test_every_destroyed_block_of_the_device_file_metadata_loses_nothing(tmp_path, capsys):
    """The FileDevice's own metadata: its label block, each block of the zone-state slots, the label
    copy at the end; each destroyed in turn, the store opens (or repairs) with every generation."""
    from retainz.testing.metadamage import run_device_blocks

    c = run_device_blocks("jobs", str(tmp_path))
    _report(capsys, "jobs", c)
    assert c.failures == [] and c.resurrected == 0 and c.lost == 0
    assert c.sites >= 6 and c.opened_intact + c.repaired == c.sites and c.opened_intact >= 2
