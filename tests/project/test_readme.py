"""The README's three ways in run as written, one after another, in one folder (issue 44.4).

A new user found the sections reusing ``dev.img`` and ``ckpt/`` (the CLI section's ``device create``
refused, the DCP snippet wrote a sparse 4 GiB ``rank0.img`` into the folder that had been the mount
point) and placeholders nobody marked (``train.py``, ``model.bin``).  This test reads the code blocks
of README.md's "Three ways in" and runs them in a fresh folder laid out as the repository root (its
``.venv`` and ``examples``): the mount path (FUSE: ``make setup-mount``), the DCP snippet (torch:
``make setup-torch``) and the command line, in the README's order.  ``make`` lines are checked to
name a Makefile target, not run; the researchers' block (the full experiment matrix, hours) is
checked to name files that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.mountcheck import require_fuse

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```(sh|python)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    """(language, text) of each code block in README.md's "Three ways in", in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Three ways in"):]
    section = section[:section.index("\n## ", 1)]
    return BLOCK.findall(section)


def shell(block: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a README shell block with bash (errors stop it), ``make`` lines checked, not run."""
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    lines = []
    for line in block.splitlines():
        if line.startswith("make "):
            assert line.split()[1] in targets, line
            continue
        lines.append(line)
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(lines)], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


def mounts_under(folder: Path) -> list[str]:
    """Mount points below ``folder`` (``/proc/self/mounts``)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p.startswith(str(folder) + "/")]


def ls(cwd: Path, device: str) -> list[str]:
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "retainz"), "ls", device], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [line.split("\t")[0] for line in r.stdout.splitlines()]


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "retainz").exists(), reason="the README runs .venv/bin/retainz: make setup")
def test_the_readme_paths_run_as_written_one_after_another(tmp_path):
    require_fuse()
    torch_ok = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", "import torch"],
                              capture_output=True).returncode == 0
    if not torch_ok and os.environ.get("CI") not in ("true", "1"):
        pytest.skip("the DCP snippet needs torch: make setup-torch")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    found = blocks()
    assert [lang for lang, _ in found] == ["sh", "python", "sh", "sh"]
    (_, mount), (_, dcp), (_, research), (_, cli) = found

    try:
        r = shell(mount, tmp_path)
        assert r.returncode == 0, r.stderr
    finally:       # whatever the block mounted under tmp_path (a failed run must not leave a mount)
        for point in mounts_under(tmp_path):
            subprocess.run([str(ROOT / ".venv" / "bin" / "retainz"), "umount", point], capture_output=True,
                           timeout=120)
    assert "step 2000: saved mnt/run/checkpoint-2000" in r.stdout
    # examples/train.py keeps the newest two (save_total_limit 2); the mount retired the others
    assert sorted(ls(tmp_path, "mount.img")) == ["run%2Fcheckpoint-1500", "run%2Fcheckpoint-2000"]
    assert os.listdir(tmp_path / "mnt") == []                  # unmounted: the mount point is an empty folder

    r = subprocess.run([str(tmp_path / ".venv" / "bin" / "python"), "-c", dcp], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert ls(tmp_path, "dcp/rank0.img") == ["step-500"]
    assert os.listdir(tmp_path / "mnt") == []                  # nothing written where the mount was

    for path in re.findall(r"(experiments/\S+\.json)", research):
        assert (ROOT / path).is_file(), path

    r = shell(cli, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "restored" / "model.bin").read_bytes() == (tmp_path / "model.bin").read_bytes()
    assert (tmp_path / "model.bin").stat().st_size == 100 << 20
    assert ls(tmp_path, "cli.img") == ["step-100"]
    assert "clean" in r.stdout


def test_git_ignores_what_the_readme_paths_leave():
    """The files the three paths make in a clone are ignored by git (and a mount's log too)."""
    made = ["mount.img", "mount.img.mount.log", "mnt/", "dcp/rank0.img", "cli.img", "model.bin", "restored/model.bin"]
    r = subprocess.run(["git", "check-ignore", "--no-index", *made], cwd=ROOT, capture_output=True, text=True)
    assert sorted(r.stdout.split()) == sorted(made)
