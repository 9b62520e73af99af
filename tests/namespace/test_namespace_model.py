"""The namespace against a reference model (hypothesis ``RuleBasedStateMachine``).

The machine drives :class:`retainz.namespace.Namespace` over the real store on a MemoryDevice with
open/write/close of plain files and of DCP step folders (``run/step-N/__R_0.distcp``, committed by
their ``.metadata``), renames, unlinks, ``rm -r``, refused saves (a writer that raised:
``Namespace.discard``) and reopens of the store (recovery).  The reference is two dicts of bytes:
what is committed, and what each step folder being written holds.  After every rule every file's
listing, size and bytes must equal the reference; after a reopen only what committed is there.
"""

from __future__ import annotations

import errno

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from retainz.namespace import Namespace, NamespaceError
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice

GEOM = Geometry(nr_zones=48, zone_size=1 << 20, zone_capacity=1 << 20)
#: Small, so that some files stream into the store (the streamed path) and others stay buffered.
THRESHOLD = 2048

PLAIN = st.sampled_from(["a.bin", "b.bin", "run/c.pt"])
STEPS = st.sampled_from([1, 2, 3])
RANKS = st.sampled_from([0, 1])
DATA = st.binary(min_size=0, max_size=3 * THRESHOLD)


def _folder(step: int) -> str:
    return f"run/step-{step}"


class NamespaceMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.device = MemoryDevice(GEOM)
        self.store = Store.format(self.device)
        self.ns = self._namespace()
        self.committed: dict[str, bytes] = {}             # path -> bytes, as the store holds them
        self.pending: dict[int, dict[str, bytes]] = {}    # step -> {file name: bytes} being written
        self.refused: set[int] = set()                    # steps whose save was refused
        self.open: tuple | None = None                    # (fh, step, name, bytes so far) of an open file

    def _namespace(self) -> Namespace:
        return Namespace(self.store, stream_threshold=THRESHOLD, implicit_dirs=True)

    # -- what the namespace must show ----------------------------------------------------------------
    def visible(self) -> dict[str, bytes]:
        out = dict(self.committed)
        for step, files in self.pending.items():
            if step not in self.refused:
                for name, data in files.items():
                    out[f"{_folder(step)}/{name}"] = data
        if self.open is not None and self.open[1] not in self.refused:
            path = f"{_folder(self.open[1])}/{self.open[2]}"
            out.setdefault(path, self.open[3])   # others see a committed version until the new one commits
        return out

    @invariant()
    def listing_and_bytes(self):
        want = self.visible()
        got = self.ns.walk_files("")
        assert got == {p: len(d) for p, d in want.items()}
        open_path = f"{_folder(self.open[1])}/{self.open[2]}" if self.open is not None else None
        for p, data in want.items():
            if p == open_path:
                continue
            fh = self.ns.open_read(p)
            try:
                assert self.ns.read(fh, len(data) + 10, 0) == data, p
            finally:
                self.ns.release(fh)
        tops = {p.split("/", 1)[0] for p in want}
        assert set(self.ns.listdir("")) == tops

    # -- plain files: a generation of their own, committed at close ----------------------------------
    @precondition(lambda self: self.open is None)
    @rule(path=PLAIN, data=DATA)
    def write_plain(self, path, data):
        fh = self.ns.open_write(path)
        for i in range(0, len(data), 1000):
            self.ns.write(fh, data[i:i + 1000], i)
        self.ns.close(fh)
        self.ns.release(fh)
        self.committed[path] = data

    @precondition(lambda self: self.open is None)
    @rule(a=PLAIN, b=PLAIN)
    def rename_plain(self, a, b):
        if a == b:
            return          # rename(2) onto itself does nothing (the namespace does not look a up)
        if a not in self.committed:
            with pytest.raises(NamespaceError) as e:
                self.ns.rename(a, b)
            assert e.value.errno == errno.ENOENT
            return
        self.ns.rename(a, b)
        self.committed[b] = self.committed.pop(a)

    @rule(path=PLAIN)
    def unlink_plain(self, path):
        if path not in self.committed:
            with pytest.raises(NamespaceError) as e:
                self.ns.unlink(path)
            assert e.value.errno == errno.ENOENT
            return
        self.ns.unlink(path)
        del self.committed[path]

    # -- step folders: one generation each, committed by .metadata -------------------------------------
    def _begin(self, step: int) -> None:
        """A save into ``step`` begins: the refused saves beside it are forgotten (the runtime moved on)."""
        if step not in self.pending:
            self.refused -= {s for s in self.refused if s != step}
            self.pending[step] = {}

    def _committed_step(self, step: int) -> bool:
        return any(p.startswith(_folder(step) + "/") for p in self.committed)

    @precondition(lambda self: self.open is None)
    @rule(step=STEPS, rank=RANKS, data=DATA)
    def write_shard(self, step, rank, data):
        name = f"__{rank}_0.distcp"
        if step in self.refused:
            with pytest.raises(NamespaceError):
                self.ns.open_write(f"{_folder(step)}/{name}")
            return
        if name in self.pending.get(step, {}):
            return          # a shard once streamed is append-only: the reference does not model that
        fh = self.ns.open_write(f"{_folder(step)}/{name}")
        self._begin(step)
        self.ns.write(fh, data, 0)
        self.ns.close(fh)
        self.ns.release(fh)
        self.pending[step][name] = data

    @precondition(lambda self: self.open is None)
    @rule(step=STEPS, rank=RANKS, data=DATA)
    def open_shard(self, step, rank, data):
        """Open a shard and write its first bytes; it stays open across rules."""
        name = f"__{rank}_1.distcp"
        if step in self.refused or name in self.pending.get(step, {}):
            return
        fh = self.ns.open_write(f"{_folder(step)}/{name}")
        self._begin(step)
        self.ns.write(fh, data, 0)
        self.open = (fh, step, name, data)

    @precondition(lambda self: self.open is not None)
    @rule(data=DATA)
    def write_more(self, data):
        fh, step, name, so_far = self.open
        self.ns.write(fh, data, len(so_far))
        self.open = (fh, step, name, so_far + data)

    @precondition(lambda self: self.open is not None)
    @rule()
    def close_open(self):
        fh, step, name, data = self.open
        self.open = None
        self.ns.close(fh)
        self.ns.release(fh)
        self.pending.setdefault(step, {})[name] = data

    @precondition(lambda self: self.open is not None)
    @rule()
    def discard_open(self):
        """The open file's writer raised: its checkpoint is refused and never commits."""
        fh, step, _name, _data = self.open
        self.open = None
        self.ns.discard(fh)
        self.ns.release(fh)
        self.refused.add(step)
        self.pending.pop(step, None)

    @precondition(lambda self: self.open is None)
    @rule(step=STEPS, shards=st.dictionaries(RANKS, DATA, min_size=1, max_size=2))
    def save_step(self, step, shards):
        """A whole DCP save: shards, then ``.metadata`` (a save into a committed folder is its next
        version, carrying over the shards it does not rewrite)."""
        for rank, data in shards.items():
            self.write_shard(step, rank, data)
        self.commit_step(step)

    @precondition(lambda self: self.open is None)
    @rule(step=STEPS)
    def commit_step(self, step):
        """DCP's last write: ``.metadata``; the folder commits at its close."""
        path = f"{_folder(step)}/.metadata"
        if step in self.refused:
            with pytest.raises(NamespaceError):
                self.ns.open_write(path)
            return
        if not self.pending.get(step):
            return          # a folder of .metadata alone has no commit point of its own
        fh = self.ns.open_write(path)
        self.ns.write(fh, b"meta%d" % step, 0)
        self.ns.close(fh)
        self.ns.release(fh)
        files = dict(self.pending.pop(step))
        files[".metadata"] = b"meta%d" % step
        for p in [p for p in self.committed if p.startswith(_folder(step) + "/")]:
            name = p[len(_folder(step)) + 1:]
            files.setdefault(name, self.committed[p])     # a new version carries the files it did not rewrite
            del self.committed[p]
        for name, data in files.items():
            self.committed[f"{_folder(step)}/{name}"] = data

    @precondition(lambda self: self.open is None)
    @rule(a=STEPS, b=STEPS)
    def rename_step(self, a, b):
        """Rename a committed step folder (copied through the store) onto a free step."""
        if a == b or a in self.pending or b in self.pending or a in self.refused or b in self.refused:
            return
        if not self._committed_step(a) or self._committed_step(b):
            return
        self.ns.rename(_folder(a), _folder(b))
        for p in [p for p in self.committed if p.startswith(_folder(a) + "/")]:
            self.committed[_folder(b) + p[len(_folder(a)):]] = self.committed.pop(p)

    @precondition(lambda self: self.open is None)
    @rule(step=STEPS)
    def remove_step(self, step):
        """``rm -r`` of a step folder: committed -> retired, pending -> dropped, refused -> forgotten."""
        if not (self._committed_step(step) or step in self.pending or step in self.refused):
            return
        self.ns.remove_tree(_folder(step))
        for p in [p for p in self.committed if p.startswith(_folder(step) + "/")]:
            del self.committed[p]
        self.pending.pop(step, None)
        self.refused.discard(step)

    # -- recovery ----------------------------------------------------------------------------------
    @precondition(lambda self: self.open is None)
    @rule()
    def reopen(self):
        """Unmount, close the store, open it again from the device: only what committed is there."""
        self.ns.unmount()
        self.store.close()
        self.store = Store.open(self.device)
        self.ns = self._namespace()
        self.pending.clear()
        self.refused.clear()

    def teardown(self):
        if self.open is not None:
            self.ns.release(self.open[0])
        self.ns.unmount()
        self.store.close()


NamespaceMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_namespace_against_model = NamespaceMachine.TestCase
