# onnxpool: `make run` serves the demo model on 127.0.0.1:8000; `make test` installs and tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint typecheck unit bench clean

$(STAMP): setup.cfg setup.py pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("onnxpool needs Python 3.11+") if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

run: install
	$(BIN)/onnxpool serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q

test: lint typecheck unit

bench: install
	$(BIN)/python -m pip install --quiet -e '.[bench,baseline]'
	$(BIN)/python -m bench.compare

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache *.egg-info
