"""`retainz trace generate` and `trace mix` write their output over a missing or empty file, or over
a RetainZ trace; anything else (a device file holding a store, any other file) needs --force."""

from __future__ import annotations

import pytest

from retainz.cli import main

GEN = ["trace", "generate", "--layout", "smollm2-135m-dcp", "--retention", "torchtitan:interval=1,keep_latest_k=2",
       "--steps", "5"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def traces(tmp_path, capsys):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    assert main([*GEN, "-o", str(a)]) == 0 and main([*GEN, "--seed", "1", "-o", str(b)]) == 0
    capsys.readouterr()
    return a, b


def store_file(tmp_path):
    dev = tmp_path / "store.img"
    main(["device", "create", str(dev), "--zones", "8", "--zone-size", "1MiB"])
    main(["mkfs", str(dev)])
    return dev


@pytest.mark.parametrize("command", ["generate", "mix"])
@pytest.mark.parametrize("victim", ["store", "foreign"])
def test_output_that_is_not_a_trace_is_refused_untouched(tmp_path, capsys, traces, command, victim):
    if victim == "store":
        target = store_file(tmp_path)
    else:
        target = tmp_path / "notes.txt"
        target.write_text("my notes\n")
    before = target.read_bytes()
    argv = [*GEN] if command == "generate" else ["trace", "mix", str(traces[0]), str(traces[1])]
    capsys.readouterr()
    code, _, err = run(capsys, *argv, "-o", str(target))
    assert code == 2
    assert err.strip() == f"retainz: error: {target} exists and is not a RetainZ trace; pass --force to overwrite it"
    assert target.read_bytes() == before
    code, _, _ = run(capsys, *argv, "-o", str(target), "--force")
    assert code == 0 and target.read_bytes().startswith(b'{"type":"header"')


@pytest.mark.parametrize("command", ["generate", "mix"])
def test_an_existing_trace_or_empty_file_is_rewritten(tmp_path, capsys, traces, command):
    out = tmp_path / "out.trace"
    argv = [*GEN, "--seed", "3"] if command == "generate" else ["trace", "mix", str(traces[0]), str(traces[1])]
    for _ in range(2):                                   # the second run rewrites the first's trace
        assert run(capsys, *argv, "-o", str(out))[0] == 0
    first = out.read_bytes()
    out.write_bytes(b"")
    assert run(capsys, *argv, "-o", str(out))[0] == 0 and out.read_bytes() == first
    d = tmp_path / "dir"
    d.mkdir()
    code, _, err = run(capsys, *argv, "-o", str(d))
    assert code == 2 and err.strip() == f"retainz: error: {d} is a directory, not a trace file"
