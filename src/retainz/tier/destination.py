"""A promotion destination: an fsspec URL and where each generation's objects live there
(docs/tiers.md, "Layout at the destination").

Layout under the URL ``U`` (a shared directory ``file:///mnt/lustre/ckpt``, ``s3://bucket/prefix``)::

    U/<generation id>/data/<shard>     one object per shard (names percent-quoted: one flat level)
    U/<generation id>/MANIFEST.json    written last (:mod:`.manifest`)
    U/<generation id>/MANIFEST.<node>.json   instead, with several nodes: one per node, each written
                                              last by that node (docs/tiers.md, "Several nodes")

Every call that reaches the destination turns its failure (unreachable, refused, an error mid-upload,
full) into :class:`~retainz.errors.DestinationError` naming the URL and the object; a missing object
is ``FileNotFoundError``.
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import quote

import crc32c

from retainz.errors import DestinationError, DurableCopyError
from retainz.tier.manifest import MANIFEST_NAME, Manifest

#: A node manifest's name: ``MANIFEST.<quoted node>.json``.
NODE_MANIFEST_PREFIX, NODE_MANIFEST_SUFFIX = "MANIFEST.", ".json"

__all__ = ["Destination", "object_name", "absolute_url", "READ_CHUNK"]

#: Bytes read per request when reading an object back.
READ_CHUNK = 4 << 20


def object_name(name: str) -> str:
    """A generation id or shard name as one object-name component (percent-quoted, no ``/``)."""
    return quote(name, safe="-_.~")


def absolute_url(url: str) -> str:
    """``url`` naming the same place from any working directory: a plain path, or a ``file://`` or
    ``local://`` URL, relative or with ``~``, made absolute as fsspec's local file system resolves it
    (``fsspec.implementations.local.make_path_posix``), its form kept (``ckpt`` -> ``/job/ckpt``,
    ``file://ckpt`` -> ``file:///job/ckpt``); any other URL (``s3://``, chained ``a::b``) as given.

    A remembered destination (``DEV.tier.json``) is read by commands run from anywhere (docs/tiers.md).
    Without fsspec (the tier extra) the URL is returned as given: no destination works then anyway."""
    try:
        from fsspec.core import split_protocol
        from fsspec.implementations.local import make_path_posix
    except ImportError:  # pragma: no cover - fsspec is in the tier extra
        return url
    protocol, path = split_protocol(url)
    if protocol is None:
        return make_path_posix(url)
    if protocol in ("file", "local"):
        return f"{protocol}://{make_path_posix(path)}"
    return url


def _fs_for(url: str, storage_options: dict | None):
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is in the tier extra
        raise DestinationError("promotion needs fsspec: pip install 'retainz[tier]'") from None
    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        raise DestinationError(f"{url}: no fsspec implementation for it ({e}); for s3:// pip install "
                               "'retainz[tier]'") from None
    except (ValueError, TypeError) as e:
        raise ValueError(f"{url}: not a destination URL ({e})") from None
    except OSError as e:     # a file system that connects when made (ftp://, sftp://): unknown host, refused
        raise DestinationError(f"{url}: cannot reach the destination ({e.strerror or e})",
                               errno=e.errno if isinstance(e.errno, int) and e.errno > 0 else None) from None
    return fs, root.rstrip("/")


class Destination:
    """The objects of promoted generations under one fsspec URL.

    Args:
        url: the destination (``file:///path``, a plain path, ``s3://bucket/prefix``, any fsspec URL).
        storage_options: passed to fsspec (s3fs: ``key``, ``secret``, ``client_kwargs``...).
        fs: an fsspec filesystem to use instead of the one the URL names (tests inject faults with it);
            the URL's path part is the root.

    Raises:
        ValueError: a URL fsspec cannot parse, or a local path that is a file, not a folder;
            DestinationError: no implementation for its protocol, or a file system that connects when
            made could not (an unknown host, a refused connection).
    """

    def __init__(self, url: str, *, storage_options: dict | None = None, fs=None):
        self.url = url
        if fs is None:
            self.fs, self.root = _fs_for(url, storage_options)
        else:
            self.fs = fs
            self.root = fs._strip_protocol(url).rstrip("/")
        if self._local() and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ValueError(f"{url}: not a directory (a destination holds one folder per generation)")

    def _local(self) -> bool:
        proto = self.fs.protocol if isinstance(self.fs.protocol, tuple | list) else (self.fs.protocol,)
        return bool({"file", "local"} & set(proto))

    # -- names ----------------------------------------------------------------------------------------
    def folder(self, gen_id: str) -> str:
        """The path of generation ``gen_id``'s folder."""
        return f"{self.root}/{object_name(gen_id)}"

    def shard_path(self, gen_id: str, key: str) -> str:
        """The path of the object ``key`` (a shard's, ``data/<quoted name>``) of generation ``gen_id``."""
        return f"{self.folder(gen_id)}/{key}"

    def manifest_path(self, gen_id: str, node: str | None = None) -> str:
        """The path of generation ``gen_id``'s manifest, or of node ``node``'s manifest of its part."""
        if node is None:
            return f"{self.folder(gen_id)}/{MANIFEST_NAME}"
        return f"{self.folder(gen_id)}/{NODE_MANIFEST_PREFIX}{object_name(node)}{NODE_MANIFEST_SUFFIX}"

    def where(self, path: str) -> str:
        """``path`` for messages, with the URL's protocol."""
        if self._local():
            return path
        proto = self.fs.protocol[0] if isinstance(self.fs.protocol, tuple | list) else self.fs.protocol
        return f"{proto}://{path}"

    # -- calls ----------------------------------------------------------------------------------------
    def _fail(self, what: str, path: str, e: BaseException) -> DestinationError:
        code = e.errno if isinstance(e, OSError) and e.errno else None
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        if code == _errno.ENOSPC:
            reason = f"destination full ({reason})"
        return DestinationError(f"{self.where(path)}: {what} failed: {reason}", errno=code)

    def _call(self, what: str, path: str, fn: Callable, *args, **kw):
        try:
            return fn(*args, **kw)
        except FileNotFoundError:
            raise
        except DestinationError:
            raise
        except Exception as e:   # fsspec implementations raise anything (OSError, botocore, aiohttp...)
            raise self._fail(what, path, e) from e

    def size(self, path: str) -> int | None:
        """The object's size in bytes, ``None`` when there is none.

        Raises:
            DestinationError: the destination did not answer."""
        self.fs.invalidate_cache(path)   # s3fs caches listings: ask the destination itself
        try:
            info = self._call("stat", path, self.fs.info, path)
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        return int(info["size"])

    def write(self, path: str, chunks: Iterable[bytes], *, progress: Callable[[int], None] | None = None) -> int:
        """Write ``chunks`` as the object ``path`` (replacing one there); returns the bytes written.

        Raises:
            DestinationError: the upload failed (nothing is counted; the object may be partial).
        """
        self._call("mkdir", path, self.fs.makedirs, path.rsplit("/", 1)[0], exist_ok=True)
        n = 0
        try:
            f = self.fs.open(path, "wb")
        except Exception as e:
            raise self._fail("upload", path, e) from e
        it = iter(chunks)
        while True:
            try:
                chunk = next(it)
            except StopIteration:
                break
            except BaseException:   # the local side failed (a checksum, a deletion, a stop): not the destination
                self._give_up(f)
                raise
            try:
                f.write(chunk)
            except Exception as e:
                self._give_up(f)
                raise self._fail("upload", path, e) from e
            n += len(chunk)
            if progress is not None:
                progress(len(chunk))
        try:
            f.close()      # the upload completes here (s3fs: the last part, then the multipart commit)
        except Exception as e:
            raise self._fail("upload", path, e) from e
        return n

    @staticmethod
    def _give_up(f) -> None:
        """Abandon a partial upload where the implementation can (never commit it), else close it.

        A discarded file is marked closed: s3fs's ``S3File.discard`` aborts the multipart upload and drops
        the buffer but leaves the file open, and fsspec's ``AbstractBufferedFile.__del__`` would close it
        again when collected, flushing a buffer that is gone (an AttributeError printed per upload)."""
        discard = getattr(f, "discard", None)
        if discard is not None:
            try:
                discard()
            except Exception:  # noqa: BLE001 - cannot discard (a local file writing in place): close below
                pass
            else:
                try:
                    f.closed = True
                except AttributeError:   # a file whose ``closed`` is read-only tracks it itself
                    pass
                return
        try:
            f.close()
        except Exception:  # noqa: BLE001 - the write already failed; its error is the one to report
            pass

    def read(self, path: str, *, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        """Stream the object ``path``.

        Raises:
            FileNotFoundError: no such object; DestinationError: the read failed."""
        self.fs.invalidate_cache(path)
        f = self._call("open", path, self.fs.open, path, "rb")
        try:
            while True:
                data = self._call("read", path, f.read, chunk)
                if not data:
                    return
                yield data
        finally:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a read handle cannot lose data
                pass

    def checksum(self, path: str) -> tuple[int, int] | None:
        """Read the object back: ``(size, crc32c)``, or ``None`` when there is none.

        Raises:
            DestinationError: the read failed."""
        n, crc = 0, 0
        try:
            for data in self.read(path):
                crc = crc32c.crc32c(data, crc)
                n += len(data)
        except FileNotFoundError:
            return None
        return n, crc

    def remove(self, path: str) -> None:
        """Delete the object ``path`` (none there: nothing to do).

        Raises:
            DestinationError: the delete failed."""
        try:
            self._call("delete", path, self.fs.rm_file, path)
        except FileNotFoundError:
            pass

    # -- manifests --------------------------------------------------------------------------------------
    def put_manifest(self, m: Manifest) -> None:
        """Write ``m`` and read it back.

        Raises:
            DestinationError: the write failed; DurableCopyError: what was read back differs."""
        path = self.manifest_path(m.id, m.node)
        blob = m.encode()
        self.write(path, [blob])
        back = b"".join(self.read(path))
        if back != blob:
            raise DurableCopyError(f"{self.where(path)}: the manifest read back differs from the one written")

    def node_manifest(self, gen_id: str, node: str | None = None) -> Manifest | None:
        """The manifest at :meth:`manifest_path` (``node``: that node's), ``None`` when there is none.

        Raises:
            DestinationError: the destination did not answer; DurableCopyError: a damaged manifest, or a
                node manifest naming another node."""
        path = self.manifest_path(gen_id, node)
        try:
            data = b"".join(self.read(path))
        except FileNotFoundError:
            return None
        m = Manifest.decode(data, self.where(path))
        if m.node != node:
            raise DurableCopyError(f"{self.where(path)}: the manifest is node {m.node!r}'s, not {node!r}'s")
        return m

    def node_names(self, gen_id: str) -> list[str]:
        """The nodes with a node manifest of ``gen_id`` at the destination (unverified), sorted.

        Raises:
            DestinationError: the destination did not answer."""
        from urllib.parse import unquote

        folder = self.folder(gen_id)
        self.fs.invalidate_cache(folder)
        try:
            entries = self._call("list", folder, self.fs.ls, folder, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            name = e.rstrip("/").rsplit("/", 1)[-1]
            if (name.startswith(NODE_MANIFEST_PREFIX) and name.endswith(NODE_MANIFEST_SUFFIX)
                    and name != MANIFEST_NAME):
                out.append(unquote(name[len(NODE_MANIFEST_PREFIX):-len(NODE_MANIFEST_SUFFIX)]))
        return sorted(out)

    def manifest(self, gen_id: str) -> Manifest | None:
        """The manifest of the whole generation ``gen_id`` at the destination: its ``MANIFEST.json``, or
        the union of its node manifests once every node of their world has written one
        (:meth:`Manifest.union`); ``None`` when there is none or a node's is still missing.

        Raises:
            DestinationError: the destination did not answer; DurableCopyError: a damaged manifest, or
                node manifests that disagree."""
        m = self.node_manifest(gen_id)
        if m is not None:
            return m
        present = self.node_names(gen_id)
        if not present:
            return None
        first = self.node_manifest(gen_id, present[0])
        if first is None:
            return None
        parts = [first]
        for node in first.nodes:
            if node == first.node:
                continue
            part = self.node_manifest(gen_id, node)
            if part is None:
                return None       # a node has not finished its part: not durable (yet)
            parts.append(part)
        return Manifest.union(parts, self.where(self.folder(gen_id)))

    def generations(self) -> list[str]:
        """Ids of the generations with a manifest at the destination (unverified), or with the node
        manifests of every node of their world, sorted.

        Raises:
            DestinationError: the destination did not answer."""
        from urllib.parse import unquote

        try:
            entries = self._call("list", self.root, self.fs.ls, self.root, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            name = e.rstrip("/").rsplit("/", 1)[-1]
            if self.size(f"{self.root}/{name}/{MANIFEST_NAME}") is not None:
                out.append(unquote(name))
                continue
            try:
                if self.manifest(unquote(name)) is not None:    # every node's part is there
                    out.append(unquote(name))
            except DurableCopyError:
                continue
        return sorted(out)
