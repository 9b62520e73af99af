"""pyproject.toml metadata that setuptools and pytest read without a deprecation warning."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_string_and_setuptools_reads_it():
    """A license table is deprecated since setuptools 77 (PEP 639), which reads the SPDX string."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    req = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert req and int(re.search(r">=(\d+)", req[0]).group(1)) >= 77


def test_markers_name_only_knobs_that_exist():
    """Every ``NAME=1`` a marker description mentions is read somewhere in the Makefile, src or tests."""
    sources = "".join(p.read_text() for p in [ROOT / "Makefile", *ROOT.glob("src/**/*.py"),
                                               *ROOT.glob("tests/*.py")] if p.name != "test_packaging.py")
    for marker in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]:
        for knob in re.findall(r"\b([A-Z][A-Z_]+)=1\b", marker):
            assert knob in sources, f"marker {marker!r} mentions {knob}, which nothing reads"


def test_the_project_points_to_no_folder_outside_it():
    """Facts the product uses live in its own docs (docs/real-payload.md...), never in a path outside it."""
    outside = "shared" + "/reference"
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile", *ROOT.glob("docs/*"),
             *ROOT.glob("src/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("tools/*")]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files if p.is_file()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if outside in line or "shared" + "/" in line]
    assert hits == []
