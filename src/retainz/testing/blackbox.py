"""Black-box crash test: a writer process killed with SIGKILL at random moments, then verified
(after RocksDB's ``tools/db_crashtest.py`` "blackbox" mode: run ``db_stress`` for a while, kill it,
reopen and verify).

The writer (:func:`writer`) runs a checkpointing loop on a :class:`~retainz.zoned.FileDevice`
until it is killed: begin a generation, write one to three shards of seeded sizes and bytes,
commit (or now and then abort), delete generations beyond the latest :data:`KEEP`, now and then
run GC.  It reports what it did through a log file, one line per event, and reports an
acknowledgement only after the call returned (and fsyncs the log then)::

    open           the store is open (recovery done)
    begin GEN      before begin_generation (so an in-flight commit is known)
    commit GEN     after commit() returned: must survive
    abort GEN      after abort() returned
    delete GEN     before delete(): may be gone from now on
    deleted GEN    after delete() returned: must stay gone
    error TEXT     the writer failed on its own (a failure of the test)

Between two kills the parent (:func:`run`) reopens the store (recovery runs) and checks:

* every generation acknowledged as committed and not being deleted is present; nothing outside
  the previous committed set, this round's commits and the one in-flight commit is visible; no
  deleted generation is visible;
* every visible generation reads back byte-exact (shards and sizes are a function of its id), fsck
  is clean and the zone summaries equal a recomputation.

The device persists across rounds, as a database does across ``db_stress`` runs: each round's
writer starts with the previous round's recovery.  What a kill leaves is what the FileDevice made
durable: the data and zone state of the last flush (its module docstring).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned.file import FileDevice
from retainz.zoned.model import Geometry

__all__ = ["GEOMETRY", "KEEP", "BlackBoxReport", "run", "writer", "shard_sizes", "shard_bytes"]

#: 24 zones of 192 KiB: GC, rollover and the active limit all come into play within a few rounds.
GEOMETRY = Geometry(nr_zones=24, zone_size=256 * 1024, zone_capacity=192 * 1024, block_size=4096,
                    max_open=4, max_active=5)
#: Generations the writer keeps (older ones are deleted).
KEEP = 3
#: Share of the kills timed from the writer's start (they can land in its recovery); the others
#: are timed from its ``open`` line, so they land in the checkpointing loop even on a loaded machine.
EARLY_KILLS = 0.25
#: Steps per round: round ``r``'s generations have steps ``r * ROUND_STEPS + n``.
ROUND_STEPS = 1_000_000


def shard_sizes(gen_id: str) -> dict[str, int]:
    """The shards of generation ``gen_id`` and their sizes in bytes (0 to 100,000), seeded by the id."""
    rng = random.Random(f"sizes/{gen_id}")
    return {f"s{j}": rng.randrange(0, 100_000) for j in range(rng.randint(1, 3))}


def shard_bytes(gen_id: str, shard: str, nbytes: int) -> bytes:
    """The content of a shard: ``nbytes`` bytes seeded by the generation id and shard name."""
    return random.Random(f"{gen_id}/{shard}").randbytes(nbytes)


def writer(path: str, log_path: str, round_no: int, seed: int, early_ack: bool = False) -> None:
    """The writer process's body: the loop of the module docstring, until killed.  Any exception
    is logged as an ``error`` line (and ends the process).  ``early_ack``: acknowledge each commit
    before calling ``commit()`` (a writer that lies, for showing the check fails)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(line: str, sync: bool = False) -> None:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)

    try:
        rng = random.Random(seed)
        dev = FileDevice(path)
        store = Store.open(dev)
        log("open")
        live = [g.id for g in sorted(store.generations(), key=lambda g: g.step)]
        n = 0
        while True:
            gid, step = f"r{round_no}-{n}", round_no * ROUND_STEPS + n
            n += 1
            log(f"begin {gid}")
            w = store.begin_generation(gid, step, hint=Hint(reclaim_step=step + KEEP))
            for shard, size in shard_sizes(gid).items():
                data = shard_bytes(gid, shard, size)
                cut = rng.randrange(0, size + 1)
                w.write_shard(shard, [data[:cut], data[cut:]], size=size)
            if rng.random() < 0.1:
                w.abort()
                log(f"abort {gid}", True)
                continue
            if early_ack:
                log(f"commit {gid}", True)
            w.commit()
            if not early_ack:
                log(f"commit {gid}", True)
            live.append(gid)
            while len(live) > KEEP:
                old = live.pop(0)
                log(f"delete {old}", True)
                store.delete(old, step=step)
                log(f"deleted {old}", True)
            if rng.random() < 0.15:
                store.gc(force=True)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the round
        log("error " + " | ".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " "), True)
        raise


@dataclass
class BlackBoxReport:
    """Results of :func:`run`.

    Attributes:
        iterations: writer processes killed and verified.
        commits_acknowledged: commits the writers acknowledged over all rounds.
        in_flight_present, in_flight_absent: rounds whose in-flight commit survived / did not.
        generations_verified, bytes_verified: what the verifying reopens read back.
        seconds: wall time of the whole run.
        failures: one line per failed round.
    """

    iterations: int = 0
    commits_acknowledged: int = 0
    in_flight_present: int = 0
    in_flight_absent: int = 0
    generations_verified: int = 0
    bytes_verified: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _wait_open(proc, log_path: Path, timeout: float = 60.0) -> None:
    """Wait until the writer logged ``open`` (or ended, or ``timeout`` seconds passed)."""
    end = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < end:
        try:
            if log_path.read_bytes().startswith(b"open\n"):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.002)


