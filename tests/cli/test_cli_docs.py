"""docs/cli.md documents every ``retainz`` command and flag (walked from the argparse parser, so the
page cannot go stale): each command has a ``### `retainz CMD...` `` heading and each of its flags
appears under it."""

from __future__ import annotations

import argparse
from pathlib import Path

from retainz.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, parser) for every leaf command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, p in subs[0].choices.items():
        yield from commands(p, (*prefix, name))


def sections(text: str) -> dict[str, str]:
    out, key = {}, None
    for line in text.splitlines():
        if line.startswith("### `retainz "):
            key = line.removeprefix("### `").split("`")[0]
            out[key] = ""
        elif line.startswith("## "):
            key = None
        elif key:
            out[key] += line + "\n"
    return out


def test_every_command_and_flag_is_documented():
    text = DOC.read_text()
    assert text.splitlines()[2].startswith("*For operators")     # who it is for (tests/project/test_docs.py's rule)
    docs = sections(text)
    missing = []
    for words, p in commands(build_parser()):
        name = "retainz " + " ".join(words)
        if name not in docs:
            missing.append(name)
            continue
        for a in p._actions:
            for flag in a.option_strings:
                if flag not in ("-h", "--help") and f"`{flag}" not in docs[name]:
                    missing.append(f"{name} {flag}")
    assert not missing, "undocumented in docs/cli.md: " + ", ".join(missing)


def test_documented_commands_exist():
    real = {"retainz " + " ".join(w) for w, _ in commands(build_parser())}
    assert set(sections(DOC.read_text())) <= real
