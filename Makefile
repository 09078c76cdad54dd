VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FLOW ?= HotelFlow

.PHONY: run eval test lint typecheck bench clean chromium docs build-ApiFunction build-WebSocketFunction build-WebSocketAuthorizerFunction lock

RUN_STAMP := $(VENV)/.installed-run
# setuptools' notice about editable installs, which would otherwise end the install's output.
QUIET_SETUPTOOLS := PYTHONWARNINGS="ignore:Editable installation"

# Everything the tests, the linter and the benchmarks use.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(QUIET_SETUPTOOLS) $(PY) -m pip install --quiet -e '.[dev,docs]'
	touch $(STAMP) $(RUN_STAMP)

# Only what the demo needs: the library and its own dependencies, with pip's progress shown.
$(RUN_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(QUIET_SETUPTOOLS) $(PY) -m pip install -e .
	touch $(RUN_STAMP)

run: $(RUN_STAMP)
	$(PY) -m picoflow.local.demo --flow $(FLOW) $(if $(FLOWS),--flows $(FLOWS)) $(if $(SERVE),--serve)

# Offline: each bundled flow's scenario.json judged turn by turn, the flow scripted by its conversation.json and
# the judge by its judge_script.json (docs/how-to/evaluations.md).
eval: $(STAMP)
	@for scenario in flows/*/scenario.json; do \
		flow=$$(dirname $$scenario); \
		$(VENV)/bin/picoflow eval $$scenario --script $$flow/conversation.json \
			--judge scripted --judge-script $$flow/judge_script.json || exit 1; \
	done

# The documentation site at http://127.0.0.1:8000 (mkdocs.yml, built by Zensical), once the tables the pages include
# are written from the repository (docs/_generated/generate.py); make test builds it strictly and runs its examples.
docs: $(STAMP)
	$(PY) docs/_generated/generate.py
	$(VENV)/bin/zensical serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy --strict on picoflow/, handlers/ and flows/ (pyproject.toml: [tool.mypy]): the types users' checkers read.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# tests/test_browser.py drives Debian's Chromium; CI (CI=true, run as root) installs it when missing.
# Elsewhere nothing is installed and that test skips without the browser.
chromium:
	@if [ "$${CI:-}" = "true" ] && [ ! -x /usr/bin/chromium ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; \
	fi

test: lint typecheck chromium
	$(PY) -m pytest -v

# The Lambda function's code. `sam build` runs this target (template.yaml: BuildMethod makefile) with
# ARTIFACTS_DIR set, in this checkout (samconfig.toml: build_in_source), so that nothing of it is copied first;
# it also runs on its own: ARTIFACTS_DIR=/tmp/function make build-ApiFunction.
# It installs requirements.txt, the lock `make lock` compiles from pyproject.toml (every package pinned and
# hashed, checked with --require-hashes), as wheels for the function's runtime and architecture (so any host
# can build it, no python3.12 needed), then the picoflow library, and copies the example application,
# handlers/ and flows/, and the model script events/env.json names for `sam local invoke`; nothing else of the
# repository ships. The library is built from a copy of its sources in a folder of its own: setuptools writes
# build/ where it builds, and the checkout stays untouched even when sam builds several functions at once.
# LAMBDA_PYTHON and LAMBDA_PLATFORMS name the runtime the wheels are for: set them to this host's to run the
# built folder here (tests/test_function_build.py does).
LAMBDA_PYTHON ?= 3.12
LAMBDA_PLATFORMS ?= manylinux2014_aarch64 manylinux_2_28_aarch64
BUILD_PY ?= python3
# Left out of the lock, as the function never imports them: the AWS SDK (the Lambda Python runtime includes
# it and the function uses that copy); zstandard (21 MB), which langsmith, a dependency of langchain-core, lists
# only to compress trace uploads to LangSmith, which the function never sends (langsmith does without it); and
# pycparser, which cffi needs only to compile C declarations, while cryptography's bindings come compiled; and
# google-api-core with google-auth, proto-plus and pyasn1 (8 MB together), which a2a-sdk lists for its gRPC and
# Google-auth transports: its JSON-RPC server and client, the only parts the function uses, never import them.
# Give LOCK_EXTRAS (e.g. bedrock) to lock an optional provider into the function too.
LOCK_LEFT_OUT := boto3 botocore s3transfer zstandard pycparser google-api-core google-auth proto-plus pyasn1 \
	pyasn1-modules
LOCK_EXTRAS ?=

build-ApiFunction:
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set" >&2; exit 2; }
	$(BUILD_PY) -m pip install --quiet --disable-pip-version-check --no-compile --upgrade \
		--target "$(ARTIFACTS_DIR)" --require-hashes --no-deps \
		--implementation cp --python-version $(LAMBDA_PYTHON) --only-binary=:all: \
		$(addprefix --platform ,$(LAMBDA_PLATFORMS)) -r requirements.txt
	library=$$(mktemp -d) && trap 'rm -rf "$$library"' EXIT && \
		tar -cf - --exclude=__pycache__ pyproject.toml README.md LICENSE picoflow | tar -xf - -C "$$library" && \
		$(BUILD_PY) -m pip install --quiet --disable-pip-version-check --no-compile --upgrade --no-deps \
			--target "$(ARTIFACTS_DIR)" "$$library"
	rm -rf "$(ARTIFACTS_DIR)/bin"
	cp -R handlers flows "$(ARTIFACTS_DIR)/"
	mkdir -p "$(ARTIFACTS_DIR)/events" && cp events/script.json "$(ARTIFACTS_DIR)/events/"
	find "$(ARTIFACTS_DIR)/handlers" "$(ARTIFACTS_DIR)/flows" -name __pycache__ -prune -exec rm -rf {} +

# requirements.txt, the function's lock: pyproject.toml's dependencies resolved for the function's runtime.
# Run it after changing those dependencies and commit the result.
lock: $(STAMP)
	$(VENV)/bin/uv pip compile pyproject.toml --quiet --generate-hashes \
		--python-version $(LAMBDA_PYTHON) --python-platform aarch64-manylinux_2_28 \
		$(addprefix --extra ,$(LOCK_EXTRAS)) $(addprefix --no-emit-package ,$(LOCK_LEFT_OUT)) \
		--output-file requirements.txt

# The WebSocket API's functions, its turns and its connect authorizer, ship the same code. sam builds them from
# this checkout only when EnableWebSocketApi is true; otherwise their CodeUri is deploy/placeholder/ (template.yaml,
# mapping WebSocketCode), whose own Makefile writes a placeholder of a few bytes instead.
build-WebSocketFunction: build-ApiFunction
build-WebSocketAuthorizerFunction: build-ApiFunction

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
