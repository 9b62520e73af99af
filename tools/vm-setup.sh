#!/usr/bin/env bash
# Install what the QEMU ZNS guest lane needs, idempotently: Debian's qemu-system-x86, busybox-static,
# cpio, kmod, btrfs-progs and f2fs-tools (the guest runs the host's root, so its mkfs tools come from
# here; apt-get update once, then apt-get install -y), and a Debian kernel unpacked into
# cache/vm/kernel/ (apt-get download + dpkg-deb -x + depmod -b; nothing goes into /boot); for the FDP
# lane, bookworm-backports' qemu-system-x86 (QEMU 10) unpacked into cache/vm/qemu/ through a private apt
# state in cache/vm/apt/ (the system QEMU stays).
# A second run finds everything and runs no package command.  Called by `make vm-setup` (and so by
# `make test` and .ci/run).  Under CI=true a failure is fatal; locally the guest lane then skips with
# the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
if ! "$PY" -m retainz.vm.setup "$@"; then
    if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
        echo "tools/vm-setup.sh: the QEMU ZNS guest lane cannot be set up on this CI machine" >&2
        exit 1
    fi
    echo "tools/vm-setup.sh: warning: the QEMU guest lanes will be skipped (see the error above)" >&2
    exit 0
fi
# the FDP lane: QEMU >= 8.0 from bookworm-backports (the ZNS lane above stands without it)
if ! "$PY" -m retainz.vm.setup --fdp "$@"; then
    if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
        echo "tools/vm-setup.sh: the QEMU FDP guest lane cannot be set up on this CI machine" >&2
        exit 1
    fi
    echo "tools/vm-setup.sh: warning: the QEMU FDP guest lane will be skipped (see the error above)" >&2
fi
exit 0
