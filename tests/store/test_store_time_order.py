"""Time never runs backwards: a generation predicted to die before it is saved, or retired at a step
before its own, is refused (API: ValueError; CLI: exit 2, one line) and nothing changes."""

from __future__ import annotations

import re

import pytest

from retainz.cli import main
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


@pytest.mark.parametrize("reclaim", [0, 99, 99.5])
def test_a_reclaim_step_before_the_save_step_is_refused(reclaim):
    with Store.format(MemoryDevice(GEOM)) as s:
        with pytest.raises(ValueError, match=f"reclaim step {reclaim} is before its own step 100"):
            s.begin_generation("g", 100, hint=Hint(reclaim_step=reclaim))
        assert s.now == 0
        s.begin_generation("g", 100, hint=Hint(reclaim_step=100)).abort()   # the same step is fine


@pytest.mark.parametrize("at", [0, 49])
def test_a_retirement_before_the_generation_step_is_refused_and_changes_nothing(at):
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 50)
        w.write_shard("a", [b"x" * 5000])
        w.commit()
        key = s.table.key()
        with pytest.raises(ValueError, match=f"retirement step {at} is before its own step 50"):
            s.delete("g", step=at)
        assert [g.id for g in s.generations()] == ["g"] and s.table.key() == key and s.now == 50
        s.delete("g", step=50)
        assert s.generations() == []


def test_the_cli_refuses_both_with_exit_2(tmp_path, capsys):
    path = tmp_path / "dev.img"
    FileDevice.create(path, GEOM).close()
    assert main(["mkfs", str(path)]) == 0
    f = tmp_path / "model.bin"
    f.write_bytes(b"m" * 3000)
    capsys.readouterr()
    assert main(["put", str(path), "g", str(f), "--step", "100", "--reclaim-step", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["retainz: error: --reclaim-step 20 is before --step 100 (a generation cannot be retired "
                   "before it is saved)"]
    assert main(["put", str(path), "g", str(f), "--step", "100", "--reclaim-step", "300"]) == 0
    capsys.readouterr()
    assert main(["rm", str(path), "g", "--step", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["retainz: error: --step 10 is before step 100 of generation 'g' (a generation cannot be "
                   "retired before it is saved)"]
    assert main(["ls", str(path)]) == 0 and "g" in capsys.readouterr().out


@pytest.mark.parametrize("call", [
    lambda s: s.begin_generation("x", True),
    lambda s: s.begin_generation("x", 2 ** 63),
    lambda s: s.begin_generation("x", 10 ** 400),
    lambda s: s.begin_generation("x", 1.5),
    lambda s: s.begin_generation("x", 1, hint=Hint(reclaim_step=float("nan"))),
    lambda s: s.begin_generation("x", 1, hint=Hint(reclaim_step="x")),
    lambda s: s.begin_generation("x", 1, hint="soon"),
    lambda s: s.update_hint("g", Hint(reclaim_step=400), step=-7),
    lambda s: s.update_hint("g", Hint(reclaim_step=400), step="x"),
    lambda s: s.update_hint("g", "soon"),
    lambda s: s.update_hint("g", Hint(reclaim_step=float("nan"))),
    lambda s: s.delete("g", step="300"),
    lambda s: s.delete("g", step=2 ** 64),
    lambda s: s.advance(-1),
])
def test_steps_and_hints_that_are_not_are_refused_with_a_value_error(call):
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 50, hint=Hint(reclaim_step=100))
        w.write_shard("a", [b"x" * 5000])
        w.commit()
        key, now = s.table.key(), s.now
        with pytest.raises(ValueError) as e:
            call(s)
        assert "\n" not in str(e.value)
        assert [g.id for g in s.generations()] == ["g"] and s.table.key() == key and s.now == now
        assert s.generation("g").hint.reclaim_step == 100


MAX = 2 ** 63 - 1


@pytest.mark.parametrize("call, text", [
    (lambda s: s.begin_generation("x", True), f"step must be an int from 0 to {MAX}, not True"),
    (lambda s: s.begin_generation("x", -1), f"step must be an int from 0 to {MAX}, not -1"),
    (lambda s: s.begin_generation("x", MAX + 1), f"step must be an int from 0 to {MAX}, not {MAX + 1}"),
    (lambda s: s.delete("g", step="300"), f"step must be an int from 0 to {MAX}, not '300'"),
    (lambda s: s.begin_generation("x", 1, hint="soon"), "hint must be a retainz.hint.Hint, not str"),
    (lambda s: s.begin_generation("x", 1, hint=Hint(reclaim_step=float("nan"))),
     "hint reclaim_step must be a number or None, not nan"),
    (lambda s: s.begin_generation("x", 1, hint=Hint(reclaim_step="x")),
     "hint reclaim_step must be a number or None, not 'x'"),
    (lambda s: s.update_hint("g", Hint(reclaim_step=400, actual_reclaim_step=float("nan"))),
     "hint actual_reclaim_step must be a number or None, not nan"),
    (lambda s: s.update_hint("g", Hint(reclaim_step=400, actual_reclaim_step=[1])),
     "hint actual_reclaim_step must be a number or None, not [1]"),
])
def test_refusals_of_steps_and_hints_name_the_value(call, text):
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 50, hint=Hint(reclaim_step=100))
        w.write_shard("a", [b"x" * 5000])
        w.commit()
        with pytest.raises(ValueError, match="^" + re.escape(text) + "$"):
            call(s)
        assert [g.id for g in s.generations()] == ["g"] and s.now == 50


def test_steps_from_zero_to_the_largest_and_numeric_hints_are_taken():
    with Store.format(MemoryDevice(GEOM)) as s:
        s.begin_generation("zero", 0, hint=Hint(reclaim_step=0, actual_reclaim_step=0)).commit()
        s.begin_generation("half", 7, hint=Hint(reclaim_step=7.5, actual_reclaim_step=9)).commit()
        s.begin_generation("last", MAX, hint=Hint(reclaim_step=float("inf"), actual_reclaim_step=MAX)).commit()
        assert [(g.id, g.step) for g in s.generations()] == [("zero", 0), ("half", 7), ("last", MAX)]
        assert s.now == MAX
        s.delete("last", step=MAX)
        s.update_hint("half", Hint(reclaim_step=None, actual_reclaim_step=8.5))
        assert s.generation("half").hint.actual_reclaim_step == 8.5
