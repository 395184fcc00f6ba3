#!/usr/bin/env bash
# Runs pytest on python/tests files with the project venv's Python (ctest's
# python_* tests call it). Usage: run_tests.sh PYTHON TEST_FILE...
# Exits 77 (ctest: skipped) when PYTHON does not exist, unless
# KVTIER_REQUIRE_PYTHON=1 (`make test` sets it), which makes that a failure.
# The tests and what they start (tiny model folders, vLLM's ZMQ sockets, which
# vLLM leaves behind when an engine is killed) get a TMPDIR of their own that
# is removed when pytest exits.
set -euo pipefail
python=$1
shift
if [ ! -x "$python" ]; then
  if [ "${KVTIER_REQUIRE_PYTHON:-0}" = 1 ]; then
    echo "run_tests.sh: $python does not exist (make pydeps installs it)" >&2
    exit 1
  fi
  echo "run_tests.sh: skipped: $python does not exist (make pydeps installs it)"
  exit 77
fi
cd "$(dirname "$0")"
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-pytest.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
"$python" -m pytest -p no:cacheprovider -q "$@"
