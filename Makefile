# mlxray: `make serve` sets up and serves the default model; `make test` runs the tests;
# `make bench` runs the benchmark (BENCH_ARGS=--quick for the short one).
# MLX's backend is chosen at install: MLX_BACKEND=cpu (the default), cuda (CUDA 12) or cuda13 on
# Linux, e.g. `make install MLX_BACKEND=cuda`; a Mac always gets Metal.
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
MLX_BACKEND ?= cpu
BACKEND_PACKAGES := mlx-cpu mlx-cuda-12 mlx-cuda-13
BACKEND_PACKAGE_cpu := mlx-cpu
BACKEND_PACKAGE_cuda := mlx-cuda-12
BACKEND_PACKAGE_cuda13 := mlx-cuda-13

# `make serve`'s cluster runs with Ray's token auth (the launcher sets RAY_AUTH_MODE=token and
# makes ~/.ray/auth_token: deployments/cli/ray_auth.py); the test suite's cluster runs without it
# (RAY_AUTH_MODE=disabled below; the tests that start the command check its auth themselves)
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: install serve test compat lint bench screenshots clean

install: $(VENV)/.installed-$(MLX_BACKEND)

# one backend at a time: switching removes the other's package first
$(VENV)/.installed-$(MLX_BACKEND): pyproject.toml
	$(if $(PYTHON),,$(error $(NO_PYTHON)))
	@case "$(MLX_BACKEND)" in cpu|cuda|cuda13) ;; \
	  *) echo "MLX_BACKEND must be cpu, cuda or cuda13, not '$(MLX_BACKEND)'"; exit 2;; esac
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	rm -f $(VENV)/.installed-*
	$(PY) -m pip uninstall -q -y $(filter-out $(BACKEND_PACKAGE_$(MLX_BACKEND)),$(BACKEND_PACKAGES)) \
	  2>/dev/null || true
	$(PY) -m pip install -q -e ".[dev,$(MLX_BACKEND)]"
	touch $@

# `serve run` with a clean stop: SIGTERM or SIGINT (Ctrl-C), to it or to its whole process group,
# stops Serve and Ray and every process they started (deployments/cli/launch.py)
serve: install
	$(PY) -m deployments.cli.launch $(CONFIG)

# the compat manifest is validated (and its docs checked up to date) before the tests run
test: export RAY_AUTH_MODE ?= disabled
test: install
	$(PY) -m compat.check
	$(PY) -m compat.render --check
	$(PY) -m pytest -q -rs -p no:warnings

# rewrite the manifest shards canonically, then regenerate docs/llama-server-compat.md and README
compat: install
	$(PY) -m compat.check --fix
	$(PY) -m compat.render

lint: install
	$(VENV)/bin/ruff check .

bench: install $(VENV)/.bench-installed
	$(PY) -m bench $(BENCH_ARGS)

$(VENV)/.bench-installed: pyproject.toml
	$(PY) -m pip install -q -e ".[dev,bench,$(MLX_BACKEND)]"
	touch $@

# the web page's screenshots under docs/img (README), taken by its browser tests
screenshots: install
	MLXRAY_SCREENSHOTS=docs/img $(PY) -m pytest -q -p no:warnings tests/serve/test_webui.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
