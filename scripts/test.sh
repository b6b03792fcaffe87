#!/usr/bin/env bash
# Sets everything up (with test tools), then lints and runs the test suite. Exit status: non-zero on any failure,
# and on "no tests collected".
#   bash scripts/test.sh               # lint + the test suite (extra arguments go to pytest)
#   bash scripts/test.sh --extended    # the full extended property run of the mechanism contract: 10,000 cases per
#                                      # property for every registered mechanism (hypothesis seed 0, every CPU); run it
#                                      # before submitting any change to a mechanism, the sampler or the accounting
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
if [[ "${1:-}" == "--extended" ]]; then
  shift
  start=$SECONDS
  set +e
  DPINFER_PROPERTY_CASES="${DPINFER_PROPERTY_CASES:-10000}" .venv/bin/python -m pytest -q -p no:cacheprovider \
      -m extended -n auto --dist worksteal --hypothesis-seed=0 --durations=20 tests/unit/mechanisms/test_contract.py \
      tests/unit/mechanisms/test_dp_fusion.py::test_mollify_property_bound_maximality_and_group_guarantee "$@"
  rc=$?
  echo "test.sh: extended run took $((SECONDS - start)) s"
  exit $rc
fi
.venv/bin/ruff check src tests
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then echo "test.sh: no tests were collected" >&2; exit 1; fi
exit $rc
