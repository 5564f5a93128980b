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

.PHONY: venv testenv images proto proto-check lint test test-fast test-node test-unit demo demo-check bench bench-large bench-baseline bench-streams clean

$(VENV)/.installed: pyproject.toml testbed/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]' -e ./testbed
	touch $@

venv: $(VENV)/.installed

## testenv: build or find every binary of the test bed (control plane and node); last line = their directory
testenv:
	@bash hack/testenv/build.sh

## images: build or find the node tier's images (buildah, cached by input hash); last line = the image set
images: venv
	@SERVEGRAPH_TESTENV="$$(bash hack/testenv/build.sh | tail -n 1)" $(PY) -m servegraph_testbed.images | tail -n 1

# What the test and demo targets run first: binaries, then images, exported to pytest/the demo.
TESTBED = assets=$$(bash hack/testenv/build.sh | tail -n 1) && \
	  images=$$(SERVEGRAPH_TESTENV="$$assets" $(PY) -m servegraph_testbed.images | tail -n 1) && \
	  export SERVEGRAPH_TESTENV="$$assets" SERVEGRAPH_IMAGES="$$images"

$(BUF):
	npm install --silent --no-audit --no-fund --prefix $(BUF_DIR) @bufbuild/buf@$(BUF_VERSION)

## proto: regenerate the Python code and type stubs from proto/ (the one source of truth)
proto: venv
	$(PY) hack/protogen.py

lint: venv $(BUF)
	$(VENV)/bin/ruff check src testbed tests bench fuzz
	$(VENV)/bin/ruff format --check src testbed tests bench fuzz
	$(VENV)/bin/mypy
	cd proto && $(BUF) lint

## test: lint, type-check, then the whole suite: the fast tiers (unit, package, source, integration on the
## real control plane, e2e on real Ray), then the node tier (a real kubelet, KubeRay and Ray pods).
## On a bare machine the Go builds start at once, beside the virtualenv, lint and the fast tiers
## (hack/test.sh says how); warm, they are found cached.
test:
	@PYTEST_ARGS="$(PYTEST_ARGS)" bash hack/test.sh

test-fast: venv
	@$(TESTBED) && $(PY) -m pytest tests/unit tests/package tests/source tests/integration tests/e2e $(PYTEST_ARGS)

test-node: venv
	@$(TESTBED) && $(PY) -m pytest tests/node $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

## demo: a published graph answers on a real node under KubeRay, then version 2; Ctrl-C tears down
demo: venv
	@$(TESTBED) && $(PY) -m servegraph_testbed.demo

## demo-check: the same story without waiting; exits 0 only if every answer was right and nothing was left
demo-check: venv
	@$(TESTBED) && $(PY) -m servegraph_testbed.demo --check

BENCH_OUT ?= build/bench
BENCH_BASELINE ?= bench/baseline.json
OPERATOR_BENCH = SERVEGRAPH_TESTENV="$$(bash hack/testenv/build.sh | tail -n 1)" $(PY) bench/operator_bench.py \
	--changes 200 --quiet-s 60

## bench: parse+validate+render (bench/render_bench.py), then the operator on the real control plane at 1,000
## ServeGraphs: one shared graph (the cache-hit case), then a graph each with a publish storm (BENCHMARKS.md).
## Fails, naming the figure, when one is over 20 % worse than $(BENCH_BASELINE) in two runs: after a failed
## check both run again and each figure counts as the better run measured it (see BENCHMARKS.md).
BENCH_1000 = $(BENCH_OUT)/operator-shared-1000.json $(BENCH_OUT)/operator-distinct-1000.json
bench: venv
	$(PY) bench/render_bench.py
	$(OPERATOR_BENCH) --shared --counts 1000 --json-out $(BENCH_OUT)/operator-shared-1000.json
	$(OPERATOR_BENCH) --distinct --counts 1000 --json-out $(BENCH_OUT)/operator-distinct-1000.json
	$(PY) bench/regression.py check --baseline $(BENCH_BASELINE) $(BENCH_1000) || { \
	  echo "bench: a figure regressed; running both again: a regression must show in both runs"; \
	  $(OPERATOR_BENCH) --shared --counts 1000 --json-out $(BENCH_OUT)/again/operator-shared-1000.json && \
	  $(OPERATOR_BENCH) --distinct --counts 1000 --json-out $(BENCH_OUT)/again/operator-distinct-1000.json && \
	  $(PY) bench/regression.py check --baseline $(BENCH_BASELINE) $(BENCH_1000) \
	    $(BENCH_OUT)/again/operator-shared-1000.json $(BENCH_OUT)/again/operator-distinct-1000.json; }

## bench-large: the operator at 10,000 ServeGraphs, a graph each, 1,000 of them republished at once
bench-large: venv
	$(OPERATOR_BENCH) --distinct --counts 10000 --progress-deadline 2h --json-out $(BENCH_OUT)/operator-distinct-10000.json
	$(PY) bench/regression.py check --baseline $(BENCH_BASELINE) $(BENCH_OUT)/operator-distinct-10000.json

## bench-baseline: record the figures of the last bench runs (every $(BENCH_OUT)/operator-*.json) as the baseline
bench-baseline: venv
	$(PY) bench/regression.py record --baseline $(BENCH_BASELINE) $(BENCH_OUT)/operator-*.json

## bench-streams: on one local Ray Serve, streams through a servegraph sequence + switch vs the same chain
## hand-written with Serve handles, and gRPC vs HTTP for one unary graph (bench/stream_bench.py, ~3 min; BENCHMARKS.md)
bench-streams: venv
	$(PY) bench/stream_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
