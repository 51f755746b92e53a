# One command sets up a fresh machine and runs the main job; one runs the tests.
#   make run    create .venv, install melchior, start the mellan relay (SQLite default;
#               PORT=… HOST=… pass --port/--host)
#   make demo   the whole system working on a throwaway relay (mellan demo), Ctrl-C ends it
#   make test   create .venv if needed, install with test extras, run the whole suite
#               (on four processes; PYTEST_WORKERS=0 for one, PYTEST_ARGS=… for pytest)
#   make clis   the real coding-agent CLIs the tests drive (scripts/cli-pins), with npm
#   make bump-clis        move the pinned newest CLIs to npm's latest releases
#   make test-slow        the soak runs at full size (left out of make test)
#   make test-streaming   only the provider SSE/HTTP boundary tests (no credentials)
#   make screenshots      the dashboard's screenshots in docs/dashboard/ (needs chromium)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

JS_SDK := $(VENV)/js
# The coding-agent CLIs (1.8 GB) live in the user's cache, one directory per pinned
# release, installed once per machine and shared by every checkout: a clean clone (CI)
# does not fetch and unpack them again. CLI_DIR=… puts them elsewhere.
CLI_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/melchior/cli

.PHONY: setup run demo test test-slow test-streaming lint bench clean js-sdk clis bump-clis screenshots

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/mellan relay $(if $(PORT),--port $(PORT)) $(if $(HOST),--host $(HOST))

demo: $(STAMP)
	$(BIN)/mellan demo

# A second, independent A2A client for the interop tests (skipped where npm is missing).
js-sdk:
	@if [ ! -d $(JS_SDK)/node_modules/@grpc/grpc-js ] && command -v npm >/dev/null; then \
		mkdir -p $(JS_SDK) && cd $(JS_SDK) && \
		npm install --silent --no-audit --no-fund @a2a-js/sdk@1.3.0 \
			@grpc/grpc-js@1.14.7 @bufbuild/protobuf@2.10.2 || \
		echo "make: could not install @a2a-js/sdk; its interop tests will be skipped"; \
	fi

# Claude Code, Codex and pi for the real-CLI tests: each pinned release (scripts/cli-pins)
# once, into a directory of its own; present ones are not installed again.
clis: $(STAMP)
	@$(BIN)/python scripts/clis.py install $(CLI_DIR)

bump-clis: $(STAMP)
	$(BIN)/python scripts/clis.py bump

# The suite runs on PYTEST_WORKERS processes (pytest-xdist); every test has ports,
# databases and runtime directories of its own. PYTEST_WORKERS=0 runs it in this one.
# Four on a 2-core machine: most tests wait on subprocesses, sockets and databases (with
# two workers the suite kept 1.15 cores busy, with four 1.7), so four took 11 minutes where
# two took 18; with the start-up costs cut, about 7 (docs/benchmarks.md, "The test suite's
# wall time").
# A worker that runs out of tests takes some of another's queue (--dist worksteal), so the
# run does not end on one worker still holding a few long ones.
PYTEST_WORKERS ?= 4

# The suite starts about two thousand Python processes (relays, receivers, commands,
# bridges). With $$PYTHONDONTWRITEBYTECODE set, as some machines and CI images do, each
# of them compiled every module of ours it imported from source again (a relay's start
# took 0.48-0.58 s of CPU, 0.30-0.32 s with the caches), and every worker re-did pytest's
# assertion rewriting. So a test run writes the bytecode caches (__pycache__/, ignored by
# git) whatever it says.
test: $(STAMP) js-sdk clis
	PYTHONDONTWRITEBYTECODE= A2A_JS_SDK_DIR=$(abspath $(JS_SDK)) MELCHIOR_CLI_DIR=$(abspath $(CLI_DIR)) \
		$(BIN)/pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist worksteal) $(PYTEST_ARGS)

# The soak runs at full size (10,000 tasks through processes and replicas), left out of
# `make test`, which runs their short versions.
test-slow: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS)) -m slow $(PYTEST_ARGS)

# The provider boundary alone: SSE parser partitions and local-HTTP fixtures, no credentials.
test-streaming: $(STAMP)
	$(BIN)/pytest -m streaming $(PYTEST_ARGS)

# The dashboard's screenshots in docs/dashboard/, taken by its browser tests (needs chromium).
screenshots: $(STAMP)
	MELLAN_SCREENSHOTS=docs/dashboard $(BIN)/pytest -m browser -q tests/relay/test_dashboard_browser.py

# ruff, mypy strict, and the layers of docs/architecture.md (lint-imports: pyproject's
# [tool.importlinter] contracts; an import that points up a layer fails here)
lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard bench) scripts/clis.py scripts/tck_sut.py
	$(BIN)/ruff format --check src tests $(wildcard bench) scripts/clis.py scripts/tck_sut.py
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	for f in bench/*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
