# The two commands a newcomer runs: `make demo` and `make test`. Both install
# what they need (a virtualenv in .venv, Go-built binaries cached under
# ~/.cache/servegraph/) and work on a bare machine with registry access.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BUF_VERSION := 1.75.0
BUF_DIR := $(HOME)/.cache/servegraph/buf-$(BUF_VERSION)
BUF := $(BUF_DIR)/node_modules/.bin/buf
PYTEST_ARGS ?=

.PHONY: venv testenv proto proto-check lint test test-unit demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

## testenv: build or find kube-apiserver, etcd, KubeRay, kubectl, helm; last line = their directory
testenv:
	@bash hack/testenv/build.sh

$(BUF):
	npm install --silent --no-audit --no-fund --prefix $(BUF_DIR) @bufbuild/buf@$(BUF_VERSION)

## proto: regenerate the Python code and type stubs from proto/ (the one source of truth)
proto: venv
	$(PY) hack/protogen.py

lint: venv $(BUF)
	$(VENV)/bin/ruff check src tests bench fuzz
	$(VENV)/bin/ruff format --check src tests bench fuzz
	$(VENV)/bin/mypy
	cd proto && $(BUF) lint

## test: lint, type-check, then the whole suite (unit, integration on the real control plane, e2e on real Ray)
test: venv lint
	@assets=$$(bash hack/testenv/build.sh | tail -n 1) && \
	  SERVEGRAPH_TESTENV="$$assets" $(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

## demo: the operator on the embedded control plane with a sample graph registry
demo: venv
	@assets=$$(bash hack/testenv/build.sh | tail -n 1) && \
	  SERVEGRAPH_TESTENV="$$assets" $(VENV)/bin/servegraph demo

## bench: parse+validate+render (bench/render_bench.py) and the operator on the real control plane
bench: venv
	$(PY) bench/render_bench.py
	@assets=$$(bash hack/testenv/build.sh | tail -n 1) && for n in 100 500 1000; do \
	  SERVEGRAPH_TESTENV="$$assets" $(PY) bench/operator_bench.py --counts $$n --changes 200 --quiet-s 60 || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
