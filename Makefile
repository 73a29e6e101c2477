# Two entry points: `make demo` (the main job) and `make test` (the whole suite).
# Both run `make setup` first, which is idempotent: a second run takes seconds.

VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch lies on this kind of machine's disk; a bare `torch` would pull a CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed-stamp
DEMO_PROBLEM ?= What is 17 * 23 + 5?

.PHONY: setup demo test lint docker image model browser clean

setup: $(STAMP) docker image model browser

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

docker:
	./scripts/ensure_docker.sh

# Offline build from Debian packages; a no-op (under a second) when the image is current.
image: $(STAMP) docker
	$(PY) -m mathagent sandbox build

model: $(STAMP)
	$(PY) -m mathagent fetch-model >/dev/null

# Debian's chromium for the report's headless-browser test (playwright drives it; no download).
browser:
	./scripts/ensure_chromium.sh >/dev/null

demo: setup
	$(VENV)/bin/mathagent solve "$(DEMO_PROBLEM)"

test: setup
	$(VENV)/bin/ruff check .
	$(PY) scripts/check_imports.py
	$(PY) scripts/check_sizes.py
	$(VENV)/bin/pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/check_imports.py
	$(PY) scripts/check_sizes.py

clean:
	rm -rf $(VENV)
