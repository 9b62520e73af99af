"""Issue 44.5 (d): every subcommand's numeric and size flags, given a value that is not a number and
(for the flags that take no negative value) a negative one, refuse in one line that names the flag,
with exit status 2 (docs/cli.md's convention for bad input)."""

from __future__ import annotations

import argparse

import pytest

from retainz.cli import build_parser, count_arg, fraction_arg, main, seconds_arg, size_arg

#: Types that take no negative value (int_arg's parsers are closures named ``parse``).
_NON_NEGATIVE = {size_arg, count_arg, fraction_arg, seconds_arg}


def _is_non_negative(t) -> bool:
    return t in _NON_NEGATIVE or (getattr(t, "__qualname__", "").startswith("int_arg.") and
                                  not _int_arg_allows_negative(t))


def _int_arg_allows_negative(t) -> bool:
    try:
        t("-1")
    except argparse.ArgumentTypeError:
        return False
    return True


def _commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + (name,))
            return
    yield prefix, parser


def _cases():
    for words, parser in _commands(build_parser()):
        for a in parser._actions:
            flags = [s for s in a.option_strings if s.startswith("--")]
            if not flags or a.choices or not (a.type in (int, float) or a.type in _NON_NEGATIVE
                                               or getattr(a.type, "__qualname__", "").startswith("int_arg.")):
                continue        # not a numeric or size flag
            yield pytest.param(words, flags[0], "abc", id=f"{' '.join(words)} {flags[0]} abc")
            if _is_non_negative(a.type) or a.type is int and flags[0] in _COUNT_INTS:
                yield pytest.param(words, flags[0], "-5", id=f"{' '.join(words)} {flags[0]} -5")


#: Flags of ``type=int`` whose values are counts (a negative one is bad input).
_COUNT_INTS = {"--zones"}


@pytest.mark.parametrize("words, flag, value", list(_cases()))
def test_a_bad_value_of_any_numeric_flag_names_the_flag_and_exits_2(words, flag, value, capsys):
    code = main([*words, f"{flag}={value}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert flag in err, err
