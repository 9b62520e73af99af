"""Regenerate the "Reference" section of docs/cli.md from the ``retainz`` argument parser.

Usage: PYTHONPATH=src python tools/cli_reference.py   (rewrites docs/cli.md after "## Reference")
tests/cli/test_cli_docs.py fails when a command or flag is missing from the page: run this, then review.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retainz.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
MARK = "## Reference\n"


def _walk(p: argparse.ArgumentParser, helps: dict, prefix: tuple[str, ...] = ()):
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, p
        return
    for ca in subs[0]._choices_actions:
        helps[(*prefix, ca.dest)] = ca.help
    for name, sp in subs[0].choices.items():
        yield from _walk(sp, helps, (*prefix, name))


def reference() -> str:
    """The reference: one ``### `retainz CMD` `` section per command, its arguments and flags."""
    helps: dict = {}
    out = []
    for words, p in _walk(build_parser(), helps):
        out.append(f"### `retainz {' '.join(words)}`\n")
        h = helps.get(words) or ""
        if h:
            out.append(h[0].upper() + h[1:] + ".\n")
        pos = [a for a in p._actions if not a.option_strings]
        if pos:
            out.append("Arguments: " + ", ".join(f"`{a.metavar or a.dest}`" + (f" ({a.help})" if a.help else "")
                                                 for a in pos) + ".\n")
        for a in p._actions:
            if a.option_strings and a.option_strings[0] != "-h":
                meta = "" if a.nargs == 0 else " " + (a.metavar or a.dest.upper())
                flags = ", ".join(f"`{f}{meta}`" for f in a.option_strings)
                text = (a.help or "").replace("%(default)s", str(a.default))
                if a.choices and not text:
                    text = "one of " + ", ".join(map(str, a.choices))
                if not text and a.dest == "json":
                    text = "machine-readable output (strict JSON; no progress bar)"
                out.append(f"- {flags}: {text}" if text else f"- {flags}")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(text[:text.index(MARK) + len(MARK)] + "\n" + reference())
