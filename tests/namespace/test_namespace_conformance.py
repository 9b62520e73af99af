"""One namespace, two faces (issue 28.1): every namespace scenario runs through the real mount (FUSE,
``retainz mount``) and through ``retainz://`` (fsspec), and both must see the same result: the same
listing, sizes and bytes while the face is open, the same errno for a refused name, and the same
generations and shards in the store afterwards.

Each scenario is written once against a small face interface (:class:`MountFace`, :class:`FsspecFace`);
where the two faces' idioms differ (renaming a file still open for writing; how a failed writer cleans
up) each face does what its runtimes do, and the expected result is still one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil

import pytest

fsspec = pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.mountcheck import generations, make_device, mounted, require_fuse  # noqa: E402

BIG = 6 << 20          # past the namespace's 4 MiB stream threshold: streamed into the store as written


def _digest(b: bytes) -> str:
    """Compared instead of the bytes (pytest's report of a failed compare of megabytes is unreadable)."""
    return hashlib.sha256(b).hexdigest()[:16] + f"/{len(b)}"


def _data(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(min(n, 4096))) * (n // 4096) + bytes(n % 4096)


class MountFace:
    """The namespace through the kernel: a ``retainz mount`` server, POSIX calls on the mount point."""

    name = "mount"

    def __init__(self, device: str, tmp_path):
        require_fuse()
        self._cm = mounted(device, tmp_path / "mnt")
        self.root = str(self._cm.__enter__())

    def close(self) -> None:
        self._cm.__exit__(None, None, None)

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path)

    def makedirs(self, path: str) -> None:
        os.makedirs(self._p(path), exist_ok=True)

    def write(self, path: str, data: bytes) -> None:
        self.makedirs(os.path.dirname(path))
        with open(self._p(path), "wb") as f:
            f.write(data)

    def read(self, path: str) -> bytes:
        with open(self._p(path), "rb") as f:
            return f.read()

    def ls(self, path: str = "") -> list[str]:
        return sorted(os.listdir(self._p(path)))

    def size(self, path: str) -> int:
        return os.stat(self._p(path)).st_size

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def rename(self, a: str, b: str) -> None:
        os.rename(self._p(a), self._p(b))

    def rm_r(self, path: str) -> None:
        shutil.rmtree(self._p(path))

    def open_writer(self, path: str):
        self.makedirs(os.path.dirname(path))
        return open(self._p(path), "wb", buffering=0)

    def unlink(self, path: str) -> None:
        os.unlink(self._p(path))

    def persist_open(self, w, a: str, b: str) -> None:
        """safetensors' ``serialize_file``: the temporary file is renamed while still open, then closed."""
        self.rename(a, b)
        w.close()

    def failed_text_write(self, path: str, text: str) -> None:
        """A text-mode writer that raises; on a file system the runtime's cleanup unlinks the partial
        file while it is still open (torch's failed-write cleanup), then the ``with`` closes it."""
        self.makedirs(os.path.dirname(path))
        with open(self._p(path), "w") as f:
            f.write(text)
            f.flush()
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                os.unlink(self._p(path))
                raise


class FsspecFace:
    """The namespace through ``retainz://``: an fsspec filesystem instance."""

    name = "retainz://"

    def __init__(self, device: str, tmp_path):
        self.fs = fsspec.filesystem("retainz", skip_instance_cache=True)
        self.base = device

    def close(self) -> None:
        self.fs.close_devices()

    def _p(self, path: str) -> str:
        return f"{self.base}/{path}" if path else self.base

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(self._p(path), exist_ok=True)

    def write(self, path: str, data: bytes) -> None:
        with self.fs.open(self._p(path), "wb") as f:
            f.write(data)

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self._p(path))

    def ls(self, path: str = "") -> list[str]:
        return sorted(os.path.basename(p) for p in self.fs.ls(self._p(path), detail=False))

    def size(self, path: str) -> int:
        return self.fs.size(self._p(path))

    def isdir(self, path: str) -> bool:
        return self.fs.isdir(self._p(path))

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._p(path))

    def rename(self, a: str, b: str) -> None:
        self.fs.mv(self._p(a), self._p(b))

    def rm_r(self, path: str) -> None:
        self.fs.rm(self._p(path), recursive=True)

    def open_writer(self, path: str):
        f = self.fs.open(self._p(path), "wb", block_size=1 << 20)
        return f

    def unlink(self, path: str) -> None:
        self.fs.rm(self._p(path))

    def persist_open(self, w, a: str, b: str) -> None:
        """An fsspec file cannot be renamed while open: closed, then moved (the runtime's idiom)."""
        w.close()
        self.rename(a, b)

    def failed_text_write(self, path: str, text: str) -> None:
        with self.fs.open(self._p(path), "w") as f:
            f.write(text)
            raise RuntimeError("boom")


