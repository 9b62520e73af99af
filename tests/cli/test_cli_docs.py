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


def _tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_reference", DOC.parents[1] / "tools" / "cli_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_reference_is_what_the_generator_writes_and_it_keeps_hand_written_text():
    """``tools/cli_reference.py`` rewrites only each section's generated block (issue 44: it dropped
    the hand-written paragraphs of ``fsck`` and ``replay`` and a flag's longer text): the page is
    its own regeneration, a paragraph added by hand to a section survives, and a flag's text comes
    from the parser."""
    tool = _tool()
    text = DOC.read_text()
    assert tool.render(text) == text, "docs/cli.md is not what tools/cli_reference.py writes: run it and review"
    fsck = sections(text)["retainz fsck"]
    assert "Every error a repair fixes" in fsck and "nothing to repair: the store is clean" in fsck
    assert "Without `--json`, replay prints one metric per line" in sections(text)["retainz replay"]
    mine = "A paragraph written by hand under df.\n"
    added = text.replace("<!-- /generated -->\n", "<!-- /generated -->\n\n" + mine, 1)
    # in the first section, then with a flag line edited by hand inside the generated block
    first = next(iter(sections(added)))
    assert mine in sections(tool.render(added))[first]
    edited = added.replace("- `--json`: machine-readable output", "- `--json`: HAND-EDITED output", 1)
    again = tool.render(edited)
    assert "HAND-EDITED" not in again and mine in sections(again)[first]
    # a page written before the markers: its hand-written paragraphs are kept too
    bare = text.replace("<!-- generated -->\n", "").replace("<!-- /generated -->\n", "")
    assert tool.render(bare) == text
