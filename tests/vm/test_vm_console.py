"""The guest console filter: terminal control sequences never reach ``retainz vm run``'s stdout."""

from __future__ import annotations

import io
import os

import pytest

from retainz.vm.console import ConsoleFilter, pump, strip_control

# What the QEMU serial console of the guest really carried (SeaBIOS, the kernel's console takeover with
# a terminal reset and a clear screen, CR LF line ends), plus the other sequence kinds a program may print.
RAW = (b"SeaBIOS (version 1.16.2)\r\nProbing EDD (edd=off to disable)... o\x1bc\x1b[?7l\x1b[2J"
       b"retainz-guest: running the command\r\n\x1b[1;31mred\x1b[0m\tcol\r\n"
       b"\x1b]0;window title\x07title gone\r\n\x1bP1$r0m\x1b\\dcs gone\r\n\x1b(B\x1b7\x1b8plain\x07\x08\r\n"
       b"\x1b[Hhome\x1b[Jafter erase\r\nutf-8 \xc3\xa9 stays\r\n")
TEXT = (b"SeaBIOS (version 1.16.2)\nProbing EDD (edd=off to disable)... o\n"
        b"retainz-guest: running the command\nred\tcol\n"
        b"title gone\ndcs gone\nplain\n"
        b"home\nafter erase\nutf-8 \xc3\xa9 stays\n")


def test_strips_resets_clears_and_every_sequence_kind():
    assert strip_control(RAW) == TEXT
    assert b"\x1b" not in strip_control(RAW)


def test_a_sequence_split_across_reads_is_removed_whole():
    """Every way of cutting the stream in three reads gives the same text."""
    for i in range(0, len(RAW) + 1, 3):
        for j in range(i, len(RAW) + 1, 5):
            f = ConsoleFilter()
            assert f.feed(RAW[:i]) + f.feed(RAW[i:j]) + f.feed(RAW[j:]) + f.close() == TEXT, (i, j)


@pytest.mark.parametrize("raw, text", [
    (b"abc\x1b", b"abc"),                  # a sequence cut off by the end of the stream is dropped
    (b"abc\x1b\nnext", b"abc\nnext"),      # a lone ESC is not held back
    (b"\x1b[2J\x1bcstart", b"start"),      # a clear screen at the start adds no empty line
    (b"line\n\x1b[2Jnext", b"line\nnext"),
    (b"a\rb\r\n", b"a\rb\n"),              # a bare CR (a progress line) is kept
])
def test_edges(raw, text):
    assert strip_control(raw) == text


def test_pump_copies_a_pipe_through_the_filter():
    r, w = os.pipe()
    out = io.BytesIO()
    with os.fdopen(r, "rb") as src:
        t = pump(src, out)
        for k in range(0, len(RAW), 7):
            os.write(w, RAW[k:k + 7])
        os.close(w)
        t.join(timeout=10)
    assert not t.is_alive() and out.getvalue() == TEXT
