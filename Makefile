VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FLOW ?= HotelFlow

.PHONY: run eval test lint bench clean chromium build-ApiFunction build-WebSocketFunction

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m picoflow.local.demo --flow $(FLOW) $(if $(FLOWS),--flows $(FLOWS)) $(if $(SERVE),--serve)

# Offline: each bundled flow's scenario.json judged turn by turn, the flow scripted by its conversation.json and
# the judge by its judge_script.json (README: Evaluating a flow).
eval: $(STAMP)
	@for scenario in flows/*/scenario.json; do \
		flow=$$(dirname $$scenario); \
		$(VENV)/bin/picoflow eval $$scenario --script $$flow/conversation.json \
			--judge scripted --judge-script $$flow/judge_script.json || exit 1; \
	done

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

# The Lambda function's code. `sam build` runs this target (template.yaml: BuildMethod makefile) with
# ARTIFACTS_DIR set; it also runs on its own: ARTIFACTS_DIR=/tmp/function make build-ApiFunction.
# It installs requirements.txt as wheels for the function's runtime and architecture (so any host can
# build it, no python3.12 needed) and copies the example application, handlers/ and flows/; nothing
# else of the repository ships. boto3, botocore and s3transfer are left out: the function uses the
# copies the Lambda Python runtime includes. build/ goes first, as setuptools would pack whatever an
# earlier build left in build/lib into the library's wheel.
LAMBDA_PYTHON ?= 3.12
LAMBDA_PLATFORMS ?= manylinux2014_aarch64 manylinux_2_28_aarch64
BUILD_PY ?= python3
RUNTIME_PROVIDED := boto3 botocore s3transfer

build-ApiFunction:
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set" >&2; exit 2; }
	rm -rf build
	$(BUILD_PY) -m pip install --quiet --disable-pip-version-check --no-compile --upgrade \
		--target "$(ARTIFACTS_DIR)" \
		--implementation cp --python-version $(LAMBDA_PYTHON) --only-binary=:all: \
		$(addprefix --platform ,$(LAMBDA_PLATFORMS)) -r requirements.txt
	cd "$(ARTIFACTS_DIR)" && rm -rf bin $(foreach name,$(RUNTIME_PROVIDED),$(name) $(name)-*.dist-info)
	cp -R handlers flows "$(ARTIFACTS_DIR)/"
	find "$(ARTIFACTS_DIR)/handlers" "$(ARTIFACTS_DIR)/flows" -name __pycache__ -prune -exec rm -rf {} +

# The WebSocket API's function (template parameter EnableWebSocketApi) ships the same code.
build-WebSocketFunction: build-ApiFunction

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
