# RetainZ developer entry points. Every target builds its own virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup demo test lint bench bench-device vm-setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# The main job on the embedded default (a file-backed zoned device).
demo: setup
	$(VENV)/bin/retainz demo --out out/demo

lint: setup
	$(VENV)/bin/ruff check src tests bench tools

# The whole test command CI runs (.ci/run calls exactly this).  The second pytest is the QEMU ZNS guest
# lane: one TCG guest runs the device conformance suite on an NVMe ZNS namespace and on null_blk zoned.
test: lint vm-setup
	$(PY) -m pytest -q -m "not zns_guest and not payload"
	$(PY) -m pytest -q -rs -m zns_guest tests/test_zns_guest.py

# QEMU, busybox, cpio, kmod and a guest kernel for the zns_guest lane (idempotent; cache in cache/vm).
vm-setup: setup
	PY=$(PY) bash tools/vm-setup.sh

bench: setup
	$(PY) -m bench

# LinuxZonedDevice vs os.pwrite in the QEMU guest, FileDevice vs os.pwrite on the host: both ratios.
bench-device: vm-setup
	$(PY) -m bench.device_write

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
