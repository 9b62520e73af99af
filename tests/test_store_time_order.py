"""Time never runs backwards: a generation predicted to die before it is saved, or retired at a step
before its own, is refused (API: ValueError; CLI: exit 2, one line) and nothing changes."""

from __future__ import annotations

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
    assert len(err) == 1 and "reclaim step 20 is before its own step 100" in err[0]
    assert main(["put", str(path), "g", str(f), "--step", "100", "--reclaim-step", "300"]) == 0
    capsys.readouterr()
    assert main(["rm", str(path), "g", "--step", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "retirement step 10 is before its own step 100" in err[0]
    assert main(["ls", str(path)]) == 0 and "g" in capsys.readouterr().out
