# The two commands of the README: `make demo` (the main job on an embedded Kafka) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench soak

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[spark,test,bench]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/globald demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -ra

bench: $(BIN)/.installed
	$(BIN)/python -m bench

soak: $(BIN)/.installed
	$(BIN)/python -m tests.soak $(SOAK_ARGS)
