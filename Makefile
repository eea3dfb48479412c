# Set-up on a fresh machine: `make demo` or `make test` do everything, install included.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

# torch first, pinned: the exact pin selects the CPU wheel; a looser spec pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/bertkit quickstart

# The layers (import-linter, pyproject.toml) and ruff's rules first: seconds, and a broken layer
# or an unused import fails before the suite starts.
lint: install
	$(VENV)/bin/ruff check src tests bench docs
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest

bench: install
	$(PY) bench/encoder.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
