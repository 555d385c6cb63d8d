# The two entry points of README.md; both set everything up on a fresh machine.
#   make demo   the main job: golden model, ONNX Runtime comparison, RTL on Verilator
#   make test   ruff, then the test suite on all cores
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.qaccel-installed
PYTEST_ARGS ?=

.PHONY: demo test lint bench setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh
	touch $@

demo: setup
	$(PY) -m qaccel demo

lint: setup
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest -n auto --durations=30 $(PYTEST_ARGS)

bench: setup
	$(PY) -m qaccel bench golden

clean:
	rm -rf build sim_build .pytest_cache .ruff_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
