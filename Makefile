# mlxray: `make serve` sets up and serves the default model; `make test` runs the tests;
# `make bench` runs the benchmark (BENCH_ARGS=--quick for the short one).
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/local.yaml
# the first Python >= 3.10 on PATH (a stock Mac's python3 is 3.9, which mlxray cannot use)
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	2>/dev/null && { echo $$p; break; }; done)
NO_PYTHON = mlxray needs Python 3.10 or newer, and python3 here is \
	$(shell python3 --version 2>&1 || echo missing): install one (on a Mac: brew install \
	python@3.12) or name it, e.g. make PYTHON=/opt/homebrew/bin/python3.12

# Ray 2.60 enables token auth by default; a local cluster runs without it.
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: install serve test compat lint bench screenshots clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(if $(PYTHON),,$(error $(NO_PYTHON)))
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# `serve run` with a clean stop: SIGTERM or SIGINT (Ctrl-C), to it or to its whole process group,
# stops Serve and Ray and every process they started (deployments/launch.py)
serve: install
	$(PY) -m deployments.launch $(CONFIG)

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
