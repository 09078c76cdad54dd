VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FLOW ?= HotelFlow

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m picoflow.local.demo --flow $(FLOW)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -v

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