FACES = {"mount": MountFace, "retainz": FsspecFace}


@pytest.fixture(params=sorted(FACES))
def face(request, tmp_path):
    device = make_device(tmp_path)
    fsspec.config.conf.pop("retainz", None)
    f = FACES[request.param](device, tmp_path)
    f.device = device
    try:
        yield f
    finally:
        f.close()
        from retainz.integrations.fsspec_fs import RetainZFileSystem

        RetainZFileSystem.close_all()


def _store_view(face) -> dict[str, list[str]]:
    """``{generation id: sorted shard names}`` once the face is closed (the mount unmounted)."""
    face.close()
    return {gid: sorted(g.shards) for gid, g in generations(face.device).items()}


def _dcp_save(face, d: str, data: bytes, meta: bytes) -> None:
    """What DCP's FileSystemWriter/FsspecWriter does: data files, then ``.metadata.tmp`` renamed."""
    face.write(f"{d}/__0_0.distcp", data)
    face.write(f"{d}/.metadata.tmp", meta)
    face.rename(f"{d}/.metadata.tmp", f"{d}/.metadata")


# -- the scenarios -----------------------------------------------------------------------------------
def test_create_write_commit(face):
    data = _data(300_000, 1)
    face.write("run/model.pt", data)
    assert face.ls() == ["run"] and face.ls("run") == ["model.pt"]
    assert _digest(face.read("run/model.pt")) == _digest(data) and face.size("run/model.pt") == 300_000
    assert _store_view(face) == {"@run%2Fmodel.pt": ["file"]}


def test_directory_is_one_generation(face):
    data = _data(BIG, 2)
    _dcp_save(face, "ck/step-5", data, b"md")
    assert face.ls("ck/step-5") == [".metadata", "__0_0.distcp"]
    assert _digest(face.read("ck/step-5/__0_0.distcp")) == _digest(data) and face.size("ck/step-5/.metadata") == 2
    assert _store_view(face) == {"ck%2Fstep-5": [".metadata", "__0_0.distcp"]}


def test_nested_paths_of_a_checkpoint(face):
    """Megatron-LM: ``iter_N/mp_rank_00/model_optim_rng.pt``, then its tracker file (the commit point)."""
    model = _data(200_000, 3)
    face.write("m/iter_0000010/mp_rank_00/model_optim_rng.pt", model)
    face.write("m/latest_checkpointed_iteration.txt", b"10")
    assert face.ls("m") == ["iter_0000010", "latest_checkpointed_iteration.txt"]
    assert face.isdir("m/iter_0000010/mp_rank_00") and face.ls("m/iter_0000010") == ["mp_rank_00"]
    assert _digest(face.read("m/iter_0000010/mp_rank_00/model_optim_rng.pt")) == _digest(model)
    assert _store_view(face) == {"m%2Fiter_0000010": ["mp_rank_00%2Fmodel_optim_rng.pt"],
                                 "@m%2Flatest_checkpointed_iteration.txt": ["file"]}


def test_resave_into_the_same_directory_replaces_it(face):
    """DCP's writers default to overwrite=True (issue 28.3(a)): a second save into ``step-5`` replaces
    the first at its commit point (today: EPERM on the mount, FileExistsError on retainz://)."""
    _dcp_save(face, "ck/step-5", _data(BIG, 4), b"v1")
    new = _data(BIG, 5)
    _dcp_save(face, "ck/step-5", new, b"v2")
    assert _digest(face.read("ck/step-5/__0_0.distcp")) == _digest(new) and face.read("ck/step-5/.metadata") == b"v2"
    assert face.ls("ck/step-5") == [".metadata", "__0_0.distcp"]
    assert _store_view(face) == {"ck%2Fstep-5#1": [".metadata", "__0_0.distcp"]}


def test_a_renamed_streamed_file_gets_its_final_id(face):
    """safetensors writes a temporary file and persists it under its name (issue 27.5(b)): the store
    lists the user's name, no temporary id, no layout shard."""
    data = _data(BIG, 6)
    w = face.open_writer("run/tmpab12cd")
    w.write(data)
    face.persist_open(w, "run/tmpab12cd", "run/model.safetensors")
    assert face.ls("run") == ["model.safetensors"] and _digest(face.read("run/model.safetensors")) == _digest(data)
    assert _store_view(face) == {"@run%2Fmodel.safetensors": ["file"]}


