"""A hypothesis state machine: random begin/write/commit/abort/delete/gc/advance/crash/reopen
sequences against a model of what must be committed.  After every step the cached zone summaries
equal a full recomputation, and the committed set equals the model's."""

from __future__ import annotations

import os
import random

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from retainz.errors import NoSpaceError, PowerCutError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice, power_cut_states

KiB = 1024
GEOM = Geometry(nr_zones=14, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


def payload(gid: str, shard: str, n: int) -> bytes:
    return random.Random(f"{gid}/{shard}").randbytes(n)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dev = FaultyDevice(MemoryDevice(GEOM))
        self.store = Store.format(self.dev, meta_zones=3, gc_reserve_zones=1)
        self.committed: dict[str, dict[str, bytes]] = {}
        self.writers: dict[str, tuple] = {}
        self.n = 0
        self.step = 0

    def teardown(self):
        self.store.close()

    @rule(declare=st.one_of(st.none(), st.integers(0, 120 * KiB)), reclaim=st.integers(0, 50))
    def begin(self, declare, reclaim):
        gid = f"g{self.n}"
        self.n += 1
        try:
            w = self.store.begin_generation(gid, self.step, hint=Hint(reclaim_step=self.step + reclaim),
                                            declared_size=declare)
        except NoSpaceError:
            return
        self.writers[gid] = (w, {})

    @precondition(lambda self: self.writers)
    @rule(pick=st.integers(0, 10**6), size=st.integers(0, 60 * KiB), chunk=st.integers(1, 20 * KiB))
    def write(self, pick, size, chunk):
        gid = sorted(self.writers)[pick % len(self.writers)]
        w, shards = self.writers[gid]
        name = f"s{len(shards)}"
        data = payload(gid, name, size)
        try:
            w.write_shard(name, (data[i:i + chunk] for i in range(0, size, chunk)))
        except (NoSpaceError, ValueError):   # no space, or past the declared size
            return
        shards[name] = data

    @precondition(lambda self: self.writers)
    @rule(pick=st.integers(0, 10**6))
    def commit(self, pick):
        gid = sorted(self.writers)[pick % len(self.writers)]
        w, shards = self.writers.pop(gid)
        w.commit()
        self.committed[gid] = shards

    @precondition(lambda self: self.writers)
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick):
        gid = sorted(self.writers)[pick % len(self.writers)]
        self.writers.pop(gid)[0].abort()

    @precondition(lambda self: self.committed)
    @rule(pick=st.integers(0, 10**6), dt=st.integers(0, 5))
    def delete(self, pick, dt):
        gid = sorted(self.committed)[pick % len(self.committed)]
        self.step += dt
        self.store.delete(gid, step=self.step)
        del self.committed[gid]

    @rule(force=st.booleans())
    def gc(self, force):
        rep = self.store.gc(force=force)
        assert not rep.errors or all("no zone can take" in e for e in rep.errors)

    @rule(dt=st.integers(1, 10))
    def advance(self, dt):
        self.step += dt
        self.store.advance(self.step)

    @precondition(lambda self: self.committed)
    @rule(pick=st.integers(0, 10**6))
    def read(self, pick):
        gid = sorted(self.committed)[pick % len(self.committed)]
        for name, data in self.committed[gid].items():
            assert b"".join(self.store.read_shard(gid, name)) == data

    @rule(pick=st.integers(0, 10**6))
    def crash(self, pick):
        """Cut the power; the device keeps one of the states the cut can leave (each zone a prefix
        of its unflushed writes, independently)."""
        self.dev.dead = True
        try:
            self.store.close()
        except PowerCutError:
            pass
        states = power_cut_states(self.dev.unflushed(), enumerate_up_to=64, samples=8,
                                  rng=random.Random(pick))
        self.dev.reboot(states[pick % len(states)])
        self.writers.clear()              # uncommitted generations vanish
        self.store = Store.open(self.dev)

    @precondition(lambda self: self.writers)
    @rule(pick=st.integers(0, 10**6), k=st.integers(1, 3), torn=st.sampled_from([None, 0, 1]),
          state=st.integers(0, 10**6))
    def crash_during_commit(self, pick, k, torn, state):
        gid = sorted(self.writers)[pick % len(self.writers)]
        w, shards = self.writers.pop(gid)
        self.dev.cut_after_writes = self.dev.writes + k
        self.dev.torn_blocks = torn
        try:
            w.commit()
            acknowledged = True
        except PowerCutError:
            acknowledged = False
        self.crash(state)
        self.dev.torn_blocks = None
        present = gid in {g.id for g in self.store.generations()}
        assert present or not acknowledged       # an acknowledged commit is durable
        if present:                                # committed iff its commit record is durable
            self.committed[gid] = shards

    @rule()
    def reopen(self):
        for w, _ in self.writers.values():
            w.abort()
        self.writers.clear()
        before = self.store.table.key()
        self.store.close()
        self.store = Store.open(self.dev)
        assert self.store.table.key() == before      # a remount decides exactly as before
        assert not self.store.recovery.zones_reset

    @invariant()
    def summaries_equal_a_recomputation(self):
        assert self.store.table.key() == self.store.recompute_table().key()

    @invariant()
    def committed_set_matches_the_model(self):
        assert {g.id for g in self.store.generations()} == set(self.committed)


StoreMachine.TestCase.settings = settings(max_examples=int(os.environ.get("RETAINZ_STATEFUL_EXAMPLES", "40")), stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestStoreMachine = StoreMachine.TestCase
