"""``python -m bench``: the report's figure objects and its strict JSON (no timing is asserted)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

bench = pytest.importorskip("bench.__main__")


def strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in the report: not JSON")
    return json.loads(text, parse_constant=refuse)


def test_figure_met_compares_with_the_target_and_is_null_without_one():
    F = bench.Figure
    assert F("a", 0.96, "ratio", 0.95).met is True
    assert F("a", 0.94, "ratio", 0.95).met is False
    assert F("g", 3.0, "ratio", 256, op="<").met is True
    assert F("g", 300.0, "ratio", 256, op="<").met is False
    assert F("info", 1.2, "ratio").met is None                  # shown for information
    assert F("info", 1.2, "ratio").to_dict()["comparison"] is None
    assert F("skipped", None, "ratio", 0.9, note="not measured: x").met is None
    assert F("quick", 0.5, "ratio", 0.95, judged=False).met is None     # quick sizes: never judged
    d = F("x", math.inf, "ratio", 0.9).to_dict()
    assert d["value"] is None and set(d) == {"name", "value", "target", "met", "comparison", "unit", "note"}
    assert d["comparison"] == ">="


def test_replay_and_placement_figures_at_a_tiny_size(tmp_path):
    tiny = dataclasses.replace(bench.QUICK, replay_steps=30, placement_decisions=5)
    figs, details = bench._replay(tiny, str(tmp_path))
    assert [f.target for f in figs] == [250_000, 200_000, 0.5]
    assert all(f.value is not None and f.value > 0 for f in figs)
    assert details["runs"]["retainz"]["generations"] == 30
    figs, _ = bench._placement(tiny)
    assert figs[0].op == "<" and figs[0].target == 256 and figs[0].value > 0


def test_main_writes_one_strict_json_report(tmp_path, monkeypatch, capsys):
    def fake_run(sizes, scratch, guest=True, log=print):
        assert sizes is bench.QUICK and not guest
        figs = [bench.Figure("r", 0.5, "ratio", 0.95), bench.Figure("n", None, "ratio", 0.9, note="not measured: y")]
        for f in figs:
            log(f.name)
        return {"format": 1, "quick": True, "cpus": 2, "load_average": 1.0, "seconds": 1.0,
                "figures": [f.to_dict() for f in figs], "details": {"x": {"inf": math.inf, "nan": math.nan}}}

    monkeypatch.setattr(bench, "run", fake_run)
    out = tmp_path / "r.json"
    assert bench.main(["--quick", "--no-guest", "--dir", str(tmp_path / "s"), "--json", str(out)]) == 0
    rep = strict(out.read_text())
    assert [(f["name"], f["value"], f["target"], f["met"]) for f in rep["figures"]] == [
        ("r", 0.5, 0.95, False), ("n", None, 0.9, None)]
    assert rep["details"]["x"] == {"inf": None, "nan": None}
    assert "2 figures at quick sizes, none judged against its target" in capsys.readouterr().out


def test_full_run_summary_counts_and_markdown_table(tmp_path, monkeypatch, capsys):
    def fake_run(sizes, scratch, guest=True, log=print):
        assert sizes is bench.FULL
        figs = [bench.Figure("r", 0.5, "ratio", 0.95, note="a"), bench.Figure("n", None, "ratio", 0.9, note="b"),
                bench.Figure("m", 300_000.0, "records/s", 250_000, note="c"), bench.Figure("i", 1.5, "ratio")]
        return {"format": 1, "quick": False, "figures": [f.to_dict() for f in figs], "seconds": 2.0}

    monkeypatch.setattr(bench, "run", fake_run)
    out = tmp_path / "r.json"
    assert bench.main(["--no-guest", "--dir", str(tmp_path / "s"), "--json", str(out)]) == 0
    assert "1 of 4 figures meet their target, 1 do not, 2 without a target or not measured" in capsys.readouterr().out
    assert bench.main(["--markdown", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "| figure | value | target | met | note |", "| --- | ---: | ---: | --- | --- |",
        "| r | 0.500 | >= 0.95 | **no** | a |", "| n | - | >= 0.9 | - | b |",
        "| m | 300,000 records/s | >= 250,000 | yes | c |", "| i | 1.500 | - | - |  |"]
    out.write_text("[]")
    assert bench.main(["--markdown", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"{out}: not a benchmark report (TypeError: list indices must be " \
                                              "integers or slices, not str)"


def test_memory_figures_at_a_tiny_size(tmp_path):
    pytest.importorskip("torch")
    tiny = dataclasses.replace(bench.QUICK, memory_mib=8, memory_tensor_mib=4, memory_reps=1)
    figs, details = bench._memory(tiny, str(tmp_path))
    assert [f.name for f in figs] == [
        "dcp.save peak memory, ZonedStorageWriter/Reader / stock", "dcp.load peak memory, ZonedStorageWriter/Reader / stock",
        "dcp.save peak memory, retainz:// / stock", "dcp.load peak memory, retainz:// / stock"]
    assert all(f.target == 1.1 and f.op == "<" and 0.5 < f.value < 2 for f in figs)
    # every face's process held the state dict before its call, so each peak is above it
    assert all(p > 8 for p in details["peak_MiB"].values())