def test_unlink_of_a_file_open_for_writing(face):
    """torch cleans up a failed write by removing the file it still has open (issue 28.3(c)): the
    file is gone at once and stays gone after its close (today: it stays on the mount, and
    retainz:// raises FileNotFoundError)."""
    face.write("run/keep.bin", b"k" * 1000)
    w = face.open_writer("run/part.bin")
    w.write(b"p" * 5000)
    w.flush()
    face.unlink("run/part.bin")
    assert not face.exists("run/part.bin") and face.ls("run") == ["keep.bin"]
    w.write(b"q" * 100)
    w.close()
    assert not face.exists("run/part.bin")
    assert _store_view(face) == {"@run%2Fkeep.bin": ["file"]}


def test_a_text_writer_that_raises_does_not_commit(face):
    """Issue 28.3(d): a text-mode ("w") writer that raises leaves nothing (today retainz:// commits it)."""
    face.write("run/keep.json", b"{}")
    with pytest.raises(RuntimeError, match="boom"):
        face.failed_text_write("run/state.json", '{"partial": ')
    assert not face.exists("run/state.json") and face.ls("run") == ["keep.json"]
    assert _store_view(face) == {"@run%2Fkeep.json": ["file"]}


def test_rm_r_retires_what_is_under_it(face):
    for step in (10, 20):
        _dcp_save(face, f"ck/step-{step}", _data(50_000 + step, step), b"m")
    face.write("ck/notes.txt", b"n")
    face.write("other/last.ckpt", b"L" * 100)
    face.rm_r("ck/step-10")
    assert face.ls("ck") == ["notes.txt", "step-20"]
    face.rm_r("ck")
    assert face.ls() == ["other"] and not face.exists("ck")
    assert _store_view(face) == {"@other%2Flast.ckpt": ["file"]}


@pytest.mark.parametrize("name, code", [
    ("d" * 120 + "/" + "f" * 140, errno.ENAMETOOLONG),    # each component fits 255 bytes, the id does not
    ("ck/step-1/" + "s" * 200 + "/" + "t" * 60, errno.ENAMETOOLONG),   # its shard name does not
    ("run/bad\udcffname.pt", errno.EINVAL),              # not UTF-8 (byte 0xff)
], ids=["id-too-long", "shard-name-too-long", "not-utf8"])
def test_a_name_the_store_refuses_is_refused_at_creation(face, name, code):
    with pytest.raises(OSError) as e:
        face.write(name, b"x")
    assert e.value.errno == code
    assert not face.exists(name)
    assert _store_view(face) == {}


def test_dots_in_names_make_valid_ids(face):
    """``run..1/step-5``: the store refuses ``..`` in ids; both faces encode it (it drifted: the mount
    made a valid id, retainz:// one the store refused)."""
    _dcp_save(face, "run..1/step-5", b"d" * 1000, b"m")
    face.write("a..b/x..y.bin", b"x" * 10)
    assert face.ls("run..1/step-5") == [".metadata", "__0_0.distcp"] and face.read("a..b/x..y.bin") == b"x" * 10
    assert _store_view(face) == {"run%2E%2E1%2Fstep-5": [".metadata", "__0_0.distcp"],
                                 "@a%2E%2Eb%2Fx%2E%2Ey%2Ebin": ["file"]}


def test_listing_and_sizes(face):
    sizes = {"run/empty.bin": 0, "run/small.bin": 1, "run/block.bin": 4096, "run/big.bin": BIG + 3,
             "run/step-7/model.pt": 123_457, "run/step-7/sub/opt.pt": 77}
    for p, n in sizes.items():
        face.write(p, _data(n, n % 7))
    assert face.ls("run") == ["big.bin", "block.bin", "empty.bin", "small.bin", "step-7"]
    assert face.ls("run/step-7") == ["model.pt", "sub"] and face.ls("run/step-7/sub") == ["opt.pt"]
    assert {p: face.size(p) for p in sizes} == sizes
    assert face.isdir("run/step-7") and not face.isdir("run/big.bin")
    assert _digest(face.read("run/big.bin")) == _digest(_data(BIG + 3, (BIG + 3) % 7))
    view = _store_view(face)      # step-7 has no commit point of its own: it commits at the face's end
    assert view == {"@run%2Fempty.bin": ["file"], "@run%2Fsmall.bin": ["file"], "@run%2Fblock.bin": ["file"],
                    "@run%2Fbig.bin": ["file"], "run%2Fstep-7": ["model.pt", "sub%2Fopt.pt"]}
