#!/usr/bin/env bash
# Sets everything up (with test tools), then lints and runs the test suite. Exit status: non-zero on any failure,
# and on "no tests collected".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
.venv/bin/ruff check src tests
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then echo "test.sh: no tests were collected" >&2; exit 1; fi
exit $rc
