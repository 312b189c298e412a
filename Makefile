# mlxray: `make serve` sets up and serves the default model; `make test` runs the tests.
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/local.yaml
PYTHON ?= python3

# Ray 2.60 enables token auth by default; a local cluster runs without it.
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: install serve test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

serve: install
	$(VENV)/bin/serve run $(CONFIG)

test: install
	$(PY) -m pytest -q -p no:warnings

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
