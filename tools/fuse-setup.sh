#!/usr/bin/env bash
# libfuse 3 and fusermount3 for `retainz mount` (the Debian package fuse3), and the mount extra
# (mfusepy) in the project's virtual environment.  Idempotent; run by `make setup-mount`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# grep reads ldconfig's whole list (no -q): stopping at the match would kill ldconfig with SIGPIPE, which
# pipefail turns into "not installed" at random (make setup-mount then failed with Error 141).
have_fuse() { command -v fusermount3 >/dev/null && ldconfig -p | grep 'libfuse3\.so' >/dev/null; }

if ! have_fuse; then
    if [ "$(id -u)" != 0 ]; then
        echo "fuse-setup: the Debian package fuse3 is missing; install it as root: apt-get install -y fuse3" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends fuse3 >/dev/null
fi
have_fuse
"$PY" -m pip install -q -e '.[mount]'
"$PY" -c "import mfusepy; print('fuse-setup: libfuse', '.'.join(map(str, (mfusepy.fuse_version_major, mfusepy.fuse_version_minor))), 'and mfusepy ready')"
