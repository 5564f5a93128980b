#!/usr/bin/env bash
# `make test`: lint and type-check, then the whole suite in three pytest runs — the tiers that
# need no Go binary (unit and source, which read KubeRay's CRDs, and e2e on real Ray), the
# tiers on the real control plane (package, integration), and the node tier (a real kubelet,
# KubeRay and Ray pods).
#
# On a bare machine the Go builds are most of the time (docs/testenv.md), so nothing waits
# for them that need not: the control plane's binaries build from the first second, at a
# lower priority than the virtualenv, lint and the first run beside them (KubeRay's and the
# Gateway API's CRDs come from the module downloads, in seconds); the node's binaries and
# images build after them at the same priority. The node tier waits on Ray pods for most of
# its half hour (about 40 % of the CPU idle), so the package and integration tiers run
# beside it and beside the node's builds, at the lowest priority, their output kept in
# build/test-integration.log and printed once the node tier ends. Warm, every build is found
# cached at once. A failed build fails the run with its log; every background build and run
# is waited for before exiting, so none is left running.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p build

cp_build=
node_build=
second_run=

finish() {  # finish CODE WHAT: wait for the builds and runs still going, then exit with CODE
  if [[ -n "$node_build" ]]; then wait "$node_build"; fi
  if [[ -n "$cp_build" ]]; then wait "$cp_build"; fi
  if [[ -n "$second_run" ]]; then wait "$second_run"; cat build/test-integration.log; fi
  if [[ -n "$2" ]]; then echo "make test: $2" >&2; fi
  exit "$1"
}

# Interrupted (Ctrl-C, or SIGTERM to this script): the background run gets SIGTERM, which the
# test bed turns into its teardown (testbed/servegraph_testbed/processes.py), and is waited for.
interrupted() {
  if [[ -n "$second_run" ]]; then kill -TERM "$second_run" 2>/dev/null; wait "$second_run"; fi
  exit 130
}
trap interrupted INT TERM

joined() {  # joined VAR LOG WHAT: wait for the build whose pid VAR holds; if it failed, its log and exit
  local pid=${!1}
  printf -v "$1" ''
  wait "$pid" && return
  tail -n 30 "$2"
  finish 1 "$3 did not build ($2)"
}

SERVEGRAPH_TESTBED_TIER=manifests bash hack/testenv/build.sh >build/testbed-manifests.env 2>build/testbed-manifests.log &
manifests=$!
joined manifests build/testbed-manifests.log "KubeRay's and the Gateway API's CRDs"
SERVEGRAPH_TESTBED_TIER=controlplane nice -n 10 bash hack/testenv/build.sh >build/testbed-cp.env 2>build/testbed-cp.log &
cp_build=$!

make --no-print-directory venv || finish 1 "the virtualenv did not install"
# Behind the control plane's build (build.sh holds a lock), at its priority: the node's
# binaries, then its images (which need the virtualenv).
nice -n 10 bash -c "set -eo pipefail; bash hack/testenv/build.sh | tail -n 1 > build/testbed-node.env
  SERVEGRAPH_TESTENV=\"\$(cat build/testbed-node.env)\" $PY -m servegraph_testbed.images | tail -n 1 \
    > build/testbed-images.env" >build/testbed-node.log 2>&1 &
node_build=$!

make --no-print-directory lint || finish 1 "lint failed"
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
SERVEGRAPH_TESTENV="$(tail -n 1 build/testbed-manifests.env)" $PY -m pytest tests/unit tests/source tests/e2e ${PYTEST_ARGS:-}
first=$?
joined cp_build build/testbed-cp.log "the control plane's test bed"
# shellcheck disable=SC2086
SERVEGRAPH_TESTENV="$(tail -n 1 build/testbed-cp.env)" nice -n 19 \
  $PY -m pytest tests/package tests/integration ${PYTEST_ARGS:-} >build/test-integration.log 2>&1 &
second_run=$!
echo "make test: the package and integration tiers run beside the node's builds and tier (build/test-integration.log)"
[[ "$first" -eq 0 ]] || finish "$first" "the unit, source or e2e tier failed (the node tier not run)"
joined node_build build/testbed-node.log "the node's test bed"
# shellcheck disable=SC2086
SERVEGRAPH_TESTENV="$(cat build/testbed-node.env)" SERVEGRAPH_IMAGES="$(cat build/testbed-images.env)" \
  $PY -m pytest tests/node ${PYTEST_ARGS:-}
node=$?
wait "$second_run"
second=$?
second_run=
echo "make test: the package and integration tiers (build/test-integration.log):"
cat build/test-integration.log
[[ "$second" -eq 0 ]] || finish "$second" "the package or integration tier failed"
[[ "$node" -eq 0 ]] || finish "$node" "the node tier failed"
finish 0 ""
