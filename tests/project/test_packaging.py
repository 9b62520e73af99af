"""pyproject.toml metadata that setuptools and pytest read without a deprecation warning."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_string_and_setuptools_reads_it():
    """A license table is deprecated since setuptools 77 (PEP 639), which reads the SPDX string."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    req = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert req and int(re.search(r">=(\d+)", req[0]).group(1)) >= 77


def test_every_marker_is_applied_and_names_only_knobs_that_exist():
    """Each declared marker marks some test, and every ``RETAINZ_*`` knob a marker's description names is
    read somewhere in the Makefile, src or tests (the scale marker names RETAINZ_SCALE, so the knob check
    has something to check)."""
    tests = "".join(p.read_text() for p in ROOT.glob("tests/**/*.py") if p.name != "test_packaging.py")
    sources = tests + "".join(p.read_text() for p in [ROOT / "Makefile", *ROOT.glob("src/**/*.py")])
    knobs = []
    for marker in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]:
        name = marker.split(":")[0]
        assert f"pytest.mark.{name}" in tests, f"marker {name!r} is declared but marks no test"
        for knob in re.findall(r"\b(RETAINZ_[A-Z_]+)\b", marker):
            knobs.append(knob)
            assert knob in sources, f"marker {name!r} mentions {knob}, which nothing reads"
    assert "RETAINZ_SCALE" in knobs


def test_the_project_points_to_no_folder_outside_it():
    """Facts the product uses live in its own docs (docs/real-payload.md...), never in a path outside it."""
    outside = "shared" + "/reference"
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile", *ROOT.glob("docs/*"),
             *ROOT.glob("src/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("tools/*")]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files if p.is_file()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if outside in line or "shared" + "/" in line]
    assert hits == []


def test_errors_all_lists_every_error():
    """``retainz.errors.__all__`` is the list of every exception the package defines, and nothing else
    besides the stop-cause vocabulary."""
    import inspect

    import retainz.errors as errors

    defined = {n for n, o in vars(errors).items()
               if inspect.isclass(o) and issubclass(o, BaseException) and o.__module__ == errors.__name__}
    assert set(errors.__all__) == defined | {"STOP_CAUSES"}
    assert len(errors.__all__) == len(set(errors.__all__))
