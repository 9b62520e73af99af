"""fsspec's abstract test suite for filesystem implementers (fsspec.tests.abstract: copy, get, put,
pipe, open), run against the ``retainz`` filesystem.  Every test of the five mixins runs; the one
capability switched off is ``supports_empty_directories`` (directories exist through the files under
them, as on an object store).  fsspec/tests/abstract/mv.py holds only LocalFileSystem tests (no mixin)."""

from __future__ import annotations

import itertools
import posixpath

import pytest

fsspec = pytest.importorskip("fsspec", reason="needs fsspec (the torch, tier or mount extra: make setup-torch)")
abstract = pytest.importorskip("fsspec.tests.abstract")
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

pytestmark = pytest.mark.dcp

_COUNTER = itertools.count()

class RetainZFixtures(abstract.AbstractFixtures):
    # Class-scoped fixtures are classmethods (pytest 9 deprecates them as instance methods).
    @pytest.fixture(scope="class")
    @classmethod
    def local_fs(cls):
        """fsspec's own ``AbstractFixtures.local_fs`` (the same LocalFileSystem), as a classmethod."""
        return LocalFileSystem(auto_mkdir=True)

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls, tmp_path_factory):
        from retainz.store import Store
        from retainz.zoned import FileDevice, Geometry

        path = tmp_path_factory.mktemp("fsspec-abstract") / "dev.img"
        dev = FileDevice.create(path, Geometry(nr_zones=256, zone_size=256 << 10, zone_capacity=256 << 10))
        Store.format(dev).close()
        dev.close()
        return str(path)

    @pytest.fixture
    def fs(self, device):
        fs = fsspec.filesystem("retainz", skip_instance_cache=True)
        yield fs
        fs.close_devices()

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, device):
        return f"{device}/t{next(_COUNTER)}"   # no glob characters from the test's parameters

    @pytest.fixture
    def supports_empty_directories(self):
        return False   # directories exist through the generations under them


class TestRetainZCopy(abstract.AbstractCopyTests, RetainZFixtures):
    pass


class TestRetainZGet(abstract.AbstractGetTests, RetainZFixtures):
    pass


class TestRetainZPut(abstract.AbstractPutTests, RetainZFixtures):
    pass


class TestRetainZPipe(abstract.AbstractPipeTests, RetainZFixtures):
    pass


class TestRetainZOpen(abstract.AbstractOpenTests, RetainZFixtures):
    pass
