"""The durable destinations the tier suite runs against (docs/tiers.md): a directory tree
(``file://``) and an S3 bucket (s3fs over HTTP on loopback to moto's standalone server, started and
stopped by the tests, never an in-process mock).  :class:`TierDestination` is what a test asks of
either: the URL, the options a promoter needs, a fresh client to look at the objects independently of
the promoter, and a fault-injecting client over the same destination (:mod:`tests.tierfaults`)."""

from __future__ import annotations

import contextlib
import functools
import socket
import subprocess
import sys
import time
import uuid

#: The destination kinds every destination test runs on.
KINDS = ["dir", "s3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server():
    """moto's S3 server on a free loopback port; yields ``(endpoint URL, process)``; stopped on exit."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("moto server did not start listening")
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def options(endpoint: str) -> dict:
    """s3fs options for ``endpoint`` (moto's test credentials; one attempt, short timeouts)."""
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10},
            "skip_instance_cache": True}


#: The AWS environment that points a client made from a bare ``s3://`` URL (the CLI, a subprocess, a
#: DCP writer's ``promote=``) at the endpoint, as docs/tiers.md tells users to.
def aws_env(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}


def forget_s3_clients() -> None:
    """Drop fsspec's cached s3fs clients: one made from a bare ``s3://`` URL is cached by its arguments
    alone, so a test that points the ``AWS_*`` variables elsewhere would otherwise get an earlier
    test's client (and endpoint)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@functools.cache
def _admin(endpoint: str):
    """One client per endpoint for making buckets (a botocore session costs about a second)."""
    import s3fs

    return s3fs.S3FileSystem(**options(endpoint))


def new_bucket(endpoint: str) -> str:
    """A fresh, empty bucket at ``endpoint``; returns its name."""
    name = f"t{uuid.uuid4().hex[:16]}"
    _admin(endpoint).call_s3("create_bucket", Bucket=name)
    return name


class TierDestination:
    """One fresh, empty destination of ``kind`` (``"dir"``: the folder ``ckpt`` in ``tmp_path``'s ``shared`` folder; ``"s3"``:
    ``s3://<fresh bucket>/ckpt`` at ``endpoint``).  Objects are named by their path relative to the
    URL (``step-1/data/model.bin``)."""

    def __init__(self, kind: str, tmp_path, endpoint: str | None = None):
        self.kind, self.endpoint, self._fs = kind, endpoint, None
        if kind == "dir":
            self.url = (tmp_path / "shared" / "ckpt").as_uri()
        elif kind == "s3":
            self.url = f"s3://{new_bucket(endpoint)}/ckpt"
        else:
            raise ValueError(kind)

    @property
    def storage_options(self) -> dict | None:
        """What a Promoter/Destination is given (``storage_options=``) to reach the destination."""
        return options(self.endpoint) if self.kind == "s3" else None

    def fs(self):
        """A client of the destination of its own (independent of any promoter's; made once)."""
        if self._fs is None:
            if self.kind == "dir":
                from fsspec.implementations.local import LocalFileSystem

                self._fs = LocalFileSystem()
            else:
                import s3fs

                self._fs = s3fs.S3FileSystem(**options(self.endpoint))
        return self._fs

    def faulty(self):
        """A fault-injecting client of the destination (:mod:`tests.tierfaults`), all switches off."""
        from tests.tierfaults import FaultyLocal, faulty_s3

        return FaultyLocal() if self.kind == "dir" else faulty_s3(**options(self.endpoint))

    def path(self, rel: str = "") -> str:
        """The client path of the object ``rel`` (or of the root)."""
        root = self.fs()._strip_protocol(self.url).rstrip("/")
        return f"{root}/{rel}" if rel else root

    def cat(self, rel: str) -> bytes:
        return self.fs().cat_file(self.path(rel))

    def pipe(self, rel: str, data: bytes) -> None:
        """Replace the object ``rel`` with ``data`` behind every promoter's back."""
        self.fs().pipe_file(self.path(rel), data)

    def listdir(self, rel: str = "") -> list[str]:
        """Names of the entries under ``rel`` (one level), sorted (asked now: s3fs caches listings)."""
        self.fs().invalidate_cache(self.path(rel))
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs().ls(self.path(rel), detail=False))

    def __repr__(self) -> str:
        return f"TierDestination({self.url})"
