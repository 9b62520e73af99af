"""tools/fuse-setup.sh (`make setup-mount`): it finds an installed libfuse 3 whatever ldconfig prints
after the match (the new-user trial saw `make setup-mount` fail with Error 141 at random: `grep -q`
stopped reading at the match, ldconfig died of SIGPIPE and `set -o pipefail` made that a failure)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_an_installed_libfuse_is_found_when_ldconfig_prints_much_after_it(tmp_path):
    """libfuse3 listed first, then ~200 KB more of ldconfig's cache (more than a pipe holds): the script
    sees fuse3 installed, asks nothing of apt (not root here) and installs the mount extra."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _tool(bin_dir / "fusermount3", "exit 0\n")
    _tool(bin_dir / "id", "echo 1000\n")
    _tool(bin_dir / "ldconfig", "echo '\tlibfuse3.so.3 (libc6,x86-64) => /lib/x86_64-linux-gnu/libfuse3.so.3'\n"
                                "for i in $(seq 5000); do echo \"\tlibother$i.so.1 (libc6,x86-64) => /lib/x\"; done\n")
    _tool(bin_dir / "python", f'echo "$*" >> {calls}\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PY": str(bin_dir / "python")}
    for _ in range(3):
        r = subprocess.run(["bash", str(ROOT / "tools" / "fuse-setup.sh")], env=env, capture_output=True,
                           text=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, ""), r
    lines = calls.read_text().splitlines()
    assert lines[0] == "-m pip install -q -e .[mount]" and len(lines) == 6, lines
