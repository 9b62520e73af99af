"""The open file's state machine (``retainz.namespace.openfile``): its life and how its bytes are kept
change only along the documented transitions; anything else is refused as a bug."""

from __future__ import annotations

import pytest

from retainz.namespace.openfile import Keeping, Life, OpenWrite


def test_a_file_written_closed_and_written_again_goes_opened_changed_settled_opened():
    h = OpenWrite("run/a.bin")
    assert h.life is Life.OPENED and h.unsettled and not h.to_finish
    h.change()
    assert h.life is Life.CHANGED and h.to_finish
    h.settle()
    assert h.life is Life.SETTLED and not h.unsettled and not h.to_finish
    h.reopen()
    h.change()
    assert h.life is Life.CHANGED
    h.release()
    assert h.life is Life.RELEASED and not h.live and h.done.is_set()


def test_an_error_keeps_the_first_and_a_close_reports_it():
    h = OpenWrite("run/a.bin")
    h.change()
    first, second = OSError(28, "full"), OSError(5, "io")
    h.fail(first)
    h.fail(second)
    assert h.life is Life.FAILED and h.error is first and h.to_finish and h.unsettled
    h.settle()
    assert h.life is Life.REPORTED and h.error is first and h.to_finish and not h.unsettled


def test_an_error_after_the_file_settled_is_reported_at_once():
    h = OpenWrite("run/a.bin", changed=True)
    h.settle()
    h.fail(OSError(5, "io"))
    assert h.life is Life.REPORTED


def test_a_dropped_file_takes_no_error_and_commits_nothing():
    h = OpenWrite("run/a.bin", buf=bytearray(b"abc"))
    h.change()
    assert h.drop() is False                   # nothing was streaming
    h.fail(OSError(5, "io"))
    h.settle()
    assert h.life is Life.DROPPED and h.error is None and h.buf == bytearray() and not h.live


@pytest.mark.parametrize("path", [
    lambda h: h.change(),                       # a failed file is never changed again
    lambda h: h.reopen(),
])
def test_illegal_transitions_are_refused(path):
    h = OpenWrite("run/a.bin")
    h.fail(OSError(5, "io"))
    with pytest.raises(AssertionError, match="cannot go from failed"):
        path(h)


def test_nothing_follows_a_release():
    h = OpenWrite("run/a.bin")
    h.release()
    for step in (h.change, h.reopen, h.drop):
        with pytest.raises(AssertionError, match="cannot go from released"):
            step()


def test_held_bytes_never_stream_and_ahead_streams_only_at_its_end():
    h = OpenWrite("run/a.bin", buf=bytearray(10))
    assert h.keeping is Keeping.BUFFERED and h.may_stream(10, 10) and not h.may_stream(10, 5)
    h.size = 20                                 # a length set ahead
    h.skip_ahead()
    assert h.keeping is Keeping.AHEAD and not h.may_stream(10, 10)
    h.buf.extend(bytes(10))
    assert h.may_stream(10, 20)
    h.hold()
    assert h.keeping is Keeping.HELD and not h.may_stream(10, 20)
    with pytest.raises(AssertionError, match="held cannot become streaming"):
        h.start_stream(_Sink(), "file")


class _Sink:
    def __init__(self):
        self.data = bytearray()
        self.aborted = False

    def write(self, b):
        self.data += bytes(b)

    def abort(self):
        self.aborted = True


def test_a_stream_takes_the_buffer_and_its_abort_drops_it():
    h = OpenWrite("run/a.bin", buf=bytearray(b"x" * 8))
    sink = _Sink()
    h.start_stream(sink, "file")
    assert h.streaming and h.put == 8 and sink.data == b"x" * 8 and h.buf == bytearray()
    h.pump.put(b"yy")
    assert h.abort_stream() and sink.aborted and not h.streaming and h.keeping is Keeping.BUFFERED
