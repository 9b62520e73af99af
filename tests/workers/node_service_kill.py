"""The node service, SIGKILLed by itself at a chosen point of its N-th commit (tests/node/test_node.py).

    python tests/workers/node_service_kill.py DEVICE POINT N

POINT is where in ``Store.commit_writer`` the process dies: ``before-flush`` (the clients' bytes
written, the device file not yet synced), ``before-record`` (synced, the commit record not appended)
or ``after-record`` (the record durable, the client not yet answered).  The service is the real one
(``retainz.node.serve``); only these three calls are wrapped.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(device: str, point: str, n: int) -> None:
    from retainz.node import serve
    from retainz.store import store as store_mod
    from retainz.store.metalog import MetadataLog

    seen = {"commits": 0}

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    real_commit_writer = store_mod.Store.commit_writer
    real_log_commit = MetadataLog.commit

    def commit_writer(self, w):
        seen["commits"] += 1
        if point == "before-flush" and seen["commits"] == n:
            die()
        return real_commit_writer(self, w)

    def log_commit(self, entry, replace_resets=None):
        mine = seen["commits"] == n
        if point == "before-record" and mine:
            die()
        real_log_commit(self, entry, replace_resets)
        if point == "after-record" and mine:
            die()

    store_mod.Store.commit_writer = commit_writer
    MetadataLog.commit = log_commit
    serve(device, ready=lambda svc: print(f"serving {svc.path}", file=sys.stderr, flush=True))


if __name__ == "__main__":
    if sys.argv[2] not in ("before-flush", "before-record", "after-record"):
        sys.exit(f"unknown kill point {sys.argv[2]!r}")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