def _parse(log_path: Path) -> dict[str, list[str]]:
    events: dict[str, list[str]] = {k: [] for k in ("begin", "commit", "abort", "delete", "deleted", "error")}
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            kind, _, arg = line.partition(" ")
            if kind in events:
                events[kind].append(arg)
    return events


def run(workdir: str | os.PathLike, iterations: int, *, seed: int = 0, max_delay: float = 0.25,
        early_ack: bool = False, geometry: Geometry = GEOMETRY, progress=None) -> BlackBoxReport:
    """Format a FileDevice in ``workdir`` and run ``iterations`` rounds: start a writer process,
    SIGKILL it after a random delay (uniform in 0..``max_delay`` seconds, seeded; counted from
    the writer's start in :data:`EARLY_KILLS` of the rounds, else from its ``open``), reopen, verify
    (the module docstring).  The writers are forked from a clean server process
    (``multiprocessing`` ``forkserver``, the store preloaded), so a round costs the kill delay and
    the verifying reopen, not an interpreter start.

    Args:
        workdir: a scratch directory (the device file and the writers' logs go there).
        iterations: rounds to run.
        seed: seeds the kill delays and the writers.
        max_delay: the longest a writer runs before it is killed, seconds.
        early_ack: writers acknowledge commits before ``commit()`` (see :func:`writer`).
        geometry: the device file's geometry (default :data:`GEOMETRY`).
        progress: called with (rounds done, rounds total).

    Returns:
        A :class:`BlackBoxReport`; a failed round is reported, and the run goes on from what the
        verifying reopen found.
    """
    t0 = time.perf_counter()
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    path = str(work / "blackbox.img")
    with FileDevice.create(path, geometry, force=True) as dev:
        Store.format(dev).close()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["retainz.testing.blackbox"])
    rng = random.Random(seed)
    rep = BlackBoxReport()
    committed: set[str] = set()
    for it in range(iterations):
        log_path = work / f"round-{it}.log"
        log_path.unlink(missing_ok=True)
        proc = ctx.Process(target=writer, args=(path, str(log_path), it, rng.randrange(2**32), early_ack),
                           daemon=True)
        proc.start()
        delay = rng.uniform(0, max_delay)
        if rng.random() >= EARLY_KILLS:    # most kills land in the checkpointing loop, however slow the start
            _wait_open(proc, log_path)
        proc.join(delay)
        if proc.exitcode is None:
            proc.kill()
        proc.join()
        rep.iterations += 1
        ev = _parse(log_path)
        if ev["error"]:
            rep.failures.append(f"round {it}: the writer failed: {ev['error'][0]}")
        rep.commits_acknowledged += len(ev["commit"])
        acked = set(ev["commit"])
        in_flight = set(ev["begin"]) - acked - set(ev["abort"])
        must = (committed | acked) - set(ev["delete"])
        may = committed | acked | in_flight
        try:
            committed = _verify(rep, path, must, may, set(ev["deleted"]), in_flight)
        except Exception as e:  # noqa: BLE001 - a failed round is reported, never hidden
            rep.failures.append(f"round {it}: {type(e).__name__}: {e}")
            try:
                with FileDevice(path) as dev, Store.open(dev) as store:
                    committed = {g.id for g in store.generations()}
            except Exception:  # noqa: BLE001 - the store cannot be opened: stop here
                break
        if progress:
            progress(it + 1, iterations)
    rep.seconds = time.perf_counter() - t0
    return rep


def _verify(rep: BlackBoxReport, path: str, must: set[str], may: set[str], deleted: set[str],
            in_flight: set[str]) -> set[str]:
    with FileDevice(path) as dev, Store.open(dev) as store:
        got = {g.id for g in store.generations()}
        if not must <= got:
            raise AssertionError(f"acknowledged commits missing: {sorted(must - got)}")
        if not got <= may:
            raise AssertionError(f"unacknowledged generations visible: {sorted(got - may)}")
        if got & deleted:
            raise AssertionError(f"deleted generations visible: {sorted(got & deleted)}")
        if in_flight:
            if got & in_flight:
                rep.in_flight_present += 1
            else:
                rep.in_flight_absent += 1
        for gid in got:
            sizes = shard_sizes(gid)
            shards = store.generation(gid).shards
            if set(shards) != set(sizes):
                raise AssertionError(f"generation {gid}: shards {sorted(shards)}, expected {sorted(sizes)}")
            for shard, size in sizes.items():
                back = b"".join(store.read_shard(gid, shard))
                if back != shard_bytes(gid, shard, size):
                    raise AssertionError(f"generation {gid} shard {shard}: bytes differ")
                rep.bytes_verified += size
        rep.generations_verified += len(got)
        fsck = store.fsck()
        if not fsck.ok:
            raise AssertionError("fsck: " + "; ".join(fsck.problems[:3]))
        if store.table.key() != store.recompute_table().key():
            raise AssertionError("zone summaries differ from a recomputation")
    return got
