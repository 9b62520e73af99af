"""Regenerate the "Reference" section of docs/cli.md from the ``retainz`` argument parser.

Usage: PYTHONPATH=src python tools/cli_reference.py   (rewrites docs/cli.md after "## Reference")
tests/cli/test_cli_docs.py fails when a command or flag is missing from the page: run this, then review.

Only the lines between ``<!-- generated -->`` and ``<!-- /generated -->`` of each command's section are
rewritten (its description, arguments and flags, from the parser's help: change a flag's text there);
the paragraphs written by hand after them, and everything before "## Reference", are kept as they are
(issue 44: a regeneration dropped them).  A section written without the markers yet keeps the lines
that are not the generator's (a flag line of that command, its description or its arguments) as its
hand-written text.  A command the parser no longer has loses its section, named on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from retainz.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
MARK = "## Reference\n"
BEGIN = "<!-- generated -->"
END = "<!-- /generated -->"


def _walk(p: argparse.ArgumentParser, helps: dict, prefix: tuple[str, ...] = ()):
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, p
        return
    for ca in subs[0]._choices_actions:
        helps[(*prefix, ca.dest)] = ca.help
    for name, sp in subs[0].choices.items():
        yield from _walk(sp, helps, (*prefix, name))


def generated() -> dict[str, str]:
    """``{"retainz CMD": the section's generated lines}`` for every command, in the parser's order:
    its description, its arguments and one line per flag."""
    helps: dict = {}
    out = {}
    for words, p in _walk(build_parser(), helps):
        lines = []
        h = helps.get(words) or ""
        if h:
            lines.append(h[0].upper() + h[1:] + ".\n")
        pos = [a for a in p._actions if not a.option_strings]
        if pos:
            lines.append("Arguments: " + ", ".join(f"`{a.metavar or a.dest}`" + (f" ({a.help})" if a.help else "")
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
                lines.append(f"- {flags}: {text}" if text else f"- {flags}")
        out[f"retainz {' '.join(words)}"] = "\n".join(lines).rstrip("\n")
    return out


def _hand_written(body: list[str]) -> str:
    """The hand-written text of one section's lines (after its heading): what follows the generated
    block, or, in a section without the markers, every line that is not the generator's kind (a
    description sentence, ``Arguments:`` or a ``- `--flag`` line) up to the first blank line after them."""
    if BEGIN in body and END in body:
        rest = body[body.index(END) + 1:]
    else:
        i = 0
        while i < len(body) and not body[i].strip():
            i += 1
        while i < len(body) and body[i].strip():       # the generated paragraph: description,
            i += 1                                     # arguments and flags, each on its own line
        while i < len(body) and (body[i].startswith("- `") or body[i].startswith("Arguments: ")
                                 or not body[i].strip()):
            i += 1
        rest = body[i:]
    return "\n".join(rest).strip("\n")


def render(text: str) -> str:
    """``text`` (docs/cli.md) with every command's generated block rewritten from the parser and its
    hand-written text kept; a section is laid out as heading, ``BEGIN``, the generated lines, ``END``,
    then the hand-written paragraphs.

    Raises:
        ValueError: ``text`` has no "## Reference" heading."""
    head, _, ref = text.partition(MARK)
    if not _:
        raise ValueError(f"no {MARK.strip()!r} heading in the page")
    sections: dict[str, list[str]] = {}
    key = None
    for line in ref.splitlines():
        if line.startswith("### `retainz "):
            key = line.removeprefix("### `").split("`")[0]
            sections[key] = []
        elif key is not None:
            sections[key].append(line)
    out = []
    gen = generated()
    for name, lines in gen.items():
        own = _hand_written(sections.get(name, []))
        out.append(f"### `{name}`\n\n{BEGIN}\n{lines}\n{END}\n" + (f"\n{own}\n" if own else ""))
    gone = sorted(set(sections) - set(gen))
    if gone:
        print("cli_reference: sections of commands the parser no longer has were dropped: " + ", ".join(gone),
              file=sys.stderr)
    return head + MARK + "\n" + "\n".join(out)


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text()))
