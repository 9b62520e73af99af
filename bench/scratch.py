"""A benchmark's scratch folder and its JSON report: the lines every ``bench/`` script that measures
in a folder of its own shares (issue 44: they were copied between ``bench_memory`` and ``bench_mount``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable


def in_scratch(prefix: str, directory: str | None, measure: Callable[[str], dict], *,
               absolute: bool = False) -> dict:
    """``measure(folder)``'s report, run in ``directory`` or, when it is ``None``, in a fresh folder
    ``out/PREFIX*`` that is removed afterwards (also when ``measure`` raises); ``absolute`` passes the
    folder's absolute path (a benchmark whose child processes run elsewhere)."""
    os.makedirs("out", exist_ok=True)
    d = directory or tempfile.mkdtemp(prefix=prefix, dir="out")
    if absolute:
        d = os.path.abspath(d)
    try:
        return measure(d)
    finally:
        if directory is None:
            shutil.rmtree(d, ignore_errors=True)


def report(res: dict, path: str | None) -> None:
    """Print ``res`` as indented JSON and, with ``path``, write it there too (its folder made)."""
    print(json.dumps(res, indent=2))
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(res, f, indent=2)
