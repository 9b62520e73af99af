"""The committed view: which committed generations a namespace shows, and at which paths.

One table owns it: each committed generation shown (a file generation, ``@`` id, or a checkpoint
directory) by its id, by ``(kind, path)`` and by the path of each of its files, and the paths of
files and directories inside committed checkpoints that were removed (``unlink``, ``rmdir``) while
the generation stays until ``rm -r`` retires it (a checkpoint directory's generation is all or
nothing in the store).  Every change goes through :meth:`CommittedView.add` and
:meth:`CommittedView.forget`, which keep the three indexes and the hidden paths consistent.

A generation's paths come from its id (:mod:`retainz.ids`) or, for one renamed while it was written,
from its layout shard (:data:`retainz.namespace.names.LAYOUT_SHARD`, read once per commit).  Of
several committed versions of one path the newest (``commit_seq``) is shown
(:func:`retainz.namespace.names.newest_versions`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from retainz import ids
from retainz.namespace import names as L

__all__ = ["CommittedGeneration", "CommittedView"]

#: A generation committed in an earlier session shows its ``commit_seq`` as this many ns since the
#: epoch (the store keeps logical time only), so time order is commit order.
SEQ_NS = 1_000_000_000


@dataclass
class CommittedGeneration:
    """A committed generation as the namespace shows it.

    Attributes:
        id: the generation id.
        kind: ``"dir"`` (a checkpoint directory) or ``"file"`` (a file of its own).
        path: the directory's or the file's path (no leading ``/``).
        names: shard -> path relative to the directory (``""`` for a file).
        sizes: shard -> bytes.
        mtime_ns: its time (ns since the epoch).
    """

    id: str
    kind: str
    path: str
    names: dict[str, str]
    sizes: dict[str, int]
    mtime_ns: int

    def file_paths(self) -> Iterator[tuple[str, str]]:
        """``(file path, shard)`` of each of its files."""
        for s, rel in self.names.items():
            yield (posixpath.join(self.path, rel) if rel else self.path), s


class CommittedView:
    """The committed generations a namespace shows (see the module docstring).

    Args:
        store: the open store (its layout shards are read from it).
    """

    def __init__(self, store):
        self.store = store
        self._gens: dict[str, CommittedGeneration] = {}
        self._by_path: dict[tuple[str, str], str] = {}
        self._files: dict[str, tuple[str, str]] = {}        # file path -> (gid, shard)
        self._hidden: set[str] = set()                      # removed paths inside committed checkpoints
        self._layouts: dict[tuple[str, int], tuple[str, dict[str, str]]] = {}
        self._seen: tuple = ()

    # -- reading ------------------------------------------------------------------------------------
    def __contains__(self, gid: str) -> bool:
        return gid in self._gens

    def __iter__(self) -> Iterator[CommittedGeneration]:
        return iter(list(self._gens.values()))

    def get(self, gid: str) -> CommittedGeneration | None:
        """The generation ``gid`` shown, or ``None``."""
        return self._gens.get(gid)

    def at(self, kind: str, path: str) -> str | None:
        """The id of the ``kind`` (``"dir"``, ``"file"``) generation shown at ``path``, or ``None``."""
        return self._by_path.get((kind, path))

    def has_file(self, path: str) -> bool:
        """Whether a committed generation has a file at ``path`` (hidden or not)."""
        return path in self._files

    def shard_at(self, path: str) -> tuple[CommittedGeneration, str]:
        """``(generation, shard)`` of the committed file at ``path``.

        Raises:
            KeyError: no committed file there."""
        gid, shard = self._files[path]
        return self._gens[gid], shard

    def shows(self, path: str) -> bool:
        """Whether a committed file is shown at ``path`` (it exists and is not hidden)."""
        return path in self._files and path not in self._hidden

    def size(self, path: str) -> int:
        """Bytes of the committed file at ``path`` (``KeyError``: none)."""
        g, shard = self.shard_at(path)
        return g.sizes[shard]

    def hidden(self, path: str) -> bool:
        """Whether ``path`` inside a committed checkpoint was removed."""
        return path in self._hidden

    def in_checkpoint(self, path: str) -> bool:
        """Whether ``path`` is a file of a committed checkpoint directory (hidden or not)."""
        return path in self._files and self._gens[self._files[path][0]].kind == "dir"

    def files(self) -> dict[str, int]:
        """``{file path: mtime_ns}`` of every committed file shown."""
        return {p: self._gens[gid].mtime_ns for p, (gid, _) in self._files.items() if p not in self._hidden}

    def directories(self) -> dict[str, int]:
        """``{directory: mtime_ns}`` of committed checkpoint directories and the directories inside them
        not removed (they stay until removed, even when emptied)."""
        dirs: dict[str, int] = {}
        for g in self._gens.values():
            if g.kind == "dir":
                dirs.setdefault(g.path, g.mtime_ns)
                for rel in g.names.values():
                    sub = posixpath.dirname(rel)
                    while sub:
                        q = posixpath.join(g.path, sub)
                        if q not in self._hidden:
                            dirs.setdefault(q, g.mtime_ns)
                        sub = posixpath.dirname(sub)
        return dirs

    # -- changing -----------------------------------------------------------------------------------
    def add(self, info, kind: str, path: str, names: dict[str, str], mtime_ns: int) -> CommittedGeneration:
        """Show committed generation ``info`` (a ``GenerationInfo``) as ``kind`` at ``path`` with files
        ``names`` (shard -> relative path); it takes the paths over from what showed there."""
        g = CommittedGeneration(info.id, kind, path, names, {s: info.shards[s].size for s in names}, mtime_ns)
        self._gens[g.id] = g
        self._by_path[(kind, path)] = g.id
        for p, s in g.file_paths():
            self._files[p] = (g.id, s)
        return g

    def forget(self, gid: str) -> CommittedGeneration | None:
        """Stop showing ``gid`` (retired, replaced, or deleted elsewhere): its paths and what was
        hidden of it go; the generation, or ``None`` if it was not shown."""
        g = self._gens.pop(gid, None)
        if g is None:
            return None
        if self._by_path.get((g.kind, g.path)) == gid:
            del self._by_path[(g.kind, g.path)]
        for p, _ in g.file_paths():
            if self._files.get(p, (None,))[0] == gid:
                del self._files[p]
            self._hidden.discard(p)
        if g.kind == "dir":
            self._hidden -= {h for h in self._hidden if h.startswith(g.path + "/")}
        return g

    def hide(self, path: str) -> None:
        """``path`` inside a committed checkpoint was removed (``unlink``, ``rmdir``)."""
        self._hidden.add(path)

    # -- the store's generations --------------------------------------------------------------------
    def resolve(self, info) -> tuple[str, str, dict[str, str]]:
        """``(kind, path, {shard: relative path})`` of committed generation ``info``: from its id, or
        from its layout shard (read once per commit)."""
        kind, path, _ = ids.parse_generation_id(info.id)
        names = {s: ("" if kind == "file" else ids.shard_path(s)) for s in info.shards if s != L.LAYOUT_SHARD}
        if L.LAYOUT_SHARD in info.shards:
            key = (info.id, info.commit_seq)
            if key not in self._layouts:
                self._layouts[key] = L.read_layout(b"".join(self.store.read_shard(info.id, L.LAYOUT_SHARD)))
            path, names = self._layouts[key]
        return kind, path, names

    def load(self, gens: Iterable) -> tuple[list[tuple[CommittedGeneration, object]], list]:
        """Show the newest version of every path of the store's committed generations ``gens`` (a
        namespace's first look).  Returns ``(shown, stale)``: each generation shown with its info, in
        commit order, and the infos of older versions (a replace interrupted by a crash), which the
        caller retires."""
        gens = list(gens)
        found = [(g, *self.resolve(g)) for g in gens]
        by_id = {g.id: (kind, path, names) for g, kind, path, names in found}
        best, stale = L.newest_versions((g, kind, path) for g, kind, path, _ in found)
        shown = []
        for g in sorted(best.values(), key=lambda g: g.commit_seq):
            kind, path, names = by_id[g.id]
            shown.append((self.add(g, kind, path, names, g.commit_seq * SEQ_NS), g))
        gone = {g.id for g in stale}
        self._seen = (tuple((g.id, g.commit_seq) for g in gens if g.id not in gone), frozenset())
        return shown, stale

    def sync(self, gens: Iterable, *, skip: set[str], retiring: frozenset[str]) -> bool:
        """Bring the view up to date with the store's committed generations ``gens``, leaving out the
        ids in ``skip`` (in flight in this namespace) and ``retiring`` (deletions deferred by a durable
        tier): generations committed elsewhere appear, deleted ones go, the newest version of a path
        is shown.  Returns whether anything was looked at (False: nothing changed since the last sync)."""
        gens = list(gens)
        key = (tuple((g.id, g.commit_seq) for g in gens), retiring)
        if key == self._seen and self._gens.keys() <= {g.id for g in gens}:
            return False    # (this namespace's own commits since are in the view; one deleted elsewhere is not)
        current = {g.id: g for g in gens if g.id not in skip and g.id not in retiring}
        for gid in [gid for gid in self._gens if gid not in current]:
            self.forget(gid)
        found = [(g, *self.resolve(g)) for g in current.values()]
        best, stale = L.newest_versions((g, kind, path) for g, kind, path, _ in found)
        for g in stale:
            self.forget(g.id)
        by_id = {g.id: (kind, path, names) for g, kind, path, names in found}
        for g in sorted(best.values(), key=lambda g: g.commit_seq):
            known = self._gens.get(g.id)
            kind, path, names = by_id[g.id]
            if known is None or set(known.names) != set(names) or any(
                    known.sizes[s] != g.shards[s].size for s in known.names):
                if known is not None:
                    self.forget(g.id)
                self.add(g, kind, path, names, g.commit_seq * SEQ_NS)
        self._seen = key
        return True
