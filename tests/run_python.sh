#!/usr/bin/env bash
# Runs a Python check script with the project venv's Python (ctest's style
# checks call it). Usage: run_python.sh PYTHON SCRIPT [ARG...]
# Exits 77 (ctest: skipped) when PYTHON does not exist, unless
# KVTIER_REQUIRE_PYTHON=1 (`make test` sets it), which makes that a failure.
set -euo pipefail
python=$1
shift
if [ ! -x "$python" ]; then
  if [ "${KVTIER_REQUIRE_PYTHON:-0}" = 1 ]; then
    echo "run_python.sh: $python does not exist (make pydeps installs it)" >&2
    exit 1
  fi
  echo "run_python.sh: skipped: $python does not exist (make pydeps installs it)"
  exit 77
fi
exec "$python" "$@"
