# mlxray: `make serve` sets up and serves the default model; `make test` runs the tests;
# `make bench` runs the benchmark (BENCH_ARGS=--quick for the short one).
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/local.yaml
PYTHON ?= python3

# Ray 2.60 enables token auth by default; a local cluster runs without it.
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: install serve test compat lint bench screenshots clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

serve: install
	$(VENV)/bin/serve run $(CONFIG)

# the compat manifest is validated (and its docs checked up to date) before the tests run
test: install
	$(PY) -m compat.check
	$(PY) -m compat.render --check
	$(PY) -m pytest -q -p no:warnings

# rewrite the manifest shards canonically, then regenerate docs/llama-server-compat.md and README
compat: install
	$(PY) -m compat.check --fix
	$(PY) -m compat.render

lint: install
	$(VENV)/bin/ruff check .

bench: install $(VENV)/.bench-installed
	$(PY) -m bench $(BENCH_ARGS)

$(VENV)/.bench-installed: pyproject.toml
	$(PY) -m pip install -q -e ".[dev,bench]"
	touch $@

# the web page's screenshots under docs/img (README), taken by its browser tests
screenshots: install
	MLXRAY_SCREENSHOTS=docs/img $(PY) -m pytest -q -p no:warnings tests/test_webui.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
