"""Analysis: figures, the 14-row placement table, claims traced to run ids, --check, and no store import.

Records come from the quick matrix run with the synthetic replay double (fast, closed-form metrics);
``test_experiments_real.py`` runs the real replay.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from retainz.analysis import analyze
from retainz.cli import main
from retainz.experiments.manifest import load_manifest
from retainz.experiments.record import finalize
from retainz.experiments.runner import run_cases
from tests.replay_double import SyntheticReplayDouble

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("quick")
    _, cases = load_manifest(os.path.join(ROOT, "experiments", "quick.json"))
    s = run_cases(cases, str(d / "runs"), jobs=2, backend=SyntheticReplayDouble(), progress=False)
    assert s.ok == 230   # 217 + the uncertain (4), geometry (4) and shared-device (5) blocks
    return d / "runs"


@pytest.fixture(scope="module")
def analysed(quick_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis")
    rep = analyze(str(quick_runs), str(out))
    assert not rep.failed
    return out, rep


def records(d):
    return {n[:-5]: json.load(open(os.path.join(d, n))) for n in os.listdir(d) if n.endswith(".json")}


def test_figures_are_written_as_pdf_and_png_in_dejavu_serif(analysed):
    out, rep = analysed
    for name in ("pressure", "mechanisms", "zonemap"):
        pdf, png = out / f"{name}.pdf", out / f"{name}.png"
        assert pdf.read_bytes().startswith(b"%PDF") and str(pdf) in rep.outputs
        assert b"DejaVuSerif" in pdf.read_bytes()
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        data = png.read_bytes()
        w = int.from_bytes(data[16:20], "big")                # IHDR width
        phys = data.index(b"pHYs")                            # pixels per metre, x
        dpi = int.from_bytes(data[phys + 4:phys + 8], "big") * 0.0254
        assert dpi >= 200 and 2.9 <= w / dpi <= 3.4, (name, w, dpi)   # ~3.3 in: one paper column


def test_placement_table_has_the_sixteen_rows_in_order(analysed, quick_runs):
    out, _ = analysed
    tex = (out / "placement_table.tex").read_text()
    body = tex.split(r"\midrule", 1)[1].split(r"\bottomrule")[0]
    rows = [ln for ln in body.splitlines() if ln.endswith(r"\\")]
    labels = [r.split(" & ")[0] for r in rows]
    assert len(rows) == 16
    assert labels[0] == "RetainZ" and labels[7:10] == ["ZenFS-Alloc", "ZenFS-Alloc migrate all",
                                                       "ZenFS-Alloc no hints"]
    assert labels[10:] == ["Zone size 1/2", "Zone size 2x", "Active zones 6", "Hint noise 0.5",
                           "Async retention", "Top-3 by metric"]
    # Hint noise has no ZenFS-Alloc run under the same change: its ZenFS column is blank
    assert rows[13].split(" & ")[-1].rstrip(" \\") == "--"
    assert tex.count(r"\midrule") == 2 and r"\begin{tabular*}{\columnwidth}" in tex
    recs = records(quick_runs)
    rz = [r for r in recs.values() if r["tags"]["label"] == "RetainZ"][0]
    zf = [r for r in recs.values() if r["tags"]["label"] == "Active zones 6" and r["inputs"]["policy"] == "zenfs"][0]
    assert rows[0].split(" & ")[1] == f"{rz['metrics']['waf']:.2f}"
    assert rows[12].split(" & ")[-1].rstrip(" \\") == f"{zf['metrics']['waf']:.2f}"


def test_claims_trace_to_run_ids_and_equal_the_records(analysed, quick_runs):
    out, _ = analysed
    claims = json.load(open(out / "paper_claims.json"))["claims"]
    recs = records(quick_runs)
    assert len(claims) > 50
    for c in claims:
        assert c["runs"], c["id"]
        assert set(c["runs"]) <= set(recs), c["id"]
        assert c["text"]
        if isinstance(c["value"], str):      # a stop cause
            assert c["rounding"] is None and c["value"] in ("admission", "allocation", "gc", "journal")
        else:
            assert isinstance(c["rounding"], int)
            if c["value"] is not None:
                assert round(c["value"], c["rounding"]) == c["value"]
    by_id = {c["id"]: c for c in claims}
    c = by_id["placement.retainz.retainz.waf"]
    (rid,) = c["runs"]
    assert recs[rid]["tags"]["label"] == "RetainZ"
    assert c["value"] == round(recs[rid]["metrics"]["waf"], 2)
    # the principal result exists and points at both policies' runs
    assert {recs[r]["inputs"]["policy"] for r in by_id["principal.stop_pressure_min.zenfs"]["runs"]} == {"zenfs"}
    # the double's zenfs stops above 0.9 and retainz above 0.97: the sweep sees both
    assert by_id["principal.stop_pressure_min.zenfs"]["value"] == 0.95
    assert by_id["principal.stop_pressure_min.retainz"]["value"] == 0.98
    assert by_id["principal.stop_cause_min.zenfs"]["value"] == "allocation"
    assert by_id["principal.zenfs_admission_stops"]["value"] == 0
    assert by_id["principal.margin.smollm2-135m-dcp.torchtitan"]["value"] == 0.03   # 0.98 - 0.95
    assert by_id["cost.recompute_identical"]["value"] == 1
    assert by_id["capacity.file_matches_memory"]["value"] == 1


def test_check_passes_on_itself_and_detects_a_changed_value(quick_runs, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(quick_runs, runs)
    expected = tmp_path / "expected.json"
    assert main(["analyze", str(runs), "--out", str(tmp_path / "a"), "--expected", str(expected),
                 "--write-expected"]) == 0
    assert main(["analyze", str(runs), "--out", str(tmp_path / "a"), "--check", "--expected", str(expected)]) == 0
    assert "claims match" in capsys.readouterr().out
    # change one recorded number: the claim that uses it differs, and only that one
    rid = json.load(open(expected))["claims"]
    target = [c for c in rid if c["id"] == "placement.retainz.retainz.waf"][0]["runs"][0]
    p = runs / f"{target}.json"
    rec = json.load(open(p))
    rec["metrics"]["gc_bytes"] *= 3
    rec["metrics"]["waf"] = (rec["metrics"]["host_bytes"] + rec["metrics"]["gc_bytes"]) / rec["metrics"]["host_bytes"]
    json.dump(finalize(rec), open(p, "w"))
    assert main(["analyze", str(runs), "--out", str(tmp_path / "a"), "--check", "--expected", str(expected)]) == 1
    out = capsys.readouterr().out
    assert "differs: placement.retainz.retainz.waf: computed" in out
    assert "differs: placement.retainz.retainz.gc_gib" in out
    assert "differs: placement.zone-size-1-2" not in out
    assert "was written from the records in" not in out          # the same folder: no hint
    # the same expected claims against another folder's records: the check says where they came from
    other = tmp_path / "other"
    shutil.copytree(runs, other)
    assert main(["analyze", str(other), "--out", str(tmp_path / "b"), "--check", "--expected", str(expected)]) == 1
    assert f"{expected} was written from the records in {runs}, not {other}" in capsys.readouterr().out


def test_check_without_expected_file_fails(quick_runs, tmp_path):
    rep = analyze(str(quick_runs), str(tmp_path), check=True, expected=str(tmp_path / "none.json"))
    assert rep.failed and "no expected claims file" in rep.lines[-1]


def test_analysis_never_imports_the_store():
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); "
            "import retainz.analysis, retainz.analysis.figures, retainz.analysis.table, retainz.analysis.zonemap, "
            "retainz.analysis.claims; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'retainz' and m.split('.')[1:2] and "
            "m.split('.')[1] not in ('analysis', 'runrecord')]; print(json.dumps(bad))")
    r = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "src")], capture_output=True, text=True,
                       check=True)
    assert json.loads(r.stdout) == []


def test_analyze_cli_runs_without_store_modules(quick_runs, tmp_path):
    code = ("import sys, json; from retainz.analysis import analyze; analyze(sys.argv[1], sys.argv[2]); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('retainz.store', 'retainz.placement', "
            "'retainz.zoned', 'retainz.trace', 'retainz.experiments')))))")
    r = subprocess.run([sys.executable, "-c", code, str(quick_runs), str(tmp_path)], capture_output=True,
                       text=True, check=True)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
    assert (tmp_path / "placement_table.tex").exists()


def test_analyze_refuses_a_tampered_record_naming_the_file(quick_runs, tmp_path, capsys):
    from retainz.analysis.records import TamperedRecordError

    runs = tmp_path / "runs"
    shutil.copytree(quick_runs, runs)
    name = sorted(n for n in os.listdir(runs) if n.startswith("placement-") and n.endswith(".json"))[0]
    rec = json.loads((runs / name).read_text())
    rec["metrics"]["waf"] = 0.5                                    # edited, digest left as it was
    (runs / name).write_text(json.dumps(rec))
    with pytest.raises(TamperedRecordError, match="digest mismatch"):
        analyze(str(runs), str(tmp_path / "a"))
    assert main(["analyze", str(runs), "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"retainz: error: {runs / name}: digest mismatch")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "b" / "placement_table.tex").exists()
    del rec["digest"]
    (runs / name).write_text(json.dumps(rec))
    with pytest.raises(TamperedRecordError, match=f"{name}: has no digest"):
        analyze(str(runs), str(tmp_path / "a"))
    (runs / name).write_text(json.dumps(finalize(rec)))              # re-stamped: accepted again
    assert not analyze(str(runs), str(tmp_path / "c")).failed


@pytest.mark.parametrize("content", ["nothing", "a failed record only"])
def test_analyze_refuses_a_folder_without_ok_records_and_writes_nothing(quick_runs, tmp_path, capsys, content):
    runs = tmp_path / "runs"
    runs.mkdir()
    if content != "nothing":
        failed = sorted(n for n in os.listdir(quick_runs) if n.endswith(".json"))[0]
        rec = json.loads((quick_runs / failed).read_text())
        rec.update(status="failed", error="worker process failed: boom")
        (runs / failed).write_text(json.dumps(finalize(rec)))
    out = tmp_path / "analysis"
    assert main(["analyze", str(runs), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{runs}: no ok run record to analyze" in err[0], err
    assert not out.exists()


def _figure_of(monkeypatch, module, draw, runs):
    """The matplotlib figure ``draw(runs, out)`` builds (captured instead of saved), drawn."""
    from retainz.analysis.figures import setup_style

    captured = []
    monkeypatch.setattr(module, "save", lambda fig, out_dir, name: captured.append(fig) or [])
    setup_style()
    draw(runs, "unused-out-dir")
    fig = captured[0]
    fig.canvas.draw()
    return fig


def test_pressure_figure_draws_ties_as_ties_with_a_compact_legend(quick_runs, monkeypatch):
    """Issue 30.5: no display offsets. Every policy's line is at its recorded WAF; a band runs along the
    best WAF at each pressure, and the count written under it is the number of policies tied there."""
    from retainz.analysis import figures
    from retainz.analysis.records import load

    runs = load(str(quick_runs))
    fig = _figure_of(monkeypatch, figures, figures.pressure_figure, runs)
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None" and len(ln.get_xdata())
             and ln.get_linewidth() < 5]
    assert len(lines) >= 5
    for ln in lines:                       # drawn where the data is: the axes' own transform, no offset
        assert ln.get_transform() == ax.transData
    assert len({ln.get_marker() for ln in lines}) == len(lines)
    (band,) = [ln for ln in ax.get_lines() if ln.get_linewidth() >= 5 and len(ln.get_xdata())]
    per_pressure: dict = {}
    for ln in lines:
        for x, y in zip(ln.get_xdata(), ln.get_ydata(), strict=True):
            per_pressure.setdefault(float(x), []).append(float(y))
    assert list(band.get_xdata()) == sorted(per_pressure)
    assert list(band.get_ydata()) == [min(per_pressure[x]) for x in sorted(per_pressure)]
    counts = [int(t.get_text()) for t in ax.texts]
    assert counts == [sum(1 for w in per_pressure[x] if w - min(per_pressure[x]) <= figures.TIE_WAF)
                      for x in sorted(per_pressure)]
    legend = fig.legends[0].get_window_extent()
    assert legend.height / fig.dpi < 0.45         # inches: four rows of four at most, not a third of the figure


def test_mechanisms_bars_start_at_zero_and_panel_b_names_its_workload(quick_runs, monkeypatch):
    from retainz.analysis import figures
    from retainz.analysis.records import layout_name, load

    runs = load(str(quick_runs))
    fig = _figure_of(monkeypatch, figures, figures.mechanisms_figure, runs)
    b = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("(b)")][0]
    layout = layout_name(runs.values("hints", "layout")[0])
    assert b.get_title(loc="left") == f"(b) hint precision: {layout}, pressure {runs.values('hints', 'pressure')[0]:g}"
    assert b.get_ylim()[0] == 0 and b.patches


def test_zonemap_draws_only_legend_colours_says_unusable_and_has_no_offset(quick_runs, monkeypatch):
    import numpy as np

    from retainz.analysis import zonemap
    from retainz.analysis.records import load

    zm = {"format": 1, "steps": [0, 10], "zones": 2, "groups": 2,
          "live": [[50, 0], [30, 100]], "dead": [[25, 0], [30, 0]], "unused": [[25, 40], [0, 0]]}
    img = zonemap.zone_map_image(zm)
    assert img.shape == (2 * zonemap.SUBROWS, 2, 3)
    palette = {tuple(c) for c in zonemap.COLORS.values()}
    assert {tuple(c) for c in img.reshape(-1, 3)} <= palette
    col = img[:zonemap.SUBROWS, 0]                                 # zone 0 at step 0: 50/25/25/0
    assert [tuple(c) for c in col[[0, 9, 10, 14, 15, 19]]] == [zonemap.COLORS[k] for k in
                                                                ("live", "live", "dead", "dead", "unused", "unused")]

    fig = _figure_of(monkeypatch, zonemap, zonemap.zonemap_figure, load(str(quick_runs)))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["live", "dead", "unusable", "free"]
    for ax in fig.axes:
        assert ax.xaxis.get_offset_text().get_text() == ""
        assert "20k" in [t.get_text() for t in ax.get_xticklabels()]
    assert np.asarray(fig.axes[0].get_images()[0].get_array()).shape[0] % zonemap.SUBROWS == 0


def test_zone_map_title_and_table_name_the_stop_cause():
    from retainz.analysis.table import _stop
    from retainz.analysis.zonemap import stop_label

    rec = {"capacity_stop_step": 5500, "capacity_stop_cause": "allocation"}
    assert stop_label(rec) == " (stop at 5,500: allocation)"
    assert _stop(rec) == "5.5k$^a$"
    assert stop_label({"capacity_stop_step": None}) == "" and _stop({"capacity_stop_step": None}) == "--"
    assert stop_label({"capacity_stop_step": 700}) == " (stop at 700)"      # a record made before causes


def test_claims_file_refuses_duplicate_ids(tmp_path):
    from retainz.analysis.claims import add_claim, write_claims

    out: list = []
    run = {"id": "case-a"}
    add_claim(out, "x.waf", 1.2345, 2, [run], "a WAF")
    add_claim(out, "x.waf", 1.5, 2, [run], "the same id again")
    with pytest.raises(ValueError, match="x.waf appear"):
        write_claims(str(tmp_path / "c.json"), out, "runs")
    assert not (tmp_path / "c.json").exists()
    write_claims(str(tmp_path / "c.json"), out[:1], "runs")
    assert json.load(open(tmp_path / "c.json"))["claims"] == [
        {"id": "x.waf", "value": 1.23, "rounding": 2, "runs": ["case-a"], "text": "a WAF"}]
