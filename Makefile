VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FLOW ?= HotelFlow

.PHONY: run test lint bench clean chromium

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m picoflow.local.demo --flow $(FLOW)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# tests/test_browser.py drives Debian's Chromium; CI (CI=true, run as root) installs it when missing.
# Elsewhere nothing is installed and that test skips without the browser.
chromium:
	@if [ "$${CI:-}" = "true" ] && [ ! -x /usr/bin/chromium ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; \
	fi

test: lint chromium
	$(PY) -m pytest -v

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
