# RetainZ developer entry points. Every target builds its own virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup demo test lint bench clean

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

# The whole test command CI runs (.ci/run calls exactly this).
test: lint
	$(PY) -m pytest -q -m "not zns_guest and not payload"

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
