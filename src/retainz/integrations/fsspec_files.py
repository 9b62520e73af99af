"""The file side of the ``retainz://`` fsspec filesystem (:mod:`retainz.integrations.fsspec_fs`):
how a path maps to a generation and shard, and the buffered read and write files that stream shards
through the store."""

from __future__ import annotations

import contextlib
import io
import posixpath
import re
from typing import Any
from urllib.parse import quote

from fsspec.spec import AbstractBufferedFile

from retainz.integrations import _stores
from retainz.retention.series import series_of
from retainz.retention.steps import parse_step
from retainz.store import ShardWriter

_DCP_NAME = re.compile(r"(.*\.distcp|(__\d+)?\.metadata(\.tmp)?)")
_FILE_SHARD = "file"


def is_dcp_name(name: str) -> bool:
    """True for DCP's file names (``*.distcp``, ``.metadata``, ``.metadata.tmp``, ``__N.metadata``):
    these are shards of their directory's generation; any other file is a generation of its own."""
    return bool(_DCP_NAME.fullmatch(name))


def generation_for(inner: str) -> tuple[str, str, bool]:
    """``(generation id, shard name, is_directory_generation)`` for a file path inside a device."""
    parent, name = posixpath.split(inner)
    if is_dcp_name(name):
        if not parent:
            raise ValueError(f"{inner}: DCP files must be inside a checkpoint directory")
        return quote(parent, safe=""), name, True
    return "@" + quote(inner, safe=""), _FILE_SHARD, False


class _Pending:
    """An uncommitted directory generation being written by this instance."""

    def __init__(self, writer: Any, directory: str):
        self.writer = writer
        self.directory = directory
        self.files: dict[str, int | None] = {}     # shard name -> size (None while streaming)
        self.tmp: dict[str, bytes] = {}            # buffered .metadata.tmp (renamed to commit)
        self.release = lambda: None                # releases the device (set by the filesystem)


class _ReadFile(AbstractBufferedFile):
    DEFAULT_BLOCK_SIZE = 4 << 20

    def __init__(self, fs, path, mode, **kwargs):
        self._window: dict = {}
        super().__init__(fs, path, mode, **kwargs)
        self._device, self._inner = fs._split(path)

    def _fetch_range(self, start, end):
        return self.fs._read_range(self._device, self._inner, start, min(end, self.size), self._window)


class _WriteFile(AbstractBufferedFile):
    DEFAULT_BLOCK_SIZE = 8 << 20

    def __init__(self, fs, path, mode, **kwargs):
        super().__init__(fs, path, mode, **kwargs)
        self._device, self._inner = fs._split(path)
        self._gen, self._name, self._dir = generation_for(self._inner)
        self._sink: ShardWriter | None = None      # the shard being streamed (push-style)
        self._single: tuple | None = None      # (ExitStack, writer) of a checkpoint-file generation
        self._tmpbuf: io.BytesIO | None = io.BytesIO() if self._is_buffered() else None
        self._done = False

    def _is_buffered(self) -> bool:
        return self._dir and (self._name.endswith(".tmp") or self._name.endswith(".metadata"))

    def _initiate_upload(self):
        fs = self.fs
        if self._tmpbuf is not None:
            return
        if self._dir:
            p = fs._pending_for(self._device, self._inner)
            p.files[self._name] = None
            self._sink = p.writer.open_shard(self._name)
            return
        stack = contextlib.ExitStack()
        store = stack.enter_context(fs._store(self._device))
        try:
            step = parse_step(self._inner, file_names=True)
            fs._enter_series(self._device, store, series_of(self._inner))
            # an existing file is replaced at this one's commit (replace-on-commit: until then it
            # stays readable and intact; a crash leaves exactly one of the two)
            writer = store.begin_generation(self._gen, step or 0, replace=True,
                                            hint=fs._hint(series_of(self._inner), step))
        except BaseException:
            stack.close()
            raise
        self._single = (stack, writer)
        self._sink = writer.open_shard(_FILE_SHARD)

    def _upload_chunk(self, final=False):
        data = self.buffer.getvalue()
        if self._tmpbuf is not None:
            self._tmpbuf.write(data)
        elif data:
            self._sink.write(data)
        if final:
            self._finish()
        return True

    def _finish(self):
        fs = self.fs
        if self._tmpbuf is not None:
            blob = self._tmpbuf.getvalue()
            if self._name.endswith(".tmp"):
                p = fs._pending_for(self._device, self._inner)
                with fs._lock:
                    p.tmp[self._name] = blob
                return
            # .metadata (or __N.metadata): the last shard; .metadata commits the generation
            p = fs._pending_for(self._device, self._inner)
            p.writer.write_shard(self._name, [blob])
            p.files[self._name] = len(blob)
            if self._name == ".metadata" and self.autocommit:
                self._commit_dir()
            return
        info = self._sink.close()
        if self._dir:
            p = fs._pending[(self._device, self._gen)]
            p.files[self._name] = info.size if info is not None else 0
            if getattr(p.writer, "joined", False) and not _stores.is_coordinator():
                fs._leave((self._device, self._gen))
        elif self.autocommit:
            self.commit()

    def _commit_dir(self):
        fs = self.fs
        key = (self._device, self._gen)
        with fs._lock:
            p = fs._pending.pop(key)
        try:
            p.writer.commit()
        finally:
            p.release()

    def commit(self):
        if self._done:
            return
        self._done = True
        if self._single is not None:
            stack, writer = self._single
            try:
                writer.commit()
            finally:
                stack.close()
        elif self._dir and self._name == ".metadata" and not self.autocommit:
            self._commit_dir()

    def discard(self):
        if self._done:
            return
        self._done = True
        if self._single is not None:
            stack, writer = self._single
            with contextlib.suppress(Exception):
                writer.abort()
            stack.close()
        elif self._dir:
            with self.fs._lock:
                self.fs._abort((self._device, self._gen))

    def close(self):
        if self.closed:
            return
        try:
            super().close()
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Drop what this file wrote: its shard, and its generation unless it belongs to a
        checkpoint directory others are still writing; a replaced file stays as it was."""
        if self._sink is not None:
            with contextlib.suppress(Exception):
                self._sink.abort()
        self.discard()

    def __exit__(self, exc_type, exc, tb):
        """An exception inside ``with fs.open(path, "wb")`` abandons the file instead of committing
        what was written so far (fsspec's default closes, i.e. commits, a partial file): a partial
        ``last.ckpt`` never replaces a whole one."""
        if exc_type is None or self.closed:
            return super().__exit__(exc_type, exc, tb)
        self._abandon()
        self.closed = True
        self.buffer = None
        return False
