"""A tiny in-memory stand-in with the store's public API (``retainz.store`` contract).

Used only by the torch integration tests while the real store is being written, and kept afterwards
as a second implementation of the contract (the integration must not depend on anything else).
Same semantics where the integration can observe them: one RLock, several writers at once, readers see
only committed generations, ids checked, ``read_shard`` yields chunks and verifies crc32c.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import crc32c

from retainz.errors import (
    ChecksumError,
    GenerationExistsError,
    GenerationNotFoundError,
    InvalidIdError,
    ShardNotFoundError,
)
from retainz.hint import Hint


@dataclass
class ShardInfo:
    name: str
    size: int
    crc: int | None


@dataclass
class GenerationInfo:
    id: str
    step: int
    hint: Hint = field(default_factory=Hint)
    state: str = "writing"
    shards: dict = field(default_factory=dict)
    commit_seq: int = 0

    @property
    def size(self) -> int:
        return sum(s.size for s in self.shards.values())


def _check_id(name: str) -> None:
    if (not name or name in (".", "..") or ".." in name or "/" in name or "\0" in name
            or any(ord(c) < 32 for c in name) or len(name.encode()) > 255):
        raise InvalidIdError(f"invalid id {name!r}")


class FakeWriter:
    def __init__(self, store: FakeStore, info: GenerationInfo):
        self._store, self._info, self._data, self._done = store, info, {}, False

    def write_shard(self, name, chunks=None, *, size=None):
        _check_id(name)
        with self._store.lock:
            if self._done or name in self._data:
                raise ValueError(f"shard {name!r}: writer closed or duplicate shard")
        parts, crc = [], 0
        for c in chunks or ():
            b = bytes(c)
            parts.append(b)
            crc = crc32c.crc32c(b, crc)
        data = b"".join(parts)
        with self._store.lock:
            self._data[name] = data
            info = ShardInfo(name, len(data), crc)
            self._info.shards[name] = info
            return info

    def commit(self):
        with self._store.lock:
            self._done = True
            self._store.seq += 1
            self._info.state, self._info.commit_seq = "committed", self._store.seq
            self._store.committed[self._info.id] = (self._info, self._data)
            self._store.writing.discard(self._info.id)
            return self._info

    def abort(self):
        with self._store.lock:
            self._done = True
            self._store.writing.discard(self._info.id)


class FakeStore:
    """In-memory store with the contract's API subset the integrations use."""

    def __init__(self):
        self.lock = threading.RLock()
        self.committed: dict[str, tuple[GenerationInfo, dict[str, bytes]]] = {}
        self.writing: set[str] = set()
        self.seq = 0
        self.deleted: list[tuple[str, int | None]] = []
        self.closed = False

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def begin_generation(self, gen_id, step, *, hint=None, declared_size=None, replace=False):
        _check_id(gen_id)
        with self.lock:     # replace: the commit overwrites the committed entry (replace-on-commit)
            if gen_id in self.writing or (gen_id in self.committed and not replace):
                raise GenerationExistsError(f"generation {gen_id!r} exists")
            self.writing.add(gen_id)
            return FakeWriter(self, GenerationInfo(gen_id, step, hint or Hint()))

    def generations(self):
        with self.lock:
            return sorted((i for i, _ in self.committed.values()), key=lambda g: g.commit_seq)

    def generation(self, gen_id):
        with self.lock:
            if gen_id not in self.committed:
                raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
            return self.committed[gen_id][0]

    def read_shard(self, gen_id, name):
        info = self.generation(gen_id)
        data = self.committed[gen_id][1]
        if name not in data:
            raise ShardNotFoundError(f"{gen_id}/{name}")
        blob = data[name]
        if crc32c.crc32c(blob) != info.shards[name].crc:
            raise ChecksumError(f"{gen_id}/{name}: crc mismatch", generation=gen_id, shard=name)
        for i in range(0, len(blob), 1 << 20):
            yield blob[i:i + (1 << 20)]

    def delete(self, gen_id, *, step=None):
        with self.lock:
            if gen_id not in self.committed:
                raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
            del self.committed[gen_id]
            self.deleted.append((gen_id, step))

    def advance(self, step):
        pass
