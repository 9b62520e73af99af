"""The core never imports torch or fsspec: only retainz.integrations.{dcp,fsspec_fs,payload} do."""

from __future__ import annotations

import json
import subprocess
import sys

CORE = ["retainz", "retainz.store", "retainz.zoned", "retainz.placement", "retainz.retention", "retainz.cli",
        "retainz.integrations", "retainz.hint", "retainz.spec", "retainz.integrations.retention_callbacks",
        "retainz.cli.payload"]


def test_core_imports_neither_torch_nor_fsspec():
    code = ("import importlib, json, sys\n"
            f"for m in {CORE!r}: importlib.import_module(m)\n"
            "import retainz.cli; retainz.cli.build_parser()\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'fsspec', 'transformers', 'numpy_torch'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
