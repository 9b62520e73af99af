"""The front door and the docs: README.md stays a short entry page that reaches every docs page, every
relative link in README.md and docs/ resolves, and each page says first who it is for."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(page: Path) -> list[str]:
    """Relative link targets in a Markdown page (http(s) and mailto links left out)."""
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t)]


def test_readme_is_a_front_door():
    """At most 150 lines; the two set-up commands, and the user's paths before any test statistics."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make main" in text and "make test" in text
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    for path in ("retainz mount", "ZonedStorageWriter", "retainz run", "retainz put"):
        assert path in text, f"README.md lost the path {path!r}"
    lines = text.splitlines()
    first_mount = next(i for i, line in enumerate(lines) if "retainz mount" in line)
    assert first_mount < 100, "the first working mount is too far down the README"
    assert not re.search(r"mutants|power-cut points|\bstates at\b", text), "test statistics belong in docs/testing.md"


def test_readme_links_every_docs_page():
    linked = {(ROOT / t).resolve() for t in _links(ROOT / "README.md")}
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert missing == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = [t for t in _links(page) if not (page.parent / t).exists()]
    assert broken == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_each_page_says_who_it_is_for(page):
    """The first paragraph after the title is an italic line starting 'For ...'."""
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ")
    first = next(line for line in lines[1:] if line.strip())
    assert first.startswith("*For "), f"{page.name}: first paragraph {first[:60]!r} does not say who it is for"
